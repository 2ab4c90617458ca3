package waitroom

import (
	"context"
	"log/slog"
	"math"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// overloadRetry is the retry hint given to entrants refused at L2.
const overloadRetry = 5 * time.Second

// Room is one waiting room on this node: its configuration, the local
// users connected to it, its last snapshot and its driver goroutine.
type Room struct {
	m    *Manager
	name string
	cfg  atomic.Pointer[RoomConfig]
	kick chan struct{}
	// snapNow asks the driver for a snapshot at its next step.
	snapNow atomic.Bool

	cancel  context.CancelFunc // guarded by Manager.mu
	updated time.Time          // last local create/update; guarded by Manager.mu

	mu      sync.Mutex
	members map[string]*member  // local users with at least one ticket
	pending map[string]struct{} // uids whose last ticket closed: disconnect
	stats   Stats
	statsAt time.Time
	alert   int
	waits   waitLog // this node's admissions and their waits
	// joining counts Joins in flight per uid; early holds admissions seen
	// for such a uid before its ticket was registered. Both are bounded by
	// the joins in flight.
	joining map[string]int
	early   map[string]time.Time

	// driver-only state
	nextMaintain, nextSnap time.Time
	lastErrLog             time.Time
	places                 []Placement // the room's recent VIP placements
	placeSeq               int64       // latest placement seq received
	placeLocal             bool        // places came from the fallback
	// reconcile: the holds recorded under this node are still to be
	// compared with its tickets (set at start and after a hand-over).
	reconcile atomic.Bool
}

// member is one local user of a room. mu serializes deliveries to the
// user's tickets and guards every field but uid.
type member struct {
	uid string

	mu       sync.Mutex
	tickets  []*Ticket
	state    EntryState
	entry    Entry
	granted  bool
	expires  time.Time
	last     Update
	lastPush time.Time
	seenSeq  int64
	nextRank time.Time // when this user is due in the next snapshot
}

// Ticket is one subscription (one socket) of a user to a room.
type Ticket struct {
	r       *Room
	mem     *member
	deliver func(Update)
	closed  atomic.Bool
}

func newRoom(m *Manager, rc RoomConfig) *Room {
	r := &Room{m: m, name: rc.Name, kick: make(chan struct{}, 1), updated: time.Now(),
		members: make(map[string]*member), pending: make(map[string]struct{}),
		joining: make(map[string]int), early: make(map[string]time.Time)}
	r.cfg.Store(&rc)
	r.reconcile.Store(m.cfg.Node != "")
	m.met.violations.WithLabelValues(rc.Name).Add(0) // exported at 0 from the start, for alerts on any increase
	return r
}

// Name is the room's name.
func (r *Room) Name() string { return r.name }

// Config returns the room's configuration.
func (r *Room) Config() RoomConfig { return *r.cfg.Load() }

func (r *Room) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *Room) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.m.cfg.CallTimeout)
}

// logErr logs backend errors of the driver at most every 10 s.
func (r *Room) logErr(op string, err error) {
	if now := time.Now(); now.Sub(r.lastErrLog) >= 10*time.Second {
		r.lastErrLog = now
		r.m.log.Warn("room backend call failed", "room", r.name, "op", op, "err", err)
	}
}

// deliverAllLocked sends u to every ticket of mem. mem.mu must be held.
func (mem *member) deliverAllLocked(u Update) {
	for _, t := range mem.tickets {
		t.deliver(u)
	}
}

func (r *Room) grantedUpdate(uid string, expires time.Time) Update {
	tok, err := r.m.signer.Sign(uid, r.name, time.Now(), expires)
	if err != nil {
		r.m.log.Error("room access token not signed", "room", r.name, "uid", uid, "err", err)
	}
	return Update{Kind: UpdateGranted, Room: r.name, AccessToken: tok, ExpiresAt: expires}
}

func (r *Room) queueUpdate(ahead int64, st Stats, local bool) Update {
	u := Update{Kind: UpdateQueue, Room: r.name, Position: ahead + 1, Ahead: ahead,
		Total: max(st.Waiting, ahead+1), Local: local}
	if st.Rate > 0 {
		u.Status = StatusWaiting
		u.ETA = time.Duration(math.Ceil(float64(ahead)/st.Rate)) * time.Second
	} else {
		u.Status = StatusPaused
	}
	return u
}

// scheduledUpdate is the queue frame of a user in the pre-queue.
func (r *Room) scheduledUpdate(pre int64, cfg *RoomConfig, local bool) Update {
	return Update{Kind: UpdateQueue, Room: r.name, Status: StatusScheduled, Total: max(pre, 1),
		StartsAt: time.Unix(cfg.StartS(), 0), Local: local}
}

