// This file holds the degradation triggers: per group on its worker
// (evaluate: downlink, group rate, hot), per node on the controller
// (egress, commit latency, store probes), and the moves of hot groups
// between the pools. They set the levels (levels.go) that deliver.go reads.

package fanout

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// moveTimeout is how long a worker waits for a requested move before it
// may ask again.
const moveTimeout = 10 * time.Second

// idleEvict is how long a group's state is kept after its last send once
// it is back to normal.
const idleEvict = 2 * time.Minute

// evaluate updates gs's automatic level and hot status from its rates. It
// runs on gs's worker.
func (s *shard) evaluate(gs *gstate, now time.Time) {
	cfg := s.tn
	gs.lastEval = now
	w := s.bucketWidth()
	arr := gs.arrivals.rate(now, w)
	com := gs.commits.rate(now, w)
	large := s.large(gs)
	cf, hold := cfg.ClearFraction, cfg.ClearAfter
	// The group's limit holds cluster-wide: the rate offered on the other
	// nodes (HotSet) counts against it, here and in limits. This node's
	// demand is at least its buffered sends spread over a rate window (they
	// are in arr while they keep arriving), so a buffer left when the sends
	// stop drains at a fair part, not at the floor.
	gs.offered = max(arr, float64(gs.queue.len())/s.e.cfg.RateWindow.Seconds())
	gs.remote = s.e.remoteDemand(gs.gid)
	_, _, _, limited := s.limits(gs)
	s.e.noteDemand(gs, gs.offered, limited)
	offered := gs.offered + gs.remote

	// L1: every online member receives every committed message at L0, so
	// the group's commit rate is each member's downlink.
	if cfg.DownlinkRate > 0 {
		th := cfg.DownlinkFraction * cfg.DownlinkRate
		gs.downlink.update(now, large && com > th, !large || com < cf*th, hold)
	}
	// L2: offered message rate above the group limit.
	th := cfg.GroupRate // the group's limit (the cause below names it)
	if cfg.GroupRate > 0 {
		if gs.hot {
			th = cfg.HotGroupRate
		}
		gs.rate.update(now, large && offered > th, !large || offered < cf*th, hold)
	}
	want := L0Normal
	switch {
	case gs.rate.on:
		want = L2Summary
	case gs.downlink.on, gs.hot:
		want = L1Merge
	}
	if want != gs.auto {
		var cause string
		switch {
		case gs.rate.on:
			cause = fmt.Sprintf("group rate %.1f msg/s above its limit %.0f/s", offered, th)
			if gs.remote > 0 {
				cause += fmt.Sprintf(" (%.1f on this node, %.1f on the others)", gs.offered, gs.remote)
			}
		case gs.downlink.on:
			cause = fmt.Sprintf("group downlink %.1f msg/s per member above %.0f%% of its limit %.0f/s", com, 100*cfg.DownlinkFraction, cfg.DownlinkRate)
		case gs.hot:
			cause = "hot group: pushes go through merge windows"
		default:
			cause = fmt.Sprintf("group traffic back to normal for %v (%.1f msg/s offered, %.1f committed)", hold, offered, com)
		}
		gs.auto = want
		s.e.levels.SetAuto(gs.gid, want, cause)
	}

	// Hot groups: rate against the baseline, with hysteresis. A request
	// the controller dropped (the route had already moved) is retried.
	if gs.moving && now.Sub(gs.movingAt) > moveTimeout {
		gs.moving = false
	}
	if cfg.HotFactor <= 0 {
		gs.marked = false
	} else if !gs.moving {
		base := math.Max(gs.baseline, cfg.HotBaselineFloor)
		above := large && arr >= cfg.HotMinRate && arr > cfg.HotFactor*base
		if !gs.hot {
			gs.marked = above
			if gs.marked {
				s.e.requestMove(gs, true, arr, base)
			}
		} else {
			// This node marks the group (HotSet) from when its own rate
			// crosses the threshold until it is back below half of it (a
			// group moved in by another node's mark is not marked here
			// below the threshold); the group stays in the hot pool while
			// any node marks it, and cools once none has for HotClearAfter.
			localCalm := !large || arr < 0.5*cfg.HotFactor*base || arr < 0.5*cfg.HotMinRate
			gs.marked = above || gs.marked && !localCalm
			calm := localCalm && !s.e.remoteHot(gs.gid)
			gs.cool.update(now, !calm, calm, cfg.HotClearAfter)
			if !gs.cool.on {
				// Asked at every evaluation until the controller takes it
				// (moving), so a request dropped at a full queue is retried.
				s.e.requestMove(gs, false, arr, base)
			}
		}
	}
	// The baseline follows the rate slowly and is frozen while hot, so a
	// hot group stays hot until its rate comes down.
	if !gs.hot {
		if dt := now.Sub(gs.baseAt); dt > 0 {
			a := 1 - math.Exp(-float64(dt)/float64(cfg.BaselineTau))
			gs.baseline += a * (arr - gs.baseline)
			gs.baseAt = now
		}
	} else {
		gs.baseAt = now
		s.e.updateHot(gs.gid, arr, math.Max(gs.baseline, cfg.HotBaselineFloor), gs.marked)
	}
}

