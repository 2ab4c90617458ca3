package fanout_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
	"github.com/fanfare-im/fanfare/store"
)

// Every push path against join_seq and removal: nobody receives a seq
// below their join_seq, nor one committed after their removal. Windows are
// held open (MergeWindow 10 s) and pushed by Shutdown's drain, so that
// what a window held when a membership changed is what it pushes.

const longWindow = 10 * time.Second

// belowJoin returns the seqs of got below joinSeq.
func belowJoin(got []int64, joinSeq int64) []int64 {
	var out []int64
	for _, s := range got {
		if s < joinSeq {
			out = append(out, s)
		}
	}
	return out
}

// shutdown drains e: every open window is pushed.
func shutdown(t *testing.T, e *fanout.Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// makeHot floods gid from uid until it is hot, and waits for the acks.
func makeHot(t *testing.T, e *fanout.Engine, gid int64, uid string) {
	t.Helper()
	var wg sync.WaitGroup
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; !e.IsHot(gid); i++ {
		if time.Now().After(deadline) {
			t.Fatal("the group did not become hot")
		}
		wg.Add(1)
		e.Send(fanout.SendRequest{GID: gid, UID: uid, ClientMsgID: fmt.Sprint("flood", i), Body: []byte(`1`), Done: func(fanout.SendResult) { wg.Done() }})
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
}

// TestJoinDuringOpenWindow: a member added while its group's merge window
// holds messages (L1 batch, L2 summary, a hot group) receives none of
// them; the members who were there receive them all.
func TestJoinDuringOpenWindow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		level fanout.Level // forced; L0 = made hot instead
	}{
		{"L1", fanout.L1Merge},
		{"L2", fanout.L2Summary},
		{"hot", fanout.L0Normal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := openStore(t)
			pres, rec := newPresence(t), newRecorder()
			cfg := fanout.Config{Tuning: fanout.Tuning{MergeWindow: longWindow, LargeGroup: 1, GroupRate: -1, DownlinkRate: -1, HotFactor: -1}, Store: st, Presence: pres, Pusher: rec}
			if tc.level == fanout.L0Normal {
				cfg.HotFactor, cfg.HotMinRate, cfg.HotGroupRate, cfg.EvalInterval = 10, 50, 1e9, 20*time.Millisecond
			}
			e := enginetest.Start(t, cfg)
			ctx := context.Background()
			gid := newGroup(t, st, "alice", "carol")
			for _, uid := range []string{"carol", "bob"} {
				if _, err := e.Connect(ctx, &testConn{uid}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.level != fanout.L0Normal {
				e.Levels().Force(gid, &tc.level, 0)
			} else {
				makeHot(t, e, gid, "alice")
			}
			before := send(e, gid, "alice", "before")
			if before.Err != nil {
				t.Fatal(before.Err)
			}
			ms, err := e.AddMembers(ctx, gid, []string{"bob"})
			if err != nil {
				t.Fatal(err)
			}
			after := send(e, gid, "alice", "after")
			if after.Err != nil {
				t.Fatal(after.Err)
			}
			shutdown(t, e)
			if got := belowJoin(rec.seqs("bob"), ms[0].JoinSeq); len(got) != 0 {
				t.Errorf("bob, added during the window (join_seq %d), got %v below it", ms[0].JoinSeq, got)
			}
			if got := rec.seqs("bob"); !slices.Contains(got, after.Seq) {
				t.Errorf("bob got %v, want the message after his join (%d)", got, after.Seq)
			}
			if got := rec.seqs("carol"); !slices.Contains(got, before.Seq) || !slices.Contains(got, after.Seq) {
				t.Errorf("carol got %v, want %d and %d", got, before.Seq, after.Seq)
			}
		})
	}
}

// TestRemovalDuringOpenWindow: a member removed while the group's window
// is open receives nothing committed after the removal.
func TestRemovalDuringOpenWindow(t *testing.T) {
	st := openStore(t)
	pres, rec := newPresence(t), newRecorder()
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{MergeWindow: longWindow}, Store: st, Presence: pres, Pusher: rec})
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "bob", "carol")
	for _, uid := range []string{"carol", "bob"} {
		if _, err := e.Connect(ctx, &testConn{uid}); err != nil {
			t.Fatal(err)
		}
	}
	l1 := fanout.L1Merge
	e.Levels().Force(gid, &l1, 0)
	before := send(e, gid, "alice", "before")
	if err := e.RemoveMember(ctx, gid, "bob"); err != nil {
		t.Fatal(err)
	}
	after := send(e, gid, "alice", "after")
	if before.Err != nil || after.Err != nil {
		t.Fatal(before.Err, after.Err)
	}
	shutdown(t, e)
	if got := rec.seqs("bob"); slices.Contains(got, after.Seq) {
		t.Errorf("bob, removed, got %v including %d committed after", got, after.Seq)
	}
	if got := rec.seqs("carol"); !slices.Equal(got, []int64{before.Seq, after.Seq}) {
		t.Errorf("carol got %v, want [%d %d]", got, before.Seq, after.Seq)
	}
}

