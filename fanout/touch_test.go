package fanout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// touchRecorder is a Store.TouchUsers that records its calls; fail makes
// the next calls fail, block makes them wait for a receive on it.
type touchRecorder struct {
	mu    sync.Mutex
	calls [][]store.UserTouch
	fail  int
	block chan struct{}
}

func (r *touchRecorder) write(_ context.Context, ts []store.UserTouch) error {
	r.mu.Lock()
	r.calls = append(r.calls, slices.Clone(ts))
	block, fail := r.block, r.fail > 0
	if fail {
		r.fail--
	}
	r.mu.Unlock()
	if block != nil {
		<-block
	}
	if fail {
		return errors.New("store down")
	}
	return nil
}

func (r *touchRecorder) got() [][]store.UserTouch {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// startToucher runs a toucher in the test's bubble; stop ends run (the
// final flush) and waits for it.
func startToucher(t *testing.T, r *touchRecorder, max int, log *slog.Logger) (tc *toucher, stop func()) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tc = newToucher(r.write, time.Second, max, time.Second, log, nil)
	stopc, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tc.run(stopc)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(stopc)
			<-done
		})
	}
	t.Cleanup(stop)
	return tc, stop
}

func touchesString(calls [][]store.UserTouch, t0 time.Time) string {
	var b strings.Builder
	for _, c := range calls {
		b.WriteString("[")
		for i, ts := range c {
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%s@%v", ts.UID, ts.At.Sub(t0))
		}
		b.WriteString("]")
	}
	return b.String()
}

// TestToucherCoalesces: a burst of connects of one user makes one write,
// of its latest time, one interval after the first touch and not before;
// an interval without touches writes nothing; stopping writes what waits;
// after it a touch is written at once.
func TestToucherCoalesces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &touchRecorder{}
		tc, stop := startToucher(t, r, 100, nil)
		t0 := time.Now()
		for i := range 1000 {
			tc.touch("u", t0.Add(time.Duration(i)*time.Millisecond/2))
		}
		tc.touch("v", t0)
		tc.touch("u", t0) // older than u's latest: no effect
		synctest.Wait()
		if got := r.got(); len(got) != 0 {
			t.Fatalf("written before the interval: %s", touchesString(got, t0))
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got, want := touchesString(r.got(), t0), "[u@499.5ms v@0s]"; got != want {
			t.Fatalf("after one interval: got %s, want %s", got, want)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got := r.got(); len(got) != 1 {
			t.Fatalf("intervals without touches wrote: %s", touchesString(got, t0))
		}
		tc.touch("w", t0.Add(5*time.Second))
		stop()
		if got, want := touchesString(r.got(), t0), "[u@499.5ms v@0s][w@5s]"; got != want {
			t.Fatalf("after stop: got %s, want %s (the final flush)", got, want)
		}
		tc.touch("x", t0.Add(6*time.Second))
		if got, want := touchesString(r.got(), t0), "[u@499.5ms v@0s][w@5s][x@6s]"; got != want {
			t.Fatalf("a touch after stop: got %s, want %s (written at once)", got, want)
		}
		if n := tc.counts.written.Load(); n != 4 {
			t.Errorf("written %d, want 4", n)
		}
	})
}

// TestToucherBound: at most max users wait while a write runs; a touch of
// another user is dropped and counted, one of a waiting user still
// updates it; reaching the bound starts a write at once.
func TestToucherBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &touchRecorder{block: make(chan struct{})}
		tc, _ := startToucher(t, r, 4, nil)
		t0 := time.Now()
		for _, uid := range []string{"a", "b", "c", "d"} {
			tc.touch(uid, t0)
		}
		synctest.Wait() // the bound started a write, which blocks
		if got, want := touchesString(r.got(), t0), "[a@0s b@0s c@0s d@0s]"; got != want {
			t.Fatalf("at the bound: got %s, want %s written at once", got, want)
		}
		for _, uid := range []string{"e", "f", "g", "h", "i", "j"} {
			tc.touch(uid, t0)
		}
		tc.touch("e", t0.Add(time.Millisecond)) // waiting: updated, not dropped
		if n, d := tc.pendingLen(), tc.counts.dropped.Load(); n != 4 || d != 2 {
			t.Fatalf("while a write runs: %d waiting, %d dropped; want 4 and 2 (i, j)", n, d)
		}
		close(r.block)
		synctest.Wait() // the bound asked for another write at once
		if got, want := touchesString(r.got(), t0), "[a@0s b@0s c@0s d@0s][e@1ms f@0s g@0s h@0s]"; got != want {
			t.Fatalf("after the write: got %s, want %s", got, want)
		}
		if n := tc.pendingLen(); n != 0 {
			t.Errorf("%d waiting after the second write, want 0", n)
		}
	})
}

