package fanout

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// HotSet is the cluster's shared set of hot groups (DESIGN.md §9): every
// node publishes the groups its own traffic makes hot and reads the marks
// of all nodes; *redishot.Set implements it. Nil in Config.HotSet = hot
// status is per node.
//
// One method, state rather than deltas: each call replaces the node's
// marks, so a lost "unmark" cannot leave a stale mark behind (the next
// call rewrites them), and publishing and reading cost one round trip per
// period however many groups are hot.
type HotSet interface {
	// Sync replaces node's marks with marks (none = withdraw them), each
	// valid for ttl: a node that stops calling loses its marks ttl after
	// its last call. It returns the live marks of every node, node's own
	// included.
	Sync(ctx context.Context, node string, marks []HotMark, ttl time.Duration) ([]HotMark, error)
}

// HotMark is one node's claim that a group is hot: its own offered rate of
// the group is above the hot threshold, or not yet back below half of it.
type HotMark struct {
	GID   int64
	Node  string
	Rate  float64   // the group's offered rate on Node, messages per second
	Since time.Time // when the group became hot on Node (millisecond precision)
}

// hotView is the cluster's hot set as last read: marks of the other nodes,
// by gid. Immutable once stored.
type hotView struct {
	remote map[int64][]HotMark
	all    int // groups marked by any node, this one included
}

var emptyHotView = &hotView{}

// remoteHot reports whether another node marks gid hot (workers call it
// once per evaluation of a hot group, never per message).
func (e *Engine) remoteHot(gid int64) bool {
	_, ok := e.view.Load().remote[gid]
	return ok
}

// kickHotSync asks the hot-set goroutine to publish at once (a group
// became hot or cooled on this node). It never blocks.
func (e *Engine) kickHotSync() {
	if e.cfg.HotSet == nil {
		return
	}
	select {
	case e.hotKick <- struct{}{}:
	default:
	}
}

// runHotSync publishes this node's marks and reads the cluster's every
// HotSync (sooner after a local change, at most every HotSync/10) until
// stop is closed, then withdraws the marks. It never touches the send
// path: a slow or unreachable HotSet only delays the cluster view.
func (e *Engine) runHotSync(ctx context.Context, stop <-chan struct{}) {
	period := e.cfg.HotSync
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		e.syncHot(ctx, e.localMarks())
		select {
		case <-stop:
			// Withdraw: other nodes stop following this node's marks now
			// rather than after HotTTL.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), period)
			_, err := e.cfg.HotSet.Sync(wctx, e.cfg.NodeID, nil, e.cfg.HotTTL)
			cancel()
			if err != nil {
				e.cfg.Logger.Warn("hot set: could not withdraw this node's marks (they expire by TTL)", "err", err, "ttl", e.cfg.HotTTL)
			}
			return
		case <-tick.C:
		case <-e.hotKick:
			// Coalesce a burst of changes.
			select {
			case <-stop:
			case <-time.After(period / 10):
			}
		}
	}
}

// localMarks returns this node's marks: hot groups whose own rate keeps
// them hot, hottest first (a HotSet that bounds the marks of a round keeps
// the same, hottest ones every round).
func (e *Engine) localMarks() []HotMark {
	e.hotMu.Lock()
	var out []HotMark
	for _, h := range e.hotInfo {
		if h.marked {
			out = append(out, HotMark{GID: h.GID, Node: e.cfg.NodeID, Rate: h.Rate, Since: h.Since})
		}
	}
	e.hotMu.Unlock()
	slices.SortFunc(out, func(a, b HotMark) int {
		if c := cmp.Compare(b.Rate, a.Rate); c != 0 {
			return c
		}
		return cmp.Compare(a.GID, b.GID)
	})
	return out
}

// maxRemoteHot bounds the hot pool a node fills on other nodes' marks:
// past it, groups marked hot elsewhere stay in the ordinary pool here.
const maxRemoteHot = 1000

// syncHot runs one round: publish marks, read the cluster's, store the
// view and ask the controller to move groups other nodes mark hot into
// the hot pool. When the HotSet fails the view falls back to this node's
// own (groups hot only elsewhere cool with the usual hysteresis); the
// first failure and the recovery are logged, every round is counted.
func (e *Engine) syncHot(ctx context.Context, marks []HotMark) {
	sctx, cancel := context.WithTimeout(ctx, e.cfg.HotSync)
	all, err := e.cfg.HotSet.Sync(sctx, e.cfg.NodeID, marks, e.cfg.HotTTL)
	cancel()
	e.cfg.Metrics.hotSync(err == nil)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if !e.hotSetDown {
			e.hotSetDown = true
			e.cfg.Logger.Warn("hot set unavailable: hot status follows this node's traffic only", "err", err)
		}
		e.view.Store(emptyHotView)
		e.cfg.Metrics.clusterHot(len(marks))
		return
	}
	if e.hotSetDown {
		e.hotSetDown = false
		e.cfg.Logger.Info("hot set reachable again: following the cluster's hot groups")
	}
	v := &hotView{remote: map[int64][]HotMark{}}
	seen := map[int64]struct{}{}
	for _, m := range marks {
		seen[m.GID] = struct{}{}
	}
	for _, m := range all {
		seen[m.GID] = struct{}{}
		if m.Node != e.cfg.NodeID {
			v.remote[m.GID] = append(v.remote[m.GID], m)
		}
	}
	v.all = len(seen)
	e.view.Store(v)
	e.cfg.Metrics.clusterHot(v.all)
	if e.tune.Load().HotFactor <= 0 {
		return
	}
	room := maxRemoteHot - len(*e.hot.Load())
	for gid, ms := range v.remote {
		if e.IsHot(gid) {
			continue
		}
		if room <= 0 {
			break
		}
		room--
		req := moveRequest{gid: gid, toHot: true, by: ms[0].Node}
		for _, m := range ms {
			req.rate += m.Rate
		}
		select {
		case e.moveReq <- req:
		default: // the controller is busy: asked again next round
		}
	}
}
