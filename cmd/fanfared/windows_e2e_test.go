package main

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// pushedSeqs reads rc's frames until it has been quiet for quiet and
// returns the seqs of gid its pushes carried (msg, batch, and a summary's
// first message).
func pushedSeqs(rc *rawConn, gid int64, quiet time.Duration) []int64 {
	var seqs []int64
	for _, f := range quietFrames(rc, quiet) {
		switch m := f.(type) {
		case *wire.Msg:
			if m.GID == gid {
				seqs = append(seqs, m.Seq)
			}
		case *wire.Batch:
			for _, x := range m.Messages {
				if x.GID == gid {
					seqs = append(seqs, x.Seq)
				}
			}
		case *wire.Summary:
			if m.GID == gid {
				seqs = append(seqs, m.First.Seq)
			}
		}
	}
	return seqs
}

// TestMembershipDuringOpenWindow over real sockets: with the group at L1
// and a 2 s merge window, a member added while the window holds a message
// does not receive it (nor its summary), a member removed while the
// window is open receives nothing sent after the removal, and a
// non-member's send is refused as forbidden.
func TestMembershipDuringOpenWindow(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-merge-window", "2s")
			gid := ts.createGroup("alice", "carol", "dave")
			alice, carol, dave, bob := ts.dialRaw("alice"), ts.dialRaw("carol"), ts.dialRaw("dave"), ts.dialRaw("bob")
			if _, errs := sendAll(t, bob, gid, "outsider", 1); len(errs) != 1 || errs[0].Code != wire.CodeForbidden {
				t.Fatalf("bob, not a member: got errors %+v, want one %q", errs, wire.CodeForbidden)
			}
			ts.degrade("group", gid, lv(1), 0)
			before, _ := sendAll(t, alice, gid, "before", 1)
			ms := ts.addMembers(gid, "bob")
			if st := ts.do("DELETE", fmt.Sprintf("/v1/groups/%d/members/dave", gid), ts.admin, nil, nil); st != http.StatusNoContent {
				t.Fatalf("remove dave: status %d", st)
			}
			after, _ := sendAll(t, alice, gid, "after", 1)
			if len(before) != 1 || len(after) != 1 {
				t.Fatalf("acks: before %v, after %v", before, after)
			}
			quiet := 3 * time.Second // past the 2 s window
			if got := pushedSeqs(bob, gid, quiet); !slices.Equal(got, after) {
				t.Errorf("bob, added during the window (join_seq %d): got seqs %v, want %v", ms[0].JoinSeq, got, after)
			}
			if got := pushedSeqs(dave, gid, quiet); slices.Contains(got, after[0]) {
				t.Errorf("dave, removed during the window: got seqs %v, including %d sent after", got, after[0])
			}
			if got := pushedSeqs(carol, gid, quiet); !slices.Equal(got, append(before, after...)) {
				t.Errorf("carol: got seqs %v, want %v", got, append(before, after...))
			}
		})
	}
}
