package redislimit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/limitertest"
)

// leaseEnv is nodes sharing one Redis under the manual clock; node i leases
// when lease[i] is set, else decides every check exactly.
type leaseEnv struct {
	t     *testing.T
	clock *limitertest.Clock
	nodes []*Limiter
}

func newLeaseEnv(t *testing.T, connect connectFunc, lim limiter.Limits, lease []bool, tune func(*Config)) *leaseEnv {
	t.Helper()
	_, prefix := connect(t)
	e := &leaseEnv{t: t, clock: limitertest.NewClock()}
	for _, on := range lease {
		c, _ := connect(t)
		cfg := Config{Client: c, Prefix: prefix, Limits: lim, Batch: true, MaxBatch: 16}
		if on {
			cfg.LeaseTTL, cfg.LeaseMax, cfg.LeaseMinHits = 100*time.Millisecond, 64, 8
			if tune != nil {
				tune(&cfg)
			}
		}
		l, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		e.nodes = append(e.nodes, l)
	}
	base := redisNow(t, e.nodes[0].client)
	for _, l := range e.nodes {
		l.clock = func() int64 { return base + e.clock.Elapsed().Microseconds() }
		if l.leases != nil {
			l.leases.mono = e.clock.Elapsed
		}
	}
	return e
}

func (e *leaseEnv) allow(node int, checks ...limiter.Check) limiter.Decision {
	e.t.Helper()
	d, err := e.nodes[node].Allow(context.Background(), checks...)
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

// left counts what node admits of c until it denies (at most max+1).
func (e *leaseEnv) left(node int, c limiter.Check, max int64) int64 {
	e.t.Helper()
	var n int64
	for n <= max && e.allow(node, c).Allowed {
		n++
	}
	return n
}

// giveBack returns every lease of every node, as Run does at shutdown.
func (e *leaseEnv) giveBack() {
	e.t.Helper()
	for _, l := range e.nodes {
		if l.leases != nil {
			if err := l.leases.sweep(context.Background(), true); err != nil {
				e.t.Fatal(err)
			}
		}
	}
}

func (e *leaseEnv) entry(node int, c limiter.Check) *lease {
	ls := e.nodes[node].leases
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.m[counter{c.Rule, c.Key, c.ID}]
}

func TestLease(t *testing.T) { leaseTests(t, shared) }

func leaseTests(t *testing.T, connect connectFunc) {
	t.Run("NoOverAdmission", func(t *testing.T) { testLeaseNoOverAdmission(t, connect) })
	t.Run("StampsAhead", func(t *testing.T) { testLeaseStampsAhead(t, connect) })
	t.Run("AllOrNothing", func(t *testing.T) { testLeaseAllOrNothing(t, connect) })
	t.Run("CrashBounded", func(t *testing.T) { testLeaseCrashBounded(t, connect) })
	t.Run("Reload", func(t *testing.T) { testLeaseReload(t, connect) })
	t.Run("Stats", func(t *testing.T) { testLeaseStats(t, connect) })
}

// Many callers of one hot counter, a lease big enough for all of them:
// nearly every check is decided from a lease, and LeaseStats counts each
// hot check once, either way. (Callers arriving as a renewal ends may take
// its units before the callers that waited for it wake, so a few of these
// go the exact way: 35-213 of 10,233 here; doc.go, "Leases".)
func testLeaseStats(t *testing.T, connect connectFunc) {
	const callers, each = 256, 40
	lim := rules(map[string]limiter.Rule{"g": slide(100_000, time.Second)})
	e := newLeaseEnv(t, connect, lim, []bool{true}, func(c *Config) { c.LeaseMax = 1024 })
	c := limiter.Check{Rule: "g", ID: 3}
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range each {
				if d, err := e.nodes[0].Allow(context.Background(), c); err != nil || !d.Allowed {
					t.Errorf("denied or failed: %+v, %v", d, err)
					return
				}
			}
		})
	}
	wg.Wait()
	cov, miss := e.nodes[0].LeaseStats()
	t.Logf("hot checks: %d from a lease, %d the exact way", cov, miss)
	if cov < callers*each*9/10 || cov+miss > callers*each {
		t.Fatalf("hot checks: %d from a lease, %d the exact way, of %d checks; want at least 90%% from a lease", cov, miss, callers*each)
	}
	e.giveBack()
}

