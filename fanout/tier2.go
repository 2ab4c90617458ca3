// This file holds tier 2: the goroutine that advances
// conversations.last_seq of active offline members once per merge window,
// from the seqs commit.go notes (noteTier2).

package fanout

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// groupMeta is what the engine reads about a group in the background: its
// member count (for LargeGroup) and its active members (tier 2).
type groupMeta struct {
	gid       int64
	members   atomic.Int64 // -1 until read
	requested atomic.Bool  // a read is queued
	readAt    atomic.Int64 // engine clock, unix nanos, of the last read
	usedAt    atomic.Int64 // engine clock, unix nanos, of the last use
	nactive   atomic.Int64 // len(active); -1 until read

	// Writer-owned: active members as of activeAt.
	active   []string
	activeAt time.Time
}

// Tier2State is one group's tier-2 switch as the admin API shows it.
type Tier2State struct {
	GID      int64
	Enabled  bool  // whether the next window would write
	Override *bool // the operator's switch; nil = automatic
	Reason   string
	Active   int   // active members at the last read (-1 = not read)
	Members  int64 // member count at the last read (-1 = not read)
}

// tier2 writes conversations.last_seq for active offline members, one
// coalesced AdvanceConversations per group per merge window, and reads
// group metadata, on one goroutine off the workers.
type tier2 struct {
	e *Engine

	metas sync.Map // gid -> *groupMeta

	mu       sync.Mutex
	pending  map[int64]int64 // gid -> newest seq to write
	metaReq  []*groupMeta
	override map[int64]bool
	wake     chan struct{}

	// writer-owned scratch
	swap    map[int64]int64
	reqs    []*groupMeta
	offline []string
	lastGC  time.Time
}

func newTier2(e *Engine) *tier2 {
	return &tier2{
		e:        e,
		pending:  map[int64]int64{},
		swap:     map[int64]int64{},
		override: map[int64]bool{},
		wake:     make(chan struct{}, 1),
	}
}

// note records that gid committed up to seq (worker side, once per group
// per window).
func (t *tier2) note(gid, seq int64) {
	t.mu.Lock()
	if seq > t.pending[gid] {
		t.pending[gid] = seq
	}
	t.mu.Unlock()
}

// meta returns gid's metadata, queueing a first read.
func (t *tier2) meta(gid int64) *groupMeta {
	if v, ok := t.metas.Load(gid); ok {
		return v.(*groupMeta)
	}
	m := &groupMeta{gid: gid}
	m.members.Store(-1)
	m.nactive.Store(-1)
	v, loaded := t.metas.LoadOrStore(gid, m)
	m = v.(*groupMeta)
	if !loaded {
		t.requestMeta(m)
	}
	return m
}

// touchMeta marks m used and queues a reread of the member count when it
// is stale (member counts move slowly: every 5 x ActiveRefresh).
func (t *tier2) touchMeta(m *groupMeta, now time.Time) {
	m.usedAt.Store(now.UnixNano())
	if now.UnixNano()-m.readAt.Load() > int64(5*t.e.tune.Load().ActiveRefresh) {
		t.requestMeta(m)
	}
}

func (t *tier2) requestMeta(m *groupMeta) {
	if !m.requested.CompareAndSwap(false, true) {
		return
	}
	t.mu.Lock()
	t.metaReq = append(t.metaReq, m)
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// setOverride sets (on non-nil) or clears the operator's switch of gid.
func (t *tier2) setOverride(gid int64, on *bool) {
	t.mu.Lock()
	if on == nil {
		delete(t.override, gid)
	} else {
		t.override[gid] = *on
	}
	t.mu.Unlock()
}

func (t *tier2) run(stop <-chan struct{}) {
	every := t.e.tune.Load().MergeWindow
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			t.flush() // the workers are done: write their last notes
			return
		case <-tick.C:
		case <-t.wake: // also sent by SetTuning
		}
		if d := t.e.tune.Load().MergeWindow; d != every {
			every = d
			tick.Reset(d)
		}
		t.flush()
	}
}

// flush reads the queued metadata and writes the pending seqs.
func (t *tier2) flush() {
	t.mu.Lock()
	t.pending, t.swap = t.swap, t.pending
	t.reqs = append(t.reqs[:0], t.metaReq...)
	clear(t.metaReq)
	t.metaReq = t.metaReq[:0]
	t.mu.Unlock()
	now := t.e.now()
	for i, m := range t.reqs {
		t.readMeta(m, now)
		t.reqs[i] = nil
	}
	for gid, seq := range t.swap {
		t.write(gid, seq, now)
	}
	clear(t.swap)
	if now.Sub(t.lastGC) > idleEvict {
		t.lastGC = now
		t.metas.Range(func(k, v any) bool {
			m := v.(*groupMeta)
			if now.UnixNano()-max(m.usedAt.Load(), m.readAt.Load()) > int64(4*idleEvict) {
				t.metas.Delete(k)
			}
			return true
		})
	}
}