// sweep evaluates every group of the worker and forgets idle ones.
func (s *shard) sweep(now time.Time) {
	for gid, gs := range s.gs {
		s.evaluate(gs, now)
		if gs.meta != nil {
			s.e.t2.touchMeta(gs.meta, now)
		}
		// A group that counted @all today keeps its state (the count)
		// until the day ends.
		if now.Sub(gs.lastSeen) > idleEvict && gs.auto == L0Normal && !gs.hot && !gs.moving &&
			gs.queue.len() == 0 && !gs.open && !gs.t2Dirty && !gs.paced &&
			(gs.atAllCount == 0 || gs.atAllDay != utcDay(now)) {
			delete(s.gs, gid)
		}
	}
}

// moveRequest asks the controller to move a group between the pools.
type moveRequest struct {
	gid        int64
	toHot      bool
	rate, base float64
	by         string // another node whose mark asked for the move (HotSet)
}

// requestMove asks the controller to move gs; it runs on gs's worker.
func (e *Engine) requestMove(gs *gstate, toHot bool, rate, base float64) {
	select {
	case e.moveReq <- moveRequest{gid: gs.gid, toHot: toHot, rate: rate, base: base}:
		gs.moving, gs.movingAt = true, e.now()
	default: // the controller is busy: asked again at the next evaluation
	}
}

// move hands a group over between the pools, keeping its order:
//  1. the new worker is told to park the group's tasks;
//  2. the route is switched under routeMu, so once Lock returns no sender
//     can still enqueue on the old route;
//  3. a marker is queued behind the group's last task on the old worker,
//     which, on reaching it, sends the group's state to the new worker;
//  4. the new worker installs the state and runs the parked tasks first.
func (e *Engine) move(m moveRequest) {
	e.moves.Add(1)
	defer e.moves.Add(-1)
	if e.closing.Load() || e.IsHot(m.gid) == m.toHot {
		// Workers are draining, or the group is already routed there (a
		// repeated request): leave it where it is.
		return
	}
	h := maphash64(e, m.gid)
	from := e.shards[h%uint64(len(e.shards))]
	to := e.hotSh[h%uint64(len(e.hotSh))]
	if !m.toHot {
		from, to = to, from
	}
	to.post(mail{gid: m.gid})
	e.routeMu.Lock()
	next := make(map[int64]struct{}, len(*e.hot.Load())+1)
	for g := range *e.hot.Load() {
		next[g] = struct{}{}
	}
	if m.toHot {
		next[m.gid] = struct{}{}
	} else {
		delete(next, m.gid)
	}
	e.hot.Store(&next)
	e.routeMu.Unlock()
	t := taskPool.Get().(*task)
	t.kind, t.gid, t.to, t.toHot, t.enq = taskMove, m.gid, to, m.toHot, time.Now()
	from.enqueueMove(t)
	switch {
	case m.toHot && m.by != "":
		e.cfg.Logger.Info("group is hot: marked hot by another node", "gid", m.gid, "node", m.by, "cluster_rate", m.rate)
	case m.toHot:
		e.cfg.Logger.Info("group is hot", "gid", m.gid, "rate", m.rate, "baseline", m.base, "factor", e.tune.Load().HotFactor)
	default:
		e.cfg.Logger.Info("group is no longer hot", "gid", m.gid, "rate", m.rate, "baseline", m.base)
	}
	e.cfg.Metrics.hotMove(m.toHot)
}

