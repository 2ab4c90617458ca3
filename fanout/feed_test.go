package fanout_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/internal/faultproxy"
	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/store"
)

// loseNextChanges takes hub down until a's bus has noticed (a send whose
// publish fails), so that the membership changes a commits next are
// dropped by a's bus; it returns a's count of dropped changes so far.
func loseNextChanges(t *testing.T, hub *bus.Local, a *clusterNode, gid int64, sender string) int64 {
	t.Helper()
	hub.SetDown(true)
	if r := send(a.e, gid, sender, "while-down-"+time.Now().Format("150405.000000000")); r.Err != nil {
		t.Fatal(r.Err)
	}
	waitUntil(t, "a's bus to notice", func() bool { return a.bus.Stats().PublishErrors > 0 })
	return a.bus.Stats().DroppedChanges
}

// bitOf reports whether n's presence holds uid's bit in gid.
func bitOf(n *clusterNode, gid int64, m store.Member) bool {
	uid, ok := n.pres.UIDOf(gid, m.Ordinal)
	return ok && uid == m.UID
}

// TestAdditionLostOnLocalBus: members added on node a while online on
// node b, whose addition a's bus dropped (the medium down), get the
// group's later messages on b by push without reconnecting, none below
// their join_seq. Before the feed of additions, b's membership re-read
// (its view was behind the batches' version) only looked at the members
// whose bits were set, so it never found them. A feed page of 1 reads the
// three additions in three pages.
func TestAdditionLostOnLocalBus(t *testing.T) {
	st := openStore(t)
	hub := bus.NewLocal()
	nodes := startClusterOn(t, hub, st, fanout.Config{Shards: 2, MemberFeedPage: 1}, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol") // b is subscribed to gid and holds a view of it
	newcomers := []string{"bob", "dave", "erin"}
	for _, u := range newcomers {
		b.connect(t, u)
	}
	sendUntilPushed(t, a, gid, "alice", b, "carol")

	dropped := loseNextChanges(t, hub, a, gid, "alice")
	ms, err := a.e.AddMembers(ctx, gid, newcomers)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.bus.Stats().DroppedChanges; got != dropped+1 {
		t.Fatalf("the addition was not dropped by a's bus (dropped %d, want %d)", got, dropped+1)
	}
	hub.SetDown(false)
	for _, m := range ms {
		sendUntilPushed(t, a, gid, "alice", b, m.UID)
		for _, s := range b.rec.seqs(m.UID) {
			if s < m.JoinSeq {
				t.Errorf("%s on b got seq %d, below its join_seq %d", m.UID, s, m.JoinSeq)
			}
		}
	}
}

// TestAdditionLostWithoutView: bob, online on node b where nobody else of
// the group is (b neither receives the group's batches nor holds a view of
// it), is added on node a and the change is lost: the group's later
// messages reach him on b by push without reconnecting. No version hole
// can show this loss on b: only the feed finds it.
func TestAdditionLostWithoutView(t *testing.T) {
	st := openStore(t)
	hub := bus.NewLocal()
	nodes := startClusterOn(t, hub, st, fanout.Config{Shards: 2}, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice")
	b.connect(t, "bob")
	if b.bus.Subscribed(gid) {
		t.Fatalf("b subscribed to %d with none of its members online there", gid)
	}
	dropped := loseNextChanges(t, hub, a, gid, "alice")
	ms, err := a.e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	if got := a.bus.Stats().DroppedChanges; got != dropped+1 {
		t.Fatalf("the addition was not dropped by a's bus (dropped %d, want %d)", got, dropped+1)
	}
	hub.SetDown(false)
	waitUntil(t, "b to give bob the group", func() bool { return bitOf(b, gid, ms[0]) && b.bus.Subscribed(gid) })
	if err := b.bus.SyncSubscriptions(ctx); err != nil {
		t.Fatal(err)
	}
	sendUntilPushed(t, a, gid, "alice", b, "bob")
	// The message sent while the bus was down is below bob's join_seq; the
	// messages sent after the join and before the repair (none here) would
	// have come with a resync.
	if got := b.rec.seqs("bob"); slices.ContainsFunc(got, func(s int64) bool { return s < ms[0].JoinSeq }) {
		t.Errorf("bob on b got %v, some below his join_seq %d", got, ms[0].JoinSeq)
	}
}

// TestAdditionRepairResyncs: messages stored between a lost addition and
// its repair were pushed on b to the members as they were, without the
// new member: the repair sends him a resync up to the group's last seq.
// The feed is read only when kicked here (a long interval), by the
// version hole of the first batch after the addition.
func TestAdditionRepairResyncs(t *testing.T) {
	st := openStore(t)
	hub := bus.NewLocal()
	nodes := startClusterOn(t, hub, st, fanout.Config{Shards: 2, MemberFeedInterval: time.Hour}, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol")
	b.connect(t, "bob")
	sendUntilPushed(t, a, gid, "alice", b, "carol")
	loseNextChanges(t, hub, a, gid, "alice")
	ms, err := a.e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	hub.SetDown(false)
	seqs := sendUntilPushed(t, a, gid, "alice", b, "bob")
	if rs := b.rec.resyncsOf("bob"); len(rs) == 0 || rs[0] < ms[0].JoinSeq {
		t.Errorf("bob's resyncs on b: %v, want one at or above his join_seq %d (a sent %v after the join)", rs, ms[0].JoinSeq, seqs)
	}
}

// removingStore removes uid from gid right after a read of the feed of
// additions returned that membership: the removal lands between the
// feed's read and its apply on the group's worker.
type removingStore struct {
	store.Store
	gid int64
	uid string
	hit chan struct{}
}

func (s *removingStore) MembersAdded(ctx context.Context, c store.AddedCursor, limit int) ([]store.Member, store.AddedCursor, error) {
	ms, next, err := s.Store.MembersAdded(ctx, c, limit)
	for _, m := range ms {
		if m.GID == s.gid && m.UID == s.uid {
			if _, err := s.Store.RemoveMember(ctx, s.gid, s.uid); err == nil {
				close(s.hit)
			}
		}
	}
	return ms, next, err
}

// TestFeedNeverRevivesRemoval: an addition the feed read, whose member
// was removed before the group's worker applied it, is not applied: the
// worker reads the membership from the store again first.
func TestFeedNeverRevivesRemoval(t *testing.T) {
	base := openStore(t)
	gid := newGroup(t, base, "alice", "carol")
	rs := &removingStore{Store: base, gid: gid, uid: "bob", hit: make(chan struct{})}
	hub := bus.NewLocal()
	nodes := startClusterOn(t, hub, rs, fanout.Config{Shards: 2}, "a", "b")
	a, b := nodes[0], nodes[1]
	b.connect(t, "carol")
	b.connect(t, "bob")
	sendUntilPushed(t, a, gid, "alice", b, "carol")
	ms, err := base.AddMembers(context.Background(), gid, []string{"bob"}) // committed, never published
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-rs.hit:
	case <-time.After(30 * time.Second):
		t.Fatal("the feed did not read bob's addition")
	}
	time.Sleep(200 * time.Millisecond) // the worker had its chance to (wrongly) apply it
	// Checked before any batch: the next one's version hole would clear
	// the bit again (the removal's own repair).
	if bitOf(b, gid, ms[0]) {
		t.Errorf("b holds bob's bit in %d after his removal", gid)
	}
	sendUntilPushed(t, a, gid, "alice", b, "carol")
	if got := b.rec.seqs("bob"); len(got) != 0 {
		t.Errorf("bob, removed before the feed's repair ran, got %v on b", got)
	}
}

// TestAdditionLostWhileSubscriberCut: node b's link to Redis is cut while
// bob, online on b, is added on node a, whose publish of the change
// succeeds: b never receives it. Once b has subscribed again it reads the
// feed of additions at once (Engine.BusReconnected; the interval is an
// hour here) and gives bob the group before any later batch shows a
// version hole; the next messages reach him by push.
func TestAdditionLostWhileSubscriberCut(t *testing.T) {
	srv := redistest.Start(t, portRedisCut)
	px := faultproxy.Start(t, srv.Addr())
	st := openStore(t)
	nodes := startRedisClusterWith(t, st, fanout.Config{Shards: 2, MemberFeedInterval: time.Hour},
		[]string{srv.Addr(), px.Addr()}, bus.Config{}, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol")
	b.connect(t, "bob")
	sendUntilPushed(t, a, gid, "alice", b, "carol")

	if err := px.Refuse(true); err != nil {
		t.Fatal(err)
	}
	px.ResetAll()
	published := a.bus.Stats().PublishedChanges
	ms, err := a.e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a to publish the addition", func() bool { return a.bus.Stats().PublishedChanges > published })
	time.Sleep(50 * time.Millisecond)
	if bitOf(b, gid, ms[0]) {
		t.Fatal("b got the addition through the cut link (the test's premise)")
	}
	if err := px.Refuse(false); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "b to give bob the group after its reconnect", func() bool { return bitOf(b, gid, ms[0]) })
	sendUntilPushed(t, a, gid, "alice", b, "bob")
}

// offWorkerRemovingStore removes uid from gid right after the feed
// repair's MembersOf on node returned it, and hands node the removal as
// the bus would with the group's worker queue full (the worker is in this
// very read): RemoteMembers applies it off the worker, between the repair's
// read and its join.
type offWorkerRemovingStore struct {
	store.Store
	gid  int64
	uid  string
	node atomic.Pointer[clusterNode]
	once sync.Once
	hit  chan struct{}
}

func (s *offWorkerRemovingStore) MembersOf(ctx context.Context, gid int64, uids []string) ([]store.Member, int64, error) {
	ms, v, err := s.Store.MembersOf(ctx, gid, uids)
	n := s.node.Load()
	if err != nil || n == nil || gid != s.gid || !slices.Equal(uids, []string{s.uid}) || len(ms) != 1 {
		return ms, v, err
	}
	s.once.Do(func() {
		m, err := s.Store.RemoveMember(ctx, gid, s.uid)
		if err != nil {
			panic(err)
		}
		for range 4 * 64 { // fill the worker's queue (QueueCap 64)
			n.e.Remote(&bus.Batch{GID: gid, Tail: 1})
		}
		n.e.RemoteMembers(&bus.MemberChange{GID: gid, Version: m.MemberVersion, Removed: true,
			Members: []store.Member{{GID: gid, UID: s.uid, Ordinal: m.Ordinal}}})
		close(s.hit)
	})
	return ms, v, err
}

// TestOffWorkerRemovalNotUndoneByRepair: a removal applied off the
// group's worker (its queue full) while the feed's repair of the same
// member's addition is between its store read and its join is not undone:
// the member holds no bit afterwards and gets none of the group's later
// pushes. It fails when joined sets the bit from the read made before the
// removal (no leave-stripe check) and the off-worker removal advances the
// view past the hole.
func TestOffWorkerRemovalNotUndoneByRepair(t *testing.T) {
	base := openStore(t)
	gid := newGroup(t, base, "alice", "carol")
	rs := &offWorkerRemovingStore{Store: base, gid: gid, uid: "bob", hit: make(chan struct{})}
	hub := bus.NewLocal()
	nodes := startClusterOn(t, hub, rs, fanout.Config{Shards: 1, QueueCap: 64}, "a", "b")
	a, b := nodes[0], nodes[1]
	b.connect(t, "carol")
	b.connect(t, "bob")
	sendUntilPushed(t, a, gid, "alice", b, "carol")
	rs.node.Store(b)
	ms, err := base.AddMembers(context.Background(), gid, []string{"bob"}) // committed, never published
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-rs.hit:
	case <-time.After(30 * time.Second):
		t.Fatal("the feed's repair did not read bob's addition")
	}
	time.Sleep(300 * time.Millisecond) // the worker had its chance to (wrongly) join bob
	if bitOf(b, gid, ms[0]) {
		t.Errorf("b holds bob's bit in %d after his removal", gid)
	}
	sendUntilPushed(t, a, gid, "alice", b, "carol")
	if got := b.rec.seqs("bob"); len(got) != 0 {
		t.Errorf("bob, removed while the feed's repair ran, got %v on b", got)
	}
}

// countingFeedStore counts the reads of the feed of additions.
type countingFeedStore struct {
	store.Store
	reads atomic.Int64
}

func (s *countingFeedStore) MembersAdded(ctx context.Context, c store.AddedCursor, limit int) ([]store.Member, store.AddedCursor, error) {
	s.reads.Add(1)
	return s.Store.MembersAdded(ctx, c, limit)
}

// TestFeedKicksSpaced: kicks arriving back to back (here bus reconnects
// for a second; in production batches behind their view, dropped changes)
// make the feed read at most once per 100 ms, not in a tight loop. The
// interval is an hour: every read counted is a kicked one.
func TestFeedKicksSpaced(t *testing.T) {
	cs := &countingFeedStore{Store: openStore(t)}
	hub := bus.NewLocal()
	nodes := startClusterOn(t, hub, cs, fanout.Config{Shards: 1, MemberFeedInterval: time.Hour}, "a")
	before := cs.reads.Load()
	const span = time.Second
	for end := time.Now().Add(span); time.Now().Before(end); {
		nodes[0].e.BusReconnected(nil)
		time.Sleep(100 * time.Microsecond)
	}
	if got, limit := cs.reads.Load()-before, int64(span/(100*time.Millisecond))+2; got > limit {
		t.Errorf("%d feed reads in %v of kicks, want at most %d", got, span, limit)
	}
}

// lateHintStore hands node the hint of uid's addition to gid 300 ms after
// a read of the feed returned that addition: the hint was slow, not lost.
type lateHintStore struct {
	store.Store
	gid  int64
	uid  string
	node atomic.Pointer[clusterNode]
	once sync.Once
	sent chan struct{}
}

func (s *lateHintStore) MembersAdded(ctx context.Context, c store.AddedCursor, limit int) ([]store.Member, store.AddedCursor, error) {
	ms, next, err := s.Store.MembersAdded(ctx, c, limit)
	for _, m := range ms {
		if n := s.node.Load(); n != nil && m.GID == s.gid && m.UID == s.uid {
			s.once.Do(func() {
				go func() {
					time.Sleep(300 * time.Millisecond)
					n.e.RemoteMembers(&bus.MemberChange{GID: m.GID, Version: m.MemberVersion, Members: []store.Member{m}})
					close(s.sent)
				}()
			})
		}
	}
	return ms, next, err
}

// TestFeedLeavesSlowHintAlone: an addition the feed reads before its
// (slow, not lost) hint is applied here is left to the hint: no repair,
// no "lost on the bus" warning. It fails when the feed repairs every
// addition it finds missing at once.
func TestFeedLeavesSlowHintAlone(t *testing.T) {
	base := openStore(t)
	gid := newGroup(t, base, "alice", "carol")
	ls := &lateHintStore{Store: base, gid: gid, uid: "bob", sent: make(chan struct{})}
	var logs syncBuffer
	hub := bus.NewLocal()
	nodes := startClusterOn(t, hub, ls, fanout.Config{Shards: 2,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, "a", "b")
	a, b := nodes[0], nodes[1]
	b.connect(t, "carol")
	b.connect(t, "bob")
	sendUntilPushed(t, a, gid, "alice", b, "carol")
	ls.node.Store(b)
	ms, err := base.AddMembers(context.Background(), gid, []string{"bob"}) // its hint comes late
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ls.sent:
	case <-time.After(30 * time.Second):
		t.Fatal("the feed did not read bob's addition")
	}
	waitUntil(t, "the hint to give bob the group", func() bool { return bitOf(b, gid, ms[0]) })
	time.Sleep(3 * time.Second) // past the feed's grace
	if strings.Contains(logs.String(), "members added on another node were online here") {
		t.Errorf("the feed repaired an addition whose hint was only slow: %s", logs.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// failingGroupStore fails every MembersOf of one group.
type failingGroupStore struct {
	store.Store
	gid int64
}

func (s *failingGroupStore) MembersOf(ctx context.Context, gid int64, uids []string) ([]store.Member, int64, error) {
	if gid == s.gid {
		return nil, 0, errors.New("test: group failing")
	}
	return s.Store.MembersOf(ctx, gid, uids)
}

// TestFeedFailingGroupDoesNotStall: a group whose repair keeps failing
// does not hold back the repair of another group's lost addition read in
// the same page of the feed.
func TestFeedFailingGroupDoesNotStall(t *testing.T) {
	base := openStore(t)
	bad := newGroup(t, base, "alice")
	good := newGroup(t, base, "alice")
	fs := &failingGroupStore{Store: base, gid: bad}
	hub := bus.NewLocal()
	nodes := startClusterOn(t, hub, fs, fanout.Config{Shards: 2}, "a", "b")
	b := nodes[1]
	b.connect(t, "bob")
	ctx := context.Background()
	if _, err := base.AddMembers(ctx, bad, []string{"bob"}); err != nil { // committed, never published
		t.Fatal(err)
	}
	ms, err := base.AddMembers(ctx, good, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "b to give bob the good group", func() bool { return bitOf(b, good, ms[0]) })
}

// TestRemoteAdditionAfterThirdNodesBatch: the bus orders a node's
// membership changes with its own batches only. Bob, online on b, is added
// on a; a message c commits after the addition reaches b first and is
// pushed there to the members as they were; then a's change arrives and
// b joins bob. Bob is owed that message and no later push may show him
// the gap: b sends him a resync up to it. (The cluster soak lost a
// group's last message to a member added 1.4 s before the end this way.)
func TestRemoteAdditionAfterThirdNodesBatch(t *testing.T) {
	st := openStore(t)
	nodes := startCluster(t, st, "a", "b", "c")
	a, b, c := nodes[0], nodes[1], nodes[2]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol", "cindy")
	b.connect(t, "carol")
	b.connect(t, "bob")
	sendUntilPushed(t, c, gid, "cindy", b, "carol")

	held := make(chan *bus.MemberChange, 1)
	take := func(ch *bus.MemberChange) bool {
		if ch.Origin != "a" || ch.Removed {
			return false
		}
		held <- ch
		return true
	}
	b.hold.Store(&take)
	ms, err := a.e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	var change *bus.MemberChange
	select {
	case change = <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("a's addition never reached b")
	}
	r := send(c.e, gid, "cindy", "after-the-addition")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if r.Seq < ms[0].JoinSeq {
		t.Fatalf("c committed seq %d, below bob's join_seq %d", r.Seq, ms[0].JoinSeq)
	}
	waitUntil(t, "carol's push of c's message on b", func() bool { return slices.Contains(b.rec.seqs("carol"), r.Seq) })
	if slices.Contains(b.rec.seqs("bob"), r.Seq) {
		t.Fatal("bob got the message before his addition reached b: the test did not reorder")
	}
	b.hold.Store(nil)
	b.e.RemoteMembers(change)
	waitUntil(t, "a resync for bob on b up to c's message", func() bool {
		return slices.ContainsFunc(b.rec.resyncsOf("bob"), func(s int64) bool { return s >= r.Seq })
	})
	if got := b.rec.seqs("bob"); slices.ContainsFunc(got, func(s int64) bool { return s < ms[0].JoinSeq }) {
		t.Errorf("bob on b got %v, some below his join_seq %d", got, ms[0].JoinSeq)
	}
}