func (t *tier2) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), t.e.cfg.CommitTimeout)
}

// readMeta rereads a group's member count. Active members are read by
// the tier-2 write path only, for groups that write.
func (t *tier2) readMeta(m *groupMeta, now time.Time) {
	defer m.requested.Store(false)
	ctx, cancel := t.ctx()
	defer cancel()
	g, err := t.e.st.Group(ctx, m.gid)
	if err != nil {
		t.e.cfg.Logger.Debug("group metadata read failed", "gid", m.gid, "err", err)
		return
	}
	m.members.Store(g.MemberCount)
	m.readAt.Store(now.UnixNano())
	m.usedAt.Store(now.UnixNano())
}

func (t *tier2) readActive(ctx context.Context, m *groupMeta, now time.Time) bool {
	uids, err := t.e.st.ActiveMembersSince(ctx, m.gid, now.Add(-t.e.tune.Load().ActiveWindow))
	if err != nil {
		t.e.cfg.Logger.Debug("active members read failed", "gid", m.gid, "err", err)
		return false
	}
	m.active, m.activeAt = uids, now
	m.nactive.Store(int64(len(uids)))
	return true
}

// decide says whether gid's tier 2 is on, and why, from its member count
// and active member count (-1 = not read yet).
func (t *tier2) decide(gid, members, active int64) (bool, *bool, string) {
	t.mu.Lock()
	ov, has := t.override[gid]
	t.mu.Unlock()
	if has {
		if ov {
			return true, &ov, "forced on by operator"
		}
		return false, &ov, "forced off by operator"
	}
	cfg := t.e.tune.Load()
	switch {
	case cfg.Tier2Off:
		return false, nil, "off by configuration"
	case t.e.IsHot(gid):
		return false, nil, "off: hot group"
	case active < 0:
		return true, nil, "on"
	case active > int64(cfg.Tier2MaxMembers):
		return false, nil, "off: too many active members"
	case members > 0 && cfg.Tier2MinActiveShare > 0 && float64(active)/float64(members) < cfg.Tier2MinActiveShare:
		return false, nil, "off: active share below threshold"
	}
	return true, nil, "on"
}

// write advances the conversations of gid's active offline members to seq.
func (t *tier2) write(gid, seq int64, now time.Time) {
	met := t.e.cfg.Metrics
	m := t.meta(gid)
	if on, _, reason := t.decide(gid, m.members.Load(), m.nactive.Load()); !on {
		met.tier2(reasonLabel(reason), 0)
		return
	}
	ctx, cancel := t.ctx()
	defer cancel()
	if m.activeAt.IsZero() || now.Sub(m.activeAt) >= t.e.tune.Load().ActiveRefresh {
		if g, err := t.e.st.Group(ctx, gid); err == nil {
			m.members.Store(g.MemberCount)
			m.readAt.Store(now.UnixNano())
		}
		if !t.readActive(ctx, m, now) {
			met.tier2("failed", 0)
			return
		}
		if on, _, reason := t.decide(gid, m.members.Load(), m.nactive.Load()); !on {
			met.tier2(reasonLabel(reason), 0)
			return
		}
	}
	t.offline = t.offline[:0]
	for _, uid := range m.active {
		if t.e.pres == nil || !t.e.pres.UserOnline(uid) {
			t.offline = append(t.offline, uid)
		}
	}
	if len(t.offline) == 0 {
		met.tier2("nobody", 0)
		return
	}
	if err := t.e.st.AdvanceConversations(ctx, gid, t.offline, seq); err != nil {
		t.e.cfg.Logger.Warn("tier-2 write failed", "gid", gid, "seq", seq, "members", len(t.offline), "err", err)
		met.tier2("failed", 0)
		return
	}
	met.tier2("written", len(t.offline))
}

func reasonLabel(reason string) string {
	switch reason {
	case "off: hot group":
		return "skipped_hot"
	case "off: active share below threshold":
		return "skipped_share"
	case "off: too many active members":
		return "skipped_size"
	}
	return "skipped_off"
}

// SetTier2 sets (on non-nil) or clears (nil) the operator's tier-2 switch
// of gid; it wins over the automatic switch.
func (e *Engine) SetTier2(gid int64, on *bool) { e.t2.setOverride(gid, on) }

// Tier2 returns gid's tier-2 switch.
func (e *Engine) Tier2(gid int64) Tier2State {
	members, active := int64(-1), int64(-1)
	if v, ok := e.t2.metas.Load(gid); ok {
		m := v.(*groupMeta)
		members, active = m.members.Load(), m.nactive.Load()
	}
	on, ov, reason := e.t2.decide(gid, members, active)
	return Tier2State{GID: gid, Enabled: on, Override: ov, Reason: reason, Active: int(active), Members: members}
}