// groupMoved records a group's arrival in its new pool (on the new worker).
func (e *Engine) groupMoved(gs *gstate, now time.Time) {
	e.hotMu.Lock()
	if gs.hot {
		e.hotInfo[gs.gid] = hotInfo{HotGroup: HotGroup{GID: gs.gid, Baseline: math.Max(gs.baseline, e.tune.Load().HotBaselineFloor), Since: gs.hotSince}, marked: gs.marked}
	} else {
		delete(e.hotInfo, gs.gid)
	}
	n := len(e.hotInfo)
	e.hotMu.Unlock()
	e.cfg.Metrics.hotGroups(gs.gid, gs.hot, n)
	e.kickHotSync()
}

// updateHot refreshes a hot group's rate, baseline and mark (on its
// worker, every evaluation); a mark that appears or goes is published at
// once.
func (e *Engine) updateHot(gid int64, rate, base float64, marked bool) {
	e.hotMu.Lock()
	h, ok := e.hotInfo[gid]
	changed := ok && h.marked != marked
	if ok {
		h.Rate, h.Baseline, h.marked = rate, base, marked
		e.hotInfo[gid] = h
	}
	e.hotMu.Unlock()
	e.cfg.Metrics.hotRate(gid, rate)
	if changed {
		e.kickHotSync()
	}
}

// hotInfo is a group of the hot pool as the engine tracks it.
type hotInfo struct {
	HotGroup
	marked bool // this node's own rate keeps it hot (published in HotSet)
}

// HotSource says why a group is hot on this node.
type HotSource string

// Hot sources.
const (
	// HotLocal: this node's own rate keeps the group hot (it publishes a
	// mark); other nodes may mark it too.
	HotLocal HotSource = "local"
	// HotRemote: only other nodes mark it (HotSet).
	HotRemote HotSource = "remote"
	// HotCooling: no node marks it any more; it leaves the hot pool once
	// its rate stayed low for HotClearAfter.
	HotCooling HotSource = "cooling"
)

// HotGroup is one hot group as the admin API shows it: rates in messages
// per second.
type HotGroup struct {
	GID      int64
	Rate     float64 // offered rate on this node over the last rate window
	Baseline float64 // the group's baseline on this node when it became hot
	Since    time.Time
	Source   HotSource
	// Marks are the nodes that mark the group hot, this one included, by
	// node (with a HotSet; else this node's mark only, if any).
	Marks []HotMark
}

// HotGroups returns the cluster's hot groups as this node sees them, by
// gid: the groups of its hot pool and those other nodes mark hot (a group
// hot elsewhere that has not reached the hot pool here yet has Rate 0).
func (e *Engine) HotGroups() []HotGroup {
	v := e.view.Load()
	e.hotMu.Lock()
	out := make([]HotGroup, 0, len(e.hotInfo)+len(v.remote))
	for _, h := range e.hotInfo {
		g := h.HotGroup
		g.Source, g.Marks = HotCooling, nil
		if h.marked {
			g.Source = HotLocal
			g.Marks = append(g.Marks, HotMark{GID: g.GID, Node: e.cfg.NodeID, Rate: h.Rate, Since: h.Since})
		}
		out = append(out, g)
	}
	e.hotMu.Unlock()
	idx := make(map[int64]int, len(out))
	for i, g := range out {
		idx[g.GID] = i
	}
	for gid, ms := range v.remote {
		i, ok := idx[gid]
		if !ok {
			out = append(out, HotGroup{GID: gid, Source: HotRemote})
			i = len(out) - 1
		} else if out[i].Source == HotCooling {
			out[i].Source = HotRemote
		}
		out[i].Marks = append(out[i].Marks, ms...)
		if !out[i].Since.IsZero() {
			continue
		}
		for _, m := range ms {
			if out[i].Since.IsZero() || m.Since.Before(out[i].Since) {
				out[i].Since = m.Since
			}
		}
	}
	for i := range out {
		slices.SortFunc(out[i].Marks, func(a, b HotMark) int { return strings.Compare(a.Node, b.Node) })
	}
	slices.SortFunc(out, func(a, b HotGroup) int { return cmp.Compare(a.GID, b.GID) })
	return out
}

