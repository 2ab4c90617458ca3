package gateway

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/store"
)

// OnlineView is the presence view behind GET /admin/v1/groups/{gid}/online.
// cmd/fanfared passes the Redis cluster view in cluster mode with Redis and
// the single-node view (presence.Embedded) otherwise; both satisfy it.
type OnlineView interface {
	// OnlineCount returns the distinct members of gid online within the
	// view's scope; an error wrapping presence.ErrUnavailable when the view
	// cannot be read.
	OnlineCount(ctx context.Context, gid int64) (int64, error)
	// Stale reports whether this node's own members may be missing from or
	// out of date in the view (its backend unreachable, a resync pending).
	Stale() bool
}

// Online scopes of the online route's answer.
const (
	OnlineScopeCluster = "cluster" // every live node (the Redis view)
	OnlineScopeNode    = "node"    // this node only (no cluster view)
)

// OnlineConfig configures OnlineRoutes.
type OnlineConfig struct {
	// View answers the online count; required.
	View OnlineView
	// Scope says what View covers: OnlineScopeCluster or OnlineScopeNode.
	Scope string
	// Here returns the members of gid online on this node; required.
	Here func(gid int64) int
	// Store tells an unknown group (404) from a group nobody is online in;
	// required.
	Store store.Store
	// Groups appends the gids with a member online on this node; nil =
	// no GET /admin/v1/online (the busiest groups).
	Groups func(dst []int64) []int64
}

// Bounds of GET /admin/v1/online's ?limit=.
const (
	DefaultOnlineList = 20
	MaxOnlineList     = 100
)

// onlineList is GET /admin/v1/online (an addition, docs/protocol.md §9.8).
type onlineList struct {
	// Groups are the groups with the most members online on this node,
	// most first, with their online count in Scope.
	Groups []onlineState `json:"groups"`
	// GroupsOnline counts the groups with a member online on this node.
	GroupsOnline int    `json:"groups_online"`
	Scope        string `json:"scope"`
}

// onlineState is the answer of GET /admin/v1/groups/{gid}/online (an
// addition, see docs/protocol.md §9.8).
type onlineState struct {
	GID        int64  `json:"gid"`
	Online     int64  `json:"online"`      // distinct members online in Scope
	OnlineHere int    `json:"online_here"` // members online on this node
	Stale      bool   `json:"stale"`
	Scope      string `json:"scope"`
}

// OnlineRoutes registers GET /admin/v1/groups/{gid}/online on a: a group's
// online members, cluster-wide when cfg.View is the cluster view.
func OnlineRoutes(a *API, cfg OnlineConfig) error {
	if cfg.View == nil || cfg.Here == nil || cfg.Store == nil {
		return errors.New("gateway: OnlineConfig needs View, Here and Store")
	}
	if cfg.Scope != OnlineScopeCluster && cfg.Scope != OnlineScopeNode {
		return errors.New("gateway: OnlineConfig.Scope must be cluster or node")
	}
	a.HandleAdmin("GET /admin/v1/groups/{gid}/online", func(w http.ResponseWriter, r *http.Request) error {
		gid, err := PathInt64(r, "gid")
		if err != nil {
			return err
		}
		if _, err := cfg.Store.Group(r.Context(), gid); err != nil {
			return err
		}
		// Stale is read before the count: a view that turns healthy in
		// between answers a fresh count flagged stale, never the reverse.
		stale := cfg.View.Stale()
		n, err := cfg.View.OnlineCount(r.Context(), gid)
		if err != nil {
			return err
		}
		WriteJSON(w, http.StatusOK, onlineState{GID: gid, Online: n, OnlineHere: cfg.Here(gid), Stale: stale, Scope: cfg.Scope})
		return nil
	})
	if cfg.Groups != nil {
		a.HandleAdmin("GET /admin/v1/online", func(w http.ResponseWriter, r *http.Request) error {
			limit, err := QueryInt64(r, "limit", DefaultOnlineList)
			if err != nil {
				return err
			}
			if limit < 1 || limit > MaxOnlineList {
				return BadRequest("limit: must be in 1..%d", MaxOnlineList)
			}
			// One walk of this node's online groups (the admin's cost, not
			// the users'), then the view's count for the top ones only.
			gids := cfg.Groups(nil)
			type hereCount struct {
				gid int64
				n   int
			}
			top := make([]hereCount, 0, len(gids))
			for _, g := range gids {
				if n := cfg.Here(g); n > 0 {
					top = append(top, hereCount{g, n})
				}
			}
			slices.SortFunc(top, func(a, b hereCount) int {
				if a.n != b.n {
					return b.n - a.n
				}
				return cmp.Compare(a.gid, b.gid)
			})
			out := onlineList{Groups: []onlineState{}, GroupsOnline: len(top), Scope: cfg.Scope}
			stale := cfg.View.Stale()
			for _, t := range top[:min(len(top), int(limit))] {
				n, err := cfg.View.OnlineCount(r.Context(), t.gid)
				if err != nil {
					return err
				}
				out.Groups = append(out.Groups, onlineState{GID: t.gid, Online: n, OnlineHere: t.n, Stale: stale, Scope: cfg.Scope})
			}
			WriteJSON(w, http.StatusOK, out)
			return nil
		})
	}
	return nil
}

