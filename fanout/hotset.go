// This file holds the cluster hot set (Config.HotSet): this node's hot
// marks and offered rates published, the other nodes' read, one call per
// HotSync; admission.go and triggers.go read the view.

package fanout

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// HotSet is the cluster's shared set of group marks: every node publishes
// the groups its own traffic makes hot (docs/architecture.md §9) and the offered rate
// of every rate-limited group it takes sends for (so that a group limit
// holds cluster-wide, docs/architecture.md §8), and reads the marks of all nodes;
// *redishot.Set implements it. Nil in Config.HotSet = hot status and group
// limits are per node.
//
// One method, state rather than deltas: each call replaces the node's
// marks, so a lost "unmark" cannot leave a stale mark behind (the next
// call rewrites them), and publishing and reading cost one round trip per
// period however many groups are marked.
type HotSet interface {
	// Sync replaces node's marks with marks (none = withdraw them), each
	// valid for ttl: a node that stops calling loses its marks ttl after
	// its last call. It returns the live marks of every node, node's own
	// included.
	Sync(ctx context.Context, node string, marks []HotMark, ttl time.Duration) ([]HotMark, error)
}

// HotMark is one node's mark of a group: its offered rate of the group
// there, and whether that node marks it hot (its own rate is above the
// hot threshold, or not yet back below half of it). A mark that is not
// hot says the group is rate-limited and offered Rate on Node.
type HotMark struct {
	GID   int64
	Node  string
	Rate  float64   // the group's offered rate on Node, messages per second
	Hot   bool      // Node marks the group hot
	Since time.Time // hot: when the group became hot on Node (millisecond precision)
}

// hotView is the cluster's marks as last read: hot marks of the other
// nodes, by gid, and their summed offered rates of the groups they limit.
// Immutable once stored.
type hotView struct {
	remote map[int64][]HotMark
	demand map[int64]float64
	all    int // groups marked hot by any node, this one included
}

var emptyHotView = &hotView{}

// remoteHot reports whether another node marks gid hot (workers call it
// once per evaluation of a hot group, never per message).
func (e *Engine) remoteHot(gid int64) bool {
	_, ok := e.view.Load().remote[gid]
	return ok
}

// remoteDemand is the other nodes' offered rate of gid as last read
// (workers call it once per evaluation of a group, never per message).
func (e *Engine) remoteDemand(gid int64) float64 {
	return e.view.Load().demand[gid]
}

// noteDemand records gs's offered rate on this node for the HotSet while
// the group is limited here (on gs's worker, every evaluation).
func (e *Engine) noteDemand(gs *gstate, rate float64, limited bool) {
	on := limited && rate > 0
	if e.cfg.HotSet == nil || !on && !gs.demand {
		return
	}
	gs.demand = on
	e.hotMu.Lock()
	if on {
		e.demand[gs.gid] = rate
	} else {
		delete(e.demand, gs.gid)
	}
	e.hotMu.Unlock()
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

// MaxHotMarks bounds the marks a node publishes per round: hot marks
// first, then the busiest limited groups. The limits of the groups left
// out are this node's alone that round (fanfare_hot_marks_dropped_total
// counts them).
const MaxHotMarks = 1000

// localMarks returns this node's marks: hot groups whose own rate keeps
// them hot, hottest first, then the other limited groups it takes sends
// for, busiest first; at most MaxHotMarks of them.
func (e *Engine) localMarks() []HotMark {
	e.hotMu.Lock()
	var out []HotMark
	for _, h := range e.hotInfo {
		if h.marked {
			out = append(out, HotMark{GID: h.GID, Node: e.cfg.NodeID, Rate: h.Rate, Hot: true, Since: h.Since})
		}
	}
	for gid, rate := range e.demand {
		if h, ok := e.hotInfo[gid]; !ok || !h.marked {
			out = append(out, HotMark{GID: gid, Node: e.cfg.NodeID, Rate: rate})
		}
	}
	e.hotMu.Unlock()
	slices.SortFunc(out, func(a, b HotMark) int {
		if a.Hot != b.Hot {
			if a.Hot {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(b.Rate, a.Rate); c != 0 {
			return c
		}
		return cmp.Compare(a.GID, b.GID)
	})
	if len(out) > MaxHotMarks {
		e.cfg.Metrics.marksDropped(len(out) - MaxHotMarks)
		out = out[:MaxHotMarks]
	}
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
			e.cfg.Logger.Warn("hot set unavailable: hot status and group limits follow this node's traffic only", "err", err)
		}
		e.view.Store(emptyHotView)
		hot := 0
		for _, m := range marks {
			if m.Hot {
				hot++
			}
		}
		e.cfg.Metrics.clusterHot(hot)
		e.cfg.Metrics.sharedLimits(0)
		return
	}
	if e.hotSetDown {
		e.hotSetDown = false
		e.cfg.Logger.Info("hot set reachable again: following the cluster's hot groups and group limits")
	}
	v := &hotView{remote: map[int64][]HotMark{}, demand: map[int64]float64{}}
	seen := map[int64]struct{}{}
	for _, m := range marks {
		if m.Hot {
			seen[m.GID] = struct{}{}
		}
	}
	for _, m := range all {
		if m.Node == e.cfg.NodeID {
			continue
		}
		v.demand[m.GID] += m.Rate
		if m.Hot {
			seen[m.GID] = struct{}{}
			v.remote[m.GID] = append(v.remote[m.GID], m)
		}
	}
	v.all = len(seen)
	e.view.Store(v)
	e.cfg.Metrics.clusterHot(v.all)
	e.cfg.Metrics.sharedLimits(len(v.demand))
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
