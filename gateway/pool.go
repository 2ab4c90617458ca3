package gateway

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// pool runs the blocking work of connections (store and Redis calls) off
// the event loops, on a fixed number of goroutines, each with its own
// bounded queue: work submitted with the same key runs in order on one
// worker.
type pool struct {
	queues  []chan func(context.Context)
	next    atomic.Uint64
	timeout time.Duration
}

// newPool makes workers goroutines sharing queue slots in total.
func newPool(workers, queue int, timeout time.Duration) *pool {
	p := &pool{queues: make([]chan func(context.Context), workers), timeout: timeout}
	per := max(queue/workers, 1)
	for i := range p.queues {
		p.queues[i] = make(chan func(context.Context), per)
	}
	return p
}

// submit queues fn on any worker; false when its queue is full.
func (p *pool) submit(fn func(context.Context)) bool {
	return p.submitKey(p.next.Add(1), fn)
}

// submitKey queues fn on the worker of key, behind the earlier work of the
// same key; false when that worker's queue is full.
func (p *pool) submitKey(key uint64, fn func(context.Context)) bool {
	select {
	case p.queues[key%uint64(len(p.queues))] <- fn:
		return true
	default:
		return false
	}
}

// run runs the workers until ctx is done; each call gets a context bounded
// by the pool's timeout.
func (p *pool) run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, q := range p.queues {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case fn := <-q:
					rctx, cancel := context.WithTimeout(ctx, p.timeout)
					fn(rctx)
					cancel()
				}
			}
		})
	}
	wg.Wait()
	return nil
}
