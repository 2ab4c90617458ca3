package limitertest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/limiter"
)

// Backend is an implementation under test.
type Backend struct {
	// New returns nodes limiters that share one state (an in-process
	// backend returns the same instance nodes times: it is one node),
	// configured with limits, each test with fresh state. Their time is
	// clock: read directly, or, for Redis, Redis TIME shifted so that it
	// moves with clock and not with the wall.
	New func(t *testing.T, limits limiter.Limits, clock *Clock, nodes int) []limiter.Limiter
	// Tolerance is how far the backend's notion of now may stray from
	// clock (0: exact, and exact boundary tests run too).
	Tolerance time.Duration
	// NewRealClock is like New, but the limiters keep their production
	// clock (the wall clock in-process, Redis TIME on Redis). Only the
	// RealClock test uses it, with short windows and sleeps.
	NewRealClock func(t *testing.T, limits limiter.Limits, nodes int) []limiter.Limiter
}

// Run runs the conformance suite against b.
func Run(t *testing.T, b Backend) {
	t.Run("SlidingBoundaries", b.testSlidingBoundaries)
	t.Run("SlidingSlides", b.testSlidingSlides)
	t.Run("SlidingCost", b.testSlidingCost)
	t.Run("GCRABurst", b.testGCRABurst)
	t.Run("AllOrNothing", b.testAllOrNothing)
	t.Run("DecisionFields", b.testDecisionFields)
	t.Run("Errors", b.testErrors)
	t.Run("Reload", b.testReload)
	t.Run("DefaultDimensions", b.testDefaultDimensions)
	t.Run("ConcurrentNoOverAdmission", b.testConcurrent)
	t.Run("WeightedReserves", b.testWeightedReserves)
	t.Run("WeightedUserCap", b.testWeightedUserCap)
	t.Run("WeightedFairness", b.testWeightedFairness)
	t.Run("RealClock", b.testRealClock)
}

type env struct {
	t   *testing.T
	b   Backend
	clk *Clock
	ls  []limiter.Limiter
}

func (b Backend) setup(t *testing.T, rules map[string]limiter.Rule, nodes int) *env {
	t.Helper()
	clk := NewClock()
	ls := b.New(t, limiter.Limits{Rules: rules}, clk, nodes)
	if len(ls) != nodes {
		t.Fatalf("backend returned %d limiters, want %d", len(ls), nodes)
	}
	return &env{t: t, b: b, clk: clk, ls: ls}
}

func (e *env) allowOn(node int, checks ...limiter.Check) limiter.Decision {
	e.t.Helper()
	d, err := e.ls[node].Allow(context.Background(), checks...)
	if err != nil {
		e.t.Fatalf("Allow(%+v): %v", checks, err)
	}
	return d
}

func (e *env) allow(checks ...limiter.Check) limiter.Decision {
	e.t.Helper()
	return e.allowOn(0, checks...)
}

// admit asserts that the request is allowed, with remaining units left.
func (e *env) admit(remaining int64, checks ...limiter.Check) {
	e.t.Helper()
	d := e.allow(checks...)
	if !d.Allowed {
		e.t.Fatalf("at %v: %+v denied (%v by %q, retry %v), want allowed", e.clk.Elapsed(), checks, d.Reason, d.Rule, d.RetryAfter)
	}
	if remaining >= 0 && d.Remaining != remaining {
		e.t.Fatalf("at %v: remaining %d, want %d", e.clk.Elapsed(), d.Remaining, remaining)
	}
}

// deny asserts that the request is denied by check index with reason, and
// that RetryAfter is retry (within the backend's tolerance; retry < 0: not
// checked).
func (e *env) deny(index int, reason limiter.Reason, retry time.Duration, checks ...limiter.Check) limiter.Decision {
	e.t.Helper()
	d := e.allow(checks...)
	if d.Allowed {
		e.t.Fatalf("at %v: %+v allowed (remaining %d), want denied", e.clk.Elapsed(), checks, d.Remaining)
	}
	if d.Index != index || d.Reason != reason || d.Rule != checks[index].Rule {
		e.t.Fatalf("at %v: denied by index %d rule %q reason %v, want %d %q %v", e.clk.Elapsed(), d.Index, d.Rule, d.Reason, index, checks[index].Rule, reason)
	}
	if retry >= 0 && !near(d.RetryAfter, retry, e.b.Tolerance) {
		e.t.Fatalf("at %v: retry after %v, want %v (tolerance %v)", e.clk.Elapsed(), d.RetryAfter, retry, e.b.Tolerance)
	}
	return d
}

