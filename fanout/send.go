// This file holds the entry of a send: Engine.Send and SendWait route it
// to its group's worker (refused at once at L4, or past the queue's
// bound). The walk goes on in shard.go (the worker's queue and loop).

package fanout

import (
	"context"
	"time"
)

// Send enqueues req on its group's worker. It never blocks: when the queue
// is past its bound, req.Done gets ErrOverloaded (as a *RetryError) at once.
func (e *Engine) Send(req SendRequest) {
	if e.closing.Load() {
		req.Done(SendResult{Err: &RetryError{Err: ErrClosed, After: time.Second}})
		return
	}
	if e.levels.Effective(req.GID) >= L4Reject {
		e.cfg.Metrics.sends(1, "refused_l4")
		req.Done(SendResult{Err: &RetryError{Err: ErrUnavailable, After: 5 * time.Second}})
		return
	}
	t := taskPool.Get().(*task)
	t.kind = taskSend
	t.send = req
	t.enq = time.Now()
	e.routeMu.RLock()
	err := e.route(req.GID).enqueue(t)
	e.routeMu.RUnlock()
	if err != nil {
		t.reset()
		taskPool.Put(t)
		req.Done(SendResult{Err: err})
	}
}

// SendWait is Send for callers that can block (the HTTP API): it waits for
// the outcome or ctx.
func (e *Engine) SendWait(ctx context.Context, req SendRequest) SendResult {
	ch := make(chan SendResult, 1)
	req.Done = func(r SendResult) { ch <- r }
	e.Send(req)
	select {
	case r := <-ch:
		return r
	case <-ctx.Done():
		// The send may still commit; a retry with the same client id
		// returns its seq.
		return SendResult{Err: ctx.Err()}
	}
}
