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
}

func newShard(e *Engine, id int) *shard {
	s := &shard{
		e:    e,
		id:   id,
		q:    make(chan *task, e.cfg.QueueCap),
		gidx: make(map[int64]int),
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
	for {
		var t *task
		select {
		case t = <-s.q:
		case <-s.e.stop:
			s.drain()
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
			g := &s.groups[i]
			s.conns = s.e.pres.AppendConns(s.conns[:0], g.gid)
			if len(s.conns) > 0 {
				s.e.push.Push(g.gid, g.msgs, s.conns)
				m.deliveries(len(s.conns) * len(g.msgs))
			}
			clear(s.conns)
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
