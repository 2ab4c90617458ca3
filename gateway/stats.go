package gateway

import (
	"net/http"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// statsResponse is GET /admin/v1/stats (an addition, docs/protocol.md
// §9.14): a few of the node's own metrics as one JSON document, for the
// admin console's charts. Counters are totals since the node started: a
// reader takes the difference of two answers over their ts.
type statsResponse struct {
	TS             int64            `json:"ts"`
	Deliveries     float64          `json:"deliveries_total"`
	Sends          float64          `json:"sends_total"`
	SendsByResult  map[string]int64 `json:"sends_by_result"`
	Connections    float64          `json:"connections"`
	PushesDropped  float64          `json:"pushes_dropped_total"`
	Resyncs        float64          `json:"resyncs_total"`
	QueueDepth     float64          `json:"shard_queue_depth"`
	QueueBound     float64          `json:"shard_queue_bound"`
	Queues         []statsQueue     `json:"shard_queues"`
	RoomWaiting    map[string]int64 `json:"room_waiting"`
	NodeLevel      float64          `json:"node_level"`
	HotGroups      float64          `json:"hot_groups"`
	OnlineUsers    float64          `json:"online_users"`
	OnlineGroups   float64          `json:"online_groups"`
	GoroutineCount float64          `json:"goroutines"`
}

type statsQueue struct {
	Pool  string  `json:"pool"`
	Shard string  `json:"shard"`
	Depth float64 `json:"depth"`
	Bound float64 `json:"bound"`
}

// StatsRoutes registers GET /admin/v1/stats on a: the metrics the admin
// console charts, read from APIConfig.Registry (what /metrics exposes).
func StatsRoutes(a *API) {
	a.HandleAdmin("GET /admin/v1/stats", func(w http.ResponseWriter, r *http.Request) error {
		fams, err := a.cfg.Registry.Gather()
		if err != nil && len(fams) == 0 {
			return err
		}
		WriteJSON(w, http.StatusOK, statsOf(fams, time.Now()))
		return nil
	})
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// statsOf picks the console's metrics out of a gathered registry.
func statsOf(fams []*dto.MetricFamily, now time.Time) statsResponse {
	s := statsResponse{TS: now.UnixMilli(), SendsByResult: map[string]int64{}, RoomWaiting: map[string]int64{}, Queues: []statsQueue{}}
	sum := func(f *dto.MetricFamily) float64 {
		t := 0.0
		for _, m := range f.Metric {
			t += metricValue(m)
		}
		return t
	}
	queues := map[[2]string]*statsQueue{}
	queue := func(m *dto.Metric) *statsQueue {
		k := [2]string{label(m, "pool"), label(m, "shard")}
		q := queues[k]
		if q == nil {
			q = &statsQueue{Pool: k[0], Shard: k[1]}
			queues[k] = q
		}
		return q
	}
	for _, f := range fams {
		switch f.GetName() {
		case "fanfare_deliveries_total":
			s.Deliveries = sum(f)
		case "fanfare_sends_total":
			s.Sends = sum(f)
			for _, m := range f.Metric {
				s.SendsByResult[label(m, "result")] += int64(metricValue(m))
			}
		case "fanfare_ws_connections":
			s.Connections = sum(f)
		case "fanfare_ws_pushes_dropped_total":
			s.PushesDropped = sum(f)
		case "fanfare_ws_resyncs_total":
			s.Resyncs = sum(f)
		case "fanfare_shard_queue_depth":
			s.QueueDepth = sum(f)
			for _, m := range f.Metric {
				queue(m).Depth = metricValue(m)
			}
		case "fanfare_shard_queue_bound":
			s.QueueBound = sum(f)
			for _, m := range f.Metric {
				queue(m).Bound = metricValue(m)
			}
		case "fanfare_room_waiting":
			for _, m := range f.Metric {
				s.RoomWaiting[label(m, "room")] = int64(metricValue(m))
			}
		case "fanfare_node_degradation_level":
			s.NodeLevel = sum(f)
		case "fanfare_hot_groups":
			s.HotGroups = sum(f)
		case "fanfare_presence_users":
			s.OnlineUsers = sum(f)
		case "fanfare_presence_groups":
			s.OnlineGroups = sum(f)
		case "go_goroutines":
			s.GoroutineCount = sum(f)
		}
	}
	for _, q := range queues {
		s.Queues = append(s.Queues, *q)
	}
	slices.SortFunc(s.Queues, func(a, b statsQueue) int {
		if a.Pool != b.Pool {
			if a.Pool < b.Pool {
				return -1
			}
			return 1
		}
		if len(a.Shard) != len(b.Shard) {
			return len(a.Shard) - len(b.Shard)
		}
		if a.Shard < b.Shard {
			return -1
		}
		if a.Shard > b.Shard {
			return 1
		}
		return 0
	})
	return s
}
