package fanout

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

type taskKind uint8

const (
	taskSend taskKind = iota
	taskFunc
)

// task is one unit of work on a shard: a send, or a function that must run
// between batches (membership changes). Tasks are pooled.
type task struct {
	kind   taskKind
	send   SendRequest
	fn     func(context.Context) error
	fnDone chan error
	enq    time.Time
}

func (t *task) reset() { *t = task{} }

var taskPool = sync.Pool{New: func() any { return new(task) }}

// groupMsgs collects one group's committed messages of a batch.
type groupMsgs struct {
	gid  int64
	msgs []store.Message
}

// shard is one worker and its bounded queue.
type shard struct {
	e  *Engine
	id int
	q  chan *task
	// bound is the soft queue bound from Little's Law (tasks).
	bound    atomic.Int64
	inflight atomic.Int64 // senders between the closing check and enqueue

	// Worker-owned scratch, reused across batches.
	batch  []*task
	reqs   []store.AppendRequest
	res    []store.AppendResult
	groups []groupMsgs
	gidx   map[int64]int
	conns  []Conn
	rate   float64 // EWMA of messages per busy second
	// windows holds L1/L2 messages per group until the merge window ends.
	windows map[int64]*window
	push    Push
}

// window is one group's pending messages in a merge window.
type window struct {
	msgs    []store.Message // L1: all (bounded by MaxMerge); L2: the first only
	count   int
	lastSeq int64
	kind    PushKind
}

func newShard(e *Engine, id int) *shard {
	s := &shard{
		e:       e,
		id:      id,
		q:       make(chan *task, e.cfg.QueueCap),
		gidx:    make(map[int64]int),
		windows: make(map[int64]*window),
	}
	s.bound.Store(int64(e.cfg.MinQueue))
	return s
}

func (s *shard) overloaded() error {
	return &RetryError{Err: ErrOverloaded, After: s.e.cfg.TargetWait}
}

