package postgres

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/fanfare-im/fanfare/store"
)

// Merging concurrent Append calls.
//
// Postgres spends most of an Append on per-statement work (parse/bind of
// six arrays, locking, the CTE pipeline, the commit record and its WAL
// flush), not per message. Several callers appending at once (the engine's
// shard workers, or many goroutines each appending one message) therefore
// share statements: at most Config.AppendStatements statements run at a
// time; a call arriving while they are all busy queues, and when one
// finishes, every queued call (up to Limits.MaxBatch requests in all) runs
// as the next statement, in one transaction. The queued call that leads
// the merged statement runs it on its own goroutine; the others sleep
// until their results are copied back.
//
// A merged statement is exactly one Append of the concatenated requests,
// so every invariant of the package comment holds for it: groups locked in
// ascending gid order, seqs dense per group in request order (the calls
// keep their arrival order, and each call its own order), a result only
// after COMMIT, and a (gid, sender, client_msg_id) repeated by two calls
// of one statement stored once, the later call answered with the earlier's
// seq as a duplicate. All calls of a statement share its error.
//
// Cancellation: a call whose ctx ends while it is queued leaves the queue
// and returns an error wrapping store.ErrUnavailable (nothing of it was
// sent). Once its statement runs it waits for it, so that Append never
// returns while the database may still read its requests; the statement
// is cancelled when the contexts of all its calls have ended.

// DefaultAppendStatements is the number of merged Append statements in
// flight when Config.AppendStatements is 0: one commits while the next
// one is parsed and executed.
const DefaultAppendStatements = 2

// appendCall is one Append call waiting for a merged statement.
type appendCall struct {
	ctx  context.Context
	reqs []store.AppendRequest
	res  []store.AppendResult
	err  error
	// ready receives nil when res and err are set, or the batch this call
	// must run (it leads the merged statement).
	ready chan *mergeBatch
}

var callPool = sync.Pool{New: func() any { return &appendCall{ready: make(chan *mergeBatch, 1)} }}

// merger queues Append calls while max statements are in flight.
type merger struct {
	max      int
	maxBatch int // requests per merged statement

	mu       sync.Mutex
	inFlight int
	queue    []*appendCall

	// statements and calls count merged statements and the calls they
	// carried (tests, benchmarks).
	statements, calls atomic.Int64
}

func newMerger(statements, maxBatch int) *merger {
	if statements == 0 {
		statements = DefaultAppendStatements
	}
	if statements < 0 {
		return nil
	}
	return &merger{max: statements, maxBatch: maxBatch}
}

// appendMerged is Append through the merger (sizes checked, reqs not empty).
func (s *Store) appendMerged(ctx context.Context, reqs []store.AppendRequest, res []store.AppendResult) error {
	m := s.merge
	m.mu.Lock()
	if m.inFlight < m.max && len(m.queue) == 0 {
		m.inFlight++
		m.mu.Unlock()
		m.statements.Add(1)
		m.calls.Add(1)
		err := s.appendOne(ctx, reqs, res)
		s.handOff()
		return err
	}
	c := callPool.Get().(*appendCall)
	c.ctx, c.reqs, c.res, c.err = ctx, reqs, res, nil
	m.queue = append(m.queue, c)
	m.mu.Unlock()
	defer func() {
		*c = appendCall{ready: c.ready}
		callPool.Put(c)
	}()

	var batch *mergeBatch
	select {
	case batch = <-c.ready:
	case <-ctx.Done():
		m.mu.Lock()
		if i := slices.Index(m.queue, c); i >= 0 {
			m.queue = slices.Delete(m.queue, i, i+1)
			m.mu.Unlock()
			return store.Unavailable(ctx.Err())
		}
		m.mu.Unlock()
		batch = <-c.ready // taken into a statement: wait for it
	}
	if batch == nil {
		return c.err
	}
	s.runMerged(batch)
	s.handOff()
	return c.err
}

// handOff ends a statement's turn: the queued calls become the next
// statement, led by the first of them, or the slot is freed.
func (s *Store) handOff() {
	m := s.merge
	m.mu.Lock()
	if len(m.queue) == 0 {
		m.inFlight--
		m.mu.Unlock()
		return
	}
	n, total := 0, 0
	for n < len(m.queue) && (n == 0 || total+len(m.queue[n].reqs) <= m.maxBatch) {
		total += len(m.queue[n].reqs)
		n++
	}
	mb := mergePool.Get().(*mergeBatch)
	mb.calls = append(mb.calls, m.queue[:n]...)
	rest := copy(m.queue, m.queue[n:])
	clear(m.queue[rest:])
	m.queue = m.queue[:rest]
	m.mu.Unlock()
	mb.calls[0].ready <- mb
}

// mergeBatch is a merged statement: its calls and their concatenated
// requests, reused.
type mergeBatch struct {
	calls []*appendCall
	reqs  []store.AppendRequest
	res   []store.AppendResult
	stops []func() bool
}

var mergePool = sync.Pool{New: func() any { return new(mergeBatch) }}

// runMerged runs ms as one Append and hands each call its results; the
// leader (the first call) gets its results without a wake-up.
func (s *Store) runMerged(ms *mergeBatch) {
	batch := ms.calls
	s.merge.statements.Add(1)
	s.merge.calls.Add(int64(len(batch)))
	for _, c := range batch {
		ms.reqs = append(ms.reqs, c.reqs...)
	}
	ms.res = slices.Grow(ms.res[:0], len(ms.reqs))[:len(ms.reqs)]

	// The statement ends early only when every call has given up on it.
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	var live atomic.Int32
	live.Store(int32(len(batch)))
	stops := ms.stops[:0]
	for _, c := range batch {
		if c.ctx.Done() == nil {
			continue // never ends, so live never reaches 0
		}
		stops = append(stops, context.AfterFunc(c.ctx, func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	err := s.appendOne(ctx, ms.reqs, ms.res)
	for _, stop := range stops {
		stop()
	}
	cancel()

	off := 0
	for i, c := range batch {
		n := len(c.reqs)
		copy(c.res, ms.res[off:off+n])
		off += n
		c.err = err
		if i > 0 {
			c.ready <- nil
		}
	}
	clear(ms.reqs) // drop references to callers' bodies
	clear(ms.res)
	clear(ms.calls)
	clear(stops)
	ms.reqs, ms.res, ms.calls, ms.stops = ms.reqs[:0], ms.res[:0], ms.calls[:0], stops[:0]
	if cap(ms.reqs) <= maxPooledScratch {
		mergePool.Put(ms)
	}
}