func (r *Room) join(ctx context.Context, uid string, level int, deliver func(Update)) (*Ticket, error) {
	cfg := r.cfg.Load()
	overloaded := r.m.Degradation() == DegradeOverload
	r.mu.Lock()
	r.joining[uid]++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		if r.joining[uid]--; r.joining[uid] <= 0 {
			delete(r.joining, uid)
			delete(r.early, uid)
		}
		r.mu.Unlock()
	}()
	var res EnterResult
	var onLocal bool
	err := r.m.do(ctx, func(b Backend, local bool) error {
		c := r.m.effective(cfg, local)
		if overloaded && !local && c.State == StateOpen {
			cc := *c
			cc.State = StateClosed // L2: known users only
			c = &cc
		}
		var err error
		res, err = b.Enter(ctx, c, EnterRequest{UID: uid, Tier: level, Node: r.m.cfg.Node})
		onLocal = local
		return err
	})
	if err != nil {
		return nil, err
	}
	if res.Ended != nil {
		r.m.sessionEnded(r, *res.Ended)
	}
	if res.Status == EnterRejected {
		code, retry := res.Reject, res.RetryAfter
		if code == RejectRoomClosed && overloaded && cfg.State == StateOpen {
			code, retry = RejectRoomFull, overloadRetry
		}
		r.m.met.rejected.WithLabelValues(r.name, string(code)).Inc()
		r.m.log.Info("room entrant rejected", "room", r.name, "uid", uid, "level", level, "code", string(code),
			"retry_after_ms", retry.Milliseconds(), "waiting", res.Waiting)
		deliver(Update{Kind: UpdateRejected, Room: r.name, Reject: code, RetryAfter: retry})
		return nil, nil
	}
	t := &Ticket{r: r, deliver: deliver}
	r.mu.Lock()
	mem := r.members[uid]
	if mem == nil {
		mem = &member{uid: uid}
		r.members[uid] = mem
	}
	delete(r.pending, uid)
	st := r.stats
	early, wasEarly := r.early[uid]
	delete(r.early, uid)
	t.mem = mem
	mem.mu.Lock()
	r.mu.Unlock()
	mem.tickets = append(mem.tickets, t)
	r.applyEnterLocked(mem, res, st, onLocal, []*Ticket{t})
	if wasEarly && !mem.granted && early.After(time.Now()) { // admitted while joining
		mem.granted, mem.state, mem.expires = true, EntryActive, early
		mem.entry.State, mem.entry.Admitted, mem.entry.Expires = EntryActive, time.Now().Truncate(time.Second), early
		mem.deliverAllLocked(r.grantedUpdate(uid, early))
	}
	mem.mu.Unlock()
	r.m.log.Debug("room join", "room", r.name, "uid", uid, "level", level, "status", res.Status.String(),
		"ahead", res.Ahead, "waiting", res.Waiting)
	r.wake()
	return t, nil
}

// applyEnterLocked records an Enter result and delivers the first frame to
// the given tickets. mem.mu must be held.
func (r *Room) applyEnterLocked(mem *member, res EnterResult, st Stats, local bool, to []*Ticket) {
	if res.Status != EnterActive && mem.granted && mem.expires.After(time.Now()) {
		// admitted after this Enter read the entry: the grant is newer
		u := r.grantedUpdate(mem.uid, mem.expires)
		for _, t := range to {
			t.deliver(u)
		}
		return
	}
	mem.entry = res.Entry
	if res.Status == EnterActive {
		mem.state, mem.granted, mem.expires = EntryActive, true, res.Entry.Expires
		u := r.grantedUpdate(mem.uid, res.Entry.Expires)
		for _, t := range to {
			t.deliver(u)
		}
		return
	}
	mem.state, mem.granted = EntryWaiting, false
	st.Waiting = res.Waiting
	u := r.queueUpdate(res.Ahead, st, local)
	if res.Entry.State == EntryScheduled {
		u = r.scheduledUpdate(res.PreQueue, r.cfg.Load(), local)
	} else {
		// The Enter has just ranked the user: due again when a snapshot
		// would make it (a paused one at the next snapshot, so that the
		// first admissions reach it soon), not at once: re-ranking every
		// entrant within SnapshotEvery roughly doubled the Redis time of a
		// surge of entrants.
		every := r.rankEvery(u)
		if u.Status == StatusPaused {
			every = r.m.cfg.SnapshotEvery
		}
		mem.nextRank = time.Now().Add(every)
	}
	mem.last, mem.lastPush, mem.seenSeq = u, time.Now(), max(mem.seenSeq, res.PlacementSeq)
	for _, t := range to {
		t.deliver(u)
	}
}

// UID is the ticket's user.
func (t *Ticket) UID() string { return t.mem.uid }

