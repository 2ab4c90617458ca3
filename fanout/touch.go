// This file holds the users' last-active times written for connects
// (Store.TouchUsers): a connect records its user's time in memory, and
// one goroutine writes the latest time of each user touched once per
// Config.TouchInterval, in one store call per touchChunk users.

package fanout

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// touchChunk bounds the users of one Store.TouchUsers call: a flush of
// many users is several short transactions, not one long one.
const touchChunk = 1000

// toucher coalesces the last-active writes of connects. A connect only
// records its user's time (touch: a map write under mu, never a store
// call); run writes them every interval, each user once with its latest
// time. Memory is bounded: at most max users wait, and at most max more
// are being written; a touch of a new user beyond the bound is dropped
// (counted) and asks for an early flush. A failed write is logged and
// counted, and its users wait for the next flush again (within the bound).
// After the final flush (close) a touch is written at once by its caller.
type toucher struct {
	write    func(ctx context.Context, ts []store.UserTouch) error // Store.TouchUsers
	interval time.Duration
	max      int
	timeout  time.Duration // bounds one write
	log      *slog.Logger
	met      *Metrics

	mu      sync.Mutex
	pending map[string]int64 // uid -> latest touch not yet written (unix ns)
	spare   map[string]int64 // the map the last flush wrote, cleared for reuse; nil while a flush runs
	closed  bool             // the final flush took pending: touches are written at once

	kick     chan struct{}     // cap 1: pending reached max
	buf      []store.UserTouch // flush's, reused
	lastFail atomic.Int64      // unix ns of the last failure logged
	// counts are the metrics' counts, for tests.
	counts struct{ written, failed, dropped atomic.Int64 }
}

func newToucher(write func(context.Context, []store.UserTouch) error, interval time.Duration, max int, timeout time.Duration, log *slog.Logger, met *Metrics) *toucher {
	return &toucher{write: write, interval: interval, max: max, timeout: timeout, log: log, met: met,
		pending: map[string]int64{}, spare: map[string]int64{}, kick: make(chan struct{}, 1)}
}

// touch records that uid was active at at. It never blocks on the store,
// except after close (shutdown), when it writes at once.
func (t *toucher) touch(uid string, at time.Time) {
	ns := at.UnixNano()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.writeAll([]store.UserTouch{{UID: uid, At: at}}, true, false)
		return
	}
	if cur, ok := t.pending[uid]; ok {
		if ns > cur {
			t.pending[uid] = ns
		}
		t.mu.Unlock()
		return
	}
	if len(t.pending) >= t.max {
		t.mu.Unlock()
		t.counts.dropped.Add(1)
		t.met.touches(0, 0, 1)
		return
	}
	t.pending[uid] = ns
	full := len(t.pending) >= t.max
	t.mu.Unlock()
	if full {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// run flushes every interval, and at once when the pending set is full,
// until stop; then it flushes a last time and closes.
func (t *toucher) run(stop <-chan struct{}) {
	tick := time.NewTicker(t.interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			t.flush(true)
			return
		case <-tick.C:
		case <-t.kick:
		}
		t.flush(false)
	}
}

// flush writes the pending touches; final also closes the toucher.
func (t *toucher) flush(final bool) {
	t.mu.Lock()
	batch := t.pending
	t.pending, t.spare = t.spare, nil // spare is set between flushes, which run on one goroutine
	t.closed = t.closed || final
	t.mu.Unlock()

	ts := t.buf[:0]
	for uid, ns := range batch {
		ts = append(ts, store.UserTouch{UID: uid, At: time.Unix(0, ns)})
	}
	// In uid order: a user's row is locked in one order by every node.
	slices.SortFunc(ts, func(a, b store.UserTouch) int { return strings.Compare(a.UID, b.UID) })
	failed := t.writeAll(ts, final, final)
	clear(batch)
	t.mu.Lock()
	t.spare = batch
	dropped := 0
	if !final {
		// Retried at the next flush, unless a later touch came meanwhile.
		for _, f := range failed {
			ns := f.At.UnixNano()
			if cur, ok := t.pending[f.UID]; ok {
				t.pending[f.UID] = max(cur, ns)
			} else if len(t.pending) < t.max {
				t.pending[f.UID] = ns
			} else {
				dropped++
			}
		}
	}
	t.mu.Unlock()
	if dropped > 0 {
		t.counts.dropped.Add(int64(dropped))
		t.met.touches(0, 0, dropped)
	}
	clear(ts)
	t.buf = ts[:0]
}

// writeAll writes ts in chunks and returns the touches whose write
// failed, counted and logged: at most every 10 s, but always when they
// are lost for good by the final flush (logLost); final touches are
// counted as dropped too, nothing retries them. After the first chunk
// that fails it writes no more: the rest is failed with it, so a store
// that does not answer holds a flush (and the final one, at shutdown)
// for one write timeout, not one per chunk.
func (t *toucher) writeAll(ts []store.UserTouch, final, logLost bool) []store.UserTouch {
	var failed []store.UserTouch
	var firstErr error
	for len(ts) > 0 {
		n := min(len(ts), touchChunk)
		if firstErr != nil {
			n = len(ts)
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
			firstErr = t.write(ctx, ts[:n])
			cancel()
			if firstErr == nil {
				t.counts.written.Add(int64(n))
				t.met.touches(n, 0, 0)
				ts = ts[n:]
				continue
			}
		}
		failed = append(failed, ts[:n]...)
		t.counts.failed.Add(int64(n))
		t.met.touches(0, n, 0)
		ts = ts[n:]
	}
	if firstErr == nil {
		return nil
	}
	if final {
		t.counts.dropped.Add(int64(len(failed)))
		t.met.touches(0, 0, len(failed))
	}
	if final && logLost {
		t.log.Warn("users' last-active write failed as the engine stopped: their last-active times are lost",
			"users", len(failed), "err", firstErr)
		return failed
	}
	now := time.Now().UnixNano()
	prev := t.lastFail.Load()
	if now-prev > int64(10*time.Second) && t.lastFail.CompareAndSwap(prev, now) {
		if final {
			t.log.Warn("users' last-active write failed after the engine stopped: lost", "users", len(failed), "err", firstErr)
		} else {
			t.log.Warn("users' last-active write failed: retried at the next flush", "users", len(failed), "err", firstErr)
		}
	}
	return failed
}

// pendingLen is the number of users waiting for a flush.
func (t *toucher) pendingLen() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}
