package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/embedded"
)

// testConn is a connection handle for the engine.
type testConn struct{ uid string }

func (c *testConn) UID() string { return c.uid }

func newPresence(t testing.TB) *presence.Local[fanout.Conn] {
	t.Helper()
	p, err := presence.New[fanout.Conn](presence.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// recorder is a Pusher that records what each connection received.
type recorder struct {
	mu    sync.Mutex
	got   map[string][]int64           // uid -> seqs, in push order
	byGID map[string]map[int64][]int64 // uid -> gid -> seqs
	// resyncs: uid -> the last_seq of every PushResync it got
	resyncs map[string][]int64
	msgs    atomic.Int64
	// bytes is what Push reported, summed over connections: the
	// recorder "writes" each message's body plus one byte per push.
	bytes atomic.Int64
}

func newRecorder() *recorder {
	return &recorder{got: map[string][]int64{}, byGID: map[string]map[int64][]int64{}, resyncs: map[string][]int64{}}
}

func (r *recorder) Push(p *fanout.Push) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 1
	for _, m := range p.Msgs {
		n += len(m.Body)
	}
	r.bytes.Add(int64(n * len(p.Conns)))
	if p.Kind == fanout.PushResync {
		for _, c := range p.Conns {
			r.resyncs[c.UID()] = append(r.resyncs[c.UID()], p.LastSeq)
		}
	}
	for _, c := range p.Conns {
		for _, m := range p.Msgs {
			if m.GID != p.GID {
				panic("message of another group in a group push")
			}
			r.got[c.UID()] = append(r.got[c.UID()], m.Seq)
			if r.byGID[c.UID()] == nil {
				r.byGID[c.UID()] = map[int64][]int64{}
			}
			r.byGID[c.UID()][p.GID] = append(r.byGID[c.UID()][p.GID], m.Seq)
		}
	}
	r.msgs.Add(int64(len(p.Msgs)))
	return n * len(p.Conns)
}

func (r *recorder) Degraded(gid int64, level fanout.Level, conns []fanout.Conn) {}

// seqsOf returns what uid received, per group.
func (r *recorder) seqsOf(uid string) map[int64][]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[int64][]int64{}
	for gid, s := range r.byGID[uid] {
		out[gid] = slices.Clone(s)
	}
	return out
}

func (r *recorder) resyncsOf(uid string) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.resyncs[uid])
}

func (r *recorder) seqs(uid string) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got[uid])
}