// TestToucherFailure: a failed write is counted and logged, its users are
// written at the next interval with their latest time; a failure of the
// final flush loses them (counted as dropped, logged).
func TestToucherFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs bytes.Buffer
		r := &touchRecorder{fail: 1}
		tc, stop := startToucher(t, r, 100, slog.New(slog.NewTextHandler(&logs, nil)))
		t0 := time.Now()
		tc.touch("a", t0)
		tc.touch("b", t0)
		time.Sleep(time.Second)
		synctest.Wait()
		tc.touch("a", t0.Add(2*time.Second)) // after the failure: its time wins
		time.Sleep(time.Second)
		synctest.Wait()
		tc.touch("c", t0.Add(3*time.Second))
		time.Sleep(time.Second)
		synctest.Wait()
		if got, want := touchesString(r.got(), t0), "[a@0s b@0s][a@2s b@0s][c@3s]"; got != want {
			t.Fatalf("got %s, want %s (the failed users retried, then the next ones)", got, want)
		}
		if f, w := tc.counts.failed.Load(), tc.counts.written.Load(); f != 2 || w != 3 {
			t.Errorf("failed %d, written %d; want 2 and 3", f, w)
		}
		if n := strings.Count(logs.String(), "retried at the next flush"); n != 1 {
			t.Errorf("%d failure logs, want 1:\n%s", n, logs.String())
		}
		r.mu.Lock()
		r.fail = 1
		r.mu.Unlock()
		tc.touch("d", t0.Add(4*time.Second))
		stop()
		if d := tc.counts.dropped.Load(); d != 1 || !strings.Contains(logs.String(), "are lost") {
			t.Errorf("dropped %d after a failed final flush, want 1 (d) and a log:\n%s", d, logs.String())
		}
	})
}

// TestToucherChunks: a flush of many users is several store calls of at
// most touchChunk users, in uid order across the calls.
func TestToucherChunks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &touchRecorder{}
		tc, _ := startToucher(t, r, 10*touchChunk, nil)
		const n = 2*touchChunk + touchChunk/2
		for i := range n {
			tc.touch(fmt.Sprintf("u%05d", (i*7)%n), time.Now())
		}
		time.Sleep(time.Second)
		synctest.Wait()
		calls := r.got()
		var sizes []int
		var uids []string
		for _, c := range calls {
			sizes = append(sizes, len(c))
			for _, ts := range c {
				uids = append(uids, ts.UID)
			}
		}
		if !slices.Equal(sizes, []int{touchChunk, touchChunk, touchChunk / 2}) {
			t.Errorf("call sizes %v, want %d, %d, %d", sizes, touchChunk, touchChunk, touchChunk/2)
		}
		if !slices.IsSorted(uids) || len(slices.Compact(uids)) != n {
			t.Errorf("uids written: %d, sorted %v; want %d distinct in order", len(uids), slices.IsSorted(uids), n)
		}
	})
}

// TestToucherStuckStore: with a store that answers nothing, a flush of
// several chunks makes one write, which times out, and fails the rest with
// it: the final flush at shutdown takes one write timeout (1 s here), not
// one per chunk; every user is counted failed and, being final, dropped.
func TestToucherStuckStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stuck := func(ctx context.Context, _ []store.UserTouch) error {
			<-ctx.Done()
			return ctx.Err()
		}
		tc := newToucher(stuck, time.Hour, 10*touchChunk, time.Second, slog.New(slog.DiscardHandler), nil)
		const n = 5 * touchChunk
		for i := range n {
			tc.touch(fmt.Sprintf("u%05d", i), time.Now())
		}
		t0 := time.Now()
		tc.flush(true)
		if d := time.Since(t0); d != time.Second {
			t.Errorf("the final flush of %d chunks took %v, want one write timeout (1s)", n/touchChunk, d)
		}
		if f, d := tc.counts.failed.Load(), tc.counts.dropped.Load(); f != n || d != n {
			t.Errorf("failed %d, dropped %d; want %d each", f, d, n)
		}
	})
}

// TestTouchConfig: TouchInterval defaults to 1 s at 0 and is valid up to
// MaxTouchInterval; TouchPendingMax defaults to 100000 and may not be
// negative.
func TestTouchConfig(t *testing.T) {
	c := Config{Store: nopStore{}}
	c.fill()
	if c.TouchInterval != time.Second || c.TouchPendingMax != 100000 {
		t.Fatalf("defaults: %v %v, want 1s and 100000", c.TouchInterval, c.TouchPendingMax)
	}
	for _, tt := range []struct {
		cfg  Config
		want string // "" = valid
	}{
		{Config{Store: nopStore{}, TouchInterval: 0, TouchPendingMax: 0}, ""},
		{Config{Store: nopStore{}, TouchInterval: time.Nanosecond, TouchPendingMax: 1}, ""},
		{Config{Store: nopStore{}, TouchInterval: MaxTouchInterval}, ""},
		{Config{Store: nopStore{}, TouchInterval: MaxTouchInterval + 1}, "TouchInterval must be 0 to 1m0s, got 1m0.000000001s"},
		{Config{Store: nopStore{}, TouchInterval: -1}, "TouchInterval must be 0 to 1m0s, got -1ns"},
		{Config{Store: nopStore{}, TouchPendingMax: -1}, "TouchPendingMax must not be negative"},
	} {
		err := tt.cfg.Validate()
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%v %v: got %v, want %q", tt.cfg.TouchInterval, tt.cfg.TouchPendingMax, err, tt.want)
		}
	}
}
