// Package bustest is the conformance suite every bus transport passes
// (bus.Local and redisbus): one suite, so the semantics cannot drift.
package bustest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/store"
)

// Medium makes the nodes of one test cluster: nodes of one Medium see each
// other's publishes, nodes of different Media never do.
type Medium interface {
	// NewNode returns a node on the medium, not running yet.
	NewNode(t *testing.T, cfg bus.Config) *bus.Node
}

// Outage is a Medium whose backend can be stopped and started again.
type Outage interface {
	Medium
	// Stop makes the backend unreachable (a Redis server killed); Start
	// brings it back, empty (subscriptions gone on the server side).
	Stop(t *testing.T)
	Start(t *testing.T)
}

// Harness gives the suite its media. The suite assumes a node receives a
// publisher's payloads in publish order across groups too (true in process
// and on one Redis server; not across Redis Cluster shards).
type Harness struct {
	// NewMedium returns a fresh medium (e.g. a new key prefix).
	NewMedium func(t *testing.T) Medium
	// NewOutage returns a fresh medium that can fail.
	NewOutage func(t *testing.T) Outage
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"SubscribedGroupsOnly", testSubscribedOnly},
		{"ThreeNodesInOrder", testThreeNodes},
		{"FieldsRoundTrip", testFields},
		{"UnsubscribeStops", testUnsubscribe},
		{"LargeBatchSplits", testLargeBatch},
		{"CoalescesWhileQueued", testCoalesce},
		{"PublishQueueBound", testQueueBound},
		{"StaleDropped", testStale},
		{"StalledConsumer", testStalledConsumer},
		{"PresenceDrivesSubscriptions", testPresence},
		{"MaxGroups", testMaxGroups},
		{"ShutdownDrains", testShutdown},
		{"Outage", testOutage},
		{"MemberChanges", testMemberChanges},
		{"TailHints", testTailHints},
		{"TailHintAfterOutage", testTailAfterOutage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
}

// ---- helpers ----

// wait is how long the suite waits for something that should happen.
const wait = 10 * time.Second

// recorder is a Handler that keeps a copy of every batch, and the tail
// hints apart.
type recorder struct {
	mu      sync.Mutex
	batches []got
	tails   []got // msgs nil; version, and the seq in tail
	ch      chan struct{}
}

type got struct {
	gid     int64
	origin  string
	version int64
	msgs    []store.Message
	tail    int64
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 1)} }

func (r *recorder) handle(b *bus.Batch) {
	g := got{gid: b.GID, origin: b.Origin, version: b.MemberVersion, msgs: slices.Clone(b.Msgs), tail: b.Tail}
	b.Release()
	r.mu.Lock()
	if g.tail > 0 {
		r.tails = append(r.tails, g)
	} else {
		r.batches = append(r.batches, g)
	}
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

func (r *recorder) snapshot() []got {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

// seqs returns the seqs received for gid from origin, in arrival order.
func (r *recorder) seqs(gid int64, origin string) []int64 {
	var s []int64
	for _, b := range r.snapshot() {
		if b.gid == gid && b.origin == origin {
			for _, m := range b.msgs {
				s = append(s, m.Seq)
			}
		}
	}
	return s
}

// tailList returns the tail hints received, as "origin gid seq vV".
func (r *recorder) tailList() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, g := range r.tails {
		out = append(out, fmt.Sprintf("%s %d %d v%d", g.origin, g.gid, g.tail, g.version))
	}
	return out
}

func (r *recorder) count() int {
	n := 0
	for _, b := range r.snapshot() {
		n += len(b.msgs)
	}
	return n
}

// waitFor polls cond until it holds or the suite's patience ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// start runs n until the test ends.
func start(t *testing.T, n *bus.Node) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
}

type node struct {
	*bus.Node
	rec *recorder
}

func newNode(t *testing.T, m Medium, cfg bus.Config) node {
	t.Helper()
	rec := newRecorder()
	if cfg.Handler == nil {
		cfg.Handler = rec.handle
	}
	return node{Node: m.NewNode(t, cfg), rec: rec}
}

func runNode(t *testing.T, m Medium, id string) node {
	t.Helper()
	n := newNode(t, m, bus.Config{NodeID: id})
	start(t, n.Node)
	return n
}

func subscribe(t *testing.T, n node, gids ...int64) {
	t.Helper()
	for _, gid := range gids {
		if err := n.Subscribe(gid); err != nil {
			t.Fatalf("Subscribe(%d): %v", gid, err)
		}
	}
	sync1(t, n)
}

func sync1(t *testing.T, n node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := n.SyncSubscriptions(ctx); err != nil {
		t.Fatalf("SyncSubscriptions: %v", err)
	}
}

