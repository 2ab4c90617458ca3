package redisquota_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
	"github.com/fanfare-im/fanfare/fanout/redisquota"
	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/store"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func init() {
	// The failure test makes go-redis log every refused dial.
	redis.SetLogger(quietLogger{})
}

// sharedQuota is a Quota on the test Redis under a prefix of its own,
// whose keys are deleted when the test ends.
func sharedQuota(t *testing.T) (*redisquota.Quota, *redis.Client, string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("Redis at %s (FANFARE_TEST_REDIS_ADDR) unreachable: %v", redistest.Addr(), err)
	}
	var b [6]byte
	_, _ = crand.Read(b[:])
	prefix := "fanfaretest:atall:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := rdb.Keys(ctx, prefix+"*").Result()
		for _, k := range keys {
			_ = rdb.Del(ctx, k).Err()
		}
	})
	q, err := redisquota.New(redisquota.Config{Client: rdb, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return q, rdb, prefix
}

// TestTake: at most limit sends per group and day; a charged send is
// admitted again uncharged; a refund frees its place; groups and days
// count apart; the key expires.
func TestTake(t *testing.T) {
	q, rdb, prefix := sharedQuota(t)
	ctx := t.Context()
	const gid, day = 42, 20_000
	const charged, retry, refused = fanout.AtAllCharged, fanout.AtAllRetry, fanout.AtAllRefused
	take := func(gid, day int64, key string, want fanout.AtAllCharge) {
		t.Helper()
		got, err := q.Take(ctx, gid, day, key, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("Take(%d, %d, %q) = %v, want %v", gid, day, key, got, want)
		}
	}
	take(gid, day, "a", charged)
	take(gid, day, "b", charged)
	take(gid, day, "c", refused)
	take(gid, day, "a", retry) // nothing to refund if it fails
	take(gid, day+1, "c", charged)
	take(gid+1, day, "c", charged)
	if err := q.Refund(ctx, gid, day, "b"); err != nil {
		t.Fatal(err)
	}
	take(gid, day, "c", charged)
	take(gid, day, "b", refused)
	if err := q.Refund(ctx, gid, day, "never"); err != nil {
		t.Errorf("refund of a key never charged: %v", err)
	}
	ttl, err := rdb.TTL(ctx, prefix+"{42}:20000").Result()
	if err != nil || ttl <= 47*time.Hour || ttl > 48*time.Hour {
		t.Errorf("key TTL %v (%v), want 48h", ttl, err)
	}
}

// TestNewNeedsClient: a Quota without a client is refused.
func TestNewNeedsClient(t *testing.T) {
	if _, err := redisquota.New(redisquota.Config{}); err == nil {
		t.Error("New without a client: no error")
	}
}

func atAll(e *fanout.Engine, gid int64, uid, id string) fanout.SendResult {
	return e.SendWait(context.Background(), fanout.SendRequest{GID: gid, UID: uid, ClientMsgID: id, Kind: store.KindAtAll, Body: []byte(`1`)})
}

// TestClusterAtAllQuota: two nodes share a group's @all quota of 2 a day:
// one @all through each uses it up for both; a retry through the other
// node is answered with its seq; an @all the store refuses (not a
// member) is refunded. Per node, each would take 2.
func TestClusterAtAllQuota(t *testing.T) {
	q, _, _ := sharedQuota(t)
	st, gid := enginetest.OpenGroup(t, "alice", "bob")
	var nodes [2]*fanout.Engine
	for i, id := range []string{"a", "b"} {
		nodes[i] = enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{AtAllPerDay: 2}, Store: st, AtAllQuota: q, NodeID: id, Logger: slog.New(slog.DiscardHandler)})
	}
	a, b := nodes[0], nodes[1]
	if r := atAll(a, gid, "alice", "x1"); r.Err != nil {
		t.Fatalf("first @all on a: %v", r.Err)
	}
	if r := atAll(b, gid, "mallory", "m1"); !errors.Is(r.Err, store.ErrNotMember) {
		t.Fatalf("@all of a non-member: got %v, want not a member", r.Err)
	}
	// The refund runs in the background: the second @all may race it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := atAll(b, gid, "bob", "y1")
		if r.Err == nil {
			break
		}
		if !errors.Is(r.Err, fanout.ErrAtAllQuota) || time.Now().After(deadline) {
			t.Fatalf("second @all on b (the refused one refunded): %v", r.Err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := atAll(a, gid, "alice", "x2"); !errors.Is(r.Err, fanout.ErrAtAllQuota) {
		t.Fatalf("third @all, on a: got %v, want the quota used up", r.Err)
	}
	if r := atAll(a, gid, "bob", "y1"); r.Err != nil || !r.Duplicate {
		t.Fatalf("retry through a of b's @all: got %+v, want its seq", r)
	}
	if r := b.SendWait(context.Background(), fanout.SendRequest{GID: gid, UID: "bob", ClientMsgID: "t", Body: []byte(`1`)}); r.Err != nil {
		t.Fatalf("a text after the quota: %v", r.Err)
	}
}

// TestAtAllQuotaRedisDown: with Redis stopped the node counts @all itself
// (the quota holds per node), the first failure costs at most the call's
// bound, it is logged once, and once Redis is back (after the retry
// period) @all is counted for the cluster again; a retry of an @all the
// node counted alone is still answered with its seq.
func TestAtAllQuotaRedisDown(t *testing.T) {
	srv := redistest.Start(t, 16440)
	// The timeouts fanfared gives its client.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	q, err := redisquota.New(redisquota.Config{Client: rdb, Prefix: "q:"})
	if err != nil {
		t.Fatal(err)
	}
	st, gid := enginetest.OpenGroup(t, "alice")
	var logs enginetest.LogBuffer
	var skew atomic.Int64 // the engine's clock runs ahead of time.Now by this
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{AtAllPerDay: 2}, Store: st, AtAllQuota: q, NodeID: "a", Now: now,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if r := atAll(e, gid, "alice", "1"); r.Err != nil {
		t.Fatal(r.Err)
	}
	srv.Stop()
	start := time.Now()
	for i, id := range []string{"2", "3"} {
		if r := atAll(e, gid, "alice", id); r.Err != nil {
			t.Fatalf("@all %d with Redis down (counted here, 0 so far): %v", i+2, r.Err)
		}
	}
	if d := time.Since(start); d > 400*time.Millisecond {
		t.Errorf("two @all with Redis down took %v: the quota call is bounded by 100 ms and then skipped", d)
	}
	if r := atAll(e, gid, "alice", "4"); !errors.Is(r.Err, fanout.ErrAtAllQuota) {
		t.Fatalf("third @all counted here: got %v, want the quota used up", r.Err)
	}
	if n := logs.Count("@all quota unavailable"); n != 1 {
		t.Errorf("logged the failure %d times, want once", n)
	}
	srv.Start()
	skew.Store(int64(5100 * time.Millisecond)) // past the retry period
	// The restarted server is empty (no persistence): the cluster count
	// starts again from what Redis holds.
	for _, id := range []string{"5", "6"} {
		if r := atAll(e, gid, "alice", id); r.Err != nil {
			t.Fatalf("@all %s with Redis back: %v", id, r.Err)
		}
	}
	if r := atAll(e, gid, "alice", "7"); !errors.Is(r.Err, fanout.ErrAtAllQuota) {
		t.Fatalf("third @all counted in Redis again: got %v, want the quota used up", r.Err)
	}
	if n := logs.Count("@all quota reachable again"); n != 1 {
		t.Errorf("logged the recovery %d times, want once", n)
	}
	if r := atAll(e, gid, "alice", "2"); r.Err != nil || !r.Duplicate {
		t.Fatalf("retry of an @all counted during the outage: got %+v, want its seq", r)
	}
}

// failingStore fails every Append while fail is set.
type failingStore struct {
	store.Store
	fail atomic.Bool
}

func (s *failingStore) Append(ctx context.Context, reqs []store.AppendRequest, res []store.AppendResult) error {
	if s.fail.Load() {
		return errors.New("disk on fire")
	}
	return s.Store.Append(ctx, reqs, res)
}

// TestFailedRetryKeepsCharge: a retry of a stored @all is admitted
// uncharged, so when it fails nothing is given back: the original's charge
// stays, and the day's quota of 1 still refuses a new @all.
func TestFailedRetryKeepsCharge(t *testing.T) {
	q, rdb, prefix := sharedQuota(t)
	st0, gid := enginetest.OpenGroup(t, "alice")
	st := &failingStore{Store: st0}
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{AtAllPerDay: 1}, Store: st, AtAllQuota: q, NodeID: "a", Logger: slog.New(slog.DiscardHandler)})
	if r := atAll(e, gid, "alice", "x1"); r.Err != nil {
		t.Fatal(r.Err)
	}
	st.fail.Store(true)
	if r := atAll(e, gid, "alice", "x1"); !errors.Is(r.Err, fanout.ErrUnavailable) {
		t.Fatalf("retry with the store failing: got %v, want unavailable", r.Err)
	}
	st.fail.Store(false)
	key := prefix + "{" + strconv.FormatInt(gid, 10) + "}:" + strconv.FormatInt(time.Now().Unix()/86400, 10)
	time.Sleep(50 * time.Millisecond) // a refund, were there one, runs in the background
	if n, err := rdb.SCard(t.Context(), key).Result(); err != nil || n != 1 {
		t.Fatalf("the day's set holds %d (%v), want x1's charge", n, err)
	}
	if r := atAll(e, gid, "alice", "x2"); !errors.Is(r.Err, fanout.ErrAtAllQuota) {
		t.Fatalf("a new @all after the failed retry: got %v, want the quota used up", r.Err)
	}
}

