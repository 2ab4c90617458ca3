package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
)

// clusterNode is one engine of a test cluster: its presence, its pushes
// and its end of an in-process bus.
type clusterNode struct {
	e    *fanout.Engine
	pres *presence.Local[fanout.Conn]
	rec  *recorder
	bus  *bus.Node
	// hold, when set, sees each membership change the bus hands this node
	// first; true: it took the change (to apply it later, or never).
	hold atomic.Pointer[func(*bus.MemberChange) bool]
}

// startCluster starts one engine per id on st, connected by a bus.Local.
func startCluster(t *testing.T, st store.Store, ids ...string) []*clusterNode {
	t.Helper()
	return startClusterWith(t, st, fanout.Config{Shards: 2}, ids...)
}

// startClusterWith is startCluster with base as every engine's config
// (its Store, Presence, Pusher and Bus are set here).
func startClusterWith(t *testing.T, st store.Store, base fanout.Config, ids ...string) []*clusterNode {
	t.Helper()
	return startClusterOn(t, bus.NewLocal(), st, base, ids...)
}

// startClusterOn is startClusterWith on the medium hub.
func startClusterOn(t *testing.T, hub *bus.Local, st store.Store, base fanout.Config, ids ...string) []*clusterNode {
	t.Helper()
	return startClusterOnBus(t, hub, st, base, bus.Config{}, ids...)
}

// startClusterOnBus is startClusterOn with busBase as every node's bus
// config (NodeID, Presence, FlushInterval and the handlers are set here).
func startClusterOnBus(t *testing.T, hub *bus.Local, st store.Store, base fanout.Config, busBase bus.Config, ids ...string) []*clusterNode {
	t.Helper()
	var nodes []*clusterNode
	for _, id := range ids {
		n := &clusterNode{pres: newPresence(t), rec: newRecorder()}
		var err error
		bc := busBase
		bc.NodeID, bc.Presence, bc.FlushInterval = id, n.pres, 5*time.Millisecond
		bc.Handler = func(b *bus.Batch) { n.e.Remote(b) }
		bc.Members = func(c *bus.MemberChange) {
			if h := n.hold.Load(); h != nil && (*h)(c) {
				return
			}
			n.e.RemoteMembers(c)
		}
		n.bus, err = hub.NewNode(bc)
		if err != nil {
			t.Fatal(err)
		}
		cfg := base
		cfg.Store, cfg.Presence, cfg.Pusher, cfg.Bus = st, n.pres, n.rec, n.bus
		n.e = enginetest.Start(t, cfg)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- n.bus.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("bus Run: %v", err)
			}
		})
		if err := n.bus.SyncSubscriptions(ctx); err != nil { // ControlGID
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	return nodes
}

