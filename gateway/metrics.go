package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/presence"
)

// statsCollector exports counters that a component keeps itself (socket
// server, presence index), read at scrape time: nothing on the hot path.
type statsCollector struct {
	descs   []*prometheus.Desc
	collect func(ch chan<- prometheus.Metric, descs []*prometheus.Desc)
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) { c.collect(ch, c.descs) }

// SocketCollector exports the socket server's connection and delivery
// counters.
func SocketCollector(srv *socket.Server) prometheus.Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("fanfare_ws_"+name, help, labels, nil)
	}
	descs := []*prometheus.Desc{
		d("connections", "Upgraded WebSocket connections open."),
		d("tcp_connections", "TCP connections, including handshakes and closings."),
		d("upgrades_total", "Successful WebSocket upgrades."),
		d("handshakes_rejected_total", "Handshakes refused, by HTTP status.", "status"),
		d("frames_written_total", "Frames written to connections (pushes and replies)."),
		d("pushes_dropped_total", "Pushes dropped by the per-connection outbound bound."),
		d("resyncs_total", "Resync frames sent to connections whose pushes were dropped."),
		d("slow_closed_total", "Connections closed for exceeding the hard outbound bound."),
		d("loop_queue_dropped_total", "Push deliveries refused because an event loop's queue was at its bound (node overloaded); each affected connection gets a resync per group."),
		d("loop_queue_closed_total", "Connections closed (1013) because they missed pushes of too many groups at the loop queue bound to track."),
	}
	return &statsCollector{descs: descs, collect: func(ch chan<- prometheus.Metric, ds []*prometheus.Desc) {
		st := srv.Stats()
		g, c := prometheus.GaugeValue, prometheus.CounterValue
		ch <- prometheus.MustNewConstMetric(ds[0], g, float64(st.Conns))
		ch <- prometheus.MustNewConstMetric(ds[1], g, float64(st.TCPConns))
		ch <- prometheus.MustNewConstMetric(ds[2], c, float64(st.Upgrades))
		for _, r := range []struct {
			status string
			n      uint64
		}{{"401", st.Unauthorized}, {"403", st.Forbidden}, {"429", st.TooMany}, {"503", st.Unavailable}} {
			ch <- prometheus.MustNewConstMetric(ds[3], c, float64(r.n), r.status)
		}
		ch <- prometheus.MustNewConstMetric(ds[4], c, float64(st.Deliveries))
		ch <- prometheus.MustNewConstMetric(ds[5], c, float64(st.PushesDropped))
		ch <- prometheus.MustNewConstMetric(ds[6], c, float64(st.Resyncs))
		ch <- prometheus.MustNewConstMetric(ds[7], c, float64(st.SlowClosed))
		ch <- prometheus.MustNewConstMetric(ds[8], c, float64(st.QueueDropped))
		ch <- prometheus.MustNewConstMetric(ds[9], c, float64(st.QueueClosed))
	}}
}

// PresenceCollector exports the local presence index's size.
func PresenceCollector(stats func() presence.Stats) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("fanfare_presence_"+name, help, nil, nil)
	}
	descs := []*prometheus.Desc{
		d("users", "Distinct users online on this node."),
		d("connections", "Connections registered in presence."),
		d("groups", "Groups with at least one member online on this node."),
	}
	return &statsCollector{descs: descs, collect: func(ch chan<- prometheus.Metric, ds []*prometheus.Desc) {
		st := stats()
		ch <- prometheus.MustNewConstMetric(ds[0], prometheus.GaugeValue, float64(st.Users))
		ch <- prometheus.MustNewConstMetric(ds[1], prometheus.GaugeValue, float64(st.Conns))
		ch <- prometheus.MustNewConstMetric(ds[2], prometheus.GaugeValue, float64(st.Groups))
	}}
}
