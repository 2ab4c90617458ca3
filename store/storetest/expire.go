package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// testExpireMessages: the oldest messages created before the cutoff go, at
// most limit per call, in seq order; newer ones and last_seq stay; range
// reads start at the oldest message left; a retry of an expired message
// is stored anew; other groups are untouched.
func testExpireMessages(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a")
	other := newGroup(t, s, "o", "a")
	sendN(t, s, g.GID, "a", 4)
	sendN(t, s, other.GID, "a", 2)
	time.Sleep(20 * time.Millisecond)
	cut := time.Now()
	time.Sleep(20 * time.Millisecond)
	sendN(t, s, g.GID, "a", 2) // seqs 5, 6: after the cutoff

	before, _ := readAll(t, s, g.GID, "a")
	id1, id5 := before[0].ClientMsgID, before[4].ClientMsgID
	if n, err := s.ExpireMessages(ctx, g.GID, cut, 3); err != nil || n != 3 {
		t.Fatalf("expire with limit 3: got %d %v, want 3", n, err)
	}
	if n, err := s.ExpireMessages(ctx, g.GID, cut, 100); err != nil || n != 1 {
		t.Fatalf("expire the rest: got %d %v, want 1", n, err)
	}
	if n, err := s.ExpireMessages(ctx, g.GID, cut, 100); err != nil || n != 0 {
		t.Fatalf("expire again: got %d %v, want 0", n, err)
	}
	for _, tc := range []struct {
		from, to int64
		limit    int
		want     []int64
	}{
		{0, 0, 0, []int64{5, 6}},
		{1, 0, 0, []int64{5, 6}},
		{1, 0, 1, []int64{5}}, // the first limit left, not seqs 1..limit
		{2, 4, 0, nil},
		{3, 5, 0, []int64{5}},
		{6, 0, 0, []int64{6}},
	} {
		msgs, last, err := s.Messages(ctx, g.GID, "a", tc.from, tc.to, tc.limit, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, m := range msgs {
			got = append(got, m.Seq)
		}
		if last != 6 || !slices.Equal(got, tc.want) {
			t.Errorf("Messages(%d, %d, limit %d): got %v last_seq %d, want %v last_seq 6", tc.from, tc.to, tc.limit, got, last, tc.want)
		}
	}
	// A retry of an expired message is a new message; of a kept one, not.
	res := appendAll(t, s, req(g.GID, "a", id1), req(g.GID, "a", id5))
	if res[0].Duplicate || res[0].Seq != 7 || !res[1].Duplicate || res[1].Seq != 5 {
		t.Errorf("retries after expiry: got %+v, want seq 1's id stored anew as 7 and seq 5's answered with 5", res)
	}
	if msgs, last := readAll(t, s, other.GID, "a"); len(msgs) != 2 || last != 2 {
		t.Errorf("other group: got %d messages last_seq %d, want 2 and 2", len(msgs), last)
	}
	if n, err := s.ExpireMessages(ctx, 1<<40, cut, 10); err != nil || n != 0 {
		t.Errorf("unknown group: got %d %v, want 0, nil", n, err)
	}
	if _, err := s.ExpireMessages(ctx, g.GID, cut, 0); !errors.Is(err, store.ErrBadRequest) {
		t.Errorf("limit 0: got %v, want ErrBadRequest", err)
	}
}

// testGroupIDs: a walk in pages visits every group once, ascending.
func testGroupIDs(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	var want []int64
	for range 5 {
		want = append(want, newGroup(t, s, "o").GID)
	}
	var got []int64
	after := int64(0)
	for {
		page, err := s.GroupIDs(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 2 {
			t.Fatalf("page of %d, limit 2", len(page))
		}
		if len(page) == 0 {
			break
		}
		got = append(got, page...)
		after = page[len(page)-1]
	}
	// The database may hold other tests' groups: ours must all be there,
	// in order, once.
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Fatalf("walk not ascending or repeats: %v", got)
	}
	for _, gid := range want {
		if !slices.Contains(got, gid) {
			t.Errorf("group %d missing from the walk", gid)
		}
	}
	if _, err := s.GroupIDs(ctx, 0, 0); !errors.Is(err, store.ErrBadRequest) {
		t.Errorf("limit 0: got %v, want ErrBadRequest", err)
	}
}
