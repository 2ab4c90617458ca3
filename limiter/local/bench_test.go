package local_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/local"
)

// A group's rate and its @all quota: the engine enforces both from its
// tuning, but the benchmark keeps a send's four dimensions so that its
// figures stay comparable.
const (
	benchGroupRule = "bench_group"
	benchAtAllRule = "bench_at_all"
)

// benchLimits are the send-path dimensions with the default algorithms;
// @all gets a per-second window so that the benchmark's steady traffic is
// mostly admitted and every request walks all four checks.
func benchLimits() limiter.Limits {
	sec := limiter.Duration(time.Second)
	return limiter.Limits{Rules: map[string]limiter.Rule{
		limiter.UserGroup: {Algorithm: limiter.GCRA, Limit: 5, Window: sec, Burst: 10},
		limiter.UserAll:   {Algorithm: limiter.SlidingWindow, Limit: 20, Window: sec},
		benchGroupRule:    {Algorithm: limiter.SlidingWindow, Limit: 20, Window: sec},
		benchAtAllRule:    {Algorithm: limiter.SlidingWindow, Limit: 20, Window: sec},
	}}
}

// Bench traffic: users send at ~4/s each into groups that see ~8/s, on a
// simulated clock that advances by 1/(total rate) per decision, so the
// counters hold a realistic steady state whatever b.N is.
const (
	benchUsers  = 100_000
	benchGroups = 50_000
	benchRate   = benchUsers * 4 // decisions per simulated second
)

var (
	benchUIDs = func() []string {
		s := make([]string, benchUsers)
		for i := range s {
			s[i] = "u" + strconv.Itoa(i)
		}
		return s
	}()
)

// simClock advances by one decision's share of a simulated second per call.
type simClock struct {
	base time.Time
	ns   atomic.Int64
}

func (c *simClock) Now() time.Time {
	return c.base.Add(time.Duration(c.ns.Add(int64(time.Second / benchRate))))
}

// fill sets the checks of decision i: users take turns, each talking in
// three groups of its own.
func fill(checks []limiter.Check, i int) {
	u := i % benchUsers
	uid := benchUIDs[u]
	gid := int64((u*7919 + (i/benchUsers)%3*13) % benchGroups)
	checks[0] = limiter.Check{Rule: limiter.UserGroup, Key: uid, ID: gid}
	checks[1] = limiter.Check{Rule: limiter.UserAll, Key: uid}
	checks[2] = limiter.Check{Rule: benchGroupRule, ID: gid}
	checks[3] = limiter.Check{Rule: benchAtAllRule, ID: gid}
}

// BenchmarkAllow measures a send's 4-dimension decision in-process.
func BenchmarkAllow(b *testing.B) {
	newLimiter := func(b *testing.B) *local.Limiter {
		clk := &simClock{base: time.Now()}
		l, err := local.New(local.Config{Limits: benchLimits(), Now: clk.Now})
		if err != nil {
			b.Fatal(err)
		}
		// Warm up: one simulated second of traffic creates the counters.
		checks := make([]limiter.Check, 4)
		for i := range benchRate {
			fill(checks, i)
			l.Allow(context.Background(), checks...)
		}
		return l
	}
	b.Run("dims=4/goroutines=1", func(b *testing.B) {
		l := newLimiter(b)
		ctx := context.Background()
		checks := make([]limiter.Check, 4)
		allowed, i := 0, 0
		b.ReportAllocs()
		start := time.Now()
		for b.Loop() {
			fill(checks, i)
			i++
			if d, _ := l.Allow(ctx, checks...); d.Allowed {
				allowed++
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
		b.ReportMetric(float64(allowed)/float64(b.N), "allowed/op")
	})
	b.Run("dims=4/goroutines=parallel", func(b *testing.B) {
		l := newLimiter(b)
		var next, allowed atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			checks := make([]limiter.Check, 4)
			n := 0
			for pb.Next() {
				fill(checks, int(next.Add(1)))
				if d, _ := l.Allow(ctx, checks...); d.Allowed {
					n++
				}
			}
			allowed.Add(int64(n))
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
		b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed/op")
	})
}

// BenchmarkAllowWeighted measures one level-weighted check (pull API,
// connection admission).
func BenchmarkAllowWeighted(b *testing.B) {
	clk := &simClock{base: time.Now()}
	l, err := local.New(local.Config{Now: clk.Now})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	checks := make([]limiter.Check, 1)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		checks[0] = limiter.Check{Rule: limiter.Pull, User: benchUIDs[i%benchUsers], Tier: i % 4}
		i++
		l.Allow(ctx, checks...)
	}
}