func (n *clusterNode) connect(t *testing.T, uid string) {
	t.Helper()
	if _, err := n.e.Connect(context.Background(), &testConn{uid}); err != nil {
		t.Fatal(err)
	}
	if err := n.bus.SyncSubscriptions(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// waitUntil waits up to 30 s: under a loaded CI machine a bus noticing a
// stopped Redis (dial timeouts, retries) has taken over 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRemoteMembershipInOrder: a member added on node a while online on
// node b gets b's pushes of the next message sent on a, without
// reconnecting; once removed on a, b pushes it nothing more. Node b has
// another member online (it is subscribed to the group), so the change and
// the batches after it reach b in order and no wait is needed.
func TestRemoteMembershipInOrder(t *testing.T) {
	st := openStore(t)
	nodes := startCluster(t, st, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol")
	b.connect(t, "bob")

	ms, err := a.e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	r1 := send(a.e, gid, "alice", "1")
	if r1.Err != nil {
		t.Fatal(r1.Err)
	}
	waitUntil(t, "carol's push on b", func() bool { return slices.Contains(b.rec.seqs("carol"), r1.Seq) })
	if got := b.rec.seqs("bob"); !slices.Equal(got, []int64{r1.Seq}) {
		t.Fatalf("bob on b got %v, want [%d] (join_seq %d)", got, r1.Seq, ms[0].JoinSeq)
	}

	if err := a.e.RemoveMember(ctx, gid, "bob"); err != nil {
		t.Fatal(err)
	}
	r2 := send(a.e, gid, "alice", "2")
	if r2.Err != nil {
		t.Fatal(r2.Err)
	}
	waitUntil(t, "carol's second push on b", func() bool { return slices.Contains(b.rec.seqs("carol"), r2.Seq) })
	if got := b.rec.seqs("bob"); !slices.Equal(got, []int64{r1.Seq}) {
		t.Errorf("bob on b, removed, got %v, want only [%d]", got, r1.Seq)
	}
	if b.pres.ContainsOrdinal(gid, ms[0].Ordinal) {
		t.Errorf("b still has bob's bit (ordinal %d) in %d", ms[0].Ordinal, gid)
	}
	if s := b.bus.Stats(); s.DeliveredChanges != 2 {
		t.Errorf("b was delivered %d changes, want 2", s.DeliveredChanges)
	}
}

// TestRemoteMembershipSubscribesAndFloors: node b, with no member of the
// group online, subscribes to it when a member online there is added on
// a, and keeps that member as a recent joiner: a batch below the new member's join_seq
// (committed before the join, late on the bus) is not pushed to it.
func TestRemoteMembershipSubscribesAndFloors(t *testing.T) {
	st := openStore(t)
	nodes := startCluster(t, st, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice")
	old := send(a.e, gid, "alice", "old")
	if old.Err != nil {
		t.Fatal(old.Err)
	}
	b.connect(t, "bob")
	if b.bus.Subscribed(gid) {
		t.Fatalf("b subscribed to %d before anyone of it was online there", gid)
	}

	ms, err := a.e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "b to subscribe", func() bool { return b.bus.Subscribed(gid) })
	if err := b.bus.SyncSubscriptions(ctx); err != nil {
		t.Fatal(err)
	}
	if !b.pres.ContainsOrdinal(gid, ms[0].Ordinal) {
		t.Fatalf("b has no bit for bob (ordinal %d) in %d", ms[0].Ordinal, gid)
	}
	// The old batch arrives late at b, then a new one.
	b.e.Remote(&bus.Batch{GID: gid, Origin: "a", Msgs: []store.Message{{GID: gid, Seq: old.Seq, Sender: "alice", Body: []byte(`1`)}}})
	r := send(a.e, gid, "alice", "new")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	waitUntil(t, "bob's push on b", func() bool { return len(b.rec.seqs("bob")) > 0 })
	if got := b.rec.seqs("bob"); !slices.Equal(got, []int64{r.Seq}) {
		t.Errorf("bob on b got %v, want [%d] (join_seq %d, the late seq %d below it)", got, r.Seq, ms[0].JoinSeq, old.Seq)
	}
	// The node that made the change did not apply it twice nor push bob
	// anything (he is not online there).
	if got := a.rec.seqs("bob"); len(got) != 0 {
		t.Errorf("bob on a got %v, want nothing", got)
	}
}

// TestRemoteAdditionOfOfflineMemberIgnored: a node where none of the
// added members is online changes nothing (no subscription, no bit); a
// member who connects afterwards gets the membership from the store.
func TestRemoteAdditionOfOfflineMemberIgnored(t *testing.T) {
	st := openStore(t)
	nodes := startCluster(t, st, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice")
	if _, err := a.e.AddMembers(ctx, gid, []string{"bob"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "b to get the change", func() bool { return b.bus.Stats().DeliveredChanges == 1 })
	time.Sleep(20 * time.Millisecond) // the worker had its chance to (wrongly) subscribe
	if b.bus.Subscribed(gid) || b.pres.OnlineCount(gid) != 0 {
		t.Fatalf("b subscribed %v, online %d; want neither", b.bus.Subscribed(gid), b.pres.OnlineCount(gid))
	}
	b.connect(t, "bob")
	r := send(a.e, gid, "alice", "1")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	waitUntil(t, "bob's push on b", func() bool { return slices.Equal(b.rec.seqs("bob"), []int64{r.Seq}) })
}

// TestLateRemoteAdditionAfterRemoval: an addition that reaches node b after
// the member was removed (its removal applied first, e.g. made on b, or on
// a third node whose change came first) does not revive the member there.
func TestLateRemoteAdditionAfterRemoval(t *testing.T) {
	st := openStore(t)
	nodes := startCluster(t, st, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol") // b is subscribed to gid
	b.connect(t, "bob")
	ms, err := st.AddMembers(ctx, gid, []string{"bob"}) // as node a committed it...
	if err != nil {
		t.Fatal(err)
	}
	if err := b.e.RemoveMember(ctx, gid, "bob"); err != nil { // ...then removed on b
		t.Fatal(err)
	}
	b.e.RemoteMembers(&bus.MemberChange{GID: gid, Origin: "a", Members: ms}) // a's addition, late
	r := send(a.e, gid, "alice", "after")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	waitUntil(t, "carol's push on b", func() bool { return slices.Contains(b.rec.seqs("carol"), r.Seq) })
	if got := b.rec.seqs("bob"); len(got) != 0 {
		t.Fatalf("bob, removed, got pushes %v on b after a late addition", got)
	}
}

// TestRemoteCommitsCountForDownlink: a member online on node b receives
// what node a commits, so b's downlink trigger counts a's commits: a
// large group sent to at 12/s through a alone moves to L1 on b too.
func TestRemoteCommitsCountForDownlink(t *testing.T) {
	st := openStore(t)
	nodes := startClusterWith(t, st, fanout.Config{Tuning: fanout.Tuning{LargeGroup: 1, GroupRate: -1, HotFactor: -1}, Shards: 2, EvalInterval: 20 * time.Millisecond}, "a", "b")
	a, b := nodes[0], nodes[1]
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol")
	tick := time.NewTicker(time.Second / 12)
	defer tick.Stop()
	for i := 0; i < 24 && b.e.Levels().Auto(gid) < fanout.L1Merge; i++ {
		<-tick.C
		a.e.Send(fanout.SendRequest{GID: gid, UID: "alice", ClientMsgID: fmt.Sprint(i), Body: []byte(`1`), Done: func(fanout.SendResult) {}})
	}
	waitUntil(t, "the group at L1 on b (12/s pushed to carol, 80% of the 10/s downlink limit is 8/s)", func() bool {
		return b.e.Levels().Auto(gid) >= fanout.L1Merge
	})
}
