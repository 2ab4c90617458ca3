package redisroom_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/redisroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/waitroomtest"
	"github.com/fanfare-im/fanfare/internal/redistest"
)

// testClient connects to the test Redis; an unreachable Redis fails the
// test, never skips it.
func testClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(), PoolSize: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s (FANFARE_TEST_REDIS_ADDR) unreachable: %v", redistest.Addr(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testPrefix returns a random key prefix and deletes its keys at cleanup.
func testPrefix(t testing.TB, c *redis.Client) string {
	var b [6]byte
	rand.Read(b[:])
	p := "fanfaretest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() { deletePrefix(c, p) })
	return p
}

func deletePrefix(c *redis.Client, p string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, p+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			c.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Unlink(ctx, batch...)
	}
}

func newBackend(t testing.TB, c *redis.Client) *redisroom.Backend {
	b, err := redisroom.New(redisroom.Config{Client: c, Prefix: testPrefix(t, c)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRedisConformance(t *testing.T) {
	c := testClient(t)
	waitroomtest.Run(t, func(t *testing.T) waitroomtest.Harness {
		return waitroomtest.Harness{Backend: newBackend(t, c), Sleep: time.Sleep}
	})
}

// TestTierCountsRecountedOnce: a room written before the per-tier counts
// existed (no w0..w3, wt in its st hash) is recounted by the first script
// that reads or changes them, and kept from then on.
func TestTierCountsRecountedOnce(t *testing.T) {
	c := testClient(t)
	p := testPrefix(t, c)
	b, err := redisroom.New(redisroom.Config{Client: c, Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	cfg := waitroom.RoomConfig{Name: "old", MaxActive: 100, AdmitRate: 100, Smoothing: -1, Shards: 2}.WithDefaults()
	ctx := t.Context()
	for i := range 10 {
		if _, err := b.Enter(ctx, &cfg, waitroom.EnterRequest{UID: fmt.Sprintf("u%d", i), Tier: i % 4}); err != nil {
			t.Fatal(err)
		}
	}
	st := p + "{room:old}:st"
	forget := func() {
		t.Helper()
		if err := c.HDel(ctx, st, "w0", "w1", "w2", "w3", "wt").Err(); err != nil {
			t.Fatal(err)
		}
	}
	want := func(step string, w [waitroom.MaxTier + 1]int64) {
		t.Helper()
		s, err := b.Snapshot(ctx, &cfg, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if s.WaitingByTier != w {
			t.Fatalf("%s: waiting by tier %v, want %v", step, s.WaitingByTier, w)
		}
	}
	forget()
	want("recounted by a snapshot", [waitroom.MaxTier + 1]int64{3, 3, 2, 2})
	forget()
	if _, err := b.Leave(ctx, &cfg, "u1"); err != nil { // recount, then the change
		t.Fatal(err)
	}
	want("recounted by a leave", [waitroom.MaxTier + 1]int64{3, 2, 2, 2})
	forget()
	if _, err := b.Enter(ctx, &cfg, waitroom.EnterRequest{UID: "new", Tier: 3}); err != nil {
		t.Fatal(err)
	}
	want("recounted by an enter", [waitroom.MaxTier + 1]int64{3, 2, 2, 3})
	if n, err := c.HGet(ctx, st, "wt").Result(); err != nil || n != "1" {
		t.Fatalf("wt after the recount: %q, %v, want 1", n, err)
	}
}

// TestStaleJVMemberDropped: a jv member that is no longer a waiting VIP
// (left by a node of an older release, whose unqueue did not know jv) does
// not turn the quota off: Admit drops it and puts the normal user who came
// before the waiting VIP in its place (review finding 3).
func TestStaleJVMemberDropped(t *testing.T) {
	c := testClient(t)
	p := testPrefix(t, c)
	b, err := redisroom.New(redisroom.Config{Client: c, Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	cfg := waitroom.RoomConfig{Name: "jv", MaxActive: 100, AdmitRate: 100, Smoothing: -1, VIPAdmitShare: 0.5}.WithDefaults()
	ctx := t.Context()
	for _, e := range []struct {
		uid  string
		tier int
	}{{"n1", 0}, {"v1", 3}, {"v2", 3}} {
		if _, err := b.Enter(ctx, &cfg, waitroom.EnterRequest{UID: e.uid, Tier: e.tier}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ZAdd(ctx, p+"{room:jv}:jv", redis.Z{Score: 0, Member: "ghost"}).Err(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 2 {
		r, err := b.Admit(ctx, &cfg, waitroom.AdmitRequest{Max: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range r.Admitted {
			got = append(got, a.UID)
		}
	}
	if len(got) != 2 || got[0] != "v1" || got[1] != "n1" {
		t.Fatalf("admitted %v, want [v1 n1] (the quota's turn for n1)", got)
	}
	if n, err := c.ZScore(ctx, p+"{room:jv}:jv", "ghost").Result(); err != redis.Nil {
		t.Fatalf("ghost still in jv: %v, %v", n, err)
	}
}
