package redishot_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/redishot"
	"github.com/fanfare-im/fanfare/internal/redistest"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func init() {
	// The failure test makes go-redis log every refused dial.
	redis.SetLogger(quietLogger{})
}

// sharedRedis connects to the test Redis; unreachable fails the test.
func sharedRedis(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("Redis at %s (FANFARE_TEST_REDIS_ADDR) unreachable: %v", redistest.Addr(), err)
	}
	return rdb
}

// testPrefix returns a random key prefix and deletes its keys at cleanup.
func testPrefix(t *testing.T, rdb redis.UniversalClient) string {
	t.Helper()
	var b [6]byte
	_, _ = crand.Read(b[:])
	prefix := "fanfaretest:hot:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		for _, k := range []string{prefix + "{hot}:nodes", prefix + "{hot}:n:a", prefix + "{hot}:n:b"} {
			_ = rdb.Del(ctx, k).Err()
		}
	})
	return prefix
}

func newSet(t *testing.T, rdb redis.UniversalClient, prefix string) *redishot.Set {
	t.Helper()
	s, err := redishot.New(redishot.Config{Client: rdb, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func sortMarks(ms []fanout.HotMark) []fanout.HotMark {
	slices.SortFunc(ms, func(a, b fanout.HotMark) int {
		if c := strings.Compare(a.Node, b.Node); c != 0 {
			return c
		}
		return int(a.GID - b.GID)
	})
	return ms
}

func equalMarks(got, want []fanout.HotMark) bool {
	return slices.EqualFunc(sortMarks(got), sortMarks(want), func(a, b fanout.HotMark) bool {
		return a.GID == b.GID && a.Node == b.Node && a.Rate == b.Rate && a.Hot == b.Hot && a.Since.Equal(b.Since)
	})
}

// TestSync: each Sync replaces the calling node's marks and returns every
// live node's; no marks withdraw the node.
func TestSync(t *testing.T) {
	rdb := sharedRedis(t)
	s := newSet(t, rdb, testPrefix(t, rdb))
	ctx := t.Context()
	since := time.UnixMilli(1_795_986_626_338)
	a1 := fanout.HotMark{GID: 1, Node: "a", Rate: 183.5, Hot: true, Since: since}
	a2 := fanout.HotMark{GID: 2, Node: "a", Rate: 1e6, Hot: true, Since: since.Add(time.Second)}
	b2 := fanout.HotMark{GID: 2, Node: "b", Rate: 0.25} // not hot: an offered rate only
	steps := []struct {
		node  string
		marks []fanout.HotMark
		want  []fanout.HotMark
	}{
		{"a", []fanout.HotMark{a1, a2}, []fanout.HotMark{a1, a2}},
		{"b", []fanout.HotMark{b2}, []fanout.HotMark{a1, a2, b2}},
		{"a", []fanout.HotMark{a2}, []fanout.HotMark{a2, b2}}, // gid 1 unmarked
		{"a", nil, []fanout.HotMark{b2}},                      // a withdrawn
		{"a", nil, []fanout.HotMark{b2}},                      // again: nothing to withdraw
		{"b", nil, nil},
	}
	for i, st := range steps {
		got, err := s.Sync(ctx, st.node, st.marks, time.Minute)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if !equalMarks(got, st.want) {
			t.Errorf("step %d (%s syncs %v): got %+v, want %+v", i, st.node, st.marks, got, st.want)
		}
	}
	// The Node field of a mark is ignored: marks are the caller's.
	got, err := s.Sync(ctx, "a", []fanout.HotMark{{GID: 7, Node: "zz", Rate: 1, Hot: true, Since: since}}, time.Minute)
	if err != nil || len(got) != 1 || got[0].Node != "a" || got[0].GID != 7 {
		t.Errorf("mark with another node name: got %+v %v, want gid 7 of node a", got, err)
	}
}

// TestDeadNodeExpires: a node that stops syncing loses its marks after its
// ttl, in Redis (keys with a TTL) and in what other nodes read.
func TestDeadNodeExpires(t *testing.T) {
	rdb := sharedRedis(t)
	prefix := testPrefix(t, rdb)
	s := newSet(t, rdb, prefix)
	ctx := t.Context()
	now := time.UnixMilli(time.Now().UnixMilli())
	const ttl = 300 * time.Millisecond
	if _, err := s.Sync(ctx, "a", []fanout.HotMark{{GID: 5, Rate: 90, Hot: true, Since: now}}, ttl); err != nil {
		t.Fatal(err)
	}
	pttl, err := rdb.PTTL(ctx, prefix+"{hot}:n:a").Result()
	if err != nil || pttl <= 0 || pttl > ttl {
		t.Fatalf("TTL of node a's key: got %v %v, want in (0, %v]", pttl, err, ttl)
	}
	got, err := s.Sync(ctx, "b", nil, time.Minute)
	if err != nil || len(got) != 1 || got[0].GID != 5 || got[0].Node != "a" {
		t.Fatalf("b reads before a's ttl: got %+v %v, want a's mark of gid 5", got, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := s.Sync(ctx, "b", nil, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's marks still read 5 s after its ttl of %v: %+v", ttl, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n, err := rdb.Exists(ctx, prefix+"{hot}:n:a").Result(); err != nil || n != 0 {
		t.Errorf("node a's key after its ttl: exists=%d %v", n, err)
	}
	// The expired node was pruned from the zset by b's sync.
	if n, err := rdb.ZCard(ctx, prefix+"{hot}:nodes").Result(); err != nil || n != 0 {
		t.Errorf("nodes zset after a expired and b withdrew: %d entries %v, want 0", n, err)
	}
}

// countHook counts the commands sent to Redis (pipelines count as one).
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestOneRoundTrip: a Sync of many marks is one command once the script
// is loaded (EVALSHA); the first may add an EVAL.
func TestOneRoundTrip(t *testing.T) {
	rdb := sharedRedis(t)
	var h countHook
	rdb.AddHook(&h)
	s := newSet(t, rdb, testPrefix(t, rdb))
	marks := make([]fanout.HotMark, 100)
	for i := range marks {
		marks[i] = fanout.HotMark{GID: int64(i + 1), Rate: float64(i), Hot: true, Since: time.UnixMilli(1000)}
	}
	if _, err := s.Sync(t.Context(), "a", marks, time.Minute); err != nil {
		t.Fatal(err)
	}
	h.n.Store(0)
	for range 3 {
		got, err := s.Sync(t.Context(), "b", marks[:10], time.Minute)
		if err != nil || len(got) != 110 {
			t.Fatalf("got %d marks %v, want 110", len(got), err)
		}
	}
	if n := h.n.Load(); n != 3 {
		t.Errorf("3 Syncs sent %d commands, want 3", n)
	}
}

// TestBounds: MaxMarks marks per Sync, the ttl and node id are checked.
func TestBounds(t *testing.T) {
	rdb := sharedRedis(t)
	s := newSet(t, rdb, testPrefix(t, rdb))
	ctx := t.Context()
	marks := make([]fanout.HotMark, redishot.MaxMarks+1)
	for i := range marks {
		marks[i] = fanout.HotMark{GID: int64(i + 1), Rate: 1, Hot: true, Since: time.UnixMilli(1)}
	}
	for _, n := range []int{redishot.MaxMarks, redishot.MaxMarks + 1} {
		got, err := s.Sync(ctx, "a", marks[:n], time.Minute)
		if err != nil || len(got) != redishot.MaxMarks {
			t.Errorf("%d marks: got %d back %v, want %d", n, len(got), err, redishot.MaxMarks)
		}
	}
	if _, err := s.Sync(ctx, "a", nil, 0); err == nil {
		t.Error("ttl 0: got no error")
	}
	if _, err := s.Sync(ctx, "", nil, time.Second); err == nil {
		t.Error("empty node: got no error")
	}
	if _, err := redishot.New(redishot.Config{}); err == nil {
		t.Error("New without a client: got no error")
	}
	// A sub-millisecond ttl is rounded up, not zero (PEXPIRE 0 would
	// delete the key at once and read nothing).
	if got, err := s.Sync(ctx, "b", marks[:1], time.Microsecond); err != nil || len(got) != redishot.MaxMarks+1 {
		t.Errorf("ttl 1µs: got %d marks %v, want %d", len(got), err, redishot.MaxMarks+1)
	}
	if _, err := s.Sync(ctx, "a", nil, time.Second); err != nil {
		t.Fatal(err)
	}
}

// ---- throwaway servers (ports: see internal/redistest) ----

// TestCluster: on a Redis Cluster the script (which reads the other
// nodes' hashes by name) runs on the {hot} slot.
func TestCluster(t *testing.T) {
	addrs := redistest.StartCluster(t, 16431, 16432, 16433)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	s := newSet(t, rdb, "c:")
	ctx := t.Context()
	since := time.UnixMilli(5000)
	if _, err := s.Sync(ctx, "a", []fanout.HotMark{{GID: 1, Rate: 2, Hot: true, Since: since}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := s.Sync(ctx, "b", []fanout.HotMark{{GID: 3, Rate: 4, Hot: true, Since: since}}, time.Minute)
	want := []fanout.HotMark{{GID: 1, Node: "a", Rate: 2, Hot: true, Since: since}, {GID: 3, Node: "b", Rate: 4, Hot: true, Since: since}}
	if err != nil || !equalMarks(got, want) {
		t.Errorf("got %+v %v, want %+v", got, err, want)
	}
}
