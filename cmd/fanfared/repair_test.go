package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/internal/redistest"
)

// portRedisRepair is this package's throwaway Redis (internal/redistest).
const portRedisRepair = 16460

// TestRemovalLostWhileRedisDownAcrossNodes: bob, online on node b, is
// removed through node a while Redis is stopped, so the change never
// reaches b over the bus. Once Redis is back, nothing sent after the
// removal reaches bob's socket on b, whichever node accepts the send.
func TestRemovalLostWhileRedisDownAcrossNodes(t *testing.T) {
	srv := redistest.Start(t, portRedisRepair)
	a, b := startTwoNodes(t, "-redis-addr", srv.Addr())
	gid := a.createGroup("alice", "carol", "bob")
	alice := a.dialRaw("alice")
	carol := b.dialRaw("carol")
	bob := b.dialRaw("bob")
	sendOn := func(rc *rawConn, id string) int64 {
		t.Helper()
		rc.send(fmt.Sprintf(`{"type":"send","id":%q,"gid":%d,"body":%q}`, id, gid, id))
		ack, _ := readUntil[*wire.Ack](rc, 20*time.Second)
		return ack.Seq
	}
	// crossed sends from rc until carol on b got one of the sends, and
	// returns the last seq sent.
	crossed := func(rc *rawConn, tag string) int64 {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; ; i++ {
			seq := sendOn(rc, fmt.Sprintf("%s-%d", tag, i))
			until := time.Now().Add(300 * time.Millisecond)
			for time.Now().Before(until) {
				f, err := carol.tryRead(time.Until(until))
				if err != nil {
					break
				}
				if m, ok := f.(*wire.Msg); ok && m.GID == gid && m.Seq == seq {
					return seq
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no push reached carol on node b in 30 s", tag)
			}
		}
	}
	cut := crossed(alice, "before") + 1 // the first seq stored after the removal

	srv.Stop()
	if st := a.do("DELETE", fmt.Sprintf("/v1/groups/%d/members/bob", gid), a.admin, nil, nil); st != http.StatusNoContent {
		t.Fatalf("remove bob: status %d", st)
	}
	srv.Start()

	crossed(alice, "after-a") // a remote batch on b
	crossed(carol, "after-b") // a commit of b's own
	for {
		f, err := bob.tryRead(300 * time.Millisecond)
		if err != nil {
			break // nothing more for bob
		}
		if m, ok := f.(*wire.Msg); ok && m.GID == gid && m.Seq >= cut {
			t.Fatalf("bob, removed on node a while Redis was down, got seq %d on node b (removed before seq %d)", m.Seq, cut)
		}
	}
}
