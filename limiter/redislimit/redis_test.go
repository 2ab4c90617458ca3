package redislimit

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/local"
)

func rules(r map[string]limiter.Rule) limiter.Limits { return limiter.Limits{Rules: r} }

func slide(limit int64, w time.Duration) limiter.Rule {
	return limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: limit, Window: limiter.Duration(w)}
}

// TestScoresAreRedisTime checks the production clock: stored times are
// Redis TIME, and every key expires.
func TestScoresAreRedisTime(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, redistest.Addr())
	prefix := testPrefix(t, c)
	w := limiter.DefaultWeighted()
	w.UserCap = 5
	l, err := New(Config{Client: c, Prefix: prefix, Limits: rules(map[string]limiter.Rule{
		"sw": slide(10, time.Hour),
		"tb": {Algorithm: limiter.GCRA, Limit: 1, Window: limiter.Duration(time.Second), Burst: 5},
		"w":  {Algorithm: limiter.SlidingWindow, Limit: 100, Window: limiter.Duration(time.Minute), Weighted: &w},
	})})
	if err != nil {
		t.Fatal(err)
	}
	before := redisNow(t, c)
	d, err := l.Allow(ctx, limiter.Check{Rule: "sw", Key: "u"}, limiter.Check{Rule: "tb", Key: "u"}, limiter.Check{Rule: "w", ID: 3, User: "u", Tier: 2})
	if err != nil || !d.Allowed {
		t.Fatalf("got %+v %v, want allowed", d, err)
	}
	after := redisNow(t, c)

	zs, err := c.ZRangeWithScores(ctx, prefix+"{k:u}:sw:s:0", 0, -1).Result()
	if err != nil || len(zs) != 1 {
		t.Fatalf("sliding key: %v %v, want one member", zs, err)
	}
	if s := int64(zs[0].Score); s < before || s > after {
		t.Errorf("member score %d, want Redis TIME in [%d, %d]", s, before, after)
	}
	tat, err := c.Get(ctx, prefix+"{k:u}:tb:g:0").Float64()
	if err != nil {
		t.Fatal(err)
	}
	if tat < float64(before+1e6) || tat > float64(after+1e6) {
		t.Errorf("GCRA TAT %v, want Redis TIME + 1s in [%d, %d]", tat, before+1e6, after+1e6)
	}
	ttl := func(key string, lo, hi time.Duration) {
		t.Helper()
		got, err := c.PTTL(ctx, key).Result()
		if err != nil || got < lo || got > hi {
			t.Errorf("%s: PTTL %v %v, want within [%v, %v]", key, got, err, lo, hi)
		}
	}
	ttl(prefix+"{k:u}:sw:s:0", time.Hour-5*time.Second, time.Hour+time.Millisecond)
	ttl(prefix+"{k:u}:tb:g:0", 900*time.Millisecond, time.Second+2*time.Millisecond)
	wt := prefix + "{w:w::3}:"
	for _, k := range []string{"t", "c2", "u:u"} {
		ttl(wt+k, time.Minute-5*time.Second, time.Minute+time.Millisecond)
	}
	ttl(wt+"d", 5*time.Minute-5*time.Second, 5*time.Minute)
	if n, _ := c.Exists(ctx, wt+"c0", wt+"c1").Result(); n != 0 {
		t.Errorf("classes without units exist: %d keys", n)
	}
}

// TestMembersUnique: concurrent requests from two nodes, in the same
// microsecond or not, each leave their own members.
func TestMembersUnique(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, redistest.Addr())
	prefix := testPrefix(t, c)
	var nodes [2]*Limiter
	for i := range nodes {
		l, err := New(Config{Client: newClient(t, redistest.Addr()), Prefix: prefix, Limits: rules(map[string]limiter.Rule{"sw": slide(1000, time.Hour)})})
		if err != nil {
			t.Fatal(err)
		}
		// Freeze time: every request lands in the same microsecond.
		l.clock = func() int64 { return 42_000_000 }
		nodes[i] = l
	}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			if d, err := nodes[i%2].Allow(ctx, limiter.Check{Rule: "sw", Key: "u"}); err != nil || !d.Allowed {
				t.Errorf("got %+v %v", d, err)
			}
		})
	}
	wg.Wait()
	if d, err := nodes[0].Allow(ctx, limiter.Check{Rule: "sw", Key: "u", N: 5}); err != nil || d.Remaining != 1000-205 {
		t.Fatalf("got %+v %v, want remaining %d", d, err, 1000-205)
	}
	if n, err := c.ZCard(ctx, prefix+"{k:u}:sw:s:0").Result(); err != nil || n != 205 {
		t.Fatalf("members %d %v, want 205", n, err)
	}
}