// Two leasing nodes and one exact node hammer one hot counter: together
// they never admit more than its limit, leases were used, and once the
// leases are given back the counter holds exactly what was admitted.
func testLeaseNoOverAdmission(t *testing.T, connect connectFunc) {
	const limit = 1000
	e := newLeaseEnv(t, connect, rules(map[string]limiter.Rule{"g": slide(limit, time.Second)}), []bool{true, true, false}, nil)
	c := limiter.Check{Rule: "g", ID: 1}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 96 {
		wg.Go(func() {
			for range 20 {
				d, err := e.nodes[g%3].Allow(context.Background(), c)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	got := admitted.Load()
	// A lease holds at most limit x TTL / window = 100 units here, at most
	// LeaseMax = 64: what the two leasing nodes may hold unspent.
	if got > limit || got < limit-2*64 {
		t.Fatalf("admitted %d of 1920, want at most %d and at least %d", got, limit, limit-2*64)
	}
	for node := range 2 {
		if en := e.entry(node, c); en == nil || en.spent+en.prevSpent == 0 {
			t.Fatalf("node %d spent nothing from leases: %+v", node, en)
		}
	}
	e.giveBack()
	if left := e.left(2, c, limit); left != limit-got {
		t.Fatalf("after the leases were given back %d left, want %d (limit - admitted)", left, limit-got)
	}
}

// Leased units are stamped at the lease's end: units a node spent late in
// its lease still count a window after that.
func testLeaseStampsAhead(t *testing.T, connect connectFunc) {
	const limit = 100 // 10 per lease TTL
	e := newLeaseEnv(t, connect, rules(map[string]limiter.Rule{"g": slide(limit, time.Second)}), []bool{true, false}, nil)
	c := limiter.Check{Rule: "g", ID: 7}
	for range 8 { // 7 exact, then the 8th takes a lease of 8 (LeaseMinHits)
		if d := e.allow(0, c); !d.Allowed {
			t.Fatalf("denied %+v", d)
		}
	}
	en := e.entry(0, c)
	if en == nil || en.size != 8 || en.left != 7 {
		t.Fatalf("lease %+v, want 8 units with 7 left", en)
	}
	e.clock.Advance(90 * time.Millisecond)
	for range 7 {
		if d := e.allow(0, c); !d.Allowed {
			t.Fatalf("denied %+v", d)
		}
	}
	if en.left != 0 {
		t.Fatalf("lease has %d left, want 0", en.left)
	}
	// At 1050 ms the 7 exact units of 0 ms are out of the window; the 8
	// leased ones, spent up to 90 ms, are not.
	e.clock.Advance(960 * time.Millisecond)
	if left := e.left(1, c, limit); left != limit-8 {
		t.Fatalf("at 1050ms: %d left, want %d (the leased units spent by 90ms still count)", left, limit-8)
	}
}

// A request whose exact check denies spends nothing from the lease of its
// other check, and a user whose own limit denies cannot grow the lease of
// a group it floods.
func testLeaseAllOrNothing(t *testing.T, connect connectFunc) {
	const limit = 1000
	e := newLeaseEnv(t, connect, rules(map[string]limiter.Rule{
		"grp": slide(limit, time.Second),
		"usr": slide(2, time.Hour), // 2 x 100ms / 1h < 2: never leased
	}), []bool{true, false}, nil)
	grp := limiter.Check{Rule: "grp", ID: 1}
	req := []limiter.Check{grp, {Rule: "usr", Key: "mallory"}}
	n := 0
	for i := range 200 {
		if i%25 == 24 {
			e.clock.Advance(110 * time.Millisecond) // the lease expires and is renewed
		}
		d := e.allow(0, req...)
		if d.Allowed {
			n++
		} else if d.Rule != "usr" || d.Index != 1 {
			t.Fatalf("denied by %q (index %d), want usr", d.Rule, d.Index)
		}
	}
	if n != 2 {
		t.Fatalf("admitted %d, want 2", n)
	}
	en := e.entry(0, grp)
	if en == nil || en.size == 0 {
		t.Fatalf("the flooded group is not leased: %+v", en)
	}
	if en.size > 8 {
		t.Fatalf("lease of %d units after 2 admissions: denied requests grew it (want at most LeaseMinHits 8)", en.size)
	}
	e.giveBack()
	if left := e.left(1, grp, limit); left != limit-2 {
		t.Fatalf("group has %d left, want %d: denied requests spent leased units", left, limit-2)
	}
}

// A node that stops without giving its lease back (a crash) keeps at most
// one lease's units from the others, and only for the lease TTL plus a
// window.
func testLeaseCrashBounded(t *testing.T, connect connectFunc) {
	const limit = 1000
	e := newLeaseEnv(t, connect, rules(map[string]limiter.Rule{"g": slide(limit, time.Second)}), []bool{true, false}, func(c *Config) { c.LeaseMax = 50 })
	c := limiter.Check{Rule: "g", ID: 3}
	for range 40 {
		e.allow(0, c)
	}
	en := e.entry(0, c)
	if en == nil || en.left == 0 {
		t.Fatalf("no lease with units left: %+v", en)
	}
	if en.size > 50 {
		t.Fatalf("lease of %d units, LeaseMax 50", en.size)
	}
	held := en.left
	// Node 0 is gone. 500 ms on, the 40 admitted and the held units count.
	e.clock.Advance(500 * time.Millisecond)
	if left := e.left(1, c, limit); left != limit-40-held {
		t.Fatalf("%d left, want %d (%d held by the lost lease)", left, limit-40-held, held)
	}
	// A window and a lease TTL after the lease (at 1200 ms), only node 1's
	// units of 500 ms count.
	e.clock.Advance(700 * time.Millisecond)
	if left := e.left(1, c, limit); left != limit-(limit-40-held) {
		t.Fatalf("%d left, want %d", left, 40+held)
	}
}

// A reload makes a lease stale: the new rule is never decided from units
// taken under the old one.
func testLeaseReload(t *testing.T, connect connectFunc) {
	e := newLeaseEnv(t, connect, rules(map[string]limiter.Rule{"g": slide(1000, time.Second)}), []bool{true}, nil)
	c := limiter.Check{Rule: "g", ID: 5}
	for range 10 {
		e.allow(0, c)
	}
	if en := e.entry(0, c); en == nil || en.left == 0 {
		t.Fatalf("no lease: %+v", en)
	}
	if err := e.nodes[0].SetLimits(rules(map[string]limiter.Rule{"g": slide(5, time.Second)})); err != nil {
		t.Fatal(err)
	}
	if d := e.allow(0, c); d.Allowed {
		t.Fatalf("admitted from a lease of the old limit: %+v", d)
	}
}
