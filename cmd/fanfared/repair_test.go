package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/internal/redistest"
)

// This package's throwaway Redis servers (internal/redistest).
const (
	portRedisRepair   = 16460
	portRedisAddition = 16461
)

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

// TestAdditionLostWhileRedisDownAcrossNodes: bob, online on node b, is
// added through node a while Redis is stopped and a's bus knows it, so
// the change is dropped there (counted) and never reaches b. Once Redis
// is back, the group's messages reach bob's socket on b by push, without
// a reconnect: b's feed of additions finds him.
func TestAdditionLostWhileRedisDownAcrossNodes(t *testing.T) {
	srv := redistest.Start(t, portRedisAddition)
	a, b := startTwoNodes(t, "-redis-addr", srv.Addr())
	gid := a.createGroup("alice", "carol")
	alice := a.dialRaw("alice")
	carol := b.dialRaw("carol")
	bob := b.dialRaw("bob")
	n := 0
	sendOn := func(rc *rawConn) int64 {
		t.Helper()
		n++
		id := fmt.Sprintf("m%d", n)
		rc.send(fmt.Sprintf(`{"type":"send","id":%q,"gid":%d,"body":%q}`, id, gid, id))
		ack, _ := readUntil[*wire.Ack](rc, 20*time.Second)
		return ack.Seq
	}
	// pushedTo sends from alice until rc got one of the sends by push.
	pushedTo := func(rc *rawConn, who string) int64 {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			seq := sendOn(alice)
			until := time.Now().Add(300 * time.Millisecond)
			for time.Now().Before(until) {
				f, err := rc.tryRead(time.Until(until))
				if err != nil {
					break
				}
				if m, ok := f.(*wire.Msg); ok && m.GID == gid && m.Seq >= seq {
					return m.Seq
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no push of gid %d reached %s on node b in 30 s", gid, who)
			}
		}
	}
	pushedTo(carol, "carol")

	srv.Stop()
	const publishErrors, droppedChanges = "fanfare_bus_publish_errors_total", `fanfare_bus_member_changes_total{result="dropped"}`
	before := scrapeValues(t, a)
	deadline := time.Now().Add(30 * time.Second)
	for scrapeValues(t, a)[publishErrors] == before[publishErrors] { // a's bus notices at a failed publish
		if time.Now().After(deadline) {
			t.Fatal("node a's bus did not notice that Redis is down")
		}
		sendOn(alice)
		time.Sleep(100 * time.Millisecond)
	}
	added := a.addMembers(gid, "bob")
	if got := scrapeValues(t, a)[droppedChanges]; got != before[droppedChanges]+1 {
		t.Fatalf("node a dropped %v membership changes, want %v (the test's premise: the addition is lost)", got, before[droppedChanges]+1)
	}
	srv.Start()
	if seq := pushedTo(bob, "bob"); seq < added[0].JoinSeq {
		t.Errorf("bob got seq %d on node b, below his join_seq %d", seq, added[0].JoinSeq)
	}
}
