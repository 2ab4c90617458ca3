// This file holds a shard worker: its tasks, its queue and Little's Law
// bound (enqueue, observeRate), its loop (run, fill, process, drain), the
// per-group state it owns (group) and the moves of groups between the
// pools (handOff, handleMail). process hands each send to admission.go
// (admit), other tasks to runFunc (members.go's changes) and to
// remote.go (pushRemote); the walk goes on in admission.go.

package fanout

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/fanout/hooks"
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
	gid    int64                                       // taskFunc, taskMove
	fn     func(ctx context.Context, seen int64) error // seen: the group's gstate.seenSeq here (0: none)
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
	origin  int64 // Unix ns of the oldest send's Engine.Send (Push.Origin)
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
	tn     *Tuning // the engine's tuning, loaded once per batch or tick
	batch  []*task
	ready  []*task // admitted sends awaiting commit, in order
	reqs   []store.AppendRequest
	res    []store.AppendResult
	groups []groupMsgs
	gidx   map[int64]int
	conns  []Conn
	// origin is Push.Origin for the pushes of the commit being delivered
	// (commit.go); 0 outside it.
	origin    int64
	rel       []joiner // pushJoiners' recent joiners of one push
	rate      float64  // EWMA of messages per busy second
	push      Push
	mailbox   []mail
	gs        map[int64]*gstate
	gated     map[int64][]*task // groups moving in: their parked tasks
	open      []*gstate         // groups with an open merge window
	paced     []*gstate         // groups with buffered sends
	t2dirty   []*gstate         // groups with commits not yet handed to tier 2
	hookCalls []hookCall        // moderate's calls of one batch (hooks.go)
	evs       []hooks.Event     // emitMessages' events of one batch
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

func (s *shard) runFunc(t *task) {
	var seen int64
	if gs := s.gs[t.gid]; gs != nil {
		seen = gs.seenSeq
		// A membership change applies to what is committed after it: the
		// group's open window, committed before, is pushed first to the
		// members as they are, so a member added now gets none of it.
		if gs.win.count > 0 {
			s.flushWindow(gs)
		}
		clear(gs.senders) // checkSender asks the store again
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.e.cfg.CommitTimeout)
	err := t.fn(ctx, seen)
	cancel()
	if t.fnDone != nil { // nil: nobody waits (a remote membership change)
		t.fnDone <- err
	} else if err != nil {
		s.e.cfg.Logger.Warn("remote membership change not applied", "gid", t.gid, "err", err)
	}
	releaseTask(t)
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
