package redisjournal_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/fanout/hooks/redisjournal"
)

func client(t *testing.T) *redis.Client {
	t.Helper()
	addr := os.Getenv("FANFARE_TEST_REDIS_ADDR")
	if addr == "" {
		t.Fatal("FANFARE_TEST_REDIS_ADDR is not set (make test sets it)")
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

func prefix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "t" + hex.EncodeToString(b) + ":hooks:"
}

// TestJournal: two nodes append; one holds the lease and reads, the
// other reads nothing and cannot ack; entries younger than the reorder
// window wait; the capacity holds; an ack trims; a released lease passes
// to the other node, which reads from the cursor.
func TestJournal(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	p := prefix()
	cfg := redisjournal.Config{Client: rdb, Prefix: p, Capacity: 4, Reorder: 2 * time.Second, LeaseTTL: 5 * time.Second}
	cfg.Node = "a"
	a, err := redisjournal.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Node = "b"
	b, _ := redisjournal.New(cfg)
	t.Cleanup(func() {
		for _, k := range []string{"stream", "cursor", "lease"} {
			rdb.Del(ctx, "{"+p+"}"+k)
		}
	})
	if err := a.Append(ctx, [][]byte{[]byte("1"), []byte("2")}); err != nil {
		t.Fatal(err)
	}
	if err := b.Append(ctx, [][]byte{[]byte("3")}); err != nil {
		t.Fatal(err)
	}
	if err := b.Append(ctx, [][]byte{[]byte("4"), []byte("5")}); !errors.Is(err, hooks.ErrFull) {
		t.Fatalf("past capacity: %v", err)
	}
	if recs, err := a.Read(ctx, 10); err != nil || len(recs) != 0 {
		t.Fatalf("entries younger than the reorder window read: %v %v", recs, err)
	}
	if recs, _ := b.Read(ctx, 10); len(recs) != 0 {
		t.Fatalf("the node without the lease read %v", recs)
	}
	var recs []hooks.Record
	deadline := time.Now().Add(15 * time.Second)
	for len(recs) < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		recs, err = a.Read(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(recs) != 3 || string(recs[0].Data) != "1" || string(recs[2].Data) != "3" {
		t.Fatalf("read: %+v", recs)
	}
	if err := b.Ack(ctx, recs[0].ID); !errors.Is(err, hooks.ErrNotDeliverer) {
		t.Fatalf("ack without the lease: %v", err)
	}
	if err := a.Ack(ctx, recs[1].ID); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.Pending(ctx); n != 1 {
		t.Fatalf("pending after ack: %d, want 1", n)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := b.Read(ctx, 10)
	if err != nil || len(got) != 1 || got[0].ID != recs[2].ID {
		t.Fatalf("after the lease passed: %+v %v", got, err)
	}
	if got, _ := a.Read(ctx, 10); len(got) != 0 {
		t.Fatalf("the old holder still reads: %+v", got)
	}
}