// enqueue adds a send without blocking, or reports ErrOverloaded.
func (s *shard) enqueue(t *task) error {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	if s.e.closing.Load() {
		return &RetryError{Err: ErrClosed, After: time.Second}
	}
	if int64(len(s.q)) >= s.bound.Load() {
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

// enqueueControl adds a membership task, waiting for room (these are rare
// admin operations and must not be refused by the send bound).
func (s *shard) enqueueControl(ctx context.Context, t *task) error {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	if s.e.closing.Load() {
		return &RetryError{Err: ErrClosed, After: time.Second}
	}
	select {
	case s.q <- t:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *shard) run() {
	max := s.e.cfg.MaxBatch
	tick := time.NewTicker(s.e.cfg.MergeWindow)
	defer tick.Stop()
	for {
		var t *task
		select {
		case t = <-s.q:
		case <-tick.C:
			s.flushWindows()
			continue
		case <-s.e.stop:
			s.drain()
			s.flushWindows()
			return
		}
		s.batch = append(s.batch[:0], t)
		s.fill(max)
		s.process(s.batch)
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
// senders that passed the closing check before it was set.
func (s *shard) drain() {
	for s.inflight.Load() > 0 {
		runtime.Gosched()
	}
	for {
		s.batch = s.batch[:0]
		s.fill(s.e.cfg.MaxBatch)
		if len(s.batch) == 0 {
			return
		}
		s.process(s.batch)
	}
}

func (s *shard) process(batch []*task) {
	for i := 0; i < len(batch); {
		if batch[i].kind == taskFunc {
			s.runFunc(batch[i])
			i++
			continue
		}
		j := i + 1
		for j < len(batch) && batch[j].kind == taskSend {
			j++
		}
		s.commit(batch[i:j])
		i = j
	}
	for i := range batch {
		batch[i].reset()
		taskPool.Put(batch[i])
		batch[i] = nil
	}
}

func (s *shard) runFunc(t *task) {
	ctx, cancel := context.WithTimeout(context.Background(), s.e.cfg.CommitTimeout)
	err := t.fn(ctx)
	cancel()
	t.fnDone <- err
}

// commit stores one run of sends in one transaction, acks them and pushes
// the new messages, grouped per group in seq order.
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
	if err != nil {
		if !errors.Is(err, store.ErrBadRequest) && !errors.Is(err, store.ErrTooLarge) {
			s.e.cfg.Logger.Warn("commit failed", "shard", s.id, "messages", len(tasks), "err", err)
			err = &RetryError{Err: errors.Join(ErrUnavailable, err), After: time.Second}
		}
		for _, t := range tasks {
			t.send.Done(SendResult{Err: err})
		}
		m.sends(len(tasks), "failed")
		m.process(time.Since(start), len(tasks))
		return
	}

	committed := 0
	for k, t := range tasks {
		r := s.res[k]
		t.send.Done(SendResult{Seq: r.Seq, CreatedAt: r.CreatedAt, Duplicate: r.Duplicate, Err: r.Err})
		if r.Err != nil || r.Duplicate {
			continue
		}
		committed++
		gi, ok := s.gidx[t.send.GID]
		if !ok {
			gi = len(s.groups)
			if gi < cap(s.groups) {
				s.groups = s.groups[:gi+1]
				s.groups[gi].gid = t.send.GID
				s.groups[gi].msgs = s.groups[gi].msgs[:0]
			} else {
				s.groups = append(s.groups, groupMsgs{gid: t.send.GID})
			}
			s.gidx[t.send.GID] = gi
		}
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

	if s.e.pres != nil && s.e.push != nil {
		for i := range s.groups {
			s.deliver(s.groups[i].gid, s.groups[i].msgs)
		}
	}
	for i := range s.groups {
		clear(s.groups[i].msgs) // drop body references
	}
	s.groups = s.groups[:0]
	clear(s.gidx)

	busy := time.Since(start)
	m.process(busy, len(tasks))
	s.observeRate(len(tasks), busy)
}

// deliver pushes one group's newly committed messages as its effective
// level says: at once (L0), into the merge window (L1, L2), or not at all.
func (s *shard) deliver(gid int64, msgs []store.Message) {
	switch lv := s.e.levels.Effective(gid); {
	case lv == L0Normal:
		if w := s.windows[gid]; w != nil && w.count > 0 {
			s.flushWindow(gid, w) // keep order when a window is still open
		}
		s.pushNow(gid, PushMsgs, msgs, len(msgs), msgs[len(msgs)-1].Seq)
	case lv <= L2Summary:
		w := s.windows[gid]
		if w == nil {
			w = &window{}
			s.windows[gid] = w
		}
		kind := PushBatch
		if lv == L2Summary {
			kind = PushSummary
		}
		if w.count > 0 && w.kind != kind {
			s.flushWindow(gid, w)
		}
		w.kind = kind
		for _, m := range msgs {
			if kind == PushSummary {
				if w.count == 0 {
					w.msgs = append(w.msgs[:0], m)
				}
			} else {
				if len(w.msgs) >= s.e.cfg.MaxMerge {
					s.flushWindow(gid, w)
					w.kind = kind
				}
				w.msgs = append(w.msgs, m)
			}
			w.count++
			w.lastSeq = m.Seq
		}
	default:
		// L3, L4: no pushes; clients were told by a degraded frame and
		// pull on demand. Drop what a window still held.
		if w := s.windows[gid]; w != nil {
			s.resetWindow(w)
		}
	}
}

func (s *shard) pushNow(gid int64, kind PushKind, msgs []store.Message, count int, lastSeq int64) {
	s.conns = s.e.pres.AppendConns(s.conns[:0], gid)
	if len(s.conns) > 0 {
		s.push = Push{GID: gid, Kind: kind, Msgs: msgs, Count: count, LastSeq: lastSeq, Conns: s.conns}
		s.e.push.Push(&s.push)
		s.push = Push{}
		frames := len(msgs)
		if kind != PushMsgs {
			frames = 1
		}
		s.e.cfg.Metrics.deliveries(len(s.conns)*count, frames*len(s.conns))
	}
	clear(s.conns)
}

// flushWindows ends the merge window of every group.
func (s *shard) flushWindows() {
	for gid, w := range s.windows {
		if w.count > 0 {
			s.flushWindow(gid, w)
		} else {
			delete(s.windows, gid) // idle for a whole window
		}
	}
}

func (s *shard) flushWindow(gid int64, w *window) {
	if s.e.pres != nil && s.e.push != nil && w.count > 0 {
		switch lv := s.e.levels.Effective(gid); {
		case lv >= L3WriteOnly:
			// dropped: the level rose during the window
		default:
			s.pushNow(gid, w.kind, w.msgs, w.count, w.lastSeq)
		}
	}
	s.resetWindow(w)
}

func (s *shard) resetWindow(w *window) {
	clear(w.msgs) // drop body references
	w.msgs = w.msgs[:0]
	w.count, w.lastSeq = 0, 0
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
	cfg := &s.e.cfg
	b := int64(s.rate * cfg.TargetWait.Seconds() * cfg.Safety)
	b = max(b, int64(cfg.MinQueue))
	b = min(b, int64(cfg.QueueCap))
	s.bound.Store(b)
}
