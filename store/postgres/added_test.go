package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fanfare-im/fanfare/store"
)

// TestMembersAddedLateCommit: an addition made by a transaction that
// began before another one and commits after the feed has read that
// other one's is still returned by the next read. Transaction ids are
// handed out at the first write, not at commit, so a feed resuming after
// the largest id it read would skip it; the feed resumes from the oldest
// transaction still running when its pass began.
func TestMembersAddedLateCommit(t *testing.T) {
	s := openTest(t, newSchema(t), 4)
	ctx := context.Background()
	g, err := s.CreateGroup(ctx, store.Group{Name: "g", Owner: "owner"})
	if err != nil {
		t.Fatal(err)
	}
	_, cur, err := s.MembersAdded(ctx, store.AddedCursor{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	// The slow addition: its row (and transaction id) is written first,
	// its commit comes last.
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO group_members (gid, uid, ordinal, join_seq) VALUES ($1, 'slow', 1000, 1)`, g.GID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMembers(ctx, g.GID, []string{"fast"}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	read := func() {
		t.Helper()
		for range 100 {
			ms, next, err := s.MembersAdded(ctx, cur, 10)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				seen[m.UID] = true
			}
			cur = next
			if len(ms) < 10 {
				return
			}
		}
		t.Fatal("feed not caught up")
	}
	read()
	if !seen["fast"] || seen["slow"] {
		t.Fatalf("feed before the slow commit: got %v, want fast only", seen)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	read()
	if !seen["slow"] {
		t.Errorf("feed after the slow commit: got %v, want slow too (committed after the feed read a later transaction's addition)", seen)
	}
}

// TestMembersAddedRestoredXids: memberships copied from another Postgres
// cluster keep that cluster's transaction ids, far above this one's; the
// feed does not return them (they would come again in every pass, each
// pass starting at this cluster's much lower horizon), only the additions
// this cluster made.
func TestMembersAddedRestoredXids(t *testing.T) {
	s := openTest(t, newSchema(t), 4)
	ctx := context.Background()
	g, err := s.CreateGroup(ctx, store.Group{Name: "g", Owner: "owner"})
	if err != nil {
		t.Fatal(err)
	}
	_, cur, err := s.MembersAdded(ctx, store.AddedCursor{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO group_members (gid, uid, ordinal, join_seq, added_xid)
		VALUES ($1, 'restored', 1000, 1, pg_current_xact_id()::text::bigint + 1000000000)`, g.GID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMembers(ctx, g.GID, []string{"local"}); err != nil {
		t.Fatal(err)
	}
	for pass := range 3 {
		seen := map[string]bool{}
		for {
			ms, next, err := s.MembersAdded(ctx, cur, 10)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				seen[m.UID] = true
			}
			cur = next
			if len(ms) < 10 {
				break
			}
		}
		if seen["restored"] {
			t.Fatalf("pass %d returned the restored membership: %v", pass, seen)
		}
		if pass == 0 && !seen["local"] {
			t.Fatalf("pass 0: got %v, want local", seen)
		}
	}
}

// TestMembersAddedOpenTransaction: a transaction left open (here one
// unrelated to memberships, holding a transaction id like a long report
// that writes or a session idle in transaction) does not make every pass
// read again the additions made since it began: each addition comes back
// in the one pass that first read it. An addition whose
// transaction was running when a pass began and commits between two of
// its pages, behind the page's position, still comes in the next pass.
func TestMembersAddedOpenTransaction(t *testing.T) {
	s := openTest(t, newSchema(t), 6)
	ctx := context.Background()
	g, err := s.CreateGroup(ctx, store.Group{Name: "g", Owner: "owner"})
	if err != nil {
		t.Fatal(err)
	}
	_, cur, err := s.MembersAdded(ctx, store.AddedCursor{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	open, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if _, err := open.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil { // takes a transaction id and keeps it
		t.Fatal(err)
	}
	// pass reads the feed with pages of limit until caught up and returns
	// the uids of the pass, each once per page that returned it.
	pass := func(limit int) map[string]int {
		t.Helper()
		got := map[string]int{}
		for range 100 {
			ms, next, err := s.MembersAdded(ctx, cur, limit)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				got[m.UID]++
			}
			cur = next
			if len(ms) < limit {
				return got
			}
		}
		t.Fatal("feed not caught up")
		return nil
	}
	returned := map[string]int{} // uid -> passes that returned it
	for i := range 6 {
		u := fmt.Sprintf("u%d", i)
		if _, err := s.AddMembers(ctx, g.GID, []string{u}); err != nil {
			t.Fatal(err)
		}
		for uid := range pass(2) {
			returned[uid]++
		}
		if returned[u] == 0 {
			t.Fatalf("pass %d after adding %s: not returned (got %v)", i, u, returned)
		}
	}
	for range 3 { // passes with nothing added
		for uid := range pass(2) {
			returned[uid]++
		}
	}
	for uid, n := range returned {
		if n != 1 {
			t.Errorf("%s returned by %d passes while an unrelated transaction stayed open, want 1", uid, n)
		}
	}

	// A slow addition that began before a pass and commits between its
	// pages, behind the position the pass reached.
	slow, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	if _, err := slow.Exec(ctx, `INSERT INTO group_members (gid, uid, ordinal, join_seq) VALUES ($1, 'slow', 1000, 1)`, g.GID); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"f1", "f2"} {
		if _, err := s.AddMembers(ctx, g.GID, []string{u}); err != nil {
			t.Fatal(err)
		}
	}
	ms, next, err := s.MembersAdded(ctx, cur, 1) // the first page: f1, with slow running
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].UID != "f1" {
		t.Fatalf("first page of the pass: got %v, want f1", ms)
	}
	cur = next
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for uid := range pass(1) { // the rest of this pass, past slow's position
		seen[uid] = true
	}
	for uid := range pass(1) {
		seen[uid] = true
	}
	if !seen["f2"] || !seen["slow"] {
		t.Errorf("after slow committed between two pages: got %v, want f2 and slow", seen)
	}
}

