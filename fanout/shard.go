package fanout

import (
	"cmp"
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/store"
)

type taskKind uint8

const (
	taskSend   taskKind = iota
	taskFunc            // membership change: runs between batches
	taskMove            // marker: hand the group over to another pool
	taskRemote          // a batch another node committed, to push here
)

// task is one unit of work on a shard. Tasks are pooled; a task is released
// when it is answered (sends), run (funcs) or handed off (moves), not when
// its batch ends: a send may wait in its group's rate-limit buffer or be
// parked while its group moves between pools.
type task struct {
	kind   taskKind
	send   SendRequest
	gid    int64 // taskFunc, taskMove
	fn     func(context.Context) error
	fnDone chan error
	to     *shard     // taskMove: the new worker
	toHot  bool       // taskMove: the group becomes hot
	remote *bus.Batch // taskRemote
	atAll  bool       // counted against the group's @all quota
	shared bool       // atAll: counted in Config.AtAllQuota, not on the group
	atDay  int64      // atAll: the UTC day charged
	enq    time.Time
}

func (t *task) reset() { *t = task{} }

func (t *task) groupID() int64 {
	if t.kind == taskSend {
		return t.send.GID
	}
	return t.gid
}

var taskPool = sync.Pool{New: func() any { return new(task) }}

func releaseTask(t *task) {
	t.reset()
	taskPool.Put(t)
}

// groupMsgs collects one group's committed messages of a batch.
type groupMsgs struct {
	gid     int64
	version int64 // membership version of the last message stored
	msgs    []store.Message
}

// mail is a message to a worker from another goroutine: gs nil = park the
// tasks of gid until its state arrives (a move into this worker began);
// gs set = the group's state, handed over by its previous worker.
type mail struct {
	gid int64
	gs  *gstate
}

// shard is one worker and its bounded queue.
type shard struct {
	e   *Engine
	id  int
	hot bool // in the hot pool
	q   chan *task
	// bound is the soft queue bound from Little's Law (tasks).
	bound    atomic.Int64
	inflight atomic.Int64 // senders between the closing check and enqueue
	held     atomic.Int64 // tasks parked for groups moving in (count against bound)

	mailMu sync.Mutex
	mail   []mail
	wake   chan struct{}

	// Commit statistics read (and reset) by the controller.
	commitNanos atomic.Int64
	commitCount atomic.Int64
	commitFails atomic.Int64 // commits failed with the store unavailable
	commitOKs   atomic.Int64

	// Worker-owned state and scratch, reused across batches.
	tn        *Tuning // the engine's tuning, loaded once per batch or tick
	batch     []*task
	ready     []*task // admitted sends awaiting commit, in order
	reqs      []store.AppendRequest
	res       []store.AppendResult
	groups    []groupMsgs
	gidx      map[int64]int
	conns     []Conn
	rel       []joiner // pushJoiners' recent joiners of one push
	rate      float64  // EWMA of messages per busy second
	push      Push
	mailbox   []mail
	gs        map[int64]*gstate
	gated     map[int64][]*task // groups moving in: their parked tasks
	open      []*gstate         // groups with an open merge window
	paced     []*gstate         // groups with buffered sends
	t2dirty   []*gstate         // groups with commits not yet handed to tier 2
	lastFlush time.Time         // wall clock of the last window flush
	lastSweep time.Time         // engine clock of the last evaluation sweep
}

func newShard(e *Engine, id int, hot bool) *shard {
	qcap := e.cfg.QueueCap
	if hot {
		qcap = e.cfg.HotQueueCap
	}
	s := &shard{
		e:     e,
		id:    id,
		hot:   hot,
		q:     make(chan *task, qcap),
		wake:  make(chan struct{}, 1),
		gidx:  make(map[int64]int),
		gs:    make(map[int64]*gstate),
		gated: make(map[int64][]*task),
	}
	s.tn = e.tune.Load()
	s.bound.Store(int64(min(s.tn.QueueMinBound, qcap)))
	return s
}

func (s *shard) pool() string {
	if s.hot {
		return "hot"
	}
	return "normal"
}

func (s *shard) overloaded() error {
	// Called by senders: the tuning is loaded here, not s.tn (worker-owned).
	return &RetryError{Err: ErrOverloaded, After: s.e.tune.Load().QueueTargetWait}
}