func near(got, want, tol time.Duration) bool {
	// Redis works in microseconds and rounds RetryAfter up.
	tol += time.Microsecond
	return got >= want-tol && got <= want+tol
}

func sw(limit int64, window time.Duration) limiter.Rule {
	return limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: limit, Window: limiter.Duration(window)}
}

func gcra(limit int64, window time.Duration, burst int64) limiter.Rule {
	return limiter.Rule{Algorithm: limiter.GCRA, Limit: limit, Window: limiter.Duration(window), Burst: burst}
}

func weighted(capacity int64, window time.Duration, userCap int64) limiter.Rule {
	w := limiter.DefaultWeighted()
	w.UserCap = userCap
	r := sw(capacity, window)
	r.Weighted = &w
	return r
}

func (b Backend) testSlidingBoundaries(t *testing.T) {
	e := b.setup(t, map[string]limiter.Rule{"sw": sw(5, time.Second)}, 1)
	c := limiter.Check{Rule: "sw", Key: "u1"}
	for i := int64(4); i >= 0; i-- {
		e.admit(i, c)
	}
	e.deny(0, limiter.ReasonLimit, time.Second, c)
	e.clk.Advance(300 * time.Millisecond)
	e.deny(0, limiter.ReasonLimit, 700*time.Millisecond, c)
	// Other counters of the same rule are independent.
	e.admit(4, limiter.Check{Rule: "sw", Key: "u2"})
	e.admit(4, limiter.Check{Rule: "sw", Key: "u1", ID: 7})
	e.clk.Advance(650 * time.Millisecond) // 950ms
	e.deny(0, limiter.ReasonLimit, 50*time.Millisecond, c)
	if b.Tolerance == 0 {
		e.clk.Advance(50*time.Millisecond - time.Nanosecond)
		e.deny(0, limiter.ReasonLimit, time.Nanosecond, c)
		e.clk.Advance(time.Nanosecond) // exactly one window after the first five
	} else {
		e.clk.Advance(50*time.Millisecond + 2*b.Tolerance)
	}
	for i := int64(4); i >= 0; i-- {
		e.admit(i, c)
	}
	e.deny(0, limiter.ReasonLimit, -1, c)
}

func (b Backend) testSlidingSlides(t *testing.T) {
	e := b.setup(t, map[string]limiter.Rule{"sw": sw(4, time.Second)}, 1)
	c := limiter.Check{Rule: "sw", Key: "u"}
	e.admit(3, c)
	e.clk.Advance(400 * time.Millisecond)
	e.admit(2, c)
	e.admit(1, c)
	e.admit(0, c)
	e.deny(0, limiter.ReasonLimit, 600*time.Millisecond, c)
	e.clk.Advance(650 * time.Millisecond) // 1050ms: the first unit left
	e.admit(0, c)
	e.deny(0, limiter.ReasonLimit, 350*time.Millisecond, c)
	e.clk.Advance(400 * time.Millisecond) // 1450ms: the three of 400ms left
	e.admit(2, c)
	e.admit(1, c)
	e.admit(0, c)
	e.deny(0, limiter.ReasonLimit, 600*time.Millisecond, c)
}

func (b Backend) testSlidingCost(t *testing.T) {
	e := b.setup(t, map[string]limiter.Rule{"sw": sw(5, time.Second)}, 1)
	c3 := limiter.Check{Rule: "sw", Key: "u", N: 3}
	e.admit(2, c3)
	e.deny(0, limiter.ReasonLimit, time.Second, c3)
	e.admit(0, limiter.Check{Rule: "sw", Key: "u", N: 2})
	e.clk.Advance(200 * time.Millisecond)
	e.deny(0, limiter.ReasonLimit, 800*time.Millisecond, limiter.Check{Rule: "sw", Key: "u"})
	e.deny(0, limiter.ReasonCost, time.Second, limiter.Check{Rule: "sw", Key: "v", N: 6})
	// The units of one request leave together.
	e.clk.Advance(800 * time.Millisecond)
	e.admit(0, limiter.Check{Rule: "sw", Key: "u", N: 5})
}