// Close is called when the user's socket closes. It never blocks: the
// user's last ticket closing makes the driver disconnect the user (a
// waiting user keeps the position for Grace; an admitted session ends,
// which admits the next user). Close is idempotent.
func (t *Ticket) Close() {
	if !t.closed.CompareAndSwap(false, true) {
		return
	}
	r, mem := t.r, t.mem
	r.mu.Lock()
	mem.mu.Lock()
	for i, x := range mem.tickets {
		if x == t {
			mem.tickets = append(mem.tickets[:i], mem.tickets[i+1:]...)
			break
		}
	}
	empty := len(mem.tickets) == 0
	if empty && r.members[mem.uid] == mem {
		delete(r.members, mem.uid)
		r.pending[mem.uid] = struct{}{}
	}
	mem.mu.Unlock()
	r.mu.Unlock()
	if empty {
		r.wake()
	}
}

// Leave is an explicit leave: the user's entry is removed or its admitted
// session ends now. Other sockets of the same user get an Ended update.
func (t *Ticket) Leave(ctx context.Context) error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	r, mem := t.r, t.mem
	r.mu.Lock()
	mem.mu.Lock()
	others := make([]*Ticket, 0, len(mem.tickets))
	for _, x := range mem.tickets {
		if x != t {
			others = append(others, x)
		}
	}
	mem.tickets = nil
	mem.granted, mem.state = false, EntryNone
	if r.members[mem.uid] == mem {
		delete(r.members, mem.uid)
	}
	delete(r.pending, mem.uid)
	mem.mu.Unlock()
	r.mu.Unlock()
	cfg := r.cfg.Load()
	var d Departure
	err := r.m.do(ctx, func(b Backend, local bool) error {
		var err error
		d, err = b.Leave(ctx, r.m.effective(cfg, local), mem.uid)
		return err
	})
	if d.Ended != nil {
		r.m.sessionEnded(r, *d.Ended)
	}
	mem.mu.Lock()
	for _, o := range others {
		o.closed.Store(true)
		o.deliver(Update{Kind: UpdateEnded, Room: r.name, Reason: EndLeave})
	}
	mem.mu.Unlock()
	r.wake()
	return err
}

// run is the room's driver: one step per Tick or wake-up.
func (r *Room) run(ctx context.Context) {
	t := time.NewTicker(r.m.cfg.Tick)
	defer t.Stop()
	for {
		r.step(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
		}
	}
}

func (r *Room) step(ctx context.Context) {
	cfg := r.cfg.Load()
	if r.reconcile.Load() && r.releaseStale(ctx, cfg) {
		r.reconcile.Store(false)
	}
	r.flushPending(ctx, cfg)
	now := time.Now()
	lvl := r.m.Degradation()
	if !now.Before(r.nextMaintain) {
		r.nextMaintain = now.Add(r.m.cfg.MaintainEvery)
		r.maintain(ctx, cfg, lvl)
	}
	r.admit(ctx, cfg)
	if r.snapNow.Swap(false) || !now.Before(r.nextSnap) {
		every := r.m.cfg.SnapshotEvery
		if lvl == DegradeMemory || lvl == DegradeOverload {
			every = r.m.cfg.LiveRefresh
		}
		r.nextSnap = now.Add(every)
		r.refresh(ctx, cfg)
	}
}

// releaseStale disconnects, on behalf of this node, every user the backend
// records as held by it while it holds no ticket of the user and none is
// being entered: holds of a previous life of the node under the same name
// (a restart within NodeTimeout, before any sweep), and closes lost while
// the node ran on its fallback (Backend.Holds). false: try again later.
func (r *Room) releaseStale(ctx context.Context, cfg *RoomConfig) bool {
	cctx, cancel := r.callCtx(ctx)
	var held []string
	err := r.m.do(cctx, func(b Backend, local bool) error {
		var err error
		held, err = b.Holds(cctx, r.m.effective(cfg, local), r.m.cfg.Node)
		return err
	})
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			r.logErr("holds", err)
		}
		return false
	}
	r.mu.Lock()
	stale := held[:0]
	for _, u := range held {
		if r.members[u] == nil && r.joining[u] == 0 {
			stale = append(stale, u)
		}
	}
	r.mu.Unlock()
	for _, uid := range stale {
		cctx, cancel := r.callCtx(ctx)
		var d Departure
		err := r.m.do(cctx, func(b Backend, local bool) error {
			var err error
			d, err = b.Disconnect(cctx, r.m.effective(cfg, local), uid, r.m.cfg.Node)
			return err
		})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.logErr("disconnect", err)
			}
			return false
		}
		if d.Ended != nil {
			r.m.sessionEnded(r, *d.Ended)
		}
	}
	if len(stale) > 0 {
		r.m.log.Info("room: released stale holds of this node", "room", r.name, "node", r.m.cfg.Node, "users", len(stale))
	}
	return true
}

