package redispresence

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/presence/presencetest"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func init() {
	// The failure tests make go-redis log every refused dial.
	redis.SetLogger(quietLogger{})
}

// sharedRedis connects to the test Redis; unreachable fails the test.
func sharedRedis(t *testing.T) *redis.Client { return sharedRedisB(t) }

func sharedRedisB(t testing.TB) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("Redis at %s (FANFARE_TEST_REDIS_ADDR) unreachable: %v", redistest.Addr(), err)
	}
	return rdb
}

// testPrefix returns a random key prefix and deletes its keys at cleanup.
func testPrefix(t *testing.T, rdb *redis.Client) string { return testPrefixB(t, rdb) }

func testPrefixB(t testing.TB, rdb *redis.Client) string {
	t.Helper()
	var b [6]byte
	_, _ = crand.Read(b[:])
	prefix := "fanfaretest:presence:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			_ = rdb.Del(ctx, keys...).Err()
		}
	})
	return prefix
}

func newLocal(t *testing.T) *presence.Local[int] {
	t.Helper()
	l, err := presence.New[int](presence.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newView(t *testing.T, rdb redis.UniversalClient, l presence.Source, cfg Config) *View {
	t.Helper()
	v, err := New(rdb, l, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestConformance(t *testing.T) {
	rdb := sharedRedis(t)
	presencetest.Run(t, func(t *testing.T) presencetest.Node {
		l := newLocal(t)
		v := newView(t, rdb, l, Config{NodeID: "n1", Prefix: testPrefix(t, rdb)})
		t.Cleanup(func() { _ = v.Shutdown(context.Background()) })
		return presencetest.Node{Local: l, View: v, ID: "n1"}
	})
}

func m(gid int64, ord uint32) presence.Membership {
	return presence.Membership{GID: gid, Ordinal: ord}
}

func mustFlush(t *testing.T, vs ...*View) {
	t.Helper()
	for _, v := range vs {
		if err := v.Flush(t.Context()); err != nil {
			t.Fatalf("%s: Flush: %v", v.NodeID(), err)
		}
	}
}

func wantCount(t *testing.T, v *View, gid, want int64) {
	t.Helper()
	got, err := v.OnlineCount(t.Context(), gid)
	if err != nil || got != want {
		t.Fatalf("%s: OnlineCount(%d) got %d, %v; want %d", v.NodeID(), gid, got, err, want)
	}
}

func wantNodes(t *testing.T, v *View, gid int64, want ...string) {
	t.Helper()
	got, err := v.Nodes(t.Context(), gid)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("%s: Nodes(%d) got %v, %v; want %v", v.NodeID(), gid, got, err, want)
	}
}

func wantAnywhere(t *testing.T, v *View, gid int64, ords []uint32, want []bool) {
	t.Helper()
	got, err := v.OnlineAnywhere(t.Context(), gid, ords, nil)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("%s: OnlineAnywhere(%d, %v) got %v, %v; want %v", v.NodeID(), gid, ords, got, err, want)
	}
}

// TestTwoNodes: two nodes share Redis; a user online on both counts once.
func TestTwoNodes(t *testing.T) {
	rdb := sharedRedis(t)
	prefix := testPrefix(t, rdb)
	la, lb := newLocal(t), newLocal(t)
	a := newView(t, rdb, la, Config{NodeID: "a", Prefix: prefix})
	b := newView(t, rdb, lb, Config{NodeID: "b", Prefix: prefix})

	for _, c := range []struct {
		l    *presence.Local[int]
		uid  string
		conn int
		ms   []presence.Membership
	}{
		{la, "u1", 1, []presence.Membership{m(1, 1), m(2, 0)}},
		{la, "u2", 2, []presence.Membership{m(1, 2)}},
		{la, "u3", 3, []presence.Membership{m(1, 3)}},
		{lb, "u3", 4, []presence.Membership{m(1, 3)}}, // second device on node b
		{lb, "u4", 5, []presence.Membership{m(1, 4)}},
	} {
		if err := c.l.Connect(c.uid, c.conn, c.ms); err != nil {
			t.Fatal(err)
		}
	}
	mustFlush(t, a, b)
	for _, v := range []*View{a, b} {
		wantCount(t, v, 1, 4)
		wantCount(t, v, 2, 1)
		wantNodes(t, v, 1, "a", "b")
		wantNodes(t, v, 2, "a")
		wantAnywhere(t, v, 1, []uint32{0, 1, 2, 3, 4, 5}, []bool{false, true, true, true, true, false})
	}

	// b's users go; a's view follows after b's flush.
	lb.Disconnect("u3", 4)
	lb.Disconnect("u4", 5)
	wantCount(t, a, 1, 4) // not flushed yet
	mustFlush(t, b)
	wantCount(t, a, 1, 3)
	wantNodes(t, a, 1, "a")
	wantAnywhere(t, a, 1, []uint32{3, 4}, []bool{true, false})
}

// TestNodeDeath: a node that stops flushing without Shutdown drops out after
// its TTL (Redis time), while a live node keeps renewing.
func TestNodeDeath(t *testing.T) {
	rdb := sharedRedis(t)
	prefix := testPrefix(t, rdb)
	la, lb := newLocal(t), newLocal(t)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	cfg := Config{Prefix: prefix, TTL: 600 * time.Millisecond, FlushInterval: 100 * time.Millisecond, Now: clock}
	cfg.NodeID = "a"
	a := newView(t, rdb, la, cfg)
	cfg.NodeID = "b"
	b := newView(t, rdb, lb, cfg)
	if err := la.Connect("u1", 1, []presence.Membership{m(1, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := lb.Connect("u2", 2, []presence.Membership{m(1, 2)}); err != nil {
		t.Fatal(err)
	}
	mustFlush(t, a, b)
	wantCount(t, a, 1, 2)

	// Node b dies. Node a keeps flushing; its clock says renewals are due.
	deadline := time.Now().Add(5 * time.Second)
	for {
		now.Add(int64(cfg.TTL / 3))
		mustFlush(t, a)
		nodes, err := a.Nodes(t.Context(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(nodes, []string{"a"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead node b still listed after 5 s: %v", nodes)
		}
		time.Sleep(50 * time.Millisecond) // Redis TTLs run on Redis time
	}
	wantCount(t, a, 1, 1)
	wantAnywhere(t, a, 1, []uint32{1, 2}, []bool{true, false})
	if got := a.Stats().Renewals; got == 0 {
		t.Fatalf("node a renewed nothing: %+v", a.Stats())
	}
	if n, err := rdb.Exists(t.Context(), prefix+"{g:1}:n:b").Result(); err != nil || n != 0 {
		t.Fatalf("dead node's key: exists=%d, %v", n, err)
	}
}

// TestShutdownWithdraws: a graceful Shutdown removes the node at once.
func TestShutdownWithdraws(t *testing.T) {
	rdb := sharedRedis(t)
	prefix := testPrefix(t, rdb)
	la, lb := newLocal(t), newLocal(t)
	a := newView(t, rdb, la, Config{NodeID: "a", Prefix: prefix})
	b := newView(t, rdb, lb, Config{NodeID: "b", Prefix: prefix, FlushInterval: 10 * time.Millisecond})
	_ = la.Connect("u1", 1, []presence.Membership{m(1, 1)})
	_ = lb.Connect("u2", 2, []presence.Membership{m(1, 2), m(2, 2)})

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- b.Run(ctx) }()
	mustFlush(t, a)
	// Run flushes at once; wait until b is visible.
	for deadline := time.Now().Add(5 * time.Second); ; {
		if n, _ := a.OnlineCount(t.Context(), 1); n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node b's Run never published")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := b.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; err != nil {
		t.Fatalf("Run after Shutdown: got %v, want nil", err)
	}
	wantCount(t, a, 1, 1)
	wantNodes(t, a, 1, "a")
	wantNodes(t, a, 2)
	if err := b.Flush(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Shutdown: got %v, want ErrClosed", err)
	}
}

// TestRandomChurn drives random changes through many flushes (deltas and
// whole writes) and checks Redis against the local index after each.
func TestRandomChurn(t *testing.T) {
	rdb := sharedRedis(t)
	prefix := testPrefix(t, rdb)
	l := newLocal(t)
	v := newView(t, rdb, l, Config{NodeID: "n", Prefix: prefix, Batch: 3})
	r := rand.New(rand.NewPCG(7, 7))
	const users, groups = 400, 5
	online := make(map[int]bool)
	var probe []uint32
	for o := range uint32(users) {
		probe = append(probe, o*37)
	}
	for round := range 30 {
		for range 1 + r.IntN(60) {
			u := r.IntN(users)
			uid := "u" + strconv.Itoa(u)
			switch {
			case !online[u]:
				var ms []presence.Membership
				for g := range int64(groups) {
					if r.IntN(3) > 0 {
						ms = append(ms, m(g, uint32(u*37)))
					}
				}
				if err := l.Connect(uid, u, ms); err != nil {
					t.Fatal(err)
				}
				online[u] = true
			case r.IntN(3) == 0:
				l.Leave(int64(r.IntN(groups)), uid)
			default:
				l.Disconnect(uid, u)
				online[u] = false
			}
		}
		mustFlush(t, v)
		for g := range int64(groups) {
			want := make([]bool, len(probe))
			for i, o := range probe {
				want[i] = l.ContainsOrdinal(g, o)
			}
			wantAnywhere(t, v, g, probe, want)
			wantCount(t, v, g, int64(l.OnlineCount(g)))
		}
		_ = round
	}
	st := v.Stats()
	if st.DeltaWrites == 0 || st.FullWrites == 0 {
		t.Fatalf("churn did not exercise both write kinds: %+v", st)
	}
}

func TestBatchBound(t *testing.T) {
	rdb := sharedRedis(t)
	v := newView(t, rdb, newLocal(t), Config{Prefix: testPrefix(t, rdb), MaxQuery: 10})
	_, err := v.OnlineAnywhere(t.Context(), 1, make([]uint32, 11), nil)
	if !errors.Is(err, presence.ErrBatchTooLarge) {
		t.Fatalf("got %v, want ErrBatchTooLarge", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  Config
		want bool
	}{
		{Config{}, true},
		{Config{TTL: time.Second, FlushInterval: 100 * time.Millisecond}, true},
		{Config{Prefix: "a{b"}, false},
		{Config{TTL: time.Second, FlushInterval: time.Second}, false},
		{Config{TTL: 1500 * time.Microsecond, FlushInterval: time.Millisecond / 2}, false},
		{Config{Batch: -1}, false},
		{Config{FlushInterval: -1}, false},
	}
	for _, tt := range tests {
		if err := tt.cfg.Validate(); (err == nil) != tt.want {
			t.Errorf("%+v: got %v, want ok=%v", tt.cfg, err, tt.want)
		}
	}
}

// ---- failure tests on a throwaway Redis (ports: see internal/redistest) ----

func fastClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond, MaxRetries: -1,
	})
}

// TestRedisDown: Redis dies; local presence keeps working, the view reports
// stale/unavailable; Redis comes back empty and the next flush resyncs
// everything, including changes made during the outage.
func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t, 16400)
	rdb := fastClient(srv.Addr())
	defer rdb.Close()
	l := newLocal(t)
	v := newView(t, rdb, l, Config{NodeID: "n", Prefix: "p:"})
	if !v.Stale() {
		t.Fatal("Stale before the first flush: got false, want true")
	}
	_ = l.Connect("u1", 1, []presence.Membership{m(1, 1), m(2, 1)})
	_ = l.Connect("u2", 2, []presence.Membership{m(1, 2)})
	mustFlush(t, v)
	wantCount(t, v, 1, 2)
	if v.Stale() {
		t.Fatal("Stale after a good flush: got true")
	}

	srv.Stop()
	// Local presence is unaffected.
	if err := l.Connect("u3", 3, []presence.Membership{m(1, 3)}); err != nil {
		t.Fatal(err)
	}
	l.Disconnect("u1", 1)
	if got := l.AppendConns(nil, 1); !slices.Equal(sortedInts(got), []int{2, 3}) {
		t.Fatalf("local push set during outage: got %v, want [2 3]", got)
	}
	if err := v.Flush(t.Context()); err == nil {
		t.Fatal("Flush with Redis down: got nil error")
	}
	if !v.Stale() {
		t.Fatal("Stale with Redis down: got false")
	}
	if _, err := v.OnlineCount(t.Context(), 1); !errors.Is(err, presence.ErrUnavailable) {
		t.Fatalf("OnlineCount with Redis down: got %v, want ErrUnavailable", err)
	}
	if _, err := v.Nodes(t.Context(), 1); !errors.Is(err, presence.ErrUnavailable) {
		t.Fatalf("Nodes with Redis down: got %v, want ErrUnavailable", err)
	}
	if _, err := v.OnlineAnywhere(t.Context(), 1, []uint32{1}, nil); !errors.Is(err, presence.ErrUnavailable) {
		t.Fatalf("OnlineAnywhere with Redis down: got %v, want ErrUnavailable", err)
	}

	srv.Start() // empty: no data, no scripts
	mustFlush(t, v)
	if v.Stale() {
		t.Fatal("Stale after recovery: got true")
	}
	wantCount(t, v, 1, 2)
	wantCount(t, v, 2, 0) // u1 left during the outage; its group 2 entry is withdrawn
	wantAnywhere(t, v, 1, []uint32{1, 2, 3}, []bool{false, true, true})
	wantNodes(t, v, 1, "n")
	if st := v.Stats(); st.Resyncs < 2 || st.Failures == 0 {
		t.Fatalf("stats after recovery: %+v", st)
	}
}

// TestKeysLost: Redis loses our keys without any error seen (eviction, a
// failover to an empty replica); renewals notice and rewrite them.
func TestKeysLost(t *testing.T) {
	srv := redistest.Start(t, 16401)
	rdb := fastClient(srv.Addr())
	defer rdb.Close()
	l := newLocal(t)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	v := newView(t, rdb, l, Config{NodeID: "n", Prefix: "p:", Now: func() time.Time { return time.Unix(0, now.Load()) }})
	_ = l.Connect("u1", 1, []presence.Membership{m(1, 1), m(2, 5)})
	mustFlush(t, v)
	wantCount(t, v, 1, 1)
	if err := rdb.FlushAll(t.Context()).Err(); err != nil { // our own throwaway server
		t.Fatal(err)
	}
	// A delta onto the lost key is refused and becomes a whole write.
	_ = l.Connect("u2", 2, []presence.Membership{m(1, 2)})
	mustFlush(t, v)
	wantCount(t, v, 1, 2)
	wantCount(t, v, 2, 0) // not renewed yet
	// The renewal of the unchanged group finds its key missing.
	now.Add(int64(DefaultTTL))
	mustFlush(t, v)
	wantCount(t, v, 2, 1)
	wantAnywhere(t, v, 2, []uint32{5}, []bool{true})
}

// TestRunSurvivesOutage: Run keeps going through an outage and recovers on
// its own.
func TestRunSurvivesOutage(t *testing.T) {
	srv := redistest.Start(t, 16402)
	rdb := fastClient(srv.Addr())
	defer rdb.Close()
	l := newLocal(t)
	v := newView(t, rdb, l, Config{NodeID: "n", Prefix: "p:", FlushInterval: 20 * time.Millisecond, TTL: time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (stats %+v)", what, v.Stats())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	_ = l.Connect("u1", 1, []presence.Membership{m(1, 1)})
	waitFor("first publish", func() bool { n, _ := v.OnlineCount(t.Context(), 1); return n == 1 })
	srv.Stop()
	waitFor("stale", v.Stale)
	_ = l.Connect("u2", 2, []presence.Membership{m(1, 2)})
	srv.Start()
	waitFor("resync", func() bool { n, _ := v.OnlineCount(t.Context(), 1); return n == 2 && !v.Stale() })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: got %v, want context.Canceled", err)
	}
}

func sortedInts(s []int) []int {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