// TestClusterGroupsShareSlot: in cluster mode every script's keys hash to
// one slot, and a send splits into the user's and the group's scripts.
func TestClusterGroupsShareSlot(t *testing.T) {
	lim := limiter.Limits{Rules: map[string]limiter.Rule{
		"per_group":     slide(20, time.Second),
		"per_group_day": slide(10, 24*time.Hour),
	}}
	send := []limiter.Check{
		{Rule: limiter.UserGroup, Key: "alice", ID: 7},
		{Rule: limiter.UserAll, Key: "alice"},
		{Rule: "per_group", ID: 7},
		{Rule: "per_group_day", ID: 7},
		{Rule: limiter.Pull, User: "alice", Tier: 1},
	}
	for _, cluster := range []bool{false, true} {
		l, err := New(Config{Client: redis.NewClient(&redis.Options{}), Cluster: cluster, Limits: lim})
		if err != nil {
			t.Fatal(err)
		}
		req, err := l.build(l.table.Load(), send)
		if err != nil {
			t.Fatal(err)
		}
		want := 1
		if cluster {
			want = 3
		}
		if len(req.groups) != want {
			t.Fatalf("cluster=%v: %d scripts, want %d", cluster, len(req.groups), want)
		}
		nkeys := 0
		for _, g := range req.groups {
			nkeys += len(g.keys)
			if len(g.args) != 3+argWidth*len(g.idx) {
				t.Errorf("group %s: %d args for %d checks", g.tag, len(g.args), len(g.idx))
			}
			if !cluster {
				continue
			}
			for _, k := range g.keys {
				if slot(k) != slot(g.keys[0]) {
					t.Errorf("group %s: key %s in slot %d, %s in %d", g.tag, k, slot(k), g.keys[0], slot(g.keys[0]))
				}
			}
		}
		if nkeys != 4+6 {
			t.Errorf("cluster=%v: %d keys, want 10", cluster, nkeys)
		}
	}
}