func openStore(t testing.TB) store.Store {
	t.Helper()
	st, err := embedded.Open(embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newGroup(t testing.TB, st store.Store, uids ...string) int64 {
	t.Helper()
	ctx := context.Background()
	g, err := st.CreateGroup(ctx, store.Group{Name: "g", Owner: uids[0]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.AddMembers(ctx, g.GID, uids); err != nil {
		t.Fatal(err)
	}
	return g.GID
}

func send(e *fanout.Engine, gid int64, uid, id string) fanout.SendResult {
	return e.SendWait(context.Background(), fanout.SendRequest{GID: gid, UID: uid, ClientMsgID: id, Body: []byte(`"hi"`)})
}

func TestSendAckPushInOrder(t *testing.T) {
	st := openStore(t)
	pres, rec := newPresence(t), newRecorder()
	e := enginetest.Start(t, fanout.Config{Store: st, Presence: pres, Pusher: rec, Shards: 3})
	ctx := context.Background()
	const groups, senders, perSender = 5, 4, 50
	var gids []int64
	for g := 0; g < groups; g++ {
		gids = append(gids, newGroup(t, st, "alice", "bob", "s0", "s1", "s2", "s3"))
	}
	alice, bob1, bob2 := &testConn{"alice"}, &testConn{"bob"}, &testConn{"bob"}
	for _, c := range []*testConn{alice, bob1, bob2} {
		if _, err := e.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	acked := make([][]int64, groups)
	var mu sync.Mutex
	for s := 0; s < senders; s++ {
		wg.Go(func() {
			for i := 0; i < perSender; i++ {
				g := i % groups
				r := send(e, gids[g], fmt.Sprintf("s%d", s), fmt.Sprintf("m%d-%d", s, i))
				if r.Err != nil {
					t.Errorf("send: %v", r.Err)
					return
				}
				mu.Lock()
				acked[g] = append(acked[g], r.Seq)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for g := range groups {
		seqs := slices.Sorted(slices.Values(acked[g]))
		for i, s := range seqs {
			if s != int64(i+1) {
				t.Fatalf("group %d: acked seqs %v are not dense from 1", g, seqs)
			}
		}
	}
	// alice and bob are members of every group: each of bob's two
	// connections gets every message once; per group, in seq order.
	// (The last batch is pushed just after its ack.)
	total := senders * perSender
	waitUntil(t, fmt.Sprintf("alice's %d pushes and bob's %d (2 devices)", total, 2*total), func() bool {
		return len(rec.seqs("alice")) >= total && len(rec.seqs("bob")) >= 2*total
	})
	if got, want := len(rec.seqs("alice")), total; got != want {
		t.Errorf("alice got %d pushes, want %d", got, want)
	}
	if got, want := len(rec.seqs("bob")), 2*total; got != want {
		t.Errorf("bob (2 devices) got %d pushes, want %d", got, want)
	}
}

func TestDuplicateSendReturnsOriginalSeqAndIsNotPushedTwice(t *testing.T) {
	st := openStore(t)
	pres, rec := newPresence(t), newRecorder()
	e := enginetest.Start(t, fanout.Config{Store: st, Presence: pres, Pusher: rec})
	gid := newGroup(t, st, "alice", "bob")
	if _, err := e.Connect(context.Background(), &testConn{"bob"}); err != nil {
		t.Fatal(err)
	}
	first := send(e, gid, "alice", "same")
	again := send(e, gid, "alice", "same")
	if first.Err != nil || again.Err != nil {
		t.Fatalf("errors: %v, %v", first.Err, again.Err)
	}
	if again.Seq != first.Seq || !again.Duplicate {
		t.Errorf("retry: got seq %d duplicate %v, want seq %d duplicate true", again.Seq, again.Duplicate, first.Seq)
	}
	if got := rec.seqs("bob"); !slices.Equal(got, []int64{first.Seq}) {
		t.Errorf("bob got %v, want [%d]", got, first.Seq)
	}
}

func TestRejectionsPassThrough(t *testing.T) {
	st := openStore(t)
	e := enginetest.Start(t, fanout.Config{Store: st})
	gid := newGroup(t, st, "alice")
	if r := send(e, gid, "mallory", "x"); !errors.Is(r.Err, store.ErrNotMember) {
		t.Errorf("non-member: got %v, want ErrNotMember", r.Err)
	}
	if r := send(e, gid+1000, "alice", "x"); !errors.Is(r.Err, store.ErrGroupNotFound) {
		t.Errorf("unknown group: got %v, want ErrGroupNotFound", r.Err)
	}
}

// slowStore delays every Append, to fill the queues.
type slowStore struct {
	store.Store
	delay time.Duration
	fail  atomic.Bool
}

func (s *slowStore) Append(ctx context.Context, reqs []store.AppendRequest, res []store.AppendResult) error {
	time.Sleep(s.delay)
	if s.fail.Load() {
		return store.Unavailable(errors.New("injected: connection refused"))
	}
	return s.Store.Append(ctx, reqs, res)
}

func TestQueueBoundAnswersOverloaded(t *testing.T) {
	st := &slowStore{Store: openStore(t), delay: 50 * time.Millisecond}
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{QueueMinBound: 8}, Store: st, Shards: 1, QueueCap: 16, MaxBatch: 4})
	gid := newGroup(t, st, "alice")
	var overloaded, ok atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		e.Send(fanout.SendRequest{GID: gid, UID: "alice", ClientMsgID: fmt.Sprint(i), Body: []byte(`1`), Done: func(r fanout.SendResult) {
			defer wg.Done()
			var re *fanout.RetryError
			switch {
			case r.Err == nil:
				ok.Add(1)
			case errors.Is(r.Err, fanout.ErrOverloaded) && errors.As(r.Err, &re) && re.RetryAfter() > 0:
				overloaded.Add(1)
			default:
				t.Errorf("unexpected result %+v", r)
			}
		}})
	}
	wg.Wait()
	if overloaded.Load() == 0 {
		t.Errorf("got no overloaded answers with 64 sends into a queue bound of 8")
	}
	if got := ok.Load() + overloaded.Load(); got != 64 {
		t.Errorf("got %d answers, want 64", got)
	}
	// Everything acked is stored.
	msgs, last, err := st.Messages(context.Background(), gid, "alice", 1, 0, 200, 0)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(msgs)) != ok.Load() || last != ok.Load() {
		t.Errorf("stored %d (last_seq %d), acked %d", len(msgs), last, ok.Load())
	}
}

func TestStoreFailureIsUnavailableAndNothingAcked(t *testing.T) {
	st := &slowStore{Store: openStore(t)}
	e := enginetest.Start(t, fanout.Config{Store: st})
	gid := newGroup(t, st, "alice")
	st.fail.Store(true)
	r := send(e, gid, "alice", "a")
	var re *fanout.RetryError
	if !errors.Is(r.Err, fanout.ErrUnavailable) || !errors.As(r.Err, &re) {
		t.Fatalf("got %v, want retryable ErrUnavailable", r.Err)
	}
	st.fail.Store(false)
	if r := send(e, gid, "alice", "a"); r.Err != nil || r.Seq != 1 {
		t.Errorf("after recovery: got %+v, want seq 1", r)
	}
}

func TestMembershipChangesAreOrderedWithSends(t *testing.T) {
	st := openStore(t)
	pres, rec := newPresence(t), newRecorder()
	e := enginetest.Start(t, fanout.Config{Store: st, Presence: pres, Pusher: rec, Shards: 2})
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "carol")
	for _, uid := range []string{"bob", "carol"} {
		if _, err := e.Connect(ctx, &testConn{uid}); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var sent sync.WaitGroup
	sent.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if r := send(e, gid, "alice", fmt.Sprint(i)); r.Err != nil {
				t.Errorf("send: %v", r.Err)
				return
			}
		}
	})
	time.Sleep(20 * time.Millisecond)
	ms, err := e.AddMembers(ctx, gid, []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	joinSeq := ms[0].JoinSeq
	time.Sleep(20 * time.Millisecond)
	if err := e.RemoveMember(ctx, gid, "carol"); err != nil {
		t.Fatal(err)
	}
	g, err := st.Group(ctx, gid)
	if err != nil {
		t.Fatal(err)
	}
	removedAt := g.LastSeq // everything after this was committed after removal
	time.Sleep(20 * time.Millisecond)
	close(stop)
	sent.Wait()

	bob := rec.seqs("bob")
	if len(bob) == 0 {
		t.Fatal("bob got nothing after joining")
	}
	for i, s := range bob {
		if s < joinSeq {
			t.Fatalf("bob got seq %d below his join_seq %d", s, joinSeq)
		}
		if i > 0 && s != bob[i-1]+1 {
			t.Fatalf("bob's pushes are not dense and in order: %v", bob)
		}
	}
	for _, s := range rec.seqs("carol") {
		if s > removedAt {
			t.Fatalf("carol got seq %d after her removal at last_seq %d", s, removedAt)
		}
	}
}

func TestShutdownAnswersEverySend(t *testing.T) {
	st := &slowStore{Store: openStore(t), delay: 5 * time.Millisecond}
	e, err := fanout.New(fanout.Config{Store: st, Shards: 2, MaxBatch: 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)
	gid := newGroup(t, st, "alice")
	var answered, acked atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		e.Send(fanout.SendRequest{GID: gid, UID: "alice", ClientMsgID: fmt.Sprint(i), Body: []byte(`1`), Done: func(r fanout.SendResult) {
			if r.Err == nil {
				acked.Add(1)
			}
			answered.Add(1)
			wg.Done()
		}})
		if i == 100 {
			go e.Shutdown(context.Background())
		}
	}
	wg.Wait()
	if answered.Load() != 200 {
		t.Errorf("answered %d of 200", answered.Load())
	}
	g, err := st.Group(context.Background(), gid)
	if err != nil {
		t.Fatal(err)
	}
	if g.LastSeq != acked.Load() {
		t.Errorf("stored %d, acked %d", g.LastSeq, acked.Load())
	}
}

// gatedStore blocks the first UserGroups call of uid until release is
// closed.
type gatedStore struct {
	store.Store
	uid     string
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *gatedStore) UserGroups(ctx context.Context, uid string) ([]store.Member, error) {
	ms, err := s.Store.UserGroups(ctx, uid)
	if uid == s.uid {
		s.once.Do(func() {
			close(s.entered)
			<-s.release
		})
	}
	return ms, err
}

// TestConnectRacingRemoval: a member removed while its connection is being
// registered (its groups already read) gets no push of that group, and the
// member who takes over its ordinal meanwhile keeps receiving.
func TestConnectRacingRemoval(t *testing.T) {
	base := openStore(t)
	st := &gatedStore{Store: base, uid: "bob", entered: make(chan struct{}), release: make(chan struct{})}
	pres, rec := newPresence(t), newRecorder()
	e := enginetest.Start(t, fanout.Config{Store: st, Presence: pres, Pusher: rec})
	ctx := context.Background()
	gid := newGroup(t, base, "alice", "bob")
	if _, err := e.Connect(ctx, &testConn{"carol"}); err != nil {
		t.Fatal(err)
	}
	connected := make(chan error, 1)
	go func() {
		_, err := e.Connect(ctx, &testConn{"bob"})
		connected <- err
	}()
	<-st.entered // bob's groups are read: [gid]
	if err := e.RemoveMember(ctx, gid, "bob"); err != nil {
		t.Fatal(err)
	}
	ms, err := e.AddMembers(ctx, gid, []string{"carol"}) // reuses bob's ordinal
	if err != nil {
		t.Fatal(err)
	}
	close(st.release)
	if err := <-connected; err != nil {
		t.Fatal(err)
	}
	r := send(e, gid, "alice", "after")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	// The ack comes before the push: wait for carol's, which is in the
	// same delivery as any push to bob.
	waitUntil(t, fmt.Sprintf("carol (ordinal %d) pushed seq %d", ms[0].Ordinal, r.Seq), func() bool {
		return slices.Equal(rec.seqs("carol"), []int64{r.Seq})
	})
	if got := rec.seqs("bob"); len(got) != 0 {
		t.Errorf("bob, removed while connecting, got pushes %v", got)
	}
}

// TestPushBytesAccounted: the engine counts as egress exactly the bytes the
// Pusher reports, times its connections, at every push level (there is no
// estimate of its own to drift from what was written).
func TestPushBytesAccounted(t *testing.T) {
	for _, level := range []fanout.Level{fanout.L0Normal, fanout.L1Merge, fanout.L2Summary} {
		t.Run(fmt.Sprintf("level=L%d", level), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			st := openStore(t)
			pres, rec := newPresence(t), newRecorder()
			e := enginetest.Start(t, fanout.Config{Store: st, Presence: pres, Pusher: rec, Metrics: fanout.NewMetrics(reg)})
			gid := newGroup(t, st, "alice", "bob", "carol")
			for _, uid := range []string{"alice", "bob", "bob", "carol"} {
				if _, err := e.Connect(context.Background(), &testConn{uid}); err != nil {
					t.Fatal(err)
				}
			}
			if level != fanout.L0Normal {
				e.Levels().Force(gid, &level, 0)
			}
			const sends = 20
			for i := range sends {
				body := []byte(fmt.Sprintf(`{"text":"%s"}`, strings.Repeat("x", i)))
				if r := e.SendWait(context.Background(), fanout.SendRequest{GID: gid, UID: "alice", ClientMsgID: fmt.Sprint(i), Body: body}); r.Err != nil {
					t.Fatal(r.Err)
				}
			}
			pushed := func() float64 {
				fams, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				for _, f := range fams {
					if f.GetName() == "fanfare_push_bytes_total" {
						return f.GetMetric()[0].GetCounter().GetValue()
					}
				}
				t.Fatal("no fanfare_push_bytes_total")
				return 0
			}
			// Windows (L1, L2) flush on the worker's ticker: wait until every
			// message reached every connection, then compare.
			deadline := time.Now().Add(10 * time.Second)
			for rec.bytes.Load() == 0 || pushed() != float64(rec.bytes.Load()) {
				if time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got, want := pushed(), float64(rec.bytes.Load()); got != want || want == 0 {
				t.Errorf("fanfare_push_bytes_total: got %v, want %v (what the pusher reported)", got, want)
			}
		})
	}
}

// touchCounter counts the TouchUsers calls and the touches of each user
// on the way to a real store.
type touchCounter struct {
	store.Store
	mu    sync.Mutex
	calls int
	per   map[string]int
}

func (s *touchCounter) TouchUsers(ctx context.Context, ts []store.UserTouch) error {
	s.mu.Lock()
	s.calls++
	if s.per == nil {
		s.per = map[string]int{}
	}
	for _, t := range ts {
		s.per[t.UID]++
	}
	s.mu.Unlock()
	return s.Store.TouchUsers(ctx, ts)
}

// TestConnectTouchesUser: a connect does not write its user's
// last-active time itself; the engine writes it within TouchInterval,
// once for a burst of connects of the user (its latest), and at Shutdown
// for what still waits; a connect after Run ended writes its own.
func TestConnectTouchesUser(t *testing.T) {
	ctx := context.Background()
	lastActive := func(st store.Store, uid string) time.Time {
		u, err := st.User(ctx, uid)
		if errors.Is(err, store.ErrUserNotFound) {
			return time.Time{}
		}
		if err != nil {
			t.Fatal(err)
		}
		return u.LastActiveAt
	}

	t.Run("within the interval", func(t *testing.T) {
		st := openStore(t)
		e := enginetest.Start(t, fanout.Config{Store: st, Presence: newPresence(t), TouchInterval: 50 * time.Millisecond})
		before := time.Now().Truncate(time.Microsecond)
		if _, err := e.Connect(ctx, &testConn{"u"}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitFor(t, "u's last-active time", func() bool { return !lastActive(st, "u").IsZero() })
		if at := lastActive(st, "u"); at.Before(before) || at.After(time.Now()) {
			t.Errorf("last_active_at %v, want the connect's time (after %v)", at, before)
		}
		// waitFor polls every 5 ms: well within a few intervals unless the
		// write waited for something else.
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("written %v after the connect, want within the interval (50ms)", d)
		}
	})

	t.Run("burst and shutdown", func(t *testing.T) {
		st := &touchCounter{Store: openStore(t)}
		e, err := fanout.New(fanout.Config{Store: st, Presence: newPresence(t), TouchInterval: fanout.MaxTouchInterval})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- e.Run(context.Background()) }()
		var last time.Time
		for range 50 {
			c := &testConn{"b"}
			if _, err := e.Connect(ctx, c); err != nil {
				t.Fatal(err)
			}
			last = time.Now()
			e.Disconnect(c)
		}
		if _, err := e.Connect(ctx, &testConn{"other"}); err != nil {
			t.Fatal(err)
		}
		if at := lastActive(st, "b"); !at.IsZero() {
			t.Fatalf("last_active_at %v before the interval (1 min): the connect wrote it", at)
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := e.Shutdown(sctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		st.mu.Lock()
		calls, perB, perOther := st.calls, st.per["b"], st.per["other"]
		st.mu.Unlock()
		if calls != 1 || perB != 1 || perOther != 1 {
			t.Errorf("%d TouchUsers calls, b written %d times, other %d; want one call writing each once", calls, perB, perOther)
		}
		if at := lastActive(st, "b"); at.IsZero() || at.After(last) || last.Sub(at) > time.Second {
			t.Errorf("b's last_active_at %v, want its last connect (%v)", at, last)
		}
		// After Run: the connect writes its own time.
		if _, err := e.Connect(ctx, &testConn{"late"}); err != nil {
			t.Fatal(err)
		}
		if at := lastActive(st, "late"); at.IsZero() {
			t.Error("a connect after shutdown: last_active_at not written")
		}
	})
}
