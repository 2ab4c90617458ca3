package redislimit

import (
	"context"
	"sync"
)

// batcher coalesces concurrent Allow calls into shared pipelines without a
// goroutine of its own (group commit): a caller that finds fewer than
// inflight pipelines running becomes a leader and sends its request together
// with whatever is queued (up to max); callers arriving meanwhile queue. A
// finishing leader wakes the requests it carried and hands the rest of the
// queue to the oldest queued caller, which leads the next pipeline. No
// request waits for a timer, and an idle limiter adds no latency.
type batcher struct {
	l        *Limiter
	max      int
	inflight int

	mu      sync.Mutex
	queue   []*request
	running int // leaders with a pipeline in flight
}

func (b *batcher) do(ctx context.Context, r *request) {
	b.mu.Lock()
	if b.running < b.inflight {
		b.running++
		b.mu.Unlock()
		b.lead(ctx, r)
		return
	}
	r.done = make(chan struct{}, 1)
	b.queue = append(b.queue, r)
	b.mu.Unlock()
	<-r.done
	if r.lead {
		b.lead(ctx, r)
	}
}

// lead sends r and up to max-1 queued requests in one pipeline. The batch
// runs under r's values but not its cancellation: the others did not agree
// to it (the client's timeouts bound it).
func (b *batcher) lead(ctx context.Context, r *request) {
	batch := []*request{r}
	b.mu.Lock()
	n := min(len(b.queue), b.max-1)
	batch = append(batch, b.queue[:n]...)
	k := copy(b.queue, b.queue[n:])
	clear(b.queue[k:])
	b.queue = b.queue[:k]
	b.mu.Unlock()

	b.l.exec(context.WithoutCancel(ctx), batch)
	for _, x := range batch[1:] {
		x.done <- struct{}{}
	}

	b.mu.Lock()
	if len(b.queue) == 0 {
		b.running--
		b.mu.Unlock()
		return
	}
	next := b.queue[0]
	k = copy(b.queue, b.queue[1:])
	b.queue[k] = nil
	b.queue = b.queue[:k]
	b.mu.Unlock()
	next.lead = true
	next.done <- struct{}{}
}
