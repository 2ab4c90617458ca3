package fanout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

func TestCutBelow(t *testing.T) {
	for _, tt := range []struct {
		seqs  []int64
		floor int64
		want  []int64
		same  bool // the input is left as it was
	}{
		{[]int64{5, 6, 7}, 5, []int64{5, 6, 7}, true},
		{[]int64{3, 4, 5, 6}, 5, []int64{5, 6}, true}, // a prefix: subslice
		{[]int64{3, 4}, 5, []int64{}, true},
		{[]int64{7, 3, 8, 4}, 5, []int64{7, 8}, false}, // a window of several nodes' batches
		{[]int64{3, 7, 4, 8}, 5, []int64{7, 8}, false},
		{nil, 5, []int64{}, true},
	} {
		msgs := make([]store.Message, len(tt.seqs))
		for i, s := range tt.seqs {
			msgs[i] = store.Message{Seq: s}
		}
		orig := slices.Clone(msgs)
		got := []int64{}
		for _, m := range cutBelow(msgs, tt.floor) {
			got = append(got, m.Seq)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("cutBelow(%v, %d) = %v, want %v", tt.seqs, tt.floor, got, tt.want)
		}
		if tt.same && !slices.EqualFunc(msgs, orig, func(a, b store.Message) bool { return a.Seq == b.Seq }) {
			t.Errorf("cutBelow(%v, %d) modified its input: %v", tt.seqs, tt.floor, msgs)
		}
	}
}

func TestAboveFloor(t *testing.T) {
	m := func(seqs ...int64) []store.Message {
		var out []store.Message
		for _, s := range seqs {
			out = append(out, store.Message{Seq: s})
		}
		return out
	}
	for _, tt := range []struct {
		name      string
		kind      PushKind
		msgs      []store.Message
		count     int
		last      int64
		wantCount int
		wantLast  int64
	}{
		{"batch above", PushBatch, m(5, 6), 2, 6, 2, 6},
		{"batch straddling", PushBatch, m(9, 4, 6), 3, 6, 2, 9},
		{"batch below", PushBatch, m(3, 4), 2, 4, 0, 0},
		{"msgs prefix", PushMsgs, m(4, 5, 6), 3, 6, 2, 6},
		{"summary above", PushSummary, m(5), 7, 11, 7, 11},
		{"summary first below", PushSummary, m(4), 7, 11, 0, 0},
	} {
		_, count, last := aboveFloor(tt.kind, tt.msgs, tt.count, tt.last, 5)
		if count != tt.wantCount || (count > 0 && last != tt.wantLast) {
			t.Errorf("%s: got count %d last %d, want %d, %d", tt.name, count, last, tt.wantCount, tt.wantLast)
		}
	}
}

func TestRaiseFloorNeverLowers(t *testing.T) {
	e := testEngine(t, &fakeClock{t: time.Unix(10_000, 0)}, Config{})
	const gid = 1 << 40 // not one of the small integers boxed without allocating
	for _, s := range []int64{5, 3, 9, 0, 7} {
		e.raiseFloor(gid, s)
	}
	if got := e.joinFloor(gid); got != 9 {
		t.Errorf("floor: got %d, want 9", got)
	}
	if got := e.joinFloor(gid + 1); got != 0 {
		t.Errorf("floor of a group without one: got %d, want 0", got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = e.joinFloor(gid) }); n != 0 {
		t.Errorf("joinFloor allocates %v times per push", n)
	}
}

// countingMembers counts Member lookups.
type countingMembers struct {
	store.Store
	n int
}

func (s *countingMembers) Member(ctx context.Context, gid int64, uid string) (store.Member, error) {
	s.n++
	return s.Store.Member(ctx, gid, uid)
}

// TestSenderCacheBounds: the cache of a group holds at most MemberCache
// senders, an answer is used for MemberCacheTTL and asked again after it.
func TestSenderCacheBounds(t *testing.T) {
	clk := &fakeClock{t: time.Unix(10_000, 0)}
	e := testEngine(t, clk, Config{MemberCache: 2, MemberCacheTTL: time.Second})
	st := &countingMembers{Store: e.st}
	e.st = st
	ctx := context.Background()
	g, err := st.CreateGroup(ctx, store.Group{Name: "g", Owner: "u0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.AddMembers(ctx, g.GID, []string{"u0", "u1", "u2"}); err != nil {
		t.Fatal(err)
	}
	s := e.shards[0]
	s.tn = e.tune.Load()
	gs := s.newGroup(g.GID, clk.now())
	check := func(uid string) error {
		return s.checkSender(gs, &task{send: SendRequest{GID: g.GID, UID: uid}}, clk.now())
	}
	for i := range 3 {
		if err := check(fmt.Sprint("u", i)); err != nil {
			t.Fatalf("u%d: %v", i, err)
		}
		if len(gs.senders) > 2 {
			t.Fatalf("cache holds %d senders, bound 2", len(gs.senders))
		}
	}
	if st.n != 3 {
		t.Fatalf("lookups: got %d, want 3", st.n)
	}
	if err := check("x"); !errors.Is(err, store.ErrNotMember) {
		t.Fatalf("x: got %v, want ErrNotMember", err)
	}
	if _, err := st.AddMembers(ctx, g.GID, []string{"x"}); err != nil { // behind the engine's back
		t.Fatal(err)
	}
	clk.advance(999 * time.Millisecond)
	if err := check("x"); !errors.Is(err, store.ErrNotMember) {
		t.Fatalf("x within the TTL: got %v, want the remembered ErrNotMember", err)
	}
	clk.advance(time.Millisecond)
	if err := check("x"); err != nil {
		t.Fatalf("x after the TTL: got %v, want nil (asked again)", err)
	}
	if st.n != 5 {
		t.Errorf("lookups: got %d, want 5", st.n)
	}
}