func (b Backend) testGCRABurst(t *testing.T) {
	// 10 per second (one every 100ms), up to 3 at once.
	e := b.setup(t, map[string]limiter.Rule{"tb": gcra(10, time.Second, 3)}, 1)
	c := limiter.Check{Rule: "tb", Key: "u"}
	e.admit(2, c)
	e.admit(1, c)
	e.admit(0, c)
	d := e.deny(0, limiter.ReasonLimit, 100*time.Millisecond, c)
	if d.Limit != 3 || d.Window != 300*time.Millisecond {
		t.Fatalf("limit %d window %v, want 3 and 300ms (burst and its refill time)", d.Limit, d.Window)
	}
	e.clk.Advance(100 * time.Millisecond)
	e.admit(0, c)
	e.deny(0, limiter.ReasonLimit, 100*time.Millisecond, c)
	e.clk.Advance(250 * time.Millisecond)
	e.admit(1, c)
	e.admit(0, c)
	e.deny(0, limiter.ReasonLimit, 50*time.Millisecond, c)
	// A long pause refills the bucket to its burst, no more.
	e.clk.Advance(10 * time.Second)
	e.admit(2, c)
	e.admit(1, c)
	e.admit(0, c)
	e.deny(0, limiter.ReasonLimit, 100*time.Millisecond, c)
	// Costs: two units take two emission intervals.
	e.clk.Advance(time.Second)
	e.admit(1, limiter.Check{Rule: "tb", Key: "u", N: 2})
	e.admit(0, c)
	e.deny(0, limiter.ReasonLimit, 200*time.Millisecond, limiter.Check{Rule: "tb", Key: "u", N: 2})
	e.deny(0, limiter.ReasonCost, 300*time.Millisecond, limiter.Check{Rule: "tb", Key: "w", N: 4})
}

func (b Backend) testAllOrNothing(t *testing.T) {
	e := b.setup(t, map[string]limiter.Rule{
		"a": sw(10, time.Hour),
		"b": sw(2, time.Hour),
		"g": gcra(1, time.Hour, 5),
		"w": weighted(100, time.Hour, 3),
	}, 1)
	req := []limiter.Check{
		{Rule: "a", Key: "u"},
		{Rule: "g", Key: "u"},
		{Rule: "w", User: "u"},
		{Rule: "b", ID: 42},
	}
	e.admit(-1, req...)
	e.admit(-1, req...)
	for range 5 {
		e.deny(3, limiter.ReasonLimit, time.Hour, req...)
	}
	// The denying check first: nothing after it is consumed either.
	rev := []limiter.Check{req[3], req[2], req[1], req[0]}
	for range 5 {
		e.deny(0, limiter.ReasonLimit, time.Hour, rev...)
	}
	// Each dimension holds exactly the two admitted requests.
	for i := int64(7); i >= 0; i-- {
		e.admit(i, req[0])
	}
	e.deny(0, limiter.ReasonLimit, -1, req[0])
	for i := int64(2); i >= 0; i-- {
		e.admit(i, req[1])
	}
	e.deny(0, limiter.ReasonLimit, -1, req[1])
	e.admit(0, req[2])
	e.deny(0, limiter.ReasonUserCap, time.Hour, req[2])
}

func (b Backend) testDecisionFields(t *testing.T) {
	e := b.setup(t, map[string]limiter.Rule{
		"big":   sw(100, time.Minute),
		"small": sw(3, 10*time.Second),
		"off":   sw(0, time.Second),
	}, 1)
	d := e.allow(limiter.Check{Rule: "big", Key: "u"}, limiter.Check{Rule: "small", Key: "u"}, limiter.Check{Rule: "off", Key: "u"})
	want := limiter.Decision{Allowed: true, Index: 1, Rule: "small", Limit: 3, Window: 10 * time.Second, Remaining: 2}
	if d != want {
		t.Fatalf("got %+v, want %+v", d, want)
	}
	// A disabled rule (limit 0) admits everything.
	for range 20 {
		d = e.allow(limiter.Check{Rule: "off", Key: "u"})
		if !d.Allowed || d.Index != -1 {
			t.Fatalf("disabled rule: got %+v, want allowed with index -1", d)
		}
	}
	d = e.allow()
	if !d.Allowed || d.Index != -1 {
		t.Fatalf("no checks: got %+v, want allowed with index -1", d)
	}
}