func (r *Room) flushPending(ctx context.Context, cfg *RoomConfig) {
	r.mu.Lock()
	if len(r.pending) == 0 {
		r.mu.Unlock()
		return
	}
	uids := make([]string, 0, len(r.pending))
	for u := range r.pending {
		if r.members[u] == nil {
			uids = append(uids, u)
		}
	}
	clear(r.pending)
	r.mu.Unlock()
	for _, uid := range uids {
		cctx, cancel := r.callCtx(ctx)
		var d Departure
		err := r.m.do(cctx, func(b Backend, local bool) error {
			var err error
			d, err = b.Disconnect(cctx, r.m.effective(cfg, local), uid, r.m.cfg.Node)
			return err
		})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.logErr("disconnect", err)
			r.mu.Lock()
			if r.members[uid] == nil {
				r.pending[uid] = struct{}{}
			}
			r.mu.Unlock()
			continue
		}
		if d.Ended != nil {
			r.m.sessionEnded(r, *d.Ended)
		}
		r.m.log.Debug("room disconnect", "room", r.name, "uid", uid, "was", d.Prev.String(), "held_elsewhere", d.Held)
	}
}

func (r *Room) maintain(ctx context.Context, cfg *RoomConfig, lvl Degradation) {
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	var res MaintainResult
	err := r.m.do(cctx, func(b Backend, local bool) error {
		var err error
		res, err = b.Maintain(cctx, r.m.effective(cfg, local),
			MaintainRequest{Node: r.m.cfg.Node, NodeTimeout: r.m.cfg.NodeTimeout})
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			r.logErr("maintain", err)
		}
		return
	}
	for _, e := range res.Ended {
		r.m.sessionEnded(r, e)
		r.endedLocal(e.UID, e.Reason)
	}
	if res.Orphans > 0 {
		r.m.log.Warn("room users of a dead node marked away", "room", r.name, "count", res.Orphans)
	}
	if len(res.Dropped) > 0 {
		r.m.log.Info("room entries dropped after hard timeout", "room", r.name, "count", len(res.Dropped))
	}
	r.mu.Lock()
	r.stats.Rate, r.stats.LMax = res.Rate, res.LMax
	st := r.stats
	r.mu.Unlock()
	r.checkAlert(st)
	if lvl == DegradeMemory {
		var n int
		err := r.m.do(cctx, func(b Backend, local bool) error {
			var err error
			n, err = b.Trim(cctx, r.m.effective(cfg, local))
			return err
		})
		if err != nil {
			r.logErr("trim", err)
		} else if n > 0 {
			r.m.log.Info("room stale entries trimmed (L1)", "room", r.name, "count", n)
		}
	}
}

// endedLocal tells a local user that its admitted session ended.
func (r *Room) endedLocal(uid string, reason EndReason) {
	r.mu.Lock()
	mem := r.members[uid]
	r.mu.Unlock()
	if mem == nil {
		return
	}
	mem.mu.Lock()
	ended := mem.granted
	if ended {
		r.endLocked(mem, reason)
	}
	mem.mu.Unlock()
	if ended {
		r.forget(mem)
	}
}

// endLocked tells a member that its session is over and detaches its
// tickets: the user is not queued again unless it joins again.
// mem.mu must be held; call forget afterwards without it.
func (r *Room) endLocked(mem *member, reason EndReason) {
	mem.granted, mem.state = false, EntryNone
	mem.deliverAllLocked(Update{Kind: UpdateEnded, Room: r.name, Reason: reason})
	for _, t := range mem.tickets {
		t.closed.Store(true)
	}
	mem.tickets = nil
}

// forget removes mem from the room's members if it is still the one there.
func (r *Room) forget(mem *member) {
	r.mu.Lock()
	if r.members[mem.uid] == mem {
		delete(r.members, mem.uid)
	}
	r.mu.Unlock()
}

func (r *Room) admit(ctx context.Context, cfg *RoomConfig) {
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	var res AdmitResult
	err := r.m.do(cctx, func(b Backend, local bool) error {
		var err error
		res, err = b.Admit(cctx, r.m.effective(cfg, local), AdmitRequest{})
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			r.logErr("admit", err)
		}
		return
	}
	if len(res.Admitted) == 0 {
		return
	}
	uids := make([]string, len(res.Admitted))
	now := time.Now()
	r.mu.Lock()
	for _, a := range res.Admitted {
		r.waits.recordLocked(a.Tier, a.Admitted.Sub(a.promised()), now)
	}
	r.mu.Unlock()
	for i, a := range res.Admitted {
		uids[i] = a.UID
		lvl := strconv.Itoa(a.Tier)
		r.m.met.admitted.WithLabelValues(r.name, lvl, strconv.FormatBool(a.Overdue)).Inc()
		r.m.met.perceived.WithLabelValues(r.name, lvl).Observe(a.Admitted.Sub(a.First).Seconds())
		from := a.promised()
		r.m.met.wait.WithLabelValues(r.name, lvl).Observe(a.Admitted.Sub(from).Seconds())
		if a.Late {
			r.m.met.violations.WithLabelValues(r.name).Inc()
			r.m.log.Error("room admission broke the max-wait promise", "room", r.name, "uid", a.UID,
				"wait_s", a.Admitted.Sub(from).Seconds(), "max_wait_s", cfg.MaxWait.Seconds())
		}
		r.m.log.Debug("room admitted", "room", r.name, "uid", a.UID, "level", a.Tier, "overdue", a.Overdue,
			"wait_s", a.Admitted.Sub(a.First).Seconds())
	}
	r.grantUIDs(uids, res.Admitted[0].Expires)
}