// nodeSample is what the controller reads from the workers each interval.
type nodeSample struct {
	egressBytes int64 // total so far
	commitNanos int64 // over the interval
	commits     int64
	fails       int64 // commits failed with the store unavailable
	oks         int64
}

// nodeTriggers is the node's automatic level (controller-owned).
type nodeTriggers struct {
	egress, latency hysteresis
	storeDown       bool
	okProbes        int
	lastEgress      int64
	lastAt          time.Time
	egressRate      float64 // bytes per second
	lat             float64 // commit latency EWMA, seconds
}

// observe feeds one interval and returns the node's automatic level and
// its cause. ping probes the store; it is called only when commits failed
// without any success, or while the store is down.
func (n *nodeTriggers) observe(cfg *Tuning, now time.Time, s nodeSample, ping func() error) (Level, string) {
	cf, hold := cfg.ClearFraction, cfg.ClearAfter
	if !n.lastAt.IsZero() {
		if dt := now.Sub(n.lastAt).Seconds(); dt > 0 {
			n.egressRate = float64(s.egressBytes-n.lastEgress) / dt
		}
	}
	n.lastAt, n.lastEgress = now, s.egressBytes
	if cfg.EgressBandwidth > 0 {
		th := cfg.EgressFraction * float64(cfg.EgressBandwidth)
		n.egress.update(now, n.egressRate > th, n.egressRate < cf*th, hold)
	}
	mean := 0.0
	if s.commits > 0 {
		mean = float64(s.commitNanos) / float64(s.commits) / 1e9
	}
	n.lat = 0.6*n.lat + 0.4*mean
	if cfg.StoreLatencyAlarm > 0 {
		th := cfg.StoreLatencyAlarm.Seconds()
		n.latency.update(now, n.lat > th, n.lat < cf*th, hold)
	}
	switch {
	case !n.storeDown && s.fails > 0 && s.oks == 0:
		if ping() != nil {
			n.storeDown, n.okProbes = true, 0
		}
	case n.storeDown:
		if ping() == nil {
			n.okProbes++
			if n.okProbes >= cfg.StoreClearProbes {
				n.storeDown = false
			}
		} else {
			n.okProbes = 0
		}
	}
	switch {
	case n.storeDown:
		return L4Reject, fmt.Sprintf("store unavailable: %d commits failed, none succeeded, ping failed", s.fails)
	case n.egress.on && n.latency.on:
		return L3WriteOnly, fmt.Sprintf("node egress %.0f B/s above %.0f%% of %d B/s and store commit latency %.3fs above %v", n.egressRate, 100*cfg.EgressFraction, cfg.EgressBandwidth, n.lat, cfg.StoreLatencyAlarm)
	case n.egress.on:
		return L3WriteOnly, fmt.Sprintf("node egress %.0f B/s above %.0f%% of %d B/s", n.egressRate, 100*cfg.EgressFraction, cfg.EgressBandwidth)
	case n.latency.on:
		return L3WriteOnly, fmt.Sprintf("store commit latency %.3fs above %v", n.lat, cfg.StoreLatencyAlarm)
	}
	return L0Normal, fmt.Sprintf("node back to normal (egress %.0f B/s, commit latency %.3fs, store reachable)", n.egressRate, n.lat)
}

// evalNode samples the workers and sets the node's automatic level.
func (e *Engine) evalNode(ctx context.Context) {
	var s nodeSample
	s.egressBytes = e.egress.Load()
	for _, pool := range [][]*shard{e.shards, e.hotSh} {
		for _, sh := range pool {
			s.commitNanos += sh.commitNanos.Swap(0)
			s.commits += sh.commitCount.Swap(0)
			s.fails += sh.commitFails.Swap(0)
			s.oks += sh.commitOKs.Swap(0)
		}
	}
	ping := func() error {
		pctx, cancel := context.WithTimeout(ctx, max(e.cfg.NodeInterval, 500*time.Millisecond))
		defer cancel()
		return e.st.Ping(pctx)
	}
	lv, cause := e.node.observe(e.tune.Load(), e.now(), s, ping)
	e.cfg.Metrics.nodeSample(e.node.egressRate, e.node.lat)
	e.levels.SetAuto(0, lv, cause)
}
