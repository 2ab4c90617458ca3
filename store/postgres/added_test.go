package postgres

import (
	"context"
	"testing"

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