// sawAdmissionsLocked counts n admissions seen on this node (its own admit
// steps and the other nodes', not the Enter of a user admitted earlier,
// which is no new admission) into a rate
// the last snapshot had at zero, so that a user entering before the next
// snapshot is told waiting, not paused. With no admission in the window
// before these, RateOf over the one second they fell in is exact; a
// non-zero rate is left to the next snapshot. r.mu must be held.
func (r *Room) sawAdmissionsLocked(n int) {
	if n > 0 && r.stats.Rate == 0 {
		now := time.Now().Unix()
		r.stats.Rate = RateOf(int64(n), now, now)
	}
}

// grantUIDs pushes granted to the local users among uids (idempotent: an
// admission seen both as our own result and on the channel grants once).
func (r *Room) grantUIDs(uids []string, expires time.Time) {
	if !expires.After(time.Now()) {
		return
	}
	r.mu.Lock()
	r.sawAdmissionsLocked(len(uids))
	mems := make([]*member, 0, len(uids))
	for _, u := range uids {
		if mem := r.members[u]; mem != nil {
			mems = append(mems, mem)
		} else if r.joining[u] > 0 {
			r.early[u] = expires
		}
	}
	r.mu.Unlock()
	for _, mem := range mems {
		mem.mu.Lock()
		if !mem.granted && mem.state == EntryWaiting {
			mem.granted, mem.state, mem.expires = true, EntryActive, expires
			mem.entry.State, mem.entry.Admitted, mem.entry.Expires = EntryActive, time.Now().Truncate(time.Second), expires
			mem.deliverAllLocked(r.grantedUpdate(mem.uid, expires))
		}
		mem.mu.Unlock()
	}
}

// refresh takes a snapshot for the local users and pushes what changed.
func (r *Room) refresh(ctx context.Context, cfg *RoomConfig) {
	now := time.Now()
	r.mu.Lock()
	all := make([]*member, 0, len(r.members))
	for _, mem := range r.members {
		all = append(all, mem)
	}
	r.mu.Unlock()
	mems := all[:0]
	uids := make([]string, 0, len(all))
	for _, mem := range all {
		mem.mu.Lock()
		due := !now.Before(mem.nextRank)
		mem.mu.Unlock()
		if due {
			mems = append(mems, mem)
			uids = append(uids, mem.uid)
		}
	}
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	var snap Snapshot
	var onLocal bool
	err := r.m.do(cctx, func(b Backend, local bool) error {
		var err error
		since := r.placeSeq
		if local != r.placeLocal {
			since = 0
		}
		snap, err = b.Snapshot(cctx, r.m.effective(cfg, local), uids, since)
		onLocal = local
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			r.logErr("snapshot", err)
		}
		return
	}
	r.mu.Lock()
	r.stats, r.statsAt = snap.Stats, now
	r.mu.Unlock()
	r.checkAlert(snap.Stats)
	reset := onLocal != r.placeLocal || snap.PlacementSeq < r.placeSeq
	if reset { // another backend, or the room was reset: old seqs mean nothing
		r.places, r.placeLocal = r.places[:0], onLocal
	}
	r.places = append(r.places, snap.Placements...)
	if len(r.places) > PlacementLog {
		r.places = append(r.places[:0], r.places[len(r.places)-PlacementLog:]...)
	}
	r.placeSeq = snap.PlacementSeq
	idx := newPlaceIndex(r.places)
	smoothing := max(cfg.Smoothing, 0) + 2*time.Second
	var again, ended []*member
	for i, mem := range mems {
		pos := snap.Positions[i]
		mem.mu.Lock()
		if len(mem.tickets) == 0 {
			mem.mu.Unlock()
			continue
		}
		if reset {
			mem.seenSeq = snap.PlacementSeq
		}
		switch pos.State {
		case EntryWaiting:
			mem.state, mem.entry, mem.granted = EntryWaiting, pos.Entry, false
			u := r.queueUpdate(pos.Ahead, snap.Stats, onLocal)
			notice := idx.notice(mem.seenSeq, pos.Score) &&
				!(pos.Tier > 0 && snap.Now.Sub(pos.Join) <= smoothing) // its own smoothing
			r.pushLocked(mem, u, notice, idx.maxSeq, now)
			mem.nextRank = now.Add(r.rankEvery(u))
		case EntryScheduled:
			mem.state, mem.entry, mem.granted = EntryWaiting, pos.Entry, false
			u := r.scheduledUpdate(snap.PreQueue, cfg, onLocal)
			r.pushLocked(mem, u, false, idx.maxSeq, now)
			// ranked again at the start, when the shuffle gives positions
			mem.nextRank = now.Add(pausedRankEvery)
			if start := u.StartsAt.Add(time.Second); start.After(now) && start.Before(mem.nextRank) {
				mem.nextRank = start
			}
		case EntryActive:
			mem.nextRank = now.Add(activeRankEvery)
			mem.expires, mem.entry = pos.Expires, pos.Entry
			if !mem.granted {
				mem.granted, mem.state = true, EntryActive
				mem.deliverAllLocked(r.grantedUpdate(mem.uid, pos.Expires))
			}
		default:
			if mem.granted {
				reason := EndDisconnect
				if !snap.Now.Before(mem.expires) {
					reason = EndExpired
				}
				r.endLocked(mem, reason)
				ended = append(ended, mem)
			} else {
				again = append(again, mem)
			}
		}
		mem.mu.Unlock()
	}
	for _, mem := range ended {
		r.forget(mem)
	}
	for _, mem := range again {
		r.rejoin(ctx, cfg, mem)
	}
}

