package storetest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/fanfare-im/fanfare/store"
)

// feedKey names one membership of the feed of additions.
type feedKey struct {
	gid int64
	uid string
}

// readFeed reads the feed from c with pages of limit until a page comes
// back short (caught up), adds what it read to seen and returns the
// cursor to go on from. It fails past 1,000 pages.
func readFeed(t *testing.T, s store.Store, c store.AddedCursor, limit int, seen map[feedKey]store.Member) store.AddedCursor {
	t.Helper()
	for range 1000 {
		ms, next, err := s.MembersAdded(t.Context(), c, limit)
		if err != nil {
			t.Fatalf("MembersAdded: %v", err)
		}
		if !next.Set {
			t.Fatalf("MembersAdded returned a cursor that is not set: %+v", next)
		}
		if len(ms) > limit {
			t.Fatalf("MembersAdded(limit %d) returned %d members", limit, len(ms))
		}
		for _, m := range ms {
			seen[feedKey{m.GID, m.UID}] = m
		}
		c = next
		if len(ms) < limit {
			return c
		}
	}
	t.Fatalf("MembersAdded: not caught up after 1000 pages of %d", limit)
	return c
}

// testMembersAdded: the feed returns every membership added after the
// cursor, in any group, as it is stored now, once paged through at any
// limit; nothing that was removed before the read; members already there
// (AddMembers of a member) add nothing; the zero cursor returns nobody.
func testMembersAdded(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g1 := newGroup(t, s, "owner", "old")
	start, next, err := s.MembersAdded(ctx, store.AddedCursor{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(start) != 0 || !next.Set {
		t.Fatalf("MembersAdded(zero cursor): got %d members and cursor %+v, want none and a set cursor", len(start), next)
	}
	from := next
	g2 := newGroup(t, s, "owner")
	if _, err := s.AddMembers(ctx, g1.GID, []string{"a", "b", "old"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMembers(ctx, g2.GID, []string{"c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMembers(ctx, g2.GID, []string{"gone"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RemoveMember(ctx, g2.GID, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetMemberMuted(ctx, g1.GID, "b", true); err != nil { // a rewrite of the row keeps it in the feed
		t.Fatal(err)
	}
	want := map[feedKey]bool{{g1.GID, "a"}: true, {g1.GID, "b"}: true, {g2.GID, "c"}: true}
	for _, limit := range []int{1, 2, 100} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			seen := map[feedKey]store.Member{}
			readFeed(t, s, from, limit, seen)
			for k := range want {
				m, ok := seen[k]
				if !ok {
					t.Errorf("feed from the cursor: %v missing (got %v)", k, keys(seen))
					continue
				}
				cur, err := s.Member(ctx, k.gid, k.uid)
				if err != nil {
					t.Fatal(err)
				}
				if m.Ordinal != cur.Ordinal || m.JoinSeq != cur.JoinSeq || m.Role != cur.Role || m.Muted != cur.Muted {
					t.Errorf("feed: %v is %+v, the store has %+v", k, m, cur)
				}
			}
			if _, ok := seen[feedKey{g2.GID, "gone"}]; ok {
				t.Errorf("feed: gone returned, but it was removed before the read")
			}
		})
	}

	// A member removed and added again comes back as it is now; a read
	// from a caught-up cursor returns it and nothing removed.
	seen := map[feedKey]store.Member{}
	caught := readFeed(t, s, from, 100, seen)
	if _, err := s.RemoveMember(ctx, g1.GID, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMembers(ctx, g1.GID, []string{"x"}); err != nil { // takes a's ordinal
		t.Fatal(err)
	}
	again, err := s.AddMembers(ctx, g1.GID, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	seen = map[feedKey]store.Member{}
	readFeed(t, s, caught, 100, seen)
	if m, ok := seen[feedKey{g1.GID, "a"}]; !ok || m.Ordinal != again[0].Ordinal || m.JoinSeq != again[0].JoinSeq {
		t.Errorf("feed after a's removal and return: got %+v (found %v), want ordinal %d join_seq %d", m, ok, again[0].Ordinal, again[0].JoinSeq)
	}
	if _, ok := seen[feedKey{g1.GID, "x"}]; !ok {
		t.Errorf("feed after x's addition: x missing (got %v)", keys(seen))
	}

	_, _, err = s.MembersAdded(ctx, caught, 0)
	wantIs(t, "MembersAdded(limit 0)", err, store.ErrBadRequest)

	// A limit above Limits.MaxAddMembers is lowered to it.
	ls := su.withLimits(t, store.Limits{MaxAddMembers: 2})
	g := newGroup(t, ls, "owner")
	_, c, err := ls.MembersAdded(ctx, store.AddedCursor{}, 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"p", "q", "r"} {
		if _, err := ls.AddMembers(ctx, g.GID, []string{u}); err != nil {
			t.Fatal(err)
		}
	}
	ms, _, err := ls.MembersAdded(ctx, c, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Errorf("MembersAdded(limit 100) with MaxAddMembers 2 and 3 additions: got %d members, want 2", len(ms))
	}
}

func keys(m map[feedKey]store.Member) []feedKey {
	out := make([]feedKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// testConcurrentMembersAdded: additions committed on two handles at once,
// while a reader follows the feed in small pages, all reach the reader
// once it has caught up: none is skipped, whatever order the writers'
// transactions commit in.
func testConcurrentMembersAdded(t *testing.T, su *suite) {
	a, b := su.two(t)
	ctx := t.Context()
	var gids []int64
	for range 4 {
		gids = append(gids, newGroup(t, a, "owner").GID)
	}
	_, c, err := a.MembersAdded(ctx, store.AddedCursor{}, 7)
	if err != nil {
		t.Fatal(err)
	}
	const perWriter = 60
	want := map[feedKey]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w, s := range []store.Store{a, b} {
		uids := make([]string, perWriter)
		for i := range uids {
			uids[i] = fmt.Sprintf("w%d-%d", w, i)
			want[feedKey{gids[i%len(gids)], uids[i]}] = true
		}
		wg.Go(func() {
			for i, u := range uids {
				if _, err := s.AddMembers(ctx, gids[i%len(gids)], []string{u}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	seen := map[feedKey]store.Member{}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		c = readFeed(t, b, c, 7, seen)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	readFeed(t, b, c, 7, seen) // caught up after the last commit
	for k := range want {
		if _, ok := seen[k]; !ok {
			t.Errorf("feed: %v missing", k)
		}
	}
}