func (b Backend) testErrors(t *testing.T) {
	e := b.setup(t, map[string]limiter.Rule{"sw": sw(5, time.Second)}, 1)
	ctx := context.Background()
	cases := []struct {
		name   string
		checks []limiter.Check
		want   error
	}{
		{"unknown rule", []limiter.Check{{Rule: "nope"}}, limiter.ErrUnknownRule},
		{"negative cost", []limiter.Check{{Rule: "sw", N: -1}}, limiter.ErrInvalidCheck},
		{"duplicate", []limiter.Check{{Rule: "sw", Key: "u"}, {Rule: "sw", Key: "u"}}, limiter.ErrInvalidCheck},
		{"too many", make([]limiter.Check, limiter.MaxChecks+1), limiter.ErrInvalidCheck},
	}
	for _, tc := range cases {
		if _, err := e.ls[0].Allow(ctx, tc.checks...); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	// Nothing was consumed by the failed calls.
	for i := int64(4); i >= 0; i-- {
		e.admit(i, limiter.Check{Rule: "sw", Key: "u"})
	}
}

func (b Backend) testReload(t *testing.T) {
	e := b.setup(t, map[string]limiter.Rule{"sw": sw(5, time.Second)}, 2)
	c := limiter.Check{Rule: "sw", Key: "u"}
	e.admit(4, c)
	e.admit(3, c)
	e.admit(2, c)
	next := e.ls[0].Limits()
	next.Rules["sw"] = sw(3, time.Second)
	for _, l := range e.ls {
		if err := l.SetLimits(next); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.ls[1].Limits().Rules["sw"].Limit; got != 3 {
		t.Fatalf("limit after reload %d, want 3", got)
	}
	e.deny(0, limiter.ReasonLimit, time.Second, c)
	bad := e.ls[0].Limits()
	bad.Rules["sw"] = sw(-1, time.Second)
	if err := e.ls[0].SetLimits(bad); !errors.Is(err, limiter.ErrInvalidLimits) {
		t.Fatalf("invalid limits: got %v, want ErrInvalidLimits", err)
	}
	if got := e.ls[0].Limits().Rules["sw"].Limit; got != 3 {
		t.Fatalf("limit after rejected reload %d, want 3 (unchanged)", got)
	}
	next.Rules["sw"] = sw(10, time.Second)
	if err := e.ls[0].SetLimits(next); err != nil {
		t.Fatal(err)
	}
	e.admit(6, c)
}

// testDefaultDimensions runs the §8 defaults through one send.
func (b Backend) testDefaultDimensions(t *testing.T) {
	e := b.setup(t, nil, 1)
	send := []limiter.Check{
		{Rule: limiter.UserGroup, Key: "alice", ID: 1},
		{Rule: limiter.UserAll, Key: "alice"},
	}
	// user_group: burst 10 then 5/s.
	for range 10 {
		e.admit(-1, send...)
	}
	e.deny(0, limiter.ReasonLimit, 200*time.Millisecond, send...)
	// user_all: 20/s over all groups, 10 of them used above.
	for gid := range int64(10) {
		e.admit(-1, limiter.Check{Rule: limiter.UserGroup, Key: "alice", ID: 2 + gid}, limiter.Check{Rule: limiter.UserAll, Key: "alice"})
	}
	e.deny(1, limiter.ReasonLimit, time.Second, limiter.Check{Rule: limiter.UserGroup, Key: "alice", ID: 99}, limiter.Check{Rule: limiter.UserAll, Key: "alice"})
}

func (b Backend) testConcurrent(t *testing.T) {
	t.Run("OneRule", func(t *testing.T) {
		e := b.setup(t, map[string]limiter.Rule{"sw": sw(100, time.Hour)}, 2)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			allowed int
		)
		for g := range 64 {
			wg.Go(func() {
				n := 0
				for range 5 {
					d, err := e.ls[g%2].Allow(context.Background(), limiter.Check{Rule: "sw", Key: "hot"})
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						n++
					}
				}
				mu.Lock()
				allowed += n
				mu.Unlock()
			})
		}
		wg.Wait()
		if allowed != 100 {
			t.Fatalf("allowed %d of 320, want exactly 100", allowed)
		}
	})
	t.Run("FourDimensions", func(t *testing.T) {
		const users, groups = 16, 4
		e := b.setup(t, map[string]limiter.Rule{
			"ug": gcra(1, time.Hour, 4),
			"ua": sw(6, time.Hour),
			"g":  sw(25, time.Hour),
			"w":  weighted(40, time.Hour, 5), // normal users may use 40 - 12 (VIP reserve)
		}, 2)
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			perUG = map[[2]int]int64{}
			perU  = map[int]int64{}
			perG  = map[int]int64{}
			total int64
		)
		for i := range 64 {
			u, g := i%users, i/users
			wg.Go(func() {
				uid := fmt.Sprint("u", u)
				checks := []limiter.Check{
					{Rule: "ug", Key: uid, ID: int64(g)},
					{Rule: "ua", Key: uid},
					{Rule: "g", ID: int64(g)},
					{Rule: "w", User: uid},
				}
				for range 8 {
					d, err := e.ls[i%2].Allow(context.Background(), checks...)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mu.Lock()
						perUG[[2]int{u, g}]++
						perU[u]++
						perG[g]++
						total++
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		if total == 0 {
			t.Fatal("nothing admitted")
		}
		// No dimension over its limit, and each holds exactly what was
		// admitted: probing it alone finds limit - admitted left.
		probe := func(c limiter.Check, limit, used int64) {
			t.Helper()
			if used > limit {
				t.Fatalf("%s %q/%d: admitted %d, limit %d", c.Rule, c.Key, c.ID, used, limit)
			}
			left := int64(0)
			for {
				d := e.allow(c)
				if !d.Allowed {
					break
				}
				left++
				if left > limit {
					break
				}
			}
			if left != limit-used {
				t.Fatalf("%s %q/%d: %d left after %d admitted, want %d", c.Rule, c.Key, c.ID, left, used, limit-used)
			}
		}
		for g := range groups {
			probe(limiter.Check{Rule: "g", ID: int64(g)}, 25, perG[g])
		}
		for u := range users {
			uid := fmt.Sprint("u", u)
			if perU[u] > 5 {
				t.Fatalf("user %s admitted %d, user cap 5", uid, perU[u])
			}
			probe(limiter.Check{Rule: "ua", Key: uid}, 6, perU[u])
			for g := range groups {
				probe(limiter.Check{Rule: "ug", Key: uid, ID: int64(g)}, 4, perUG[[2]int{u, g}])
			}
		}
		left := int64(0)
		for i := 0; ; i++ {
			if d := e.allow(limiter.Check{Rule: "w", User: fmt.Sprint("probe", i)}); !d.Allowed {
				break
			}
			left++
		}
		if total > 28 || left != 28-total {
			t.Fatalf("weighted: %d admitted, %d left, want at most 28 and %d left", total, left, 28-total)
		}
	})
}

func (b Backend) testWeightedReserves(t *testing.T) {
	// Capacity 10: shares VIP 6, normal 3, low 1; reserves VIP 3, normal 1.
	// Each scope starts cold (no demand), so only reserves are held.
	e := b.setup(t, map[string]limiter.Rule{"w": weighted(10, time.Second, 0)}, 1)
	scope := func(id int64, level int) limiter.Check {
		return limiter.Check{Rule: "w", ID: id, Tier: level}
	}
	const vip, normal, low = 2, 0, -1
	// Normals alone: everything but the VIP reserve.
	for i := int64(6); i >= 0; i-- {
		e.admit(i, scope(1, normal))
	}
	e.deny(0, limiter.ReasonReserve, time.Second, scope(1, normal))
	e.deny(0, limiter.ReasonReserve, -1, scope(1, low))
	for i := int64(2); i >= 0; i-- {
		e.admit(i, scope(1, vip)) // the reserve is there
	}
	e.deny(0, limiter.ReasonLimit, time.Second, scope(1, vip))
	// A low flood leaves both reserves; each class still gets its reserve.
	for i := int64(5); i >= 0; i-- {
		e.admit(i, scope(2, low))
	}
	e.deny(0, limiter.ReasonReserve, -1, scope(2, low))
	for i := int64(2); i >= 0; i-- {
		e.admit(i, scope(2, vip))
	}
	e.deny(0, limiter.ReasonReserve, -1, scope(2, vip)) // normal's reserve
	e.admit(0, scope(2, normal))
	e.deny(0, limiter.ReasonLimit, -1, scope(2, normal))
	// A VIP flood leaves the normal reserve.
	for range 9 {
		e.admit(-1, scope(3, vip))
	}
	e.deny(0, limiter.ReasonReserve, -1, scope(3, vip))
	e.admit(0, scope(3, normal))
	// Level 1 is normal when VIPs start at level 2.
	l := e.ls[0].Limits()
	l.VIPFromTier = 2
	if err := e.ls[0].SetLimits(l); err != nil {
		t.Fatal(err)
	}
	for range 7 {
		e.admit(-1, scope(4, 1))
	}
	e.deny(0, limiter.ReasonReserve, -1, scope(4, 1))
	e.admit(-1, scope(4, 2))
	// The window slides for weighted rules too; demand fades.
	e.clk.Advance(20 * time.Second)
	for i := int64(6); i >= 0; i-- {
		e.admit(i, scope(1, normal))
	}
	e.deny(0, limiter.ReasonReserve, -1, scope(1, normal))
}

func (b Backend) testWeightedUserCap(t *testing.T) {
	e := b.setup(t, map[string]limiter.Rule{"w": weighted(100, time.Second, 2)}, 1)
	v := limiter.Check{Rule: "w", User: "v", Tier: 3}
	e.admit(1, v)
	e.clk.Advance(100 * time.Millisecond)
	e.admit(0, v)
	e.deny(0, limiter.ReasonUserCap, 900*time.Millisecond, v) // the cap binds VIPs too
	e.admit(1, limiter.Check{Rule: "w", User: "v2", Tier: 3})
	e.deny(0, limiter.ReasonCost, time.Second, limiter.Check{Rule: "w", User: "v3", Tier: 3, N: 3})
	e.clk.Advance(900 * time.Millisecond)
	e.admit(0, v)
}

// testWeightedFairness floods a weighted rule with normal users at 10x its
// capacity while VIPs send at their share, and the other way round.
func (b Backend) testWeightedFairness(t *testing.T) {
	const (
		capacity = 100
		userCap  = 10
		step     = 10 * time.Millisecond
		steps    = 600 // 6 s
	)
	type flow struct {
		class   limiter.Class
		level   int
		users   int
		perSec  float64 // offered load of the class
		pending float64
		next    int
	}
	run := func(t *testing.T, flows []*flow, greedy bool) (perClass [limiter.NumClasses][]int64) {
		e := b.setup(t, map[string]limiter.Rule{"w": weighted(capacity, time.Second, userCap)}, 2)
		admits := map[string][]time.Duration{} // per user
		var all []time.Duration
		for c := range perClass {
			perClass[c] = make([]int64, steps*int(step)/int(time.Second))
		}
		node := 0
		for s := range steps {
			now := e.clk.Elapsed()
			for _, f := range flows {
				f.pending += f.perSec * step.Seconds()
				for f.pending >= 1 {
					f.pending--
					uid := fmt.Sprintf("%s-%d", f.class, f.next%f.users)
					f.next++
					node = 1 - node
					if d := e.allowOn(node, limiter.Check{Rule: "w", User: uid, Tier: f.level}); d.Allowed {
						admits[uid] = append(admits[uid], now)
						all = append(all, now)
						perClass[f.class][s*int(step)/int(time.Second)]++
					}
				}
			}
			if greedy { // one VIP flooding at 10x the per-user cap
				for range userCap * 10 * int(step) / int(time.Second) {
					if d := e.allowOn(0, limiter.Check{Rule: "w", User: "greedy", Tier: 3}); d.Allowed {
						admits["greedy"] = append(admits["greedy"], now)
						all = append(all, now)
						perClass[limiter.ClassVIP][s*int(step)/int(time.Second)]++
					}
				}
			}
			e.clk.Advance(step)
		}
		// No window of one second holds more than the capacity, and no
		// user more than the cap.
		maxIn := func(ts []time.Duration) int {
			sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
			m, lo := 0, 0
			for hi := range ts {
				for ts[hi]-ts[lo] >= time.Second-b.Tolerance {
					lo++
				}
				m = max(m, hi-lo+1)
			}
			return m
		}
		if m := maxIn(all); m > capacity {
			t.Errorf("%d admitted within one window, capacity %d", m, capacity)
		}
		for uid, ts := range admits {
			if m := maxIn(ts); m > userCap {
				t.Errorf("user %s: %d admitted within one window, cap %d", uid, m, userCap)
			}
		}
		return perClass
	}
	// Capacity 100 with the default split: shares VIP 60, normal 30, low
	// 10; reserves VIP 30, normal 15. Once demand has built up (from the
	// fourth second on), every class that asks for at least its share gets
	// it (within 10% for the demand estimate), and never less than its
	// reserve.
	check := func(t *testing.T, per [limiter.NumClasses][]int64, want [limiter.NumClasses]int64) {
		reserve := [limiter.NumClasses]int64{limiter.ClassVIP: 30, limiter.ClassNormal: 15}
		for sec := 1; sec < len(per[0]); sec++ { // after the first window fills
			t.Logf("second %d: vip %d normal %d low %d", sec, per[limiter.ClassVIP][sec], per[limiter.ClassNormal][sec], per[limiter.ClassLow][sec])
			for c := range want {
				got := per[c][sec]
				if got < reserve[c] {
					t.Errorf("second %d: %s admitted %d, want at least the reserve %d", sec, limiter.Class(c), got, reserve[c])
				}
				if sec >= 3 && got < want[c]*9/10 {
					t.Errorf("second %d: %s admitted %d, want at least %d", sec, limiter.Class(c), got, want[c]*9/10)
				}
			}
		}
	}
	t.Run("NormalFlood", func(t *testing.T) {
		flows := []*flow{
			{class: limiter.ClassNormal, level: 0, users: 50, perSec: 10 * capacity}, // 20/s each: over the cap
			{class: limiter.ClassVIP, level: 1, users: 20, perSec: 60},
		}
		// Normals flood first in every step: the worst case for VIPs.
		check(t, run(t, flows, true), [limiter.NumClasses]int64{limiter.ClassVIP: 60, limiter.ClassNormal: 30})
	})
	t.Run("VIPFlood", func(t *testing.T) {
		flows := []*flow{
			{class: limiter.ClassVIP, level: 2, users: 200, perSec: 10 * capacity},
			{class: limiter.ClassNormal, level: 0, users: 20, perSec: 30},
			{class: limiter.ClassLow, level: -1, users: 20, perSec: 50},
		}
		check(t, run(t, flows, false), [limiter.NumClasses]int64{limiter.ClassVIP: 60, limiter.ClassNormal: 30, limiter.ClassLow: 10})
	})
}

// testRealClock checks the production clock: two nodes share windows and
// buckets, and a denial's RetryAfter is honest.
func (b Backend) testRealClock(t *testing.T) {
	if b.NewRealClock == nil {
		t.Fatal("Backend.NewRealClock is nil")
	}
	ls := b.NewRealClock(t, limiter.Limits{Rules: map[string]limiter.Rule{
		"sw": sw(5, 300*time.Millisecond),
		"tb": gcra(10, time.Second, 2),
	}}, 2)
	ctx := context.Background()
	allow := func(node int, c limiter.Check) limiter.Decision {
		t.Helper()
		d, err := ls[node].Allow(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tc := range []struct {
		c      limiter.Check
		n      int
		window time.Duration
	}{
		{limiter.Check{Rule: "sw", Key: "u"}, 5, 300 * time.Millisecond},
		{limiter.Check{Rule: "tb", Key: "u"}, 2, 100 * time.Millisecond},
	} {
		start := time.Now()
		for i := range tc.n {
			if d := allow(i%2, tc.c); !d.Allowed {
				t.Fatalf("%s: request %d denied, want allowed", tc.c.Rule, i)
			}
		}
		var d limiter.Decision
		for node := range 2 {
			if d = allow(node, tc.c); d.Allowed {
				t.Fatalf("%s: node %d admitted over the shared limit", tc.c.Rule, node)
			}
		}
		if d.RetryAfter <= 0 || d.RetryAfter > tc.window {
			t.Fatalf("%s: retry after %v, want within (0, %v]", tc.c.Rule, d.RetryAfter, tc.window)
		}
		if time.Since(start) < tc.window-50*time.Millisecond {
			// Still well inside the window: waiting less than RetryAfter
			// must not help.
			time.Sleep(d.RetryAfter / 2)
			if d2 := allow(0, tc.c); d2.Allowed {
				t.Fatalf("%s: admitted after half of RetryAfter %v", tc.c.Rule, d.RetryAfter)
			}
		}
		time.Sleep(d.RetryAfter + 20*time.Millisecond)
		if d := allow(1, tc.c); !d.Allowed {
			t.Fatalf("%s: denied after RetryAfter (%v, retry %v)", tc.c.Rule, d.Reason, d.RetryAfter)
		}
	}
}