// rankAll makes every local user due in the next snapshot (after a
// backend switch or a configuration change).
func (r *Room) rankAll() {
	r.mu.Lock()
	mems := make([]*member, 0, len(r.members))
	for _, mem := range r.members {
		mems = append(mems, mem)
	}
	r.mu.Unlock()
	r.snapNow.Store(true)
	for _, mem := range mems {
		mem.mu.Lock()
		mem.nextRank = time.Time{}
		mem.mu.Unlock()
	}
	r.wake()
}

// Rank refresh periods: users far back are re-ranked less often (their
// position moves little relative to its size), which bounds the snapshot
// cost per node; users near the front, every SnapshotEvery.
const (
	maxRankEvery    = 30 * time.Second
	pausedRankEvery = 10 * time.Second
	activeRankEvery = 5 * time.Second
)

// rankEvery is how soon a waiting user is re-ranked: ETA/30, between
// SnapshotEvery and maxRankEvery.
func (r *Room) rankEvery(u Update) time.Duration {
	if u.Status == StatusPaused {
		return pausedRankEvery
	}
	return min(max(u.ETA/30, r.m.cfg.SnapshotEvery), maxRankEvery)
}

// pushLocked sends u when it differs from the last frame, at most every
// PushEvery unless the status changed or a VIP notice is due.
func (r *Room) pushLocked(mem *member, u Update, notice bool, maxSeq int64, now time.Time) {
	last := mem.last
	changed := last.Kind != UpdateQueue || u.Position != last.Position || u.Total != last.Total ||
		u.Status != last.Status || u.ETA != last.ETA || u.Local != last.Local || !u.StartsAt.Equal(last.StartsAt)
	if !changed && !notice {
		return
	}
	urgent := notice || last.Kind != UpdateQueue || u.Status != last.Status || u.Local != last.Local
	if !urgent && now.Sub(mem.lastPush) < r.m.cfg.PushEvery {
		return
	}
	u.VIPAheadNotice = notice
	mem.deliverAllLocked(u)
	mem.last, mem.lastPush, mem.seenSeq = u, now, max(mem.seenSeq, maxSeq)
}

// rejoin re-enters a connected user whose entry went away (a disconnect
// raced with a new socket, a trim, a backend switch).
func (r *Room) rejoin(ctx context.Context, cfg *RoomConfig, mem *member) {
	mem.mu.Lock()
	level := mem.entry.Tier
	mem.mu.Unlock()
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	var res EnterResult
	var onLocal bool
	err := r.m.do(cctx, func(b Backend, local bool) error {
		var err error
		res, err = b.Enter(cctx, r.m.effective(cfg, local), EnterRequest{UID: mem.uid, Tier: level, Node: r.m.cfg.Node})
		onLocal = local
		return err
	})
	if err != nil {
		r.logErr("rejoin", err)
		return
	}
	r.mu.Lock()
	st := r.stats
	r.mu.Unlock()
	mem.mu.Lock()
	defer mem.mu.Unlock()
	if res.Status == EnterRejected {
		u := Update{Kind: UpdateRejected, Room: r.name, Reject: res.Reject, RetryAfter: res.RetryAfter}
		mem.deliverAllLocked(u)
		for _, t := range mem.tickets {
			t.closed.Store(true)
		}
		mem.tickets = nil
		r.mu.Lock()
		if r.members[mem.uid] == mem {
			delete(r.members, mem.uid)
		}
		r.mu.Unlock()
		return
	}
	r.applyEnterLocked(mem, res, st, onLocal, mem.tickets)
}

