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

// TestRecentJoiners: a push sees the joiners above its lowest seq; a
// joiner leaves its group's set joinerGrace after a push reached its
// join_seq, and the set leaves the engine when it empties (a later join
// makes a new one).
func TestRecentJoiners(t *testing.T) {
	e := testEngine(t, &fakeClock{t: time.Unix(10_000, 0)}, Config{})
	const gid int64 = 7
	e.addJoiner(gid, "old", 3)
	e.addJoiner(gid, "new", 9)
	e.addJoiner(gid, "new", 5) // never lowered
	e.addJoiner(gid, "none", 0)
	load := func() *joiners {
		v, ok := e.joiners.Load(gid)
		if !ok {
			return nil
		}
		return v.(*joiners)
	}
	uids := func(rel []joiner) []string {
		var out []string
		for _, j := range rel {
			out = append(out, fmt.Sprintf("%s@%d", j.uid, j.seq))
		}
		return out
	}
	now := int64(time.Hour)
	if got := uids(e.recent(nil, gid, load(), 6, 8, now)); !slices.Equal(got, []string{"new@9"}) {
		t.Errorf("joiners above 6: got %v, want [new@9]", got)
	}
	if got := uids(e.recent(nil, gid, load(), 1, 8, now+int64(joinerGrace)/2)); !slices.Equal(got, []string{"new@9", "old@3"}) {
		t.Errorf("joiners above 1: got %v, want [new@9 old@3] (a late batch; sorted by uid)", got)
	}
	// old was reached at now: gone after the grace; new is reached now.
	if got := uids(e.recent(nil, gid, load(), 10, 10, now+int64(joinerGrace)+1)); got != nil {
		t.Errorf("joiners above 10: got %v, want none", got)
	}
	if js := load(); js == nil || len(js.m) != 1 || js.m["new"].uid != "new" {
		t.Fatalf("after old's grace: got %+v, want new alone", js)
	}
	js := load()
	_ = e.recent(nil, gid, js, 10, 10, now+2*int64(joinerGrace)+2)
	if load() != nil || !js.dead {
		t.Fatalf("the emptied set is still in the engine")
	}
	e.addJoiner(gid, "later", 12)
	if got := load(); got == nil || got == js || len(got.m) != 1 {
		t.Errorf("a join after the set emptied: got %+v, want a new set with it", got)
	}
}

// TestRecentJoinersFastPath: a push none of whose seqs a joiner's
// join_seq is above costs no walk of the set (a re-read makes every member
// online here a joiner) until joinerSweep has passed; the walk then drops
// the expired ones, and joinSeqOf finds each joiner of a large set.
func TestRecentJoinersFastPath(t *testing.T) {
	e := testEngine(t, &fakeClock{t: time.Unix(10_000, 0)}, Config{})
	const gid int64 = 8
	const n = 5000
	for i := range n {
		e.addJoiner(gid, fmt.Sprintf("u%05d", i), int64(1+i%100))
	}
	v, _ := e.joiners.Load(gid)
	js := v.(*joiners)
	now := int64(time.Hour)
	if got := e.recent(nil, gid, js, 50, 200, now); len(got) != n/100*50 {
		t.Fatalf("joiners above 50: got %d, want %d", len(got), n/100*50)
	} else {
		for _, j := range got {
			if joinSeqOf(got, j.uid) != j.seq {
				t.Fatalf("joinSeqOf(%s) = %d, want %d", j.uid, joinSeqOf(got, j.uid), j.seq)
			}
		}
		if joinSeqOf(got, "u00000") != 0 {
			t.Fatalf("joinSeqOf of a joiner at or below the push's seqs is not 0")
		}
	}
	// Every joiner was reached at now. Past the grace but within a sweep
	// interval of the last walk, a push above all of them does not walk.
	later := now + int64(joinerGrace) + 1
	js.sweptAt = later
	if got := e.recent(nil, gid, js, 300, 300, later+int64(joinerSweep)-1); got != nil || len(js.m) != n {
		t.Fatalf("fast path: got %d joiners, %d in the set, want 0 and %d (no walk)", len(got), len(js.m), n)
	}
	if got := e.recent(nil, gid, js, 300, 300, later+int64(joinerSweep)); got != nil || len(js.m) != 0 || !js.dead {
		t.Fatalf("sweep: got %d joiners, %d left in the set, dead %v, want the set dropped", len(got), len(js.m), js.dead)
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