var t0 = time.UnixMilli(1_700_000_000_000)

// msgs returns count text messages of gid from seq on.
func msgs(gid, seq int64, count int) []store.Message {
	out := make([]store.Message, count)
	for i := range out {
		s := seq + int64(i)
		out[i] = store.Message{
			GID: gid, Seq: s, Sender: "u" + strconv.FormatInt(s%7, 10), ClientMsgID: "c" + strconv.FormatInt(s, 10),
			Kind: store.KindText, Body: []byte(`{"n":` + strconv.FormatInt(s, 10) + `}`), CreatedAt: t0.Add(time.Duration(s) * time.Millisecond),
		}
	}
	return out
}

func publish(t *testing.T, n node, gid int64, m []store.Message) {
	t.Helper()
	if err := n.Publish(gid, 0, m); err != nil {
		t.Fatalf("Publish(%d): %v", gid, err)
	}
}

func seqRange(from, to int64) []int64 {
	var s []int64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// ---- tests ----

// testSubscribedOnly: B gets A's batches of the groups it subscribed to,
// in order, and nothing else; A (subscribed too) never gets its own.
func testSubscribedOnly(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	a, b := runNode(t, m, "a"), runNode(t, m, "b")
	subscribe(t, a, 1)
	subscribe(t, b, 1, 3)
	var next int64 = 1
	for i := range 40 {
		n := 1 + i%5
		publish(t, a, 1, msgs(1, next, n))
		publish(t, a, 2, msgs(2, next, n)) // nobody subscribed
		next += int64(n)
	}
	publish(t, a, 3, msgs(3, 1, 1)) // marker: published last
	waitFor(t, "b to receive the marker", func() bool { return len(b.rec.seqs(3, "a")) == 1 })
	if got, want := b.rec.seqs(1, "a"), seqRange(1, next-1); !slices.Equal(got, want) {
		t.Errorf("b got seqs %v of gid 1, want %v", got, want)
	}
	if got := b.rec.seqs(2, "a"); len(got) != 0 {
		t.Errorf("b got %d messages of unsubscribed gid 2, want 0", len(got))
	}
	if got := a.rec.count(); got != 0 {
		t.Errorf("a received %d messages, want 0 (no self-delivery)", got)
	}
	if s := b.Stats(); s.DecodeErrors != 0 || s.Dropped != (bus.Drops{}) {
		t.Errorf("b stats: got %+v, want no drops or decode errors", s)
	}
}

// testThreeNodes: every node publishes to one group; each gets the other
// two's batches, each publisher's in order, and never its own.
func testThreeNodes(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	ids := []string{"n1", "n2", "n3"}
	var nodes []node
	for _, id := range ids {
		n := runNode(t, m, id)
		subscribe(t, n, 7)
		nodes = append(nodes, n)
	}
	const per = 60
	var wg sync.WaitGroup
	for k, n := range nodes {
		wg.Go(func() {
			for i := range per {
				// Each node owns a seq range, as the store would give
				// interleaved ranges.
				if err := n.Publish(7, 0, msgs(7, int64(k*1000+i*2+1), 2)); err != nil {
					t.Errorf("Publish: %v", err)
				}
			}
		})
	}
	wg.Wait()
	for i, n := range nodes {
		waitFor(t, ids[i]+" to receive everything", func() bool { return n.rec.count() == 2*per*2 })
		for k, id := range ids {
			got := n.rec.seqs(7, id)
			if k == i {
				if len(got) != 0 {
					t.Errorf("%s got %d of its own messages, want 0", ids[i], len(got))
				}
				continue
			}
			if want := seqRange(int64(k*1000+1), int64(k*1000+2*per)); !slices.Equal(got, want) {
				t.Errorf("%s got seqs %v from %s, want %v", ids[i], got, id, want)
			}
		}
	}
}

// testFields: every field the push needs survives the trip.
func testFields(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	a, b := runNode(t, m, "a"), runNode(t, m, "b")
	subscribe(t, b, -5, 1<<62)
	in := []store.Message{
		{GID: 1 << 62, Seq: 1, Sender: "alice", ClientMsgID: "id-1", Kind: store.KindText, Body: []byte(`"hi"`), CreatedAt: t0},
		{GID: 1 << 62, Seq: 2, Sender: "bob", ClientMsgID: "", Kind: store.KindAtAll, Body: []byte(`{"t":"all","x":[1,2]}`), CreatedAt: t0.Add(1500 * time.Millisecond)},
		{GID: 1 << 62, Seq: 1 << 40, Sender: "ü-ñ", ClientMsgID: "x", Kind: "poll", Body: []byte(`null`), CreatedAt: time.UnixMilli(-1)},
	}
	publish(t, a, 1<<62, in)
	publish(t, a, -5, msgs(-5, 9, 1))
	waitFor(t, "both batches", func() bool { return len(b.rec.snapshot()) == 2 })
	gb := b.rec.snapshot()
	if gb[0].gid != 1<<62 || gb[0].origin != "a" || len(gb[0].msgs) != len(in) {
		t.Fatalf("got batch gid %d origin %q with %d messages, want gid %d origin a with %d", gb[0].gid, gb[0].origin, len(gb[0].msgs), int64(1<<62), len(in))
	}
	for i, w := range in {
		g := gb[0].msgs[i]
		if g.GID != w.GID || g.Seq != w.Seq || g.Sender != w.Sender || g.ClientMsgID != w.ClientMsgID ||
			g.Kind != w.Kind || string(g.Body) != string(w.Body) || g.CreatedAt.UnixMilli() != w.CreatedAt.UnixMilli() {
			t.Errorf("message %d: got %+v, want %+v", i, g, w)
		}
	}
	if gb[1].gid != -5 || len(gb[1].msgs) != 1 || gb[1].msgs[0].Seq != 9 {
		t.Errorf("second batch: got %+v, want gid -5 seq 9", gb[1])
	}
}

// testUnsubscribe: nothing is delivered after Unsubscribe returns, the
// transport stops receiving after the flush, and a new Subscribe works.
func testUnsubscribe(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	a, b := runNode(t, m, "a"), runNode(t, m, "b")
	subscribe(t, b, 1, 2)
	publish(t, a, 1, msgs(1, 1, 3))
	waitFor(t, "first batch", func() bool { return b.rec.count() == 3 })

	b.Unsubscribe(1)
	if b.Subscribed(1) {
		t.Fatal("Subscribed(1) after Unsubscribe: got true, want false")
	}
	publish(t, a, 1, msgs(1, 4, 3)) // the transport still carries it: filtered
	waitFor(t, "the publish", func() bool { return a.Stats().Published == 2 })
	sync1(t, b)
	publish(t, a, 1, msgs(1, 7, 3)) // not even received
	publish(t, a, 2, msgs(2, 1, 1)) // marker
	waitFor(t, "marker", func() bool { return len(b.rec.seqs(2, "a")) == 1 })
	if got := b.rec.seqs(1, "a"); !slices.Equal(got, seqRange(1, 3)) {
		t.Errorf("after Unsubscribe: got seqs %v of gid 1, want [1 2 3]", got)
	}
	s := b.Stats()
	if s.Received != 3 || s.Unsubscribed != 1 {
		t.Errorf("stats: got received %d, unsubscribed %d; want 3 payloads received, 1 of them filtered", s.Received, s.Unsubscribed)
	}

	subscribe(t, b, 1)
	publish(t, a, 1, msgs(1, 10, 2))
	waitFor(t, "after resubscribe", func() bool { return len(b.rec.seqs(1, "a")) == 5 })
	if got := b.rec.seqs(1, "a"); !slices.Equal(got, []int64{1, 2, 3, 10, 11}) {
		t.Errorf("after resubscribe: got seqs %v, want [1 2 3 10 11]", got)
	}
}

// testLargeBatch: a batch bigger than one payload arrives whole, in
// order, split at MaxPayloadBytes and MaxBatchMessages; a message that
// cannot fit any payload is dropped and counted.
func testLargeBatch(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	a := newNode(t, m, bus.Config{NodeID: "a", MaxPayloadBytes: 4096, MaxBatchMessages: 50})
	start(t, a.Node)
	b := runNode(t, m, "b")
	subscribe(t, b, 1)
	big := msgs(1, 1, 1000) // ~30 bytes each: split by bytes and by count
	for i := range big {
		if i%100 == 0 {
			big[i].Body = []byte(`"` + fmt.Sprintf("%03000d", i) + `"`)
		}
	}
	publish(t, a, 1, big)
	waitFor(t, "1000 messages", func() bool { return b.rec.count() == 1000 })
	if got := b.rec.seqs(1, "a"); !slices.Equal(got, seqRange(1, 1000)) {
		t.Errorf("got %d seqs out of order or missing, want 1..1000", len(got))
	}
	for _, bt := range b.rec.snapshot() {
		if len(bt.msgs) > 50 {
			t.Errorf("got a payload of %d messages, want at most 50", len(bt.msgs))
		}
	}
	huge := msgs(1, 1001, 2)
	huge[0].Body = make([]byte, 5000)
	if err := a.Publish(1, 0, huge); !errors.Is(err, bus.ErrTooLarge) {
		t.Errorf("Publish with a 5000-byte body: got %v, want ErrTooLarge", err)
	}
	waitFor(t, "the message that fits", func() bool { return b.rec.count() == 1001 })
	if got := a.Stats().Dropped.TooLarge; got != 1 {
		t.Errorf("Dropped.TooLarge: got %d, want 1", got)
	}
}

// testCoalesce: batches published while the node is not sending are merged
// into one payload per group, in order.
func testCoalesce(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	b := runNode(t, m, "b")
	subscribe(t, b, 1, 2)
	a := newNode(t, m, bus.Config{NodeID: "a"})
	for i := range 10 {
		// The payload carries the highest membership version of the
		// batches coalesced into it.
		if err := a.Publish(1, int64(i), msgs(1, int64(i*3+1), 3)); err != nil {
			t.Fatal(err)
		}
		if err := a.Publish(2, int64(5-i%2), msgs(2, int64(i+1), 1)); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.Stats().Coalesced; got != 18 {
		t.Errorf("Coalesced: got %d, want 18", got)
	}
	start(t, a.Node)
	waitFor(t, "40 messages", func() bool { return b.rec.count() == 40 })
	if got := len(b.rec.snapshot()); got != 2 {
		t.Errorf("got %d payloads, want 2 (one per group)", got)
	}
	for _, g := range b.rec.snapshot() {
		if want := map[int64]int64{1: 9, 2: 5}[g.gid]; g.version != want {
			t.Errorf("gid %d: payload has membership version %d, want %d (the highest)", g.gid, g.version, want)
		}
	}
	if got := b.rec.seqs(1, "a"); !slices.Equal(got, seqRange(1, 30)) {
		t.Errorf("gid 1: got %v, want 1..30", got)
	}
	if s := a.Stats(); s.Published != 2 || s.PublishedMsgs != 40 {
		t.Errorf("stats: got %d payloads / %d messages published, want 2 / 40", s.Published, s.PublishedMsgs)
	}
}

// testQueueBound: past MaxPendingBytes the oldest payloads are dropped and
// counted; the newest are sent.
func testQueueBound(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	b := runNode(t, m, "b")
	const groups = 200
	for g := range int64(groups) {
		if err := b.Subscribe(g); err != nil {
			t.Fatal(err)
		}
	}
	sync1(t, b)
	a := newNode(t, m, bus.Config{NodeID: "a", MaxPendingBytes: 8192, MaxPayloadBytes: 1024})
	for g := range int64(groups) {
		publish(t, a, g, msgs(g, 1, 1)) // ~100 bytes each with overhead: most evicted
	}
	s := a.Stats()
	if s.PendingBytes > 8192 {
		t.Errorf("PendingBytes: got %d, want <= 8192", s.PendingBytes)
	}
	if s.Dropped.QueueFull == 0 {
		t.Fatal("Dropped.QueueFull: got 0, want > 0")
	}
	kept := groups - int(s.Dropped.QueueFull)
	start(t, a.Node)
	waitFor(t, "the kept batches", func() bool { return b.rec.count() == kept })
	// The survivors are the newest groups.
	var gids []int64
	for _, bt := range b.rec.snapshot() {
		gids = append(gids, bt.gid)
	}
	slices.Sort(gids)
	if want := seqRange(int64(groups-kept), groups-1); !slices.Equal(gids, want) {
		t.Errorf("got groups %v, want the newest %v", gids, want)
	}
}

// testStale: message payloads queued longer than MaxDelay are dropped,
// not sent; a membership change is sent however late (it is what stops
// pushes to a removed member).
func testStale(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	b := runNode(t, m, "b")
	subscribe(t, b, 1, 2)
	var lc changeLog
	c := newNode(t, m, bus.Config{NodeID: "c", Handler: lc.batch, Members: lc.members})
	start(t, c.Node)
	if err := c.SyncSubscriptions(context.Background()); err != nil { // ControlGID
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	a := newNode(t, m, bus.Config{NodeID: "a", MaxDelay: time.Second, Now: clock})
	publish(t, a, 1, msgs(1, 1, 4))
	if err := a.PublishMembers(1, 0, true, []store.Member{{UID: "bob"}}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	publish(t, a, 2, msgs(2, 1, 1))
	start(t, a.Node)
	waitFor(t, "the fresh batch", func() bool { return b.rec.count() == 1 })
	waitFor(t, "the stale drop", func() bool { return a.Stats().Dropped.Stale == 4 })
	if got := b.rec.seqs(1, "a"); len(got) != 0 {
		t.Errorf("got stale seqs %v, want none", got)
	}
	waitFor(t, "the late membership change", func() bool { return slices.Contains(lc.snapshot(), "a 1 v0 -bob") })
}

// testStalledConsumer: a handler that stops consuming never blocks the
// receiver: the inbox keeps its bound, drops the oldest (counted), and
// hands over the newest once the handler resumes.
func testStalledConsumer(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	a := runNode(t, m, "a")
	release := make(chan struct{})
	rec := newRecorder()
	var first sync.Once
	entered := make(chan struct{})
	b := newNode(t, m, bus.Config{NodeID: "b", InboxBatches: 8, Handler: func(bt *bus.Batch) {
		first.Do(func() { close(entered); <-release })
		rec.handle(bt)
	}})
	b.rec = rec
	start(t, b.Node)
	subscribe(t, b, 1)
	publish(t, a, 1, msgs(1, 1, 1))
	<-entered // the handler is stuck on seq 1
	const total = 200
	for i := int64(2); i <= total; i++ {
		publish(t, a, 1, msgs(1, i, 1))
		if i%20 == 0 { // separate payloads, not one coalesced
			waitFor(t, "publish", func() bool { return a.Stats().PublishedMsgs == i })
		}
	}
	waitFor(t, "everything received", func() bool { return b.Stats().ReceivedMsgs == total })
	s := b.Stats()
	if s.Dropped.Inbox == 0 {
		t.Errorf("Dropped.Inbox: got 0, want > 0 with a stalled handler")
	}
	close(release)
	waitFor(t, "the inbox drained", func() bool {
		return int64(rec.count())+b.Stats().Dropped.Inbox == total
	})
	got := rec.seqs(1, "a")
	if got[len(got)-1] != total {
		t.Errorf("last delivered seq: got %d, want %d (the newest survive)", got[len(got)-1], total)
	}
	if !slices.IsSorted(got) {
		t.Errorf("delivered seqs out of order: %v", got)
	}
}

// fakePresence is a settable Presence.
type fakePresence struct {
	mu     sync.Mutex
	online map[int64]int
}

func (p *fakePresence) set(gid int64, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n == 0 {
		delete(p.online, gid)
	} else {
		p.online[gid] = n
	}
}

func (p *fakePresence) AppendGroups(dst []int64) []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	for g := range p.online {
		dst = append(dst, g)
	}
	return dst
}

func (p *fakePresence) OnlineCount(gid int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.online[gid]
}

// testPresence: with Presence, the node follows the groups online here.
func testPresence(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	a := runNode(t, m, "a")
	p := &fakePresence{online: map[int64]int{1: 2}}
	b := newNode(t, m, bus.Config{NodeID: "b", Presence: p, ReconcileInterval: 10 * time.Millisecond, FlushInterval: 5 * time.Millisecond})
	start(t, b.Node)
	waitFor(t, "gid 1 subscribed", func() bool { return b.Subscribed(1) && b.Stats().Subscriptions == 1 })
	p.set(2, 1)
	waitFor(t, "gid 2 subscribed", func() bool { return b.Subscribed(2) && b.Stats().Subscriptions == 2 })
	sync1(t, b)
	publish(t, a, 1, msgs(1, 1, 1))
	publish(t, a, 2, msgs(2, 1, 1))
	waitFor(t, "both groups", func() bool { return b.rec.count() == 2 })
	p.set(1, 0)
	waitFor(t, "gid 1 dropped", func() bool { return !b.Subscribed(1) && b.Stats().Subscriptions == 1 })
	if !b.Subscribed(2) {
		t.Error("gid 2: got unsubscribed, want subscribed (a member is online)")
	}
	// A group touched by Subscribe right before the sweep is kept even
	// though presence does not list it yet (the engine subscribes at join).
	p.set(9, 1)
	if err := b.Subscribe(9); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		time.Sleep(10 * time.Millisecond) // across sweeps
		if !b.Subscribed(9) {
			t.Fatal("gid 9: got unsubscribed, want subscribed")
		}
	}
}

// testMaxGroups: Subscribe past MaxGroups fails and is counted.
func testMaxGroups(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	b := newNode(t, m, bus.Config{NodeID: "b", MaxGroups: 3})
	for g := range int64(3) {
		if err := b.Subscribe(g); err != nil {
			t.Fatalf("Subscribe(%d): %v", g, err)
		}
	}
	if err := b.Subscribe(0); err != nil {
		t.Errorf("Subscribe of a subscribed group at the bound: got %v, want nil", err)
	}
	if err := b.Subscribe(3); !errors.Is(err, bus.ErrTooManyGroups) {
		t.Errorf("Subscribe past the bound: got %v, want ErrTooManyGroups", err)
	}
	b.Unsubscribe(1)
	if err := b.Subscribe(3); err != nil {
		t.Errorf("Subscribe after Unsubscribe: got %v, want nil", err)
	}
	if got := b.Stats().Refused; got != 1 {
		t.Errorf("Refused: got %d, want 1", got)
	}
}

// testShutdown: Shutdown sends what is queued; Publish then fails.
func testShutdown(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	b := runNode(t, m, "b")
	subscribe(t, b, 1)
	a := newNode(t, m, bus.Config{NodeID: "a"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	publish(t, a, 1, msgs(1, 1, 1))
	waitFor(t, "a running", func() bool { return b.rec.count() == 1 })
	for i := range 49 {
		publish(t, a, 1, msgs(1, int64(i+2), 1))
	}
	sctx, scancel := context.WithTimeout(context.Background(), wait)
	defer scancel()
	if err := a.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Run after Shutdown: got %v, want nil", err)
	}
	if err := a.Publish(1, 0, msgs(1, 51, 1)); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Publish after Shutdown: got %v, want ErrClosed", err)
	}
	waitFor(t, "the 50 queued messages", func() bool { return b.rec.count() == 50 })
	if got := b.rec.seqs(1, "a"); !slices.Equal(got, seqRange(1, 50)) {
		t.Errorf("got %v, want 1..50", got)
	}
}

// testOutage: the backend goes away and comes back. Publish drops
// (counted) while it is down, the nodes keep running, a subscription made
// during the outage and the old ones all work afterwards, without a
// restart of the nodes.
func testOutage(t *testing.T, h Harness) {
	m := h.NewOutage(t)
	cfg := func(id string) bus.Config {
		return bus.Config{NodeID: id, ProbeInterval: 20 * time.Millisecond, PublishTimeout: time.Second, FlushInterval: 10 * time.Millisecond}
	}
	a := newNode(t, m, cfg("a"))
	b := newNode(t, m, cfg("b"))
	start(t, a.Node)
	start(t, b.Node)
	subscribe(t, b, 1)
	publish(t, a, 1, msgs(1, 1, 1))
	waitFor(t, "delivery before the outage", func() bool { return b.rec.count() == 1 })

	m.Stop(t)
	// The first publish after the outage fails in the publisher and
	// turns the node down; from then on Publish drops at once.
	waitFor(t, "a to notice the outage", func() bool {
		_ = a.Publish(1, 0, msgs(1, 2, 1))
		return !a.Up()
	})
	if err := a.Publish(1, 0, msgs(1, 3, 1)); !errors.Is(err, bus.ErrUnavailable) {
		t.Errorf("Publish during the outage: got %v, want ErrUnavailable", err)
	}
	if s := a.Stats(); s.Dropped.Unavailable == 0 {
		t.Errorf("Dropped.Unavailable: got 0, want > 0 (stats %+v)", s.Dropped)
	}
	if err := b.Subscribe(2); err != nil { // during the outage
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the flush try and fail

	m.Start(t)
	waitFor(t, "a to publish again", func() bool { return a.Up() })
	// Subscriptions come back with the receivers' reconnect: probe until
	// a publish of each group is delivered.
	var seq int64 = 100
	for _, gid := range []int64{1, 2} {
		waitFor(t, fmt.Sprintf("delivery of gid %d after the outage", gid), func() bool {
			seq++
			_ = a.Publish(gid, 0, msgs(gid, seq, 1))
			time.Sleep(20 * time.Millisecond)
			return slices.ContainsFunc(b.rec.seqs(gid, "a"), func(s int64) bool { return s > 100 })
		})
	}
	// And it flows in order again.
	for i := range int64(20) {
		publish(t, a, 1, msgs(1, 1000+i, 1))
	}
	after := func() []int64 {
		var s []int64
		for _, q := range b.rec.seqs(1, "a") {
			if q >= 1000 {
				s = append(s, q)
			}
		}
		return s
	}
	waitFor(t, "20 more", func() bool { return len(after()) == 20 })
	if got := after(); !slices.Equal(got, seqRange(1000, 1019)) {
		t.Errorf("after the outage: got %v, want 1000..1019", got)
	}
}

// changeLog is a MembersHandler that keeps, in arrival order, every change
// as "origin gid +uid/ordinal/join_seq" or "origin gid -uid", and the
// batches as "origin gid seq N".
type changeLog struct {
	mu  sync.Mutex
	got []string
}

func (l *changeLog) add(s string) {
	l.mu.Lock()
	l.got = append(l.got, s)
	l.mu.Unlock()
}

func (l *changeLog) members(c *bus.MemberChange) {
	for _, m := range c.Members {
		if c.Removed {
			l.add(fmt.Sprintf("%s %d v%d -%s", c.Origin, c.GID, c.Version, m.UID))
		} else {
			l.add(fmt.Sprintf("%s %d v%d +%s/%d/%d", c.Origin, c.GID, c.Version, m.UID, m.Ordinal, m.JoinSeq))
		}
	}
}

func (l *changeLog) batch(b *bus.Batch) {
	for _, m := range b.Msgs {
		l.add(fmt.Sprintf("%s %d seq %d", b.Origin, b.GID, m.Seq))
	}
	b.Release()
}

func (l *changeLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got)
}

// testMemberChanges: a membership change reaches every node that takes
// changes, whether or not it is subscribed to the group, in publish order
// with the publisher's batches; the publisher does not get its own; a node
// without a MembersHandler gets none; a change larger than a payload
// arrives whole (split); Unsubscribe(ControlGID) does not stop changes.
func testMemberChanges(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	var la, lb, lc changeLog
	a := newNode(t, m, bus.Config{NodeID: "a", Handler: la.batch, Members: la.members, MaxPayloadBytes: 1024})
	b := newNode(t, m, bus.Config{NodeID: "b", Handler: lb.batch, Members: lb.members})
	c := newNode(t, m, bus.Config{NodeID: "c", Handler: lc.batch}) // takes no changes
	for _, n := range []node{a, b, c} {
		start(t, n.Node)
	}
	subscribe(t, b, 5, 8) // b has members of 5 and 8 online; 6 is new to it
	subscribe(t, c, 5, 8)
	b.Unsubscribe(bus.ControlGID)
	for _, n := range []node{a, b, c} {
		if err := n.SyncSubscriptions(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	mustPublish := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	mustPublish(a.PublishMembers(6, 3, false, []store.Member{{UID: "bob", Ordinal: 3, JoinSeq: 11}, {UID: "carol", Ordinal: 0, JoinSeq: 11}}))
	mustPublish(a.PublishMembers(5, 7, false, []store.Member{{UID: "bob", Ordinal: 1 << 31, JoinSeq: 40}}))
	mustPublish(a.Publish(5, 7, msgs(5, 40, 1)))
	mustPublish(a.PublishMembers(5, 8, true, []store.Member{{UID: "bob"}}))
	mustPublish(a.Publish(5, 8, msgs(5, 41, 1)))
	// 300 members do not fit in one payload of 1 KiB.
	many := make([]store.Member, 300)
	for i := range many {
		many[i] = store.Member{UID: "user-" + strconv.Itoa(i), Ordinal: uint32(i), JoinSeq: 1}
	}
	mustPublish(a.PublishMembers(7, 2, false, many))
	mustPublish(a.Publish(8, 0, msgs(8, 1, 1))) // the end marker (a batch of 5 would join seq 41's payload)

	want := []string{"a 6 v3 +bob/3/11", "a 6 v3 +carol/0/11", "a 5 v7 +bob/2147483648/40", "a 5 seq 40", "a 5 v8 -bob", "a 5 seq 41"}
	for i := range many {
		want = append(want, fmt.Sprintf("a 7 v2 +user-%d/%d/1", i, i))
	}
	want = append(want, "a 8 seq 1")
	waitFor(t, "b to get every change", func() bool { return len(lb.snapshot()) >= len(want) })
	if got := lb.snapshot(); !slices.Equal(got, want) {
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Fatalf("b got %d events; event %d: got %q, want %q", len(got), i, got[i], want[i])
			}
		}
		t.Fatalf("b got %d events, want %d", len(got), len(want))
	}
	// c gets the batches of 5 and nothing else; the end marker came last.
	waitFor(t, "c to get the batches", func() bool { return len(lc.snapshot()) == 3 })
	if got, want := lc.snapshot(), []string{"a 5 seq 40", "a 5 seq 41", "a 8 seq 1"}; !slices.Equal(got, want) {
		t.Errorf("c got %v, want %v", got, want)
	}
	if got := la.snapshot(); len(got) != 0 {
		t.Errorf("a got %v, want nothing of its own", got)
	}
	sa, sb := a.Stats(), b.Stats()
	if sa.PublishedChanges < 4 || sb.DeliveredChanges != sa.PublishedChanges || sa.DroppedChanges != 0 {
		t.Errorf("changes: a published %d dropped %d, b delivered %d; want >= 4 (the large one split), as many, 0",
			sa.PublishedChanges, sa.DroppedChanges, sb.DeliveredChanges)
	}
	if sa.PublishedMsgs != 3 || sb.DeliveredMsgs != 3 {
		t.Errorf("messages: a published %d, b delivered %d; want 3 (changes are not messages)", sa.PublishedMsgs, sb.DeliveredMsgs)
	}
}

// testTailHints: a group that goes quiet for TailDelay gets one tail hint
// with its last seq and version, after its batches; a publish within the
// delay postpones it; TailDelay < 0 sends none.
func testTailHints(t *testing.T, h Harness) {
	m := h.NewMedium(t)
	b := runNode(t, m, "b")
	subscribe(t, b, 1, 2)
	a := newNode(t, m, bus.Config{NodeID: "a", TailDelay: 300 * time.Millisecond})
	start(t, a.Node)
	off := newNode(t, m, bus.Config{NodeID: "off", TailDelay: -1})
	start(t, off.Node)
	publishV := func(n node, gid, version int64, ms []store.Message) {
		t.Helper()
		if err := n.Publish(gid, version, ms); err != nil {
			t.Fatalf("Publish(%d): %v", gid, err)
		}
	}
	publishV(a, 1, 4, msgs(1, 1, 3))
	publishV(a, 2, 1, msgs(2, 1, 1))
	publishV(off, 2, 1, msgs(2, 7, 1))
	time.Sleep(150 * time.Millisecond)
	publishV(a, 1, 5, msgs(1, 4, 2)) // within the delay: gid 1's hint waits
	waitFor(t, "two tail hints", func() bool { return len(b.rec.tailList()) >= 2 })
	time.Sleep(400 * time.Millisecond) // nothing more comes
	want := []string{"a 2 1 v1", "a 1 5 v5"}
	if got := b.rec.tailList(); !slices.Equal(got, want) {
		t.Errorf("tail hints: got %v, want %v", got, want)
	}
	if got := b.rec.seqs(1, "a"); !slices.Equal(got, seqRange(1, 5)) {
		t.Errorf("gid 1 seqs: got %v, want 1..5", got)
	}
	if s := a.Stats(); s.TailsPublished != 2 {
		t.Errorf("TailsPublished: got %d, want 2", s.TailsPublished)
	}
	if s := b.Stats(); s.TailsDelivered != 2 {
		t.Errorf("TailsDelivered: got %d, want 2", s.TailsDelivered)
	}
}

// testTailAfterOutage: the batches published while the backend is down are
// dropped, but their group's tail hint is kept and sent once it is back,
// with the last seq published during the outage.
func testTailAfterOutage(t *testing.T, h Harness) {
	m := h.NewOutage(t)
	cfg := func(id string) bus.Config {
		return bus.Config{NodeID: id, ProbeInterval: 20 * time.Millisecond, PublishTimeout: time.Second,
			FlushInterval: 10 * time.Millisecond, TailDelay: 100 * time.Millisecond}
	}
	a := newNode(t, m, cfg("a"))
	b := newNode(t, m, cfg("b"))
	start(t, a.Node)
	start(t, b.Node)
	subscribe(t, b, 1, 2)
	publish(t, a, 1, msgs(1, 1, 1))
	waitFor(t, "delivery before the outage", func() bool { return b.rec.count() == 1 })
	waitFor(t, "the first tail hint", func() bool { return slices.Contains(b.rec.tailList(), "a 1 1 v0") })

	m.Stop(t)
	seq := int64(1)
	waitFor(t, "a to notice the outage", func() bool {
		seq++
		_ = a.Publish(1, 0, msgs(1, seq, 1))
		return !a.Up()
	})
	seq++
	if err := a.Publish(1, 0, msgs(1, seq, 1)); !errors.Is(err, bus.ErrUnavailable) {
		t.Errorf("Publish during the outage: got %v, want ErrUnavailable", err)
	}
	time.Sleep(300 * time.Millisecond) // the hint is due, the backend down
	before := a.Stats().TailsPublished
	m.Start(t)
	// b's subscriptions come back with its reconnect, which can take
	// longer than a's first publish round: b's copy of a hint sent before
	// it may be lost, as a batch would be. So the check is that a sends
	// the hint once the backend is back (without any new publish of gid
	// 1), and that b, once subscribed, hears it from a at the latest with
	// gid 1's next publish.
	waitFor(t, "a to send the kept hint", func() bool { return a.Stats().TailsPublished > before })
	want := fmt.Sprintf("a 1 %d v0", seq)
	if !slices.Contains(b.rec.tailList(), want) {
		var probe int64 = 100
		waitFor(t, "b to hear a again", func() bool {
			probe++
			_ = a.Publish(2, 0, msgs(2, probe, 1))
			time.Sleep(20 * time.Millisecond)
			return len(b.rec.seqs(2, "a")) > 0
		})
		seq++
		publish(t, a, 1, msgs(1, seq, 1))
		want = fmt.Sprintf("a 1 %d v0", seq)
	}
	waitFor(t, "the tail hint of gid 1 after the outage", func() bool { return slices.Contains(b.rec.tailList(), want) })
}