func (r *Room) checkAlert(st Stats) {
	level := 0
	ratio := 0.0
	if st.LMax > 0 {
		ratio = float64(st.Waiting) / float64(st.LMax)
	} else if st.Waiting > 0 {
		ratio = math.Inf(1)
	}
	switch {
	case ratio >= AlertCritical:
		level = 2
	case ratio >= AlertWarn:
		level = 1
	}
	m := r.m.met
	m.waiting.WithLabelValues(r.name).Set(float64(st.Waiting))
	m.active.WithLabelValues(r.name).Set(float64(st.Active))
	m.rate.WithLabelValues(r.name).Set(st.Rate)
	m.lmax.WithLabelValues(r.name).Set(float64(st.LMax))
	m.preQueue.WithLabelValues(r.name).Set(float64(st.PreQueue))
	m.owed.WithLabelValues(r.name).Set(float64(st.Owed))
	m.alert.WithLabelValues(r.name).Set(float64(level))
	if st.Rate > 0 {
		m.eta.WithLabelValues(r.name).Set(float64(st.Waiting) / st.Rate)
	} else {
		m.eta.WithLabelValues(r.name).Set(-1)
	}
	r.mu.Lock()
	old := r.alert
	r.alert = level
	r.mu.Unlock()
	if level == old {
		return
	}
	lv := slog.LevelInfo
	switch {
	case level == 2 && old < 2:
		lv = slog.LevelError
	case level == 1 && old < 1:
		lv = slog.LevelWarn
	}
	r.m.log.Log(context.Background(), lv, "room queue depth against L_max", "room", r.name,
		"waiting", st.Waiting, "l_max", st.LMax, "ratio", ratio, "alert", level, "previous", old)
}

func (r *Room) position(uid string) (Update, bool) {
	r.mu.Lock()
	mem := r.members[uid]
	r.mu.Unlock()
	if mem == nil {
		return Update{}, false
	}
	mem.mu.Lock()
	defer mem.mu.Unlock()
	if mem.granted {
		return Update{Kind: UpdateGranted, Room: r.name, ExpiresAt: mem.expires}, true
	}
	return mem.last, mem.last.Kind != 0
}

func (r *Room) status(ctx context.Context) (RoomStatus, error) {
	cfg := r.cfg.Load()
	lvl := r.m.Degradation()
	st := RoomStatus{Config: *cfg, Degradation: lvl, Local: lvl == DegradeLocal, At: time.Now()}
	if lvl == DegradeOverload {
		r.mu.Lock()
		st.Stats, st.At = r.stats, r.statsAt
		r.mu.Unlock()
	} else {
		var snap Snapshot
		err := r.m.do(ctx, func(b Backend, local bool) error {
			var err error
			snap, err = b.Snapshot(ctx, r.m.effective(cfg, local), nil, math.MaxInt64)
			return err
		})
		if err != nil {
			return RoomStatus{}, err
		}
		st.Stats = snap.Stats
	}
	r.mu.Lock()
	st.Alert, st.LocalUsers = r.alert, len(r.members)
	st.AdmittedByTier = r.waits.admitted
	for t := range st.WaitByTier {
		st.WaitByTier[t] = r.waits.summaryLocked(t, time.Now())
	}
	r.mu.Unlock()
	return st, nil
}

