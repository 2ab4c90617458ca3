package redispresence

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/presence"
)

func occupancy(t *testing.T, v *View, qs ...presence.OccupancyQuery) []presence.Occupancy {
	t.Helper()
	got, err := v.Occupancy(t.Context(), qs, nil)
	if err != nil {
		t.Fatalf("%s: Occupancy: %v", v.NodeID(), err)
	}
	if len(got) != len(qs) {
		t.Fatalf("%d answers for %d queries", len(got), len(qs))
	}
	return got
}

// TestOccupancy: counts are the distinct members online on the live nodes;
// rosters are the union of the nodes' published rosters, a node's own
// included before its bitmaps are flushed; a withdrawn roster and the
// roster of a node gone from the view are not answered (and the dead
// node's field is pruned).
func TestOccupancy(t *testing.T) {
	rdb := sharedRedis(t)
	prefix := testPrefix(t, rdb)
	la, lb := newLocal(t), newLocal(t)
	a := newView(t, rdb, la, Config{NodeID: "a", Prefix: prefix, Batch: 2}) // Batch 2: several pipelines
	b := newView(t, rdb, lb, Config{NodeID: "b", Prefix: prefix, Batch: 2})
	const large, small = 10, 20
	for i, c := range []struct {
		l   *presence.Local[int]
		uid string
		ord uint32
	}{{la, "u1", 1}, {la, "u2", 2}, {lb, "u2", 2}, {lb, "u3", 3}} {
		if err := c.l.Connect(c.uid, i+1, []presence.Membership{m(large, c.ord), m(small, c.ord)}); err != nil {
			t.Fatal(err)
		}
	}
	mustFlush(t, a, b)

	got := occupancy(t, a,
		presence.OccupancyQuery{GID: large},
		presence.OccupancyQuery{GID: small, Roster: true, Publish: true, UIDs: []string{"u1", "u2"}},
		presence.OccupancyQuery{GID: 30}) // nobody online anywhere
	if got[0].Count != 3 || got[2].Count != 0 {
		t.Fatalf("counts: got %d and %d, want 3 (u2 on both nodes once) and 0", got[0].Count, got[2].Count)
	}
	if !slices.Equal(got[1].UIDs, []string{"u1", "u2"}) || got[1].Count != 2 {
		t.Fatalf("roster of a alone: %+v", got[1])
	}
	got = occupancy(t, b, presence.OccupancyQuery{GID: small, Roster: true, Publish: true, UIDs: []string{"u2", "u3"}})
	if !slices.Equal(got[0].UIDs, []string{"u1", "u2", "u3"}) || got[0].Count != 3 {
		t.Fatalf("union: %+v", got[0])
	}
	// A read without publishing leaves the node's roster as it was.
	if got := occupancy(t, a, presence.OccupancyQuery{GID: small, Roster: true}); !slices.Equal(got[0].UIDs, []string{"u1", "u2", "u3"}) {
		t.Fatalf("read: %+v", got[0])
	}
	// a withdraws its roster.
	if got := occupancy(t, a, presence.OccupancyQuery{GID: small, Roster: true, Publish: true}); !slices.Equal(got[0].UIDs, []string{"u2", "u3"}) {
		t.Fatalf("after a withdrew: %+v", got[0])
	}
	// b leaves the view (its members all went offline and it flushed):
	// its roster field is no longer answered, and is pruned.
	if err := b.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := occupancy(t, a, presence.OccupancyQuery{GID: small, Roster: true}); len(got[0].UIDs) != 0 {
		t.Fatalf("after b left the view: %+v", got[0])
	}
	if n, err := rdb.HLen(t.Context(), a.tag(small)+"r").Result(); err != nil || n != 0 {
		t.Fatalf("roster fields left: %d %v", n, err)
	}
	if got := occupancy(t, a, presence.OccupancyQuery{GID: large}); got[0].Count != 2 {
		t.Fatalf("count after b left: %d, want 2", got[0].Count)
	}
}

// TestOccupancyScriptFlushed: after Redis lost its scripts the call loads
// the script again; with Redis unreachable it fails with ErrUnavailable.
func TestOccupancyScriptFlushed(t *testing.T) {
	// A server of its own: SCRIPT FLUSH on the shared one would hit other
	// tests' scripts.
	srv := redistest.Start(t, 16403)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	v := newView(t, rdb, newLocal(t), Config{NodeID: "a", Prefix: "occ:"})
	occupancy(t, v, presence.OccupancyQuery{GID: 1})
	if err := rdb.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	occupancy(t, v, presence.OccupancyQuery{GID: 1}, presence.OccupancyQuery{GID: 2, Roster: true})

	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer down.Close()
	dv := newView(t, down, newLocal(t), Config{NodeID: "a", Prefix: "x:"})
	if _, err := dv.Occupancy(context.Background(), []presence.OccupancyQuery{{GID: 1}}, nil); !errors.Is(err, presence.ErrUnavailable) {
		t.Fatalf("Redis down: got %v, want ErrUnavailable", err)
	}
}
