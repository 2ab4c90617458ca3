package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/fanout/bus/redisbus"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/store"
)

// Ports of this package's throwaway Redis servers (internal/redistest).
const (
	portRedisDown      = 16450
	portRedisPause     = 16451
	portRedisReconnect = 16452
	portRedisCut       = 16453
)

// startRedisCluster starts one engine per id on st, connected by a Redis
// bus on addr (fresh channel prefix); busCfg is every node's bus config
// (NodeID, Handler, Members and Presence are set here).
func startRedisCluster(t *testing.T, st store.Store, addr string, busCfg bus.Config, ids ...string) []*clusterNode {
	t.Helper()
	addrs := make([]string, len(ids))
	for i := range addrs {
		addrs[i] = addr
	}
	return startRedisClusterWith(t, st, fanout.Config{Shards: 2}, addrs, busCfg, ids...)
}

// startRedisClusterWith is startRedisCluster with base as every engine's
// config (Store, Presence, Pusher and Bus are set here) and node ids[i]
// reaching Redis at addrs[i] (a fault proxy, say).
func startRedisClusterWith(t *testing.T, st store.Store, base fanout.Config, addrs []string, busCfg bus.Config, ids ...string) []*clusterNode {
	t.Helper()
	prefix := "fanfare:test:" + strings.ReplaceAll(t.Name(), "/", ":") + ":" + time.Now().Format("150405.000000") + ":"
	var nodes []*clusterNode
	for i, id := range ids {
		addr := addrs[i]
		n := &clusterNode{pres: newPresence(t), rec: newRecorder()}
		rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
			MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { rdb.Close() })
		cfg := busCfg
		cfg.NodeID, cfg.Presence = id, n.pres
		cfg.FlushInterval = 5 * time.Millisecond
		cfg.ProbeInterval = 50 * time.Millisecond
		cfg.Handler = func(b *bus.Batch) { n.e.Remote(b) }
		cfg.Members = func(c *bus.MemberChange) { n.e.RemoteMembers(c) }
		cfg.Reconnected = func(gids []int64) { n.e.BusReconnected(gids) }
		var err error
		n.bus, err = redisbus.New(redisbus.Config{Bus: cfg, Client: rdb, Prefix: prefix, ReconnectBackoff: 100 * time.Millisecond,
			HealthInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ecfg := base
		ecfg.Store, ecfg.Presence, ecfg.Pusher, ecfg.Bus = st, n.pres, n.rec, n.bus
		n.e = enginetest.Start(t, ecfg)
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

// sendUntilPushed sends from uid on from until watcher's node pushed one
// of those messages to watcher (the bus is back), and returns the seqs
// sent.
func sendUntilPushed(t *testing.T, from *clusterNode, gid int64, uid string, to *clusterNode, watcher string) []int64 {
	t.Helper()
	var seqs []int64
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		r := send(from.e, gid, uid, "probe-"+uid+"-"+time.Now().Format("150405.000000000"))
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		seqs = append(seqs, r.Seq)
		for range 20 {
			if slices.Contains(to.rec.seqs(watcher), r.Seq) {
				return seqs
			}
			time.Sleep(10 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no push of %s's messages reached %s after %d tries", uid, watcher, i+1)
		}
	}
}

// above returns the seqs of got that are at or above seq.
func above(got []int64, seq int64) []int64 {
	var out []int64
	for _, s := range got {
		if s >= seq {
			out = append(out, s)
		}
	}
	return out
}

// TestRemovalLostWhileRedisDown: a member removed on node a while Redis
// is down (the change is dropped there) and online on node b gets
// nothing stored after the removal once Redis is back: neither a's
// batches (remote path) nor b's own commits (local path). Before the
// membership version, b kept bob's bit until he reconnected.
func TestRemovalLostWhileRedisDown(t *testing.T) {
	srv := redistest.Start(t, portRedisDown)
	st := openStore(t)
	nodes := startRedisCluster(t, st, srv.Addr(), bus.Config{}, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	// Two groups: the gap shows in g1 through a remote batch, in g2
	// through a commit of b's.
	g1 := newGroup(t, st, "alice", "carol", "bob")
	g2 := newGroup(t, st, "alice", "carol", "bob")
	b.connect(t, "carol")
	b.connect(t, "bob")
	for _, gid := range []int64{g1, g2} {
		before := sendUntilPushed(t, a, gid, "alice", b, "carol")
		if got := b.rec.seqs("bob"); !slices.Contains(got, before[len(before)-1]) {
			t.Fatalf("bob on b got %v before the removal, want seq %d", got, before[len(before)-1])
		}
	}

	srv.Stop()
	// A change published before a's bus has noticed is queued and sent
	// once Redis is back (not lost): let a notice first, through a batch
	// whose publish fails.
	if r := send(a.e, g1, "alice", "while-down"); r.Err != nil {
		t.Fatal(r.Err)
	}
	waitUntil(t, "a's bus to notice Redis is down", func() bool { return !a.bus.Up() })
	for _, gid := range []int64{g1, g2} {
		if err := a.e.RemoveMember(ctx, gid, "bob"); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "a to count the dropped changes", func() bool { return a.bus.Stats().DroppedChanges >= 2 })
	cut1, cut2 := lastSeq(t, st, g1)+1, lastSeq(t, st, g2)+1
	srv.Start()

	sendUntilPushed(t, a, g1, "alice", b, "carol")
	sendUntilPushed(t, b, g2, "carol", b, "carol")
	sendUntilPushed(t, a, g2, "alice", b, "carol")
	got := b.rec.seqsOf("bob")
	if leaked := above(got[g1], cut1); len(leaked) > 0 {
		t.Errorf("bob, removed from %d on a while Redis was down, got %v on b (seqs from %d on)", g1, leaked, cut1)
	}
	if leaked := above(got[g2], cut2); len(leaked) > 0 {
		t.Errorf("bob, removed from %d on a while Redis was down, got %v on b (seqs from %d on)", g2, leaked, cut2)
	}
	for _, gid := range []int64{g1, g2} {
		if b.pres.OnlineCount(gid) != 1 {
			t.Errorf("gid %d: %d online on b, want 1 (carol)", gid, b.pres.OnlineCount(gid))
		}
	}
}

// TestRemovalLostInFullOutbox: while Redis does not answer (paused), node
// a's outbox fills with batches and evicts the removal queued among them;
// once Redis answers again, the removed member online on node b gets
// nothing stored after the removal.
func TestRemovalLostInFullOutbox(t *testing.T) {
	srv := redistest.Start(t, portRedisPause)
	st := openStore(t)
	nodes := startRedisCluster(t, st, srv.Addr(), bus.Config{MaxPayloadBytes: 1024, MaxPendingBytes: 3000}, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol", "bob")
	b.connect(t, "carol")
	b.connect(t, "bob")
	sendUntilPushed(t, a, gid, "alice", b, "carol")

	srv.Pause()
	big := []byte(`"` + strings.Repeat("x", 700) + `"`)
	sendBig := func(id string) {
		t.Helper()
		r := a.e.SendWait(ctx, fanout.SendRequest{GID: gid, UID: "alice", ClientMsgID: id, Body: big})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	sendBig("stuck") // taken by the publisher, which waits for Redis
	time.Sleep(50 * time.Millisecond)
	if err := a.e.RemoveMember(ctx, gid, "bob"); err != nil {
		t.Fatal(err)
	}
	cut := lastSeq(t, st, gid) + 1
	for i := 0; a.bus.Stats().DroppedChanges == 0; i++ {
		if i == 20 {
			t.Fatalf("the removal was not evicted from the outbox after %d batches (stats %+v)", i, a.bus.Stats())
		}
		sendBig("after-" + string(rune('a'+i)))
	}
	srv.Resume()

	sendUntilPushed(t, a, gid, "alice", b, "carol")
	if leaked := above(b.rec.seqs("bob"), cut); len(leaked) > 0 {
		t.Errorf("bob, removed while a's outbox was full, got %v on b (seqs from %d on)", leaked, cut)
	}
}

// TestRemovalLostOnLocalBus: the same repair on the in-process bus, the
// removal dropped because the medium is down: b re-reads the group's
// members before pushing the first batch whose membership version it
// has not applied, and counts the member it dropped.
func TestRemovalLostOnLocalBus(t *testing.T) {
	st := openStore(t)
	hub := bus.NewLocal()
	nodes := startClusterOn(t, hub, st, fanout.Config{Shards: 2}, "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol", "bob")
	b.connect(t, "carol")
	b.connect(t, "bob")
	r1 := send(a.e, gid, "alice", "1")
	waitUntil(t, "bob's push on b", func() bool { return slices.Contains(b.rec.seqs("bob"), r1.Seq) })

	hub.SetDown(true)
	if r := send(a.e, gid, "alice", "2"); r.Err != nil { // its publish fails: a's bus goes down
		t.Fatal(r.Err)
	}
	waitUntil(t, "a's bus to notice", func() bool { return a.bus.Stats().PublishErrors > 0 })
	dropped := a.bus.Stats().DroppedChanges
	if err := a.e.RemoveMember(ctx, gid, "bob"); err != nil {
		t.Fatal(err)
	}
	if a.bus.Stats().DroppedChanges != dropped+1 {
		t.Fatalf("the removal was not dropped by a's bus (stats %+v)", a.bus.Stats())
	}
	hub.SetDown(false)
	seqs := sendUntilPushed(t, a, gid, "alice", b, "carol")
	if got := b.rec.seqs("bob"); slices.ContainsFunc(got, func(s int64) bool { return s > r1.Seq }) {
		t.Errorf("bob, removed on a while the bus was down, got %v on b, want only [%d] (a sent %v after)", got, r1.Seq, seqs)
	}
}

func lastSeq(t *testing.T, st store.Store, gid int64) int64 {
	t.Helper()
	g, err := st.Group(context.Background(), gid)
	if err != nil {
		t.Fatal(err)
	}
	return g.LastSeq
}

// failingMembers fails MembersOf while fail is set, and counts the calls.
type failingMembers struct {
	store.Store
	fail  atomic.Bool
	calls atomic.Int64
}

func (f *failingMembers) MembersOf(ctx context.Context, gid int64, uids []string) ([]store.Member, int64, error) {
	f.calls.Add(1)
	if f.fail.Load() {
		return nil, 0, store.ErrUnavailable
	}
	return f.Store.MembersOf(ctx, gid, uids)
}

// TestRereadFailureBacksOff: while the store fails the membership
// re-read a batch needs, the group's batches are not pushed (clients
// pull) and the re-read is tried at most once per reconcileRetry, not once
// per batch (each try can hold the shard for a CommitTimeout); once the
// store answers again, pushes resume.
func TestRereadFailureBacksOff(t *testing.T) {
	fm := &failingMembers{Store: openStore(t)}
	hub := bus.NewLocal()
	nodes := startClusterOn(t, hub, fm, fanout.Config{Shards: 2}, "a", "b")
	a, b := nodes[0], nodes[1]
	gid := newGroup(t, fm, "alice", "carol")
	b.connect(t, "carol")
	fm.fail.Store(true) // b has no view of gid yet: its first batch re-reads
	var sent []int64
	for i := range 10 {
		r := send(a.e, gid, "alice", fmt.Sprintf("m%d", i))
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		sent = append(sent, r.Seq)
		time.Sleep(20 * time.Millisecond)
	}
	waitUntil(t, "b's first re-read", func() bool { return fm.calls.Load() >= 1 })
	time.Sleep(100 * time.Millisecond) // the last batches reach b
	if n := fm.calls.Load(); n != 1 {
		t.Errorf("b re-read the members %d times for 10 batches in about 300 ms while the store failed, want once", n)
	}
	if got := b.rec.seqs("carol"); len(got) != 0 {
		t.Errorf("carol got %v pushed while b could not check the members, want nothing (she pulls)", got)
	}
	fm.fail.Store(false)
	time.Sleep(time.Second) // past reconcileRetry
	sendUntilPushed(t, a, gid, "alice", b, "carol")
}

// TestTailHintResyncsLostBatch: a batch lost on the bus (a's publish while
// the bus is down) and no later message: the group's tail hint, kept by a
// until the bus is back, makes b send its online member a resync up to the
// lost seq. A hint b already pushed up to sends nothing.
func TestTailHintResyncsLostBatch(t *testing.T) {
	st := openStore(t)
	hub := bus.NewLocal()
	nodes := startClusterOnBus(t, hub, st, fanout.Config{Shards: 2},
		bus.Config{TailDelay: 100 * time.Millisecond, ProbeInterval: 20 * time.Millisecond}, "a", "b")
	a, b := nodes[0], nodes[1]
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol")
	r1 := send(a.e, gid, "alice", "1")
	waitUntil(t, "carol's push on b", func() bool { return slices.Contains(b.rec.seqs("carol"), r1.Seq) })
	waitUntil(t, "the hint of r1", func() bool { return b.bus.Stats().TailsDelivered >= 1 })
	time.Sleep(50 * time.Millisecond)
	if got := b.rec.resyncsOf("carol"); len(got) != 0 {
		t.Fatalf("a hint at what b pushed sent resyncs %v, want none", got)
	}

	hub.SetDown(true)
	r2 := send(a.e, gid, "alice", "2") // its publish fails: lost for b
	if r2.Err != nil {
		t.Fatal(r2.Err)
	}
	waitUntil(t, "a's bus to notice", func() bool { return a.bus.Stats().PublishErrors > 0 })
	r3 := send(a.e, gid, "alice", "3") // dropped at once (bus down)
	if r3.Err != nil {
		t.Fatal(r3.Err)
	}
	time.Sleep(200 * time.Millisecond) // the hint is due while the bus is down
	hub.SetDown(false)
	waitUntil(t, "carol's resync up to r3", func() bool { return slices.Contains(b.rec.resyncsOf("carol"), r3.Seq) })
	if got := b.rec.seqs("carol"); slices.Contains(got, r2.Seq) || slices.Contains(got, r3.Seq) {
		t.Fatalf("carol got %v by push, want r2 and r3 lost (the test's premise)", got)
	}
	if got := b.rec.resyncsOf("carol"); len(got) != 1 {
		t.Errorf("resyncs: got %v, want one, up to %d", got, r3.Seq)
	}
}

// TestReconnectResyncs: a batch node b never received because its Redis
// subscriber was cut (Redis restarted) is found once b has subscribed
// again: b reads the group's last seq from the store and sends its online
// member a resync up to it. Tail hints are off here, so that only this
// repair can tell.
func TestReconnectResyncs(t *testing.T) {
	srv := redistest.Start(t, portRedisReconnect)
	st := openStore(t)
	nodes := startRedisCluster(t, st, srv.Addr(), bus.Config{TailDelay: -1}, "a", "b")
	a, b := nodes[0], nodes[1]
	gid := newGroup(t, st, "alice", "carol")
	b.connect(t, "carol")
	before := sendUntilPushed(t, a, gid, "alice", b, "carol")

	srv.Stop()
	r := send(a.e, gid, "alice", "while-down") // stored; its batch is lost
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	waitUntil(t, "a's bus to drop the batch", func() bool { return !a.bus.Up() })
	srv.Start()
	waitUntil(t, "carol's resync up to the lost seq", func() bool { return slices.Contains(b.rec.resyncsOf("carol"), r.Seq) })
	if got := b.rec.seqs("carol"); slices.Contains(got, r.Seq) {
		t.Fatalf("carol got %v by push, want seq %d lost (the test's premise; before: %v)", got, r.Seq, before)
	}
}