// drain marks this node's waiting users away at shutdown and forgets all
// local users.
func (r *Room) drain(ctx context.Context) {
	cfg := r.cfg.Load()
	r.mu.Lock()
	var uids []string
	for u, mem := range r.members {
		mem.mu.Lock()
		if mem.state == EntryWaiting {
			uids = append(uids, u)
		}
		mem.mu.Unlock()
	}
	for u := range r.pending { // closed tickets not yet disconnected
		if r.members[u] == nil {
			uids = append(uids, u)
		}
	}
	clear(r.members)
	clear(r.pending)
	r.mu.Unlock()
	for _, uid := range uids {
		err := r.m.do(ctx, func(b Backend, local bool) error {
			_, err := b.Disconnect(ctx, r.m.effective(cfg, local), uid, r.m.cfg.Node)
			return err
		})
		if err != nil {
			r.m.log.Warn("room drain: disconnect failed", "room", r.name, "uid", uid, "err", err)
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// closeAll rejects every local user (the room was deleted).
func (r *Room) closeAll() {
	r.mu.Lock()
	mems := make([]*member, 0, len(r.members))
	for _, mem := range r.members {
		mems = append(mems, mem)
	}
	clear(r.members)
	clear(r.pending)
	r.mu.Unlock()
	for _, mem := range mems {
		mem.mu.Lock()
		mem.deliverAllLocked(Update{Kind: UpdateRejected, Room: r.name, Reject: RejectRoomClosed})
		for _, t := range mem.tickets {
			t.closed.Store(true)
		}
		mem.tickets = nil
		mem.mu.Unlock()
	}
}

// seedLocal copies this node's users into the fallback, keeping join
// times. Called with Manager.modeMu write-held.
func (r *Room) seedLocal(ctx context.Context, fb Backend) int {
	cfg := r.m.effective(r.cfg.Load(), true)
	if err := fb.SaveConfig(ctx, *cfg); err != nil {
		r.m.log.Warn("local room config not saved", "room", r.name, "err", err)
	}
	r.mu.Lock()
	mems := make([]*member, 0, len(r.members))
	for _, mem := range r.members {
		mems = append(mems, mem)
	}
	r.mu.Unlock()
	now := time.Now()
	n := 0
	for _, mem := range mems {
		mem.mu.Lock()
		var req EnterRequest
		e := mem.entry
		switch {
		case mem.granted && mem.expires.After(now):
			req = EnterRequest{UID: mem.uid, Tier: e.Tier, Node: r.m.cfg.Node, Restore: &Restore{Join: e.Join,
				First: e.First, Bias: e.Bias, Active: true, Admitted: e.Admitted, Expires: mem.expires}}
		case mem.state == EntryWaiting && !e.Join.IsZero() && e.State != EntryScheduled: // the pre-queue enters anew
			req = EnterRequest{UID: mem.uid, Tier: e.Tier, Node: r.m.cfg.Node,
				Restore: &Restore{Join: e.Join, First: e.First, Bias: e.Bias}}
		}
		mem.mu.Unlock()
		if req.Restore == nil {
			continue
		}
		if _, err := fb.Enter(ctx, cfg, req); err != nil {
			r.m.log.Warn("local room seed failed", "room", r.name, "uid", mem.uid, "err", err)
			continue
		}
		n++
	}
	return n
}

// handBack moves this node's users from the fallback to the primary.
// Called with Manager.modeMu write-held.
func (r *Room) handBack(ctx context.Context, fb, primary Backend) (int, error) {
	cfg := r.cfg.Load()
	r.mu.Lock()
	uids := make([]string, 0, len(r.members))
	for u := range r.members {
		uids = append(uids, u)
	}
	r.mu.Unlock()
	if err := primary.SaveConfig(ctx, *cfg); err != nil {
		return 0, err
	}
	snap, err := fb.Snapshot(ctx, r.m.effective(cfg, true), uids, math.MaxInt64)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range snap.Positions {
		var rs *Restore
		switch p.State {
		case EntryWaiting:
			rs = &Restore{Join: p.Join, First: p.First, Bias: p.Bias}
		case EntryActive:
			rs = &Restore{Join: p.Join, First: p.First, Bias: p.Bias, Active: true, Admitted: p.Admitted, Expires: p.Expires}
		default:
			continue
		}
		if _, err := primary.Enter(ctx, cfg, EnterRequest{UID: p.UID, Tier: p.Tier, Node: r.m.cfg.Node, Restore: rs}); err != nil {
			return n, err
		}
		n++
	}
	r.reconcile.Store(r.m.cfg.Node != "") // closes the fallback saw are not on the primary
	return n, nil
}

// placeIndex answers "was a VIP placed ahead of score after placement
// seq seen?" in O(log n): suffix minima over new-VIP placements (open
// intervals [lo, +Inf)) plus the few smoothing-step intervals.
type placeIndex struct {
	infSeq    []int64
	infSufMin []float64
	fin       []Placement
	maxSeq    int64
}

func newPlaceIndex(ps []Placement) placeIndex {
	var p placeIndex
	for _, x := range ps {
		p.maxSeq = max(p.maxSeq, x.Seq)
		if math.IsInf(x.Hi, 1) {
			p.infSeq = append(p.infSeq, x.Seq)
			p.infSufMin = append(p.infSufMin, x.Lo)
		} else {
			p.fin = append(p.fin, x)
		}
	}
	for i := len(p.infSufMin) - 2; i >= 0; i-- {
		p.infSufMin[i] = math.Min(p.infSufMin[i], p.infSufMin[i+1])
	}
	return p
}

func (p *placeIndex) notice(seen int64, score float64) bool {
	if i := sort.Search(len(p.infSeq), func(i int) bool { return p.infSeq[i] > seen }); i < len(p.infSeq) &&
		p.infSufMin[i] < score {
		return true
	}
	i := sort.Search(len(p.fin), func(i int) bool { return p.fin[i].Seq > seen })
	for _, x := range p.fin[i:] {
		if x.Lo < score && score <= x.Hi {
			return true
		}
	}
	return false
}
