package redislimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/local"
)

// batchEnv is a batching limiter on a throwaway Redis that the test can
// freeze (SIGSTOP) to hold a batch in flight while others queue.
type batchEnv struct {
	p     *redistest.Server
	c     *redis.Client
	l     *Limiter
	mu    sync.Mutex
	sizes []int
}

func newBatchEnv(t *testing.T, max, inflight int, lim limiter.Limits, timeout time.Duration) *batchEnv {
	t.Helper()
	e := &batchEnv{p: redistest.Start(t, portSingle)}
	e.c = redis.NewClient(&redis.Options{Addr: e.p.Addr(), DialTimeout: timeout,
		ReadTimeout: timeout, WriteTimeout: timeout, MaxRetries: -1, PoolSize: 16})
	t.Cleanup(func() { e.c.Close() })
	l, err := New(Config{Client: e.c, Batch: true, MaxBatch: max, MaxInflight: inflight, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.batch.observe = func(n int) {
		e.mu.Lock()
		e.sizes = append(e.sizes, n)
		e.mu.Unlock()
	}
	e.l = l
	return e
}

func (e *batchEnv) batches() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.sizes)
}

// waitQueued waits until n requests wait in the batcher's queue.
func (e *batchEnv) waitQueued(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.l.batch.mu.Lock()
		q := len(e.l.batch.queue)
		e.l.batch.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitBatches waits until n batches were sent.
func (e *batchEnv) waitBatches(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(e.batches()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("batches %v, want %d", e.batches(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

type result struct {
	d   limiter.Decision
	err error
}

// TestBatchFull: a lone call goes out at once as a batch of one; callers
// arriving while it is in flight queue and go out max at a time, in arrival
// order, each decided as if alone: of 10 requests on a limit of 5, the
// first five queued are admitted, and a request whose second check denies
// consumes nothing in its first.
func TestBatchFull(t *testing.T) {
	ctx := context.Background()
	e := newBatchEnv(t, 4, 1, rules(map[string]limiter.Rule{"sw": slide(5, time.Hour), "one": slide(1, time.Hour)}), 5*time.Second)
	if _, err := e.l.Allow(ctx, limiter.Check{Rule: "sw", Key: "idle"}); err != nil {
		t.Fatal(err)
	}
	if got := e.batches(); !slices.Equal(got, []int{1}) {
		t.Fatalf("idle call: batches %v, want [1]", got)
	}

	e.p.Pause()
	first := make(chan result, 1)
	go func() {
		d, err := e.l.Allow(ctx, limiter.Check{Rule: "one", Key: "x"})
		first <- result{d, err}
	}()
	e.waitBatches(t, 2) // the leader's batch of one is in flight, held
	res := make([]chan result, 10)
	for i := range res {
		res[i] = make(chan result, 1)
		go func() {
			// every request also checks "one" on a key of its own, except
			// request 9, which shares x with the leader and must be denied
			// there without leaving a unit in "sw"
			key := fmt.Sprint("k", i)
			if i == 9 {
				key = "x"
			}
			d, err := e.l.Allow(ctx, limiter.Check{Rule: "sw", Key: "hot"}, limiter.Check{Rule: "one", Key: key})
			res[i] <- result{d, err}
		}()
		e.waitQueued(t, i+1) // arrival order is queue order
	}
	e.p.Resume()
	if r := <-first; r.err != nil || !r.d.Allowed {
		t.Fatalf("leader: %+v %v", r.d, r.err)
	}
	for i, ch := range res {
		r := <-ch
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		switch {
		case i < 5 && !r.d.Allowed:
			t.Errorf("request %d denied (%v), want admitted: the first five fit", i, r.d.Reason)
		case i >= 5 && i < 9 && (r.d.Allowed || r.d.Index != 0):
			t.Errorf("request %d: %+v, want denied by sw (full)", i, r.d)
		case i == 9 && (r.d.Allowed || r.d.Index != 0 && r.d.Index != 1):
			t.Errorf("request 9: %+v, want denied", r.d)
		}
	}
	if got := e.batches(); !slices.Equal(got, []int{1, 1, 4, 4, 2}) {
		t.Errorf("batches %v, want [1 1 4 4 2] (idle, leader, then at most 4 each)", got)
	}
	if n := e.c.ZCard(ctx, "fanfare:lim:{k:hot}:sw:s:0").Val(); n != 5 {
		t.Errorf("sw holds %d units, want 5", n)
	}
}

// TestBatchAllOrNothing: within one batch a request denied by a later
// check leaves nothing in the earlier ones, so a later request of the same
// batch still gets the unit.
func TestBatchAllOrNothing(t *testing.T) {
	ctx := context.Background()
	e := newBatchEnv(t, 8, 1, rules(map[string]limiter.Rule{"a": slide(1, time.Hour), "b": slide(1, time.Hour)}), 5*time.Second)
	if d, _ := e.l.Allow(ctx, limiter.Check{Rule: "b", Key: "full"}); !d.Allowed {
		t.Fatal("setup denied")
	}
	e.p.Pause()
	lead := make(chan result, 1)
	go func() {
		d, err := e.l.Allow(ctx, limiter.Check{Rule: "b", Key: "lead"})
		lead <- result{d, err}
	}()
	e.waitBatches(t, 2)
	var res [2]chan result
	checks := [2][]limiter.Check{
		{{Rule: "a", Key: "u"}, {Rule: "b", Key: "full"}}, // denied by b
		{{Rule: "a", Key: "u"}, {Rule: "b", Key: "free"}}, // gets a's only unit
	}
	for i := range res {
		res[i] = make(chan result, 1)
		go func() {
			d, err := e.l.Allow(ctx, checks[i]...)
			res[i] <- result{d, err}
		}()
		e.waitQueued(t, i+1)
	}
	e.p.Resume()
	<-lead
	r0, r1 := <-res[0], <-res[1]
	if r0.err != nil || r0.d.Allowed || r0.d.Index != 1 {
		t.Errorf("request 0: %+v %v, want denied by check 1", r0.d, r0.err)
	}
	if r1.err != nil || !r1.d.Allowed {
		t.Errorf("request 1: %+v %v, want admitted (request 0 took nothing)", r1.d, r1.err)
	}
	if got := e.batches(); !slices.Equal(got, []int{1, 1, 2}) {
		t.Errorf("batches %v, want [1 1 2]", got)
	}
}

// TestBatchCancelWaiter: a queued caller whose context ends returns at once
// with an error wrapping its context's, leaves the queue and is never
// charged; the others are decided as usual.
func TestBatchCancelWaiter(t *testing.T) {
	ctx := context.Background()
	e := newBatchEnv(t, 8, 1, rules(map[string]limiter.Rule{"sw": slide(5, time.Hour)}), 5*time.Second)
	e.p.Pause()
	lead := make(chan result, 1)
	go func() {
		d, err := e.l.Allow(ctx, limiter.Check{Rule: "sw", Key: "lead"})
		lead <- result{d, err}
	}()
	e.waitBatches(t, 1)
	cctx, cancel := context.WithCancel(ctx)
	res := make([]chan result, 3)
	for i := range res {
		res[i] = make(chan result, 1)
		c := ctx
		if i == 1 {
			c = cctx
		}
		go func() {
			d, err := e.l.Allow(c, limiter.Check{Rule: "sw", Key: fmt.Sprint("k", i)})
			res[i] <- result{d, err}
		}()
		e.waitQueued(t, i+1)
	}
	cancel()
	select {
	case r := <-res[1]:
		if !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, limiter.ErrUnavailable) {
			t.Errorf("cancelled waiter: %v, want context.Canceled (and ErrUnavailable)", r.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("cancelled waiter still waiting while Redis is frozen")
	}
	e.waitQueued(t, 2)
	e.p.Resume()
	<-lead
	for _, i := range []int{0, 2} {
		if r := <-res[i]; r.err != nil || !r.d.Allowed {
			t.Errorf("waiter %d: %+v %v", i, r.d, r.err)
		}
	}
	if got := e.batches(); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("batches %v, want [1 2] (the cancelled request not sent)", got)
	}
	if n := e.c.Exists(ctx, "fanfare:lim:{k:k1}:sw:s:0").Val(); n != 0 {
		t.Error("the cancelled request was charged")
	}
}

// TestBatchRedisDownFailsOverEveryWaiter: Redis freezes with a batch in
// flight and callers queued, then dies. The batch's error reaches every
// request it carried, the queued ones fail in turn, and limiter.Failover
// decides every call on the in-process fallback: no caller sees an error or
// hangs.
func TestBatchRedisDownFailsOverEveryWaiter(t *testing.T) {
	ctx := context.Background()
	e := newBatchEnv(t, 4, 1, rules(map[string]limiter.Rule{"sw": slide(100, time.Hour)}), 200*time.Millisecond)
	fb, err := local.New(local.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := limiter.NewFailover(e.l, fb, limiter.FailoverConfig{Nodes: 2, ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	e.p.Pause()
	const callers = 10
	res := make(chan result, callers)
	go func() {
		d, err := f.Allow(ctx, limiter.Check{Rule: "sw", Key: "hot"})
		res <- result{d, err}
	}()
	e.waitBatches(t, 1)
	for i := 1; i < callers; i++ {
		go func() {
			d, err := f.Allow(ctx, limiter.Check{Rule: "sw", Key: "hot"})
			res <- result{d, err}
		}()
		e.waitQueued(t, i)
	}
	e.p.Stop() // killed while frozen: the batch in flight never gets a reply
	for range callers {
		select {
		case r := <-res:
			if r.err != nil || !r.d.Allowed {
				t.Errorf("call: %+v %v, want admitted by the fallback", r.d, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a caller hangs with Redis down")
		}
	}
	if !f.Fallback() {
		t.Error("not on the fallback")
	}
	// The fallback holds exactly the calls: its share of 100 is 50.
	n := 0
	for range 60 {
		if d, err := f.Allow(ctx, limiter.Check{Rule: "sw", Key: "hot"}); err == nil && d.Allowed {
			n++
		}
	}
	if n != 50-callers {
		t.Errorf("fallback admitted %d more, want %d: every call was decided there once", n, 50-callers)
	}
}
