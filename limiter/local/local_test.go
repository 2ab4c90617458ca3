package local_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/limitertest"
	"github.com/fanfare-im/fanfare/limiter/local"
)

func TestSuite(t *testing.T) {
	limitertest.Run(t, limitertest.Backend{
		New: func(t *testing.T, limits limiter.Limits, clock *limitertest.Clock, nodes int) []limiter.Limiter {
			l, err := local.New(local.Config{Limits: limits, Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			out := make([]limiter.Limiter, nodes)
			for i := range out {
				out[i] = l // one process is one node
			}
			return out
		},
		NewRealClock: func(t *testing.T, limits limiter.Limits, nodes int) []limiter.Limiter {
			l, err := local.New(local.Config{Limits: limits})
			if err != nil {
				t.Fatal(err)
			}
			out := make([]limiter.Limiter, nodes)
			for i := range out {
				out[i] = l
			}
			return out
		},
	})
}

func TestSweep(t *testing.T) {
	clk := limitertest.NewClock()
	w := limiter.DefaultWeighted()
	w.UserCap = 3
	l, err := local.New(local.Config{Now: clk.Now, Limits: limiter.Limits{Rules: map[string]limiter.Rule{
		"sw": {Algorithm: limiter.SlidingWindow, Limit: 5, Window: limiter.Duration(time.Second)},
		"tb": {Algorithm: limiter.GCRA, Limit: 1, Window: limiter.Duration(time.Second), Burst: 5},
		"w":  {Algorithm: limiter.SlidingWindow, Limit: 100, Window: limiter.Duration(time.Second), Weighted: &w},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 10 {
		uid := fmt.Sprint("u", i)
		if _, err := l.Allow(ctx, limiter.Check{Rule: "sw", Key: uid}, limiter.Check{Rule: "tb", Key: uid}, limiter.Check{Rule: "w", User: uid}); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.Counters(); got != 21 {
		t.Fatalf("counters %d, want 10 + 10 + 1", got)
	}
	if got := l.Sweep(); got != 0 {
		t.Fatalf("swept %d live counters", got)
	}
	clk.Advance(999 * time.Millisecond)
	if got := l.Sweep(); got != 0 || l.Counters() != 21 {
		t.Fatalf("swept %d before the window ended", got)
	}
	clk.Advance(time.Millisecond)
	if got := l.Sweep(); got != 21 || l.Counters() != 0 {
		t.Fatalf("swept %d, %d left; want 21 and 0", got, l.Counters())
	}
	// Counters of a rule removed by a reload go at the next sweep.
	l.Allow(ctx, limiter.Check{Rule: "sw", Key: "x"})
	if err := l.SetLimits(limiter.Limits{}); err != nil {
		t.Fatal(err)
	}
	if got := l.Sweep(); got != 1 {
		t.Fatalf("swept %d after the rule was removed, want 1", got)
	}
}

func TestRunSweeps(t *testing.T) {
	clk := limitertest.NewClock()
	l, err := local.New(local.Config{Now: clk.Now, SweepInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l.Allow(context.Background(), limiter.Check{Rule: limiter.UserAll, Key: "u"})
	clk.Advance(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- l.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for l.Counters() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil || l.Counters() != 0 {
		t.Fatalf("Run: %v, %d counters left", err, l.Counters())
	}
}

// TestAllowDoesNotAllocate: a steady-state 4-dimension send allocates
// nothing.
func TestAllowDoesNotAllocate(t *testing.T) {
	clk := limitertest.NewClock()
	l, err := local.New(local.Config{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	checks := []limiter.Check{
		{Rule: limiter.UserGroup, Key: "alice", ID: 1},
		{Rule: limiter.UserAll, Key: "alice"},
		{Rule: limiter.UserAll, Key: "bob"},
		{Rule: limiter.Pull, User: "alice", Tier: 2},
	}
	l.Allow(ctx, checks...)
	allocs := testing.AllocsPerRun(1000, func() {
		clk.Advance(time.Second)
		if d, err := l.Allow(ctx, checks...); err != nil || !d.Allowed {
			t.Fatalf("got %+v %v", d, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per decision, want 0", allocs)
	}
}