// TestDuplicateKeepsSameDayCharge: a charge taken for an @all the store
// finds stored already today stays (it may be the message's only count: a
// retry on another node admitted as charged could have been stored
// first); with a quota of 2, one more @all fits, not two.
func TestDuplicateKeepsSameDayCharge(t *testing.T) {
	q, rdb, prefix := sharedQuota(t)
	st, gid := enginetest.OpenGroup(t, "alice")
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{AtAllPerDay: 2}, Store: st, AtAllQuota: q, NodeID: "a", Logger: slog.New(slog.DiscardHandler)})
	if r := atAll(e, gid, "alice", "x1"); r.Err != nil {
		t.Fatal(r.Err)
	}
	key := prefix + "{" + strconv.FormatInt(gid, 10) + "}:" + strconv.FormatInt(time.Now().Unix()/86400, 10)
	if err := rdb.SRem(t.Context(), key, "alice\x00x1").Err(); err != nil { // its count lost
		t.Fatal(err)
	}
	if r := atAll(e, gid, "alice", "x1"); r.Err != nil || !r.Duplicate {
		t.Fatalf("retry: got %+v, want its seq", r)
	}
	time.Sleep(50 * time.Millisecond) // a refund, were there one, runs in the background
	if r := atAll(e, gid, "alice", "x2"); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := atAll(e, gid, "alice", "x3"); !errors.Is(r.Err, fanout.ErrAtAllQuota) {
		t.Fatalf("third @all of the day: got %v, want the quota used up", r.Err)
	}
}