// TestMembersAddedManyRunning: when more transactions are running than a
// cursor keeps (maxAddedRunning, lowered here to 1), the next pass starts
// at the snapshot's oldest running transaction instead: the cursor stays
// within the bound and additions committed late by any of them are still
// returned (keeping only some of the running ids would skip the others').
func TestMembersAddedManyRunning(t *testing.T) {
	defer func(n int) { maxAddedRunning = n }(maxAddedRunning)
	maxAddedRunning = 1
	s := openTest(t, newSchema(t), 6)
	ctx := context.Background()
	g, err := s.CreateGroup(ctx, store.Group{Name: "g", Owner: "owner"})
	if err != nil {
		t.Fatal(err)
	}
	_, cur, err := s.MembersAdded(ctx, store.AddedCursor{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var slow []pgx.Tx
	for i := range 2 {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO group_members (gid, uid, ordinal, join_seq) VALUES ($1, $2, $3, 1)`,
			g.GID, fmt.Sprintf("slow%d", i), 1000+i); err != nil {
			t.Fatal(err)
		}
		slow = append(slow, tx)
	}
	if _, err := s.AddMembers(ctx, g.GID, []string{"fast"}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	pass := func() {
		t.Helper()
		for range 100 {
			ms, next, err := s.MembersAdded(ctx, cur, 10)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				seen[m.UID] = true
			}
			if len(next.Running) > maxAddedRunning || len(next.NextRunning) > maxAddedRunning {
				t.Fatalf("cursor keeps %d and %d running ids, bound %d", len(next.Running), len(next.NextRunning), maxAddedRunning)
			}
			cur = next
			if len(ms) < 10 {
				return
			}
		}
		t.Fatal("feed not caught up")
	}
	pass()
	if !seen["fast"] || seen["slow0"] || seen["slow1"] {
		t.Fatalf("feed before the slow commits: got %v, want fast only", seen)
	}
	for _, tx := range slow {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pass()
	if !seen["slow0"] || !seen["slow1"] {
		t.Errorf("feed after the slow commits: got %v, want slow0 and slow1", seen)
	}
}