// waitDelivered waits until n's bus delivered at least msgs messages and
// changes membership changes.
func waitDelivered(t *testing.T, n *clusterNode, msgs, changes int64) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("bus deliveries (%d messages, %d changes)", msgs, changes), func() bool {
		s := n.bus.Stats()
		return s.DeliveredMsgs >= msgs && s.DeliveredChanges >= changes
	})
}

// TestRemoteJoinDuringOpenWindow: on node b, a batch from node a parked
// in b's window when a's addition of a member online on b arrives is not
// pushed to that member.
func TestRemoteJoinDuringOpenWindow(t *testing.T) {
	st := openStore(t)
	nodes := startClusterWith(t, st, fanout.Config{Tuning: fanout.Tuning{MergeWindow: longWindow}, Shards: 2}, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol")
	b.connect(t, "bob")
	l1 := fanout.L1Merge
	b.e.Levels().Force(gid, &l1, 0)
	s0 := b.bus.Stats()
	before := send(a.e, gid, "alice", "before")
	if before.Err != nil {
		t.Fatal(before.Err)
	}
	waitDelivered(t, b, s0.DeliveredMsgs+1, 0) // in b's window
	ms, err := a.e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	waitDelivered(t, b, 0, s0.DeliveredChanges+1)
	after := send(a.e, gid, "alice", "after")
	if after.Err != nil {
		t.Fatal(after.Err)
	}
	waitDelivered(t, b, s0.DeliveredMsgs+2, 0)
	time.Sleep(20 * time.Millisecond) // the worker took the batch from its queue
	shutdown(t, b.e)
	if got := belowJoin(b.rec.seqs("bob"), ms[0].JoinSeq); len(got) != 0 {
		t.Errorf("bob on b, added during the window (join_seq %d), got %v below it", ms[0].JoinSeq, got)
	}
	if got := b.rec.seqs("carol"); !slices.Contains(got, before.Seq) {
		t.Errorf("carol on b got %v, want %d (pushed before the join)", got, before.Seq)
	}
}

// TestConnectAfterRemoteJoinDuringOpenWindow: a member added on node a
// while offline on node b, who then connects to b while b's window holds a
// batch committed before the join, does not receive that batch.
func TestConnectAfterRemoteJoinDuringOpenWindow(t *testing.T) {
	st := openStore(t)
	nodes := startClusterWith(t, st, fanout.Config{Tuning: fanout.Tuning{MergeWindow: longWindow}, Shards: 2}, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol")
	l1 := fanout.L1Merge
	b.e.Levels().Force(gid, &l1, 0)
	s0 := b.bus.Stats()
	before := send(a.e, gid, "alice", "before")
	if before.Err != nil {
		t.Fatal(before.Err)
	}
	waitDelivered(t, b, s0.DeliveredMsgs+1, 0)
	ms, err := a.e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	waitDelivered(t, b, 0, s0.DeliveredChanges+1) // bob is offline on b: skipped
	b.connect(t, "bob")
	after := send(a.e, gid, "alice", "after")
	if after.Err != nil {
		t.Fatal(after.Err)
	}
	waitDelivered(t, b, s0.DeliveredMsgs+2, 0)
	time.Sleep(20 * time.Millisecond)
	shutdown(t, b.e)
	if got := belowJoin(b.rec.seqs("bob"), ms[0].JoinSeq); len(got) != 0 {
		t.Errorf("bob on b, connected during the window after his join on a (join_seq %d), got %v below it", ms[0].JoinSeq, got)
	}
	if got := b.rec.seqs("bob"); !slices.Contains(got, after.Seq) {
		t.Errorf("bob on b got %v, want %d", got, after.Seq)
	}
}

// TestConnectAfterRemoteJoinLateBatch: at L0, a batch committed before a
// member's join on node a and late on the bus is not pushed to that member
// on node b, where it connected after the join (its connect, not a bus
// change, brought the membership there).
func TestConnectAfterRemoteJoinLateBatch(t *testing.T) {
	st := openStore(t)
	nodes := startCluster(t, st, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice")
	old := send(a.e, gid, "alice", "old")
	if old.Err != nil {
		t.Fatal(old.Err)
	}
	s0 := b.bus.Stats()
	ms, err := a.e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	waitDelivered(t, b, 0, s0.DeliveredChanges+1) // bob is offline on b: skipped
	b.connect(t, "bob")
	b.e.Remote(&bus.Batch{GID: gid, Origin: "a", Msgs: []store.Message{{GID: gid, Seq: old.Seq, Sender: "alice", Body: []byte(`1`)}}})
	r := send(a.e, gid, "alice", "new")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	waitUntil(t, "bob's push on b", func() bool { return slices.Contains(b.rec.seqs("bob"), r.Seq) })
	if got := b.rec.seqs("bob"); !slices.Equal(got, []int64{r.Seq}) {
		t.Errorf("bob on b got %v, want [%d] (join_seq %d, the late seq %d below it)", got, r.Seq, ms[0].JoinSeq, old.Seq)
	}
}

// gatedGroups blocks uid's UserGroups calls number first and second (1 =
// the first call) until the matching release is closed.
type gatedGroups struct {
	store.Store
	uid      string
	mu       sync.Mutex
	calls    int
	gates    map[int]chan struct{} // call -> closed on entry
	releases map[int]chan struct{}
}

func newGatedGroups(st store.Store, uid string, calls ...int) *gatedGroups {
	g := &gatedGroups{Store: st, uid: uid, gates: map[int]chan struct{}{}, releases: map[int]chan struct{}{}}
	for _, c := range calls {
		g.gates[c], g.releases[c] = make(chan struct{}), make(chan struct{})
	}
	return g
}

func (g *gatedGroups) UserGroups(ctx context.Context, uid string) ([]store.Member, error) {
	ms, err := g.Store.UserGroups(ctx, uid)
	if uid != g.uid {
		return ms, err
	}
	g.mu.Lock()
	g.calls++
	n := g.calls
	g.mu.Unlock()
	if gate, ok := g.gates[n]; ok {
		close(gate)
		<-g.releases[n]
	}
	return ms, err
}

// TestConnectRacingRemovalPushes: a member removed after its connect read
// its groups, and before the connect registered it, receives no push of
// the group at any time, also before the connect's second read
// reconciles its memberships.
func TestConnectRacingRemovalPushes(t *testing.T) {
	base := openStore(t)
	st := newGatedGroups(base, "bob", 1, 2)
	pres, rec := newPresence(t), newRecorder()
	e := enginetest.Start(t, fanout.Config{Store: st, Presence: pres, Pusher: rec})
	ctx := context.Background()
	gid := newGroup(t, base, "alice", "bob", "carol")
	if _, err := e.Connect(ctx, &testConn{"carol"}); err != nil {
		t.Fatal(err)
	}
	connected := make(chan error, 1)
	go func() {
		_, err := e.Connect(ctx, &testConn{"bob"})
		connected <- err
	}()
	<-st.gates[1] // bob's groups are read: [gid]
	if err := e.RemoveMember(ctx, gid, "bob"); err != nil {
		t.Fatal(err)
	}
	close(st.releases[1])
	<-st.gates[2] // the connect's next read
	r := send(e, gid, "alice", "after")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	waitUntil(t, "carol's push", func() bool { return slices.Contains(rec.seqs("carol"), r.Seq) })
	close(st.releases[2])
	if err := <-connected; err != nil {
		t.Fatal(err)
	}
	if got := rec.seqs("bob"); len(got) != 0 {
		t.Errorf("bob, removed while connecting, got pushes %v", got)
	}
}

// TestJoinerConnectKeepsWindowForMembers: with a bus, a member who joined
// on node a after a message that still sits in node b's window connects
// on b; the window is cut for that member alone: carol, a member all
// along and online on b, still gets the message when b pushes the window.
func TestJoinerConnectKeepsWindowForMembers(t *testing.T) {
	st := openStore(t)
	nodes := startClusterWith(t, st, fanout.Config{Tuning: fanout.Tuning{MergeWindow: longWindow, LargeGroup: 1, GroupRate: -1, DownlinkRate: -1, HotFactor: -1}, Shards: 2}, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol")
	l1 := fanout.L1Merge
	b.e.Levels().Force(gid, &l1, 0)
	before := send(a.e, gid, "alice", "before")
	if before.Err != nil {
		t.Fatal(before.Err)
	}
	waitUntil(t, "b to get a's batch", func() bool { return b.bus.Stats().DeliveredMsgs > 0 })
	time.Sleep(100 * time.Millisecond) // b's worker put it in the window
	ms, err := a.e.AddMembers(ctx, gid, []string{"dave"})
	if err != nil {
		t.Fatal(err)
	}
	b.connect(t, "dave")
	shutdown(t, b.e)
	if got := b.rec.seqs("carol"); !slices.Equal(got, []int64{before.Seq}) {
		t.Errorf("carol (a member all along) got %v on b, want [%d]: dave's connect cut it for her", got, before.Seq)
	}
	if got := belowJoin(b.rec.seqs("dave"), ms[0].JoinSeq); len(got) > 0 {
		t.Errorf("dave on b got %v below his join_seq %d", got, ms[0].JoinSeq)
	}
}

// TestLateBatchCutForJoinerAlone: at L0, a batch committed before bob's
// join on node a and late on the bus reaches carol, a member all along
// online on b, and not bob, who connected on b after the join.
func TestLateBatchCutForJoinerAlone(t *testing.T) {
	st := openStore(t)
	nodes := startCluster(t, st, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol")
	old := send(a.e, gid, "alice", "old")
	if old.Err != nil {
		t.Fatal(old.Err)
	}
	b.connect(t, "carol")
	s0 := b.bus.Stats()
	ms, err := a.e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	waitDelivered(t, b, 0, s0.DeliveredChanges+1)
	b.connect(t, "bob")
	b.e.Remote(&bus.Batch{GID: gid, Origin: "a", Msgs: []store.Message{{GID: gid, Seq: old.Seq, Sender: "alice", Body: []byte(`1`)}}})
	r := send(a.e, gid, "alice", "new")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	waitUntil(t, "the pushes on b", func() bool {
		return slices.Contains(b.rec.seqs("bob"), r.Seq) && slices.Contains(b.rec.seqs("carol"), r.Seq)
	})
	if got := b.rec.seqs("bob"); !slices.Equal(got, []int64{r.Seq}) {
		t.Errorf("bob on b got %v, want [%d] (join_seq %d, the late seq %d below it)", got, r.Seq, ms[0].JoinSeq, old.Seq)
	}
	if got := b.rec.seqs("carol"); !slices.Contains(got, old.Seq) {
		t.Errorf("carol on b got %v, want the late seq %d too", got, old.Seq)
	}
}