// ClusterPresenceStats are the counters of this node's side of the cluster
// presence view (presence/redispresence.Stats, field for field, so that
// cmd/fanfared converts one into the other).
type ClusterPresenceStats struct {
	Flushes      int64 // flushes that completed
	Failures     int64 // flushes that failed (Redis unreachable or refusing)
	FullWrites   int64 // whole group bitmaps written
	DeltaWrites  int64 // bit deltas written
	Renewals     int64 // TTL renewals of unchanged groups
	Deletes      int64 // groups withdrawn
	Resyncs      int64 // full rewrites (start, after an outage, lost keys)
	BytesWritten int64 // bitmap and delta payload bytes
}

// ClusterPresenceCollector exports the cluster presence view's counters
// and whether it is stale, read at scrape time.
func ClusterPresenceCollector(stats func() ClusterPresenceStats, stale func() bool) prometheus.Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("fanfare_presence_cluster_"+name, help, labels, nil)
	}
	descs := []*prometheus.Desc{
		d("flushes_total", "Publications of this node's online bits to Redis, by result (ok, failed).", "result"),
		d("writes_total", "Group writes of those publications, by kind (full, delta, renewal, delete).", "kind"),
		d("resyncs_total", "Full rewrites of this node's bits (start, after a Redis outage, keys lost by Redis)."),
		d("written_bytes_total", "Bitmap and delta payload bytes written to Redis."),
		d("stale", "1 while this node's bits in the cluster view may be missing or out of date (Redis unreachable or resync pending)."),
	}
	return &statsCollector{descs: descs, collect: func(ch chan<- prometheus.Metric, ds []*prometheus.Desc) {
		st := stats()
		c := prometheus.CounterValue
		ch <- prometheus.MustNewConstMetric(ds[0], c, float64(st.Flushes), "ok")
		ch <- prometheus.MustNewConstMetric(ds[0], c, float64(st.Failures), "failed")
		for _, w := range []struct {
			kind string
			n    int64
		}{{"full", st.FullWrites}, {"delta", st.DeltaWrites}, {"renewal", st.Renewals}, {"delete", st.Deletes}} {
			ch <- prometheus.MustNewConstMetric(ds[1], c, float64(w.n), w.kind)
		}
		ch <- prometheus.MustNewConstMetric(ds[2], c, float64(st.Resyncs))
		ch <- prometheus.MustNewConstMetric(ds[3], c, float64(st.BytesWritten))
		s := 0.0
		if stale() {
			s = 1
		}
		ch <- prometheus.MustNewConstMetric(ds[4], prometheus.GaugeValue, s)
	}}
}