// TestNoScriptFallback: after SCRIPT FLUSH the scripts are sent again
// (EVAL), once, on both the single-script and the pipelined path, batched
// (batch.lua) or not.
func TestNoScriptFallback(t *testing.T) {
	ctx := context.Background()
	p := redistest.Start(t, portSingle)
	for mode := range 4 {
		cluster, batch := mode&1 == 1, mode&2 == 2
		c := newClient(t, p.Addr())
		l, err := New(Config{Client: c, Cluster: cluster, Batch: batch, Prefix: "ns:" + strconv.Itoa(mode) + ":",
			Limits: rules(map[string]limiter.Rule{"a": slide(10, time.Hour), "b": slide(10, time.Hour)})})
		if err != nil {
			t.Fatal(err)
		}
		req := []limiter.Check{{Rule: "a", Key: "u"}, {Rule: "b", ID: 1}}
		for i := range 3 {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			d, err := l.Allow(ctx, req...)
			if err != nil || !d.Allowed || d.Remaining != int64(9-i) {
				t.Fatalf("cluster=%v batch=%v after SCRIPT FLUSH: got %+v %v, want allowed with %d left", cluster, batch, d, err, 9-i)
			}
		}
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func gauge(g prometheus.Metric) float64 {
	var m dto.Metric
	g.Write(&m)
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// TestFailoverRedisDown stops a throwaway Redis mid-run: decisions go on
// in-process with the node's share, and move back when Redis returns.
func TestFailoverRedisDown(t *testing.T) {
	ctx := context.Background()
	p := redistest.Start(t, portSingle)
	c := redis.NewClient(&redis.Options{
		Addr: p.Addr(), DialTimeout: 100 * time.Millisecond,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, MaxRetries: -1,
	})
	t.Cleanup(func() { c.Close() })
	rl, err := New(Config{Client: c, Limits: rules(map[string]limiter.Rule{"sw": slide(10, time.Hour)})})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := local.New(local.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var logs syncBuf
	f, err := limiter.NewFailover(rl, fb, limiter.FailoverConfig{
		Nodes: 2, ProbeInterval: 20 * time.Millisecond, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	count := func(key string) int {
		t.Helper()
		n := 0
		for range 20 {
			d, err := f.Allow(ctx, limiter.Check{Rule: "sw", Key: key})
			if err != nil {
				t.Fatalf("Allow: %v (the failover must keep deciding)", err)
			}
			if d.Allowed {
				n++
			}
		}
		return n
	}
	if got := count("a"); got != 10 || f.Fallback() {
		t.Fatalf("Redis up: %d allowed (fallback %v), want 10 from Redis", got, f.Fallback())
	}
	p.Stop()
	if got := count("b"); got != 5 {
		t.Fatalf("Redis down: %d allowed, want the node's share 5", got)
	}
	if !f.Fallback() || gauge(f.ActiveGauge()) != 1 {
		t.Fatal("Redis down but not on the fallback")
	}
	p.Start()
	deadline := time.Now().Add(5 * time.Second)
	for f.Fallback() {
		if time.Now().After(deadline) {
			t.Fatal("not back on Redis 5s after it returned")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := count("c"); got != 10 {
		t.Fatalf("Redis back: %d allowed, want 10", got)
	}
	if n, err := c.ZCard(ctx, "fanfare:lim:{k:c}:sw:s:0").Result(); err != nil || n != 10 {
		t.Fatalf("Redis back: %d members %v, want 10 (decided by Redis)", n, err)
	}
	if a, b := gauge(f.SwitchCounter().WithLabelValues("fallback")), gauge(f.SwitchCounter().WithLabelValues("primary")); a != 1 || b != 1 {
		t.Errorf("switches: to fallback %v, to primary %v, want 1 and 1", a, b)
	}
	if gauge(f.ActiveGauge()) != 0 {
		t.Error("fallback gauge still 1")
	}
	for _, want := range []string{"Redis unreachable", "Redis reachable again"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	// Ping itself reports ErrUnavailable while Redis is down.
	p.Stop()
	if err := rl.Ping(ctx); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Ping with Redis down: got %v, want ErrUnavailable", err)
	}
}

// TestFailoverRedisDownLeased: with a hot counter decided from leases,
// stopping Redis still moves decisions to the fallback (once the lease is
// spent or expired, its renewal fails and the exact path reports
// ErrUnavailable), and they come back when Redis does.
func TestFailoverRedisDownLeased(t *testing.T) {
	ctx := context.Background()
	p := redistest.Start(t, portSingle)
	c := redis.NewClient(&redis.Options{
		Addr: p.Addr(), DialTimeout: 100 * time.Millisecond,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, MaxRetries: -1,
	})
	t.Cleanup(func() { c.Close() })
	rl, err := New(Config{Client: c, Batch: true, LeaseTTL: 50 * time.Millisecond, LeaseMinHits: 4,
		Limits: rules(map[string]limiter.Rule{"hot": slide(100_000, time.Second)})})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := local.New(local.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := limiter.NewFailover(rl, fb, limiter.FailoverConfig{Nodes: 2, ProbeInterval: 20 * time.Millisecond, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- f.Run(rctx) }()
	go func() { done <- rl.Run(rctx) }()
	defer func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	hot := limiter.Check{Rule: "hot", ID: 1}
	until := func(cond func() bool, what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("not %s within 5s", what)
			}
			d, err := f.Allow(ctx, hot)
			if err != nil || !d.Allowed {
				t.Fatalf("got %+v %v, want allowed (the failover must keep deciding)", d, err)
			}
		}
	}
	leasedNow := func() bool {
		rl.leases.mu.Lock()
		defer rl.leases.mu.Unlock()
		e := rl.leases.m[counter{hot.Rule, hot.Key, hot.ID}]
		return e != nil && e.spent > 0
	}
	until(leasedNow, "leased")
	p.Stop()
	until(f.Fallback, "on the fallback")
	p.Start()
	until(func() bool { return !f.Fallback() }, "back on Redis")
	rl.leases.mu.Lock()
	delete(rl.leases.m, counter{hot.Rule, hot.Key, hot.ID}) // count afresh
	rl.leases.mu.Unlock()
	until(leasedNow, "leased again")
}

// TestPublishLimits: limits published by one node reach another node's
// WatchLimits; the stored document is applied at start too.
func TestPublishLimits(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, redistest.Addr())
	prefix := testPrefix(t, c)
	var nodes [2]*Limiter
	for i := range nodes {
		l, err := New(Config{Client: newClient(t, redistest.Addr()), Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = l
	}
	if _, ok, err := nodes[0].StoredLimits(ctx); ok || err != nil {
		t.Fatalf("stored limits before any publish: ok=%v err=%v", ok, err)
	}
	next := limiter.Default()
	next.Rules[limiter.UserAll] = slide(7, time.Second)
	if err := nodes[0].PublishLimits(ctx, next); err != nil {
		t.Fatal(err)
	}
	bad := limiter.Default()
	bad.Rules[limiter.UserAll] = slide(-1, time.Second)
	if err := nodes[0].PublishLimits(ctx, bad); !errors.Is(err, limiter.ErrInvalidLimits) {
		t.Fatalf("invalid limits published: %v", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- nodes[1].WatchLimits(wctx, time.Hour, nodes[1].SetLimits) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor := func(limit int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for nodes[1].Limits().Rules[limiter.UserAll].Limit != limit {
			if time.Now().After(deadline) {
				t.Fatalf("node 1 user_all limit %d, want %d within 5s", nodes[1].Limits().Rules[limiter.UserAll].Limit, limit)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor(7) // stored before the watch started
	next.Rules[limiter.UserAll] = slide(9, time.Second)
	// The subscription may not be active yet: publish until it is seen.
	deadline := time.Now().Add(5 * time.Second)
	for nodes[1].Limits().Rules[limiter.UserAll].Limit != 9 && time.Now().Before(deadline) {
		if err := nodes[0].PublishLimits(ctx, next); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(9)

	// A document an older node stored, with the rules since retired, still
	// loads: they are dropped.
	old := `{"vip_from_level":1,"rules":{"user_all":{"algorithm":"sliding_window","limit":11,"window":"1s"},"group":{"algorithm":"sliding_window","limit":20,"window":"1s"},"at_all":{"algorithm":"sliding_window","limit":10,"window":"24h0m0s"}}}`
	if err := c.Set(ctx, prefix+"limits", old, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := nodes[0].StoredLimits(ctx); !ok || err != nil || len(got.Rules) != 1 || got.Rules[limiter.UserAll].Limit != 11 {
		t.Fatalf("stored limits of an older node: %+v ok=%v err=%v, want user_all 11 alone", got, ok, err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for nodes[1].Limits().Rules[limiter.UserAll].Limit != 11 && time.Now().Before(deadline) {
		if err := c.Publish(ctx, prefix+"limits", "changed").Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(11)
	if _, ok := nodes[1].Limits().Rules["group"]; ok {
		t.Error("node 1 applied the retired group rule")
	}
}

// TestAlgorithmSwitch: a rule reloaded with another algorithm starts from
// fresh keys instead of failing on the old ones.
func TestAlgorithmSwitch(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, redistest.Addr())
	l, err := New(Config{Client: c, Prefix: testPrefix(t, c), Limits: rules(map[string]limiter.Rule{"r": slide(2, time.Hour)})})
	if err != nil {
		t.Fatal(err)
	}
	chk := limiter.Check{Rule: "r", Key: "u"}
	for range 3 {
		if _, err := l.Allow(ctx, chk); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.SetLimits(rules(map[string]limiter.Rule{"r": {Algorithm: limiter.GCRA, Limit: 1, Window: limiter.Duration(time.Hour), Burst: 2}})); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after switching to GCRA: %+v %v, want allowed with 1 left", d, err)
	}
}
