package gateway

import (
	"context"
	"sync"
	"time"
)

// pool runs the blocking work of connections (store and Redis calls) off
// the event loops, on a fixed number of goroutines behind a bounded queue.
type pool struct {
	work    chan func(context.Context)
	workers int
	timeout time.Duration
}

func newPool(workers, queue int, timeout time.Duration) *pool {
	return &pool{work: make(chan func(context.Context), queue), workers: workers, timeout: timeout}
}

// submit queues fn; false when the queue is full.
func (p *pool) submit(fn func(context.Context)) bool {
	select {
	case p.work <- fn:
		return true
	default:
		return false
	}
}

// run runs the workers until ctx is done; each call gets a context bounded
// by the pool's timeout.
func (p *pool) run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range p.workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case fn := <-p.work:
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
