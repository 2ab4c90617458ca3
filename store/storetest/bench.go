package storetest

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// Load is a closed-loop append workload for BenchAppend: each sender sends
// one message, waits for its result, and sends the next, into a random
// group of its own.
type Load struct {
	Senders []string  // uids, one closed loop each
	Groups  [][]int64 // Groups[i]: the gids Senders[i] may send to
	Body    []byte    // message body (JSON)
	// Batched sends through a stand-in for the engine's shard workers:
	// Workers goroutines route by gid and commit all pending sends (up to
	// 1024) as one Append, lingering up to Linger for more. Without it,
	// every send is its own Append (the naive baseline).
	Batched bool
	Workers int
	Linger  time.Duration
}

// BenchBody is the body of benchmark messages: about a hundred bytes, a
// typical chat message.
const BenchBody = `{"text":"hello everyone, this is a fairly typical chat message of around a hundred bytes"}`

var cidSeq atomic.Int64

// NextClientMsgID returns a client_msg_id unique in this process, for
// benchmarks that append many messages.
func NextClientMsgID() string { return strconv.FormatInt(cidSeq.Add(1), 36) }

// CPUTime is the process's user+system CPU time so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchAppend runs l against s and reports msgs/s, the CPU microseconds
// per message and, batched, the messages per commit. Every backend's
// append benchmark is this one, so their figures compare.
func BenchAppend(b *testing.B, s store.Store, l Load) {
	var bb *batcher
	if l.Batched {
		bb = newBatcher(s, max(l.Workers, 1), 1024, l.Linger)
		defer bb.close()
	}
	senders := len(l.Senders)
	var next, failed atomic.Int64
	b.ReportAllocs()
	b.SetParallelism((senders + 1) / 2) // x GOMAXPROCS(2) = senders goroutines
	cpu0 := CPUTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1)-1) % senders
		rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
		x := &pending{done: make(chan struct{}, 1)}
		one := make([]store.AppendResult, 1)
		for pb.Next() {
			gids := l.Groups[i]
			x.req = store.AppendRequest{GID: gids[rng.IntN(len(gids))], Sender: l.Senders[i],
				ClientMsgID: NextClientMsgID(), Body: l.Body}
			if bb != nil {
				bb.send(x)
			} else {
				x.err = s.Append(context.Background(), []store.AppendRequest{x.req}, one)
				x.res = one[0]
			}
			if x.err != nil || x.res.Err != nil || x.res.Seq == 0 {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d sends failed", n)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64((CPUTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/msg")
	if bb != nil && bb.batches.Load() > 0 {
		b.ReportMetric(float64(bb.msgs.Load())/float64(bb.batches.Load()), "msgs/batch")
	}
}

// pending is one send of a closed-loop sender, reused.
type pending struct {
	req  store.AppendRequest
	res  store.AppendResult
	err  error
	done chan struct{}
}

// batcher routes sends by gid to workers; each worker commits all pending
// sends (up to maxBatch) as one Append, lingering up to linger for more
// when fewer are pending.
type batcher struct {
	s        store.Store
	queues   []chan *pending
	maxBatch int
	linger   time.Duration
	wg       sync.WaitGroup
	batches  atomic.Int64
	msgs     atomic.Int64
}

func newBatcher(s store.Store, workers, maxBatch int, linger time.Duration) *batcher {
	bb := &batcher{s: s, maxBatch: maxBatch, linger: linger}
	for range workers {
		q := make(chan *pending, 4*maxBatch)
		bb.queues = append(bb.queues, q)
		bb.wg.Go(func() { bb.work(q) })
	}
	return bb
}

func (bb *batcher) send(x *pending) {
	bb.queues[uint64(x.req.GID)%uint64(len(bb.queues))] <- x
	<-x.done
}

func (bb *batcher) close() {
	for _, q := range bb.queues {
		close(q)
	}
	bb.wg.Wait()
}

func (bb *batcher) work(q chan *pending) {
	ctx := context.Background()
	var (
		batch []*pending
		reqs  []store.AppendRequest
		res   []store.AppendResult
	)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		first, ok := <-q
		if !ok {
			return
		}
		batch = append(batch[:0], first)
		lingering := false
	collect:
		for len(batch) < bb.maxBatch {
			select {
			case x, ok := <-q:
				if !ok {
					break collect
				}
				batch = append(batch, x)
				continue
			default:
			}
			if bb.linger <= 0 {
				break
			}
			if !lingering {
				lingering = true
				timer.Reset(bb.linger)
			}
			select {
			case x, ok := <-q:
				if !ok {
					break collect
				}
				batch = append(batch, x)
			case <-timer.C:
				lingering = false
				break collect
			}
		}
		if lingering {
			timer.Stop()
		}
		reqs = reqs[:0]
		for _, x := range batch {
			reqs = append(reqs, x.req)
		}
		res = slices.Grow(res[:0], len(reqs))[:len(reqs)]
		err := bb.s.Append(ctx, reqs, res)
		bb.batches.Add(1)
		bb.msgs.Add(int64(len(batch)))
		for i, x := range batch {
			x.res, x.err = res[i], err
			x.done <- struct{}{}
		}
	}
}