// enqueue adds a send without blocking, or reports ErrOverloaded.
func (s *shard) enqueue(t *task) error {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	if s.e.closing.Load() {
		return &RetryError{Err: ErrClosed, After: time.Second}
	}
	if int64(len(s.q))+s.held.Load() >= s.bound.Load() {
		s.e.cfg.Metrics.overloaded()
		return s.overloaded()
	}
	select {
	case s.q <- t:
		return nil
	default:
		s.e.cfg.Metrics.overloaded()
		return s.overloaded()
	}
}

// tryEnqueueControl adds a membership task if the queue has room.
func (s *shard) tryEnqueueControl(t *task) (bool, error) {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	if s.e.closing.Load() {
		return false, &RetryError{Err: ErrClosed, After: time.Second}
	}
	select {
	case s.q <- t:
		return true, nil
	default:
		return false, nil
	}
}

// enqueueMove adds a move marker, waiting for room. It ignores closing: a
// move that published its route must reach the old worker, which drains
// until no move is under way.
func (s *shard) enqueueMove(t *task) {
	s.inflight.Add(1)
	s.q <- t
	s.inflight.Add(-1)
}

// post hands m to the worker and wakes it.
func (s *shard) post(m mail) {
	s.mailMu.Lock()
	s.mail = append(s.mail, m)
	s.mailMu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// tickEvery is the worker's tick: a quarter of the merge window, within
// 5..50 ms.
func tickEvery(window time.Duration) time.Duration {
	return max(min(window/4, 50*time.Millisecond), 5*time.Millisecond)
}

func (s *shard) run() {
	max := s.e.cfg.MaxBatch
	every := tickEvery(s.tn.MergeWindow)
	tick := time.NewTicker(every)
	defer tick.Stop()
	s.lastFlush = time.Now()
	for {
		select {
		case t := <-s.q:
			s.batch = append(s.batch[:0], t)
			s.fill(max)
			s.process(s.batch)
		case <-s.wake:
			s.process(nil)
		case <-tick.C:
			s.onTick()
			if d := tickEvery(s.tn.MergeWindow); d != every {
				// SetTuning changed the merge window.
				every = d
				tick.Reset(d)
			}
		case <-s.e.stop:
			s.drain()
			return
		}
	}
}

// onTick paces buffered sends, ends merge windows and evaluates triggers.
func (s *shard) onTick() {
	s.process(nil) // loads s.tn
	if time.Since(s.lastFlush) >= s.tn.MergeWindow {
		s.lastFlush = time.Now()
		s.flushWindows()
		s.noteTier2()
	}
	if now := s.e.now(); now.Sub(s.lastSweep) >= s.e.cfg.EvalInterval {
		s.lastSweep = now
		s.sweep(now)
	}
}

// fill takes what is queued, up to max tasks, waiting at most Linger.
func (s *shard) fill(max int) {
	var deadline <-chan time.Time
	if s.e.cfg.Linger > 0 {
		tm := time.NewTimer(s.e.cfg.Linger)
		defer tm.Stop()
		deadline = tm.C
	}
	for len(s.batch) < max {
		select {
		case t := <-s.q:
			s.batch = append(s.batch, t)
			continue
		default:
		}
		if deadline == nil {
			return
		}
		select {
		case t := <-s.q:
			s.batch = append(s.batch, t)
		case <-deadline:
			return
		}
	}
}

// drain processes everything still queued at shutdown, including tasks of
// senders that passed the closing check before it was set, moves under
// way and groups still moving in; then it commits the buffered sends
// without pacing, so every send is answered.
func (s *shard) drain() {
	for {
		s.batch = s.batch[:0]
		s.fill(s.e.cfg.MaxBatch)
		if len(s.batch) > 0 {
			s.process(s.batch)
			continue
		}
		s.process(nil)
		if s.inflight.Load() == 0 && s.e.moves.Load() == 0 && len(s.gated) == 0 && len(s.q) == 0 {
			break
		}
		runtime.Gosched()
		time.Sleep(100 * time.Microsecond)
	}
	for _, gs := range s.paced {
		for t := gs.queue.pop(); t != nil; t = gs.queue.pop() {
			s.ready = append(s.ready, t)
		}
		gs.paced = false
	}
	s.paced = s.paced[:0]
	s.commitReady()
	s.flushWindows()
	s.noteTier2()
}

// process handles mail, paces buffered sends, then runs batch in order.
func (s *shard) process(batch []*task) {
	s.tn = s.e.tune.Load()
	now := s.e.now()
	s.handleMail(now)
	s.pace(now)
	for i, t := range batch {
		batch[i] = nil
		gid := t.groupID()
		if parked, ok := s.gated[gid]; ok && t.kind != taskMove {
			s.gated[gid] = append(parked, t)
			s.held.Add(1)
			continue
		}
		switch t.kind {
		case taskSend:
			s.admit(t, now)
		case taskFunc:
			s.commitReady()
			s.runFunc(t)
		case taskMove:
			s.commitReady()
			s.handOff(t, now)
		case taskRemote:
			s.commitReady()
			s.pushRemote(t, now)
		}
	}
	s.commitReady()
}

// pushRemote pushes a batch another node committed to this node's online
// members, through the same levels and merge windows as a local commit
// (pushNow cuts it for recent joiners).
func (s *shard) pushRemote(t *task, now time.Time) {
	b := t.remote
	if !s.e.membersCurrent(b.GID, b.MemberVersion) {
		b.Msgs = b.Msgs[:0] // members unknown: pushed nothing (clients pull)
	}
	// Members here receive every node's commits: the downlink trigger
	// counts them all.
	s.group(b.GID, now).commits.add(now, s.bucketWidth(), len(b.Msgs))
	if len(b.Msgs) > 0 && s.e.pres != nil && s.e.push != nil {
		s.deliver(s.group(b.GID, now), b.Msgs)
	}
	b.Release()
	releaseTask(t)
}

// handleMail parks the tasks of groups moving in and installs the state of
// groups that arrived, then admits their parked tasks in order.
func (s *shard) handleMail(now time.Time) {
	s.mailMu.Lock()
	s.mailbox, s.mail = s.mail, s.mailbox[:0]
	s.mailMu.Unlock()
	for i, m := range s.mailbox {
		s.mailbox[i] = mail{}
		if m.gs == nil {
			if _, ok := s.gated[m.gid]; !ok {
				s.gated[m.gid] = nil
			}
			continue
		}
		gs := m.gs
		s.gs[gs.gid] = gs
		if gs.queue.len() > 0 {
			gs.paced = true
			s.paced = append(s.paced, gs)
		}
		parked := s.gated[gs.gid]
		delete(s.gated, gs.gid)
		s.held.Add(-int64(len(parked)))
		s.e.groupMoved(gs, now)
		s.evaluate(gs, now)
		for _, t := range parked {
			switch t.kind {
			case taskSend:
				s.admit(t, now)
			case taskFunc:
				s.commitReady()
				s.runFunc(t)
			case taskRemote:
				s.commitReady()
				s.pushRemote(t, now)
			}
		}
	}
}

// handOff ends this worker's service of a group: it pushes the group's open
// window, hands its pending tier-2 seq to the writer and its state (with
// buffered sends) to the new worker. Every task of the group queued here
// before the marker has been processed; none can follow it (the route was
// switched before the marker was queued).
func (s *shard) handOff(t *task, now time.Time) {
	gid := t.gid
	gs := s.gs[gid]
	if gs == nil {
		gs = s.newGroup(gid, now)
	}
	if gs.win.count > 0 {
		s.flushWindow(gs)
	}
	if gs.t2Dirty {
		s.e.t2.note(gid, gs.t2Seq)
		gs.t2Sent = gs.t2Seq
	}
	delete(s.gs, gid)
	s.open = removeGroup(s.open, gs)
	s.paced = removeGroup(s.paced, gs)
	s.t2dirty = removeGroup(s.t2dirty, gs)
	gs.open, gs.paced, gs.t2Dirty = false, false, false
	gs.hot, gs.moving = t.toHot, false
	if t.toHot {
		gs.hotSince = now
		gs.cool = hysteresis{on: true}
	} else {
		gs.marked = false
	}
	t.to.post(mail{gid: gid, gs: gs})
	releaseTask(t)
}

func removeGroup(list []*gstate, gs *gstate) []*gstate {
	for i, g := range list {
		if g == gs {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}

func (s *shard) newGroup(gid int64, now time.Time) *gstate {
	gs := &gstate{gid: gid, lastSeen: now, baseAt: now, hot: s.hot}
	if s.hot {
		gs.hotSince = now
		gs.cool = hysteresis{on: true}
	}
	if s.tn.LargeGroup > 1 {
		gs.meta = s.e.t2.meta(gid)
	}
	s.gs[gid] = gs
	return gs
}

func (s *shard) group(gid int64, now time.Time) *gstate {
	if gs := s.gs[gid]; gs != nil {
		return gs
	}
	return s.newGroup(gid, now)
}

// large reports whether group-level limits and triggers apply to gs.
func (s *shard) large(gs *gstate) bool {
	if s.tn.LargeGroup <= 1 {
		return true
	}
	if gs.meta == nil {
		// LargeGroup was raised from 1 by SetTuning: the group's member
		// count is read from now on (not large until it is known).
		gs.meta = s.e.t2.meta(gs.gid)
	}
	return gs.meta.members.Load() >= int64(s.tn.LargeGroup)
}

// limits returns gs's rate limit: rate per second, burst and buffer size;
// ok false when the group is not limited. With other nodes taking sends
// for the group (Config.HotSet), the rate is this node's part of it.
func (s *shard) limits(gs *gstate) (rate, burst float64, buffer int, ok bool) {
	cfg := s.tn
	switch {
	case gs.hot:
		rate, buffer = cfg.HotGroupRate, cfg.HotGroupBuffer
	case cfg.GroupRate > 0 && s.large(gs):
		rate, buffer = cfg.GroupRate, cfg.GroupBuffer
	default:
		return 0, 0, 0, false
	}
	rate = nodePart(rate, gs.offered, gs.remote)
	return rate, max(rate, 1), buffer, true
}

// nodePart is a node's part of a cluster-wide rate limit: the limit split
// in proportion to the rates offered on each node, so every send has the
// same chance wherever it arrives. A node gets at least 1/s (or the whole
// limit when that is lower): a node whose first sends arrive between two
// reads of the other nodes' rates is not shut out until the next read,
// and the cluster exceeds the limit by at most 1/s per node.
func nodePart(limit, local, remote float64) float64 {
	if remote <= 0 {
		return limit
	}
	return max(limit*local/(local+remote), min(limit, 1))
}

// bucketWidth is the span of one rate bucket.
func (s *shard) bucketWidth() time.Duration {
	return max(s.e.cfg.RateWindow/rateBuckets, time.Millisecond)
}

// admit applies the group's limits to one send: it goes to the commit list,
// waits in the group's buffer, or is refused with ErrRateLimited.
func (s *shard) admit(t *task, now time.Time) {
	cfg := s.tn
	gs := s.group(t.send.GID, now)
	if err := s.checkSender(gs, t, now); err != nil {
		s.refuseSender(t, err)
		return
	}
	gs.arrivals.add(now, s.bucketWidth(), 1)
	gs.lastSeen = now
	if t.send.Kind == store.KindAtAll && cfg.AtAllPerDay > 0 && !s.admitAtAll(gs, t, now) {
		return
	}
	if now.Sub(gs.lastEval) >= s.bucketWidth() {
		s.evaluate(gs, now)
	}
	rate, burst, buffer, limited := s.limits(gs)
	if !limited && gs.queue.len() == 0 {
		s.ready = append(s.ready, t)
		return
	}
	if gs.queue.len() == 0 && (!limited || gs.bucket.take(now, rate, burst)) {
		s.ready = append(s.ready, t)
		return
	}
	for gs.queue.len() >= buffer {
		// Keep the newest: the oldest buffered send is refused (several
		// when SetTuning shrank the buffer).
		old := gs.queue.pop()
		s.e.cfg.Metrics.limited("rejected")
		s.reject(gs, old, &RetryError{Err: ErrRateLimited, After: time.Duration(float64(buffer) / rate * float64(time.Second))})
	}
	s.e.cfg.Metrics.limited("buffered")
	gs.queue.push(t)
	if !gs.paced {
		gs.paced = true
		s.paced = append(s.paced, gs)
	}
}

// admitAtAll counts an @all send against its group's daily quota, or
// refuses it. A retry of a counted @all passes uncounted (the store answers
// it with its seq). With a shared quota the count is the cluster's (one
// round trip on this worker, bounded by atAllTimeout; @all is rare); while
// that fails, the node counts its own, and a send it counted then is still
// recognized as a retry once the shared quota answers again.
func (s *shard) admitAtAll(gs *gstate, t *task, now time.Time) bool {
	day := utcDay(now)
	if gs.atAllDay != day {
		gs.atAllDay, gs.atAllCount = day, 0
		clear(gs.atAllIDs)
		gs.atAllIDs = gs.atAllIDs[:0]
	}
	k := atAllKey(t)
	if ok, err := s.e.takeAtAll(t, day, s.tn.AtAllPerDay, now); err == nil {
		if !ok && !slices.Contains(gs.atAllIDs, k) {
			s.refuseAtAll(gs, t, now)
			return false
		}
		return true
	}
	if slices.Contains(gs.atAllIDs, k) {
		return true
	}
	if gs.atAllCount >= s.tn.AtAllPerDay {
		s.refuseAtAll(gs, t, now)
		return false
	}
	gs.atAllCount++
	gs.atAllIDs = append(gs.atAllIDs, k)
	t.atAll, t.atDay = true, day
	return true
}

// refuseAtAll refuses an @all over the quota until the next UTC day.
func (s *shard) refuseAtAll(gs *gstate, t *task, now time.Time) {
	next := time.Unix((utcDay(now)+1)*86400, 0)
	s.e.cfg.Metrics.limited("at_all")
	s.reject(gs, t, &RetryError{Err: ErrAtAllQuota, After: next.Sub(now)})
}

// reject answers a send that will not be stored.
func (s *shard) reject(gs *gstate, t *task, err error) {
	s.e.refundAtAll(gs, t)
	s.e.cfg.Metrics.sends(1, "rate_limited")
	t.send.Done(SendResult{Err: err})
	releaseTask(t)
}

// pace releases buffered sends as their groups' buckets allow.
func (s *shard) pace(now time.Time) {
	for i := 0; i < len(s.paced); {
		gs := s.paced[i]
		rate, burst, _, limited := s.limits(gs)
		for gs.queue.len() > 0 && (!limited || gs.bucket.take(now, rate, burst)) {
			s.ready = append(s.ready, gs.queue.pop())
		}
		if gs.queue.len() == 0 {
			gs.paced = false
			s.paced[i] = s.paced[len(s.paced)-1]
			s.paced[len(s.paced)-1] = nil
			s.paced = s.paced[:len(s.paced)-1]
			continue
		}
		i++
	}
}

func (s *shard) runFunc(t *task) {
	if gs := s.gs[t.gid]; gs != nil {
		// A membership change applies to what is committed after it: the
		// group's open window, committed before, is pushed first to the
		// members as they are, so a member added now gets none of it.
		if gs.win.count > 0 {
			s.flushWindow(gs)
		}
		clear(gs.senders) // checkSender asks the store again
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.e.cfg.CommitTimeout)
	err := t.fn(ctx)
	cancel()
	if t.fnDone != nil { // nil: nobody waits (a remote membership change)
		t.fnDone <- err
	} else if err != nil {
		s.e.cfg.Logger.Warn("remote membership change not applied", "gid", t.gid, "err", err)
	}
	releaseTask(t)
}

// commitReady commits the admitted sends in batches of at most MaxBatch.
func (s *shard) commitReady() {
	for len(s.ready) > 0 {
		n := min(len(s.ready), s.e.cfg.MaxBatch)
		s.commit(s.ready[:n])
		rest := copy(s.ready, s.ready[n:])
		clear(s.ready[rest:])
		s.ready = s.ready[:rest]
	}
}

// commit stores one run of sends in one transaction, acks them and pushes
// the new messages, grouped per group in seq order. It releases the tasks.
func (s *shard) commit(tasks []*task) {
	m := s.e.cfg.Metrics
	start := time.Now()
	s.reqs = s.reqs[:0]
	for _, t := range tasks {
		m.queueWait(start.Sub(t.enq))
		s.reqs = append(s.reqs, store.AppendRequest{
			GID:         t.send.GID,
			Sender:      t.send.UID,
			ClientMsgID: t.send.ClientMsgID,
			Kind:        t.send.Kind,
			Body:        t.send.Body,
		})
	}
	if cap(s.res) < len(tasks) {
		s.res = make([]store.AppendResult, len(tasks))
	}
	s.res = s.res[:len(tasks)]
	clear(s.res)

	ctx, cancel := context.WithTimeout(context.Background(), s.e.cfg.CommitTimeout)
	err := s.e.st.Append(ctx, s.reqs, s.res)
	cancel()
	end := time.Now()
	s.commitNanos.Add(int64(end.Sub(start)))
	s.commitCount.Add(1)
	now := s.e.now()
	if err != nil {
		if !errors.Is(err, store.ErrBadRequest) && !errors.Is(err, store.ErrTooLarge) {
			s.commitFails.Add(1)
			s.e.cfg.Logger.Warn("commit failed", "shard", s.id, "pool", s.pool(), "messages", len(tasks), "err", err)
			err = &RetryError{Err: errors.Join(ErrUnavailable, err), After: time.Second}
		}
		for _, t := range tasks {
			s.e.refundAtAll(s.gs[t.send.GID], t)
			t.send.Done(SendResult{Err: err})
			releaseTask(t)
		}
		m.sends(len(tasks), "failed")
		m.process(time.Since(start), len(tasks))
		return
	}
	s.commitOKs.Add(1)

	committed := 0
	for k, t := range tasks {
		r := s.res[k]
		if r.Err == nil {
			m.sendAcked(end.Sub(t.enq))
		}
		t.send.Done(SendResult{Seq: r.Seq, CreatedAt: r.CreatedAt, Duplicate: r.Duplicate, Err: r.Err})
		if r.Err != nil {
			gs := s.gs[t.send.GID]
			s.e.refundAtAll(gs, t) // not stored: not counted
			if gs != nil && gs.senders != nil && (errors.Is(r.Err, store.ErrNotMember) || errors.Is(r.Err, store.ErrMuted)) {
				s.noteSender(gs, t.send.UID, r.Err, now) // a cached answer went stale
			}
			continue
		}
		if r.Duplicate {
			// Stored before, on another UTC day: that day counted it,
			// so a charge taken today is given back. On the same day the
			// charge stays: it may be the only count the message has
			// (a retry on another node was admitted as already charged
			// and stored first).
			if t.atAll && utcDay(r.CreatedAt) != t.atDay {
				s.e.refundAtAll(s.gs[t.send.GID], t)
			}
			continue
		}
		committed++
		gi, ok := s.gidx[t.send.GID]
		if !ok {
			gi = len(s.groups)
			if gi < cap(s.groups) {
				s.groups = s.groups[:gi+1]
				s.groups[gi].gid, s.groups[gi].version = t.send.GID, 0
				s.groups[gi].msgs = s.groups[gi].msgs[:0]
			} else {
				s.groups = append(s.groups, groupMsgs{gid: t.send.GID})
			}
			s.gidx[t.send.GID] = gi
		}
		s.groups[gi].version = max(s.groups[gi].version, r.MemberVersion)
		s.groups[gi].msgs = append(s.groups[gi].msgs, store.Message{
			GID:         t.send.GID,
			Seq:         r.Seq,
			Sender:      t.send.UID,
			ClientMsgID: t.send.ClientMsgID,
			Kind:        s.reqs[k].Kind,
			Body:        t.send.Body,
			CreatedAt:   r.CreatedAt,
		})
	}
	m.sends(committed, "stored")
	m.sends(len(tasks)-committed, "rejected_or_duplicate")

	for i := range s.groups {
		g := &s.groups[i]
		gs := s.group(g.gid, now)
		gs.commits.add(now, s.bucketWidth(), len(g.msgs))
		for j := range g.msgs {
			// @all is for online members only: it does not move the
			// active members' conversation index.
			if g.msgs[j].Kind != store.KindAtAll && g.msgs[j].Seq > gs.t2Seq {
				gs.t2Seq = g.msgs[j].Seq
			}
		}
		if gs.t2Seq > gs.t2Sent && !gs.t2Dirty {
			gs.t2Dirty = true
			s.t2dirty = append(s.t2dirty, gs)
		}
		if s.e.pres != nil && s.e.push != nil && s.e.membersCurrent(g.gid, g.version) {
			s.deliver(gs, g.msgs)
		}
		if s.e.bus != nil {
			_ = s.e.bus.Publish(g.gid, g.version, g.msgs) // never blocks; a drop is counted and repaired by pull
		}
	}
	for i := range s.groups {
		clear(s.groups[i].msgs) // drop body references
	}
	s.groups = s.groups[:0]
	clear(s.gidx)
	for _, t := range tasks {
		releaseTask(t)
	}

	busy := time.Since(start)
	m.process(busy, len(tasks))
	s.observeRate(len(tasks), busy)
}

// pushLevel is the level that decides how gs is pushed: hot groups always
// go through merge windows.
func (s *shard) pushLevel(gs *gstate) Level {
	lv := s.e.levels.Effective(gs.gid)
	if gs.hot && lv < L1Merge {
		lv = L1Merge
	}
	return lv
}

// deliver pushes one group's newly committed messages as its level says:
// at once (L0), into the merge window (L1, L2), or not at all.
func (s *shard) deliver(gs *gstate, msgs []store.Message) {
	gid := gs.gid
	w := &gs.win
	switch lv := s.pushLevel(gs); {
	case lv == L0Normal:
		if w.count > 0 {
			s.flushWindow(gs) // keep order when a window is still open
		}
		s.pushNow(gid, PushMsgs, msgs, len(msgs), msgs[len(msgs)-1].Seq)
	case lv <= L2Summary:
		kind := PushBatch
		if lv == L2Summary {
			kind = PushSummary
		}
		if w.count > 0 && w.kind != kind {
			s.flushWindow(gs)
		}
		w.kind = kind
		for _, m := range msgs {
			if kind == PushSummary {
				if w.count == 0 {
					w.msgs = append(w.msgs[:0], m)
				}
			} else {
				if len(w.msgs) >= s.tn.MaxMerge {
					s.flushWindow(gs)
					w.kind = kind
				}
				w.msgs = append(w.msgs, m)
			}
			w.count++
			w.lastSeq = m.Seq
		}
		if !gs.open {
			gs.open = true
			s.open = append(s.open, gs)
		}
	default:
		// L3, L4: no pushes; clients were told by a degraded frame and
		// pull on demand. Drop what a window still held.
		resetWindow(w)
	}
}

func (s *shard) pushNow(gid int64, kind PushKind, msgs []store.Message, count int, lastSeq int64) {
	s.conns = s.e.pres.AppendConns(s.conns[:0], gid)
	if len(s.conns) > 0 {
		// Recent joiners are read after the recipients: a member among
		// them was added before its bit was set (joined, ConnectReady), so
		// no seq below its join_seq goes out, whatever the path (a window
		// still holding older commits, a late bus batch).
		if v, ok := s.e.joiners.Load(gid); ok {
			s.pushJoiners(v.(*joiners), gid, kind, msgs, count, lastSeq)
		} else {
			s.pushTo(gid, kind, msgs, count, lastSeq, s.conns)
		}
	}
	clear(s.conns)
}

// pushJoiners pushes to s.conns when gid has recent joiners: the
// connections of joiners whose join_seq is above some of msgs get the push
// cut at their join_seq (aboveFloor), every other connection gets it
// whole.
func (s *shard) pushJoiners(js *joiners, gid int64, kind PushKind, msgs []store.Message, count int, lastSeq int64) {
	low := int64(0)
	if len(msgs) > 0 {
		low = msgs[0].Seq
		if kind != PushSummary { // a window may mix several nodes' batches
			for i := range msgs {
				low = min(low, msgs[i].Seq)
			}
		}
	}
	s.rel = s.e.recent(s.rel[:0], gid, js, low, lastSeq, s.e.now().UnixNano())
	rel := s.rel
	if len(rel) == 0 {
		s.pushTo(gid, kind, msgs, count, lastSeq, s.conns)
		return
	}
	// Every other connection first, then the joiners' by join_seq: each
	// cut at a higher join_seq cuts the one before (cutBelow may compact
	// msgs in place).
	conns := s.conns
	k := 0
	for i, c := range conns {
		if joinSeqOf(rel, c.UID()) == 0 {
			conns[k], conns[i] = conns[i], conns[k]
			k++
		}
	}
	s.pushTo(gid, kind, msgs, count, lastSeq, conns[:k])
	tail := conns[k:]
	slices.SortFunc(tail, func(a, b Conn) int {
		return cmp.Compare(joinSeqOf(rel, a.UID()), joinSeqOf(rel, b.UID()))
	})
	for len(tail) > 0 {
		seq := joinSeqOf(rel, tail[0].UID())
		n := 1
		for n < len(tail) && joinSeqOf(rel, tail[n].UID()) == seq {
			n++
		}
		msgs, count, lastSeq = aboveFloor(kind, msgs, count, lastSeq, seq)
		if count == 0 {
			break // higher join_seqs cut everything too
		}
		s.pushTo(gid, kind, msgs, count, lastSeq, tail[:n])
		tail = tail[n:]
	}
	clear(rel)
}

// pushTo pushes to conns and counts it.
func (s *shard) pushTo(gid int64, kind PushKind, msgs []store.Message, count int, lastSeq int64, conns []Conn) {
	if len(conns) == 0 || count == 0 {
		return
	}
	s.push = Push{GID: gid, Kind: kind, Msgs: msgs, Count: count, LastSeq: lastSeq, Conns: conns}
	bytes := s.e.push.Push(&s.push)
	s.e.egress.Add(int64(bytes) * int64(len(conns)))
	s.push = Push{}
	frames := len(msgs)
	if kind != PushMsgs {
		frames = 1
	}
	s.e.cfg.Metrics.deliveries(len(conns)*count, frames*len(conns), bytes*len(conns))
}

// aboveFloor cuts a push to its messages at or above floor. A summary
// whose first message is below floor is dropped whole (count 0): it
// carries that message, and its count may include others below floor; the
// clients pull the gap.
func aboveFloor(kind PushKind, msgs []store.Message, count int, lastSeq, floor int64) ([]store.Message, int, int64) {
	if len(msgs) == 0 {
		return nil, 0, 0
	}
	if kind == PushSummary {
		if msgs[0].Seq < floor {
			return nil, 0, 0
		}
		return msgs, count, lastSeq
	}
	cut := cutBelow(msgs, floor)
	if len(cut) == len(msgs) {
		return msgs, count, lastSeq
	}
	lastSeq = 0
	for i := range cut {
		lastSeq = max(lastSeq, cut[i].Seq)
	}
	return cut, len(cut), lastSeq
}

// flushWindows ends the merge window of every group.
func (s *shard) flushWindows() {
	for i, gs := range s.open {
		if gs.win.count > 0 {
			s.flushWindow(gs)
		}
		gs.open = false
		s.open[i] = nil
	}
	s.open = s.open[:0]
}

func (s *shard) flushWindow(gs *gstate) {
	w := &gs.win
	if s.e.pres != nil && s.e.push != nil && w.count > 0 {
		if s.pushLevel(gs) < L3WriteOnly { // else dropped: the level rose during the window
			s.pushNow(gs.gid, w.kind, w.msgs, w.count, w.lastSeq)
		}
	}
	resetWindow(w)
}

func resetWindow(w *window) {
	clear(w.msgs) // drop body references
	w.msgs = w.msgs[:0]
	w.count, w.lastSeq = 0, 0
}

// noteTier2 hands each group's newest committed seq of this window to the
// tier-2 writer (one note per group per window).
func (s *shard) noteTier2() {
	for i, gs := range s.t2dirty {
		s.e.t2.note(gs.gid, gs.t2Seq)
		gs.t2Sent = gs.t2Seq
		gs.t2Dirty = false
		s.t2dirty[i] = nil
	}
	s.t2dirty = s.t2dirty[:0]
}

// observeRate updates the service-rate estimate and the Little's Law bound.
func (s *shard) observeRate(n int, busy time.Duration) {
	if busy <= 0 {
		busy = time.Microsecond
	}
	r := float64(n) / busy.Seconds()
	if s.rate == 0 {
		s.rate = r
	} else {
		s.rate = 0.8*s.rate + 0.2*r
	}
	cfg := s.tn
	qcap := cap(s.q)
	b := int64(s.rate * cfg.QueueTargetWait.Seconds() * cfg.QueueSafety)
	b = max(b, int64(min(cfg.QueueMinBound, qcap)))
	b = min(b, int64(qcap))
	s.bound.Store(b)
}
