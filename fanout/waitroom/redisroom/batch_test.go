package redisroom

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/internal/redistest"
)

func batchBackend(t *testing.T, batch, inflight int) *Backend {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(), PoolSize: 64})
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("Redis at %s (FANFARE_TEST_REDIS_ADDR) unreachable: %v", redistest.Addr(), err)
	}
	var r [6]byte
	rand.Read(r[:])
	prefix := "fanfaretest:" + hex.EncodeToString(r[:]) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if ks, _ := c.Keys(ctx, prefix+"*").Result(); len(ks) > 0 {
			c.Del(ctx, ks...)
		}
		c.Close()
	})
	b, err := New(Config{Client: c, Prefix: prefix, EnterBatch: batch, EnterInFlight: inflight})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEnterBatchesAreSerial: 200 concurrent Enters through one slot go in
// fewer script calls than users, and the replies are those of 200 calls in
// a row: each one's Waiting counts itself and everyone before it (so they
// are 1..200, once each), and a user entered by several of them at once
// is queued once, by exactly one of them.
func TestEnterBatchesAreSerial(t *testing.T) {
	b := batchBackend(t, 64, 1)
	rc := waitroom.RoomConfig{Name: "batch", MaxActive: 10, AdmitRate: 100}.WithDefaults()
	const n = 200
	res := make([]waitroom.EnterResult, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uid := "u" + strconv.Itoa(i)
			if i >= n-20 {
				uid = "same" // 20 Enters of one user
			}
			r, err := b.Enter(t.Context(), &rc, waitroom.EnterRequest{UID: uid, Tier: i % 4, Node: "n1"})
			if err != nil {
				errs <- err
			}
			res[i] = r
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if calls := b.enters.calls.Load(); calls >= n {
		t.Fatalf("%d script calls for %d enters: not batched", calls, n)
	}
	var waiting []int64
	news := 0
	for i, r := range res {
		if i >= n-20 {
			switch r.Status {
			case waitroom.EnterQueued:
				news++
				waiting = append(waiting, r.Waiting)
			case waitroom.EnterExisting:
			default:
				t.Fatalf("enter %d of the same user: status %v", i, r.Status)
			}
			continue
		}
		if r.Status != waitroom.EnterQueued {
			t.Fatalf("enter %d: status %v, want queued", i, r.Status)
		}
		waiting = append(waiting, r.Waiting)
	}
	if news != 1 {
		t.Fatalf("the same user was queued by %d Enters, want 1", news)
	}
	slices.Sort(waiting)
	for i, w := range waiting {
		if w != int64(i+1) {
			t.Fatalf("Waiting replies %v: want 1..%d once each", waiting, n-19)
		}
	}
}

// TestEnterBatchSeesOverdueEntrant: in one script call a new user, then an
// overdue user restored (its join a max wait ago), then another new user:
// the last one counts the overdue user ahead of it, as a call of its own
// would (the overdue list the first user loaded is dropped when the second
// joins it).
func TestEnterBatchSeesOverdueEntrant(t *testing.T) {
	b := batchBackend(t, 64, 1)
	rc := waitroom.RoomConfig{Name: "overdue", MaxActive: 10, AdmitRate: 100}.WithDefaults()
	old := strconv.FormatInt(time.Now().Add(-rc.MaxWait-time.Minute).Unix(), 10)
	user := func(uid, mode, join, bias string) []any {
		return []any{uid, "0", "0", mode, join, "0", bias, "0", "0", "", "0.5"}
	}
	a := args(&rc)
	a = append(a, user("a", "", "0", "0")...)
	// a key above everyone's: only the overdue count puts it ahead of c
	a = append(a, user("late", "w", old, "1000000")...)
	a = append(a, user("c", "", "0", "0")...)
	v, err := enterScript.Run(t.Context(), b.c, b.keys(&rc), a...).Result()
	if err != nil {
		t.Fatal(err)
	}
	r := toSlice(v)
	if len(r) != 3 {
		t.Fatalf("%d replies, want 3", len(r))
	}
	ahead := func(i int) int64 { return toInt(toSlice(r[i])[3]) }
	if ahead(0) != 0 || ahead(1) != 0 {
		t.Fatalf("ahead of a %d, of the overdue user %d: want 0 0", ahead(0), ahead(1))
	}
	// c ties with a (same second, same score) and sorts after it; the
	// overdue user goes before both, though its key is higher.
	if got := ahead(2); got != 2 {
		t.Fatalf("ahead of c = %d, want 2 (a and the overdue user)", got)
	}
	s, err := b.Snapshot(t.Context(), &rc, []string{"c"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Positions[0].Ahead != 2 {
		t.Fatalf("snapshot: ahead of c = %d, want 2", s.Positions[0].Ahead)
	}
}

// TestEnterCallerDeadline: an Enter waiting behind a slow call returns its
// own context's error at its deadline, and the queue still serves the
// Enters after it.
func TestEnterCallerDeadline(t *testing.T) {
	b := batchBackend(t, 64, 1)
	rc := waitroom.RoomConfig{Name: "deadline", MaxActive: 10, AdmitRate: 100}.WithDefaults()
	ctx, cancel := context.WithTimeout(t.Context(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	if _, err := b.Enter(ctx, &rc, waitroom.EnterRequest{UID: "late"}); err == nil {
		t.Fatal("an Enter past its deadline succeeded")
	}
	for i := range 3 {
		r, err := b.Enter(t.Context(), &rc, waitroom.EnterRequest{UID: fmt.Sprintf("u%d", i)})
		if err != nil || r.Status == waitroom.EnterRejected {
			t.Fatalf("enter after a timed-out one: %+v %v", r, err)
		}
	}
	b.enters.mu.Lock()
	lanes := len(b.enters.lanes)
	b.enters.mu.Unlock()
	if lanes != 0 {
		t.Fatalf("%d lanes left after every Enter returned", lanes)
	}
}

// TestEnterBatchBounds: Config.EnterBatch and EnterInFlight at and past
// their bounds.
func TestEnterBatchBounds(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	defer c.Close()
	for _, tc := range []struct {
		batch, inflight int
		ok              bool
	}{{0, 0, true}, {1, 1, true}, {MaxEnterBatch, MaxEnterInFlight, true}, {-1, 0, false},
		{MaxEnterBatch + 1, 0, false}, {0, -1, false}, {0, MaxEnterInFlight + 1, false}} {
		_, err := New(Config{Client: c, EnterBatch: tc.batch, EnterInFlight: tc.inflight})
		if (err == nil) != tc.ok {
			t.Errorf("EnterBatch %d EnterInFlight %d: err %v, want ok %v", tc.batch, tc.inflight, err, tc.ok)
		}
	}
}
