package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
	"github.com/fanfare-im/fanfare/store"
)

// syncClock is an injected clock safe for the engine's goroutines.
type syncClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *syncClock { return &syncClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *syncClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *syncClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// outcome collects the results of asynchronous sends by client id.
type outcome struct {
	mu  sync.Mutex
	res map[string]fanout.SendResult
	wg  sync.WaitGroup
}

func newOutcome() *outcome { return &outcome{res: map[string]fanout.SendResult{}} }

func (o *outcome) send(e *fanout.Engine, gid int64, uid, id, kind string) {
	o.wg.Add(1)
	e.Send(fanout.SendRequest{GID: gid, UID: uid, ClientMsgID: id, Kind: kind, Body: []byte(`"x"`), Done: func(r fanout.SendResult) {
		o.mu.Lock()
		o.res[id] = r
		o.mu.Unlock()
		o.wg.Done()
	}})
}

func (o *outcome) get(id string) (fanout.SendResult, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, ok := o.res[id]
	return r, ok
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGroupRateLimitKeepsNewest: over the group rate, sends wait in the
// buffer; when it is full the oldest buffered send is refused with a
// retryable rate_limited; the buffer drains at the group rate, in order.
func TestGroupRateLimitKeepsNewest(t *testing.T) {
	clk := newClock()
	st := openStore(t)
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{LargeGroup: 1, GroupRate: 4, GroupBuffer: 3, HotFactor: -1}, Store: st, Now: clk.Now})
	gid := newGroup(t, st, "alice")
	o := newOutcome()
	// Burst of 4 passes at once (burst = 1 s of rate).
	for i := range 4 {
		o.send(e, gid, "alice", fmt.Sprintf("b%d", i), "")
	}
	waitFor(t, "the burst acked", func() bool {
		for i := range 4 {
			if r, ok := o.get(fmt.Sprintf("b%d", i)); !ok || r.Err != nil {
				return false
			}
		}
		return true
	})
	// Five more: three fit the buffer; the two oldest are pushed out.
	for i := range 5 {
		o.send(e, gid, "alice", fmt.Sprintf("q%d", i), "")
	}
	waitFor(t, "two rejections", func() bool {
		_, a := o.get("q0")
		_, b := o.get("q1")
		return a && b
	})
	for _, id := range []string{"q0", "q1"} {
		r, _ := o.get(id)
		var re *fanout.RetryError
		if !errors.Is(r.Err, fanout.ErrRateLimited) || !errors.As(r.Err, &re) || re.RetryAfter() <= 0 {
			t.Errorf("%s: got %v, want ErrRateLimited with a retry-after", id, r.Err)
		}
	}
	time.Sleep(100 * time.Millisecond) // several worker ticks: nothing moves on a frozen clock
	for _, id := range []string{"q2", "q3", "q4"} {
		if r, ok := o.get(id); ok {
			t.Fatalf("%s answered (%+v) before the clock moved", id, r)
		}
	}
	clk.Advance(500 * time.Millisecond) // 2 tokens
	waitFor(t, "q2 and q3", func() bool {
		_, a := o.get("q2")
		_, b := o.get("q3")
		return a && b
	})
	time.Sleep(50 * time.Millisecond)
	if _, ok := o.get("q4"); ok {
		t.Fatal("q4 released with no token left")
	}
	clk.Advance(250 * time.Millisecond)
	o.wg.Wait()
	var seqs []int64
	for _, id := range []string{"b0", "b1", "b2", "b3", "q2", "q3", "q4"} {
		r, _ := o.get(id)
		if r.Err != nil {
			t.Fatalf("%s: %v", id, r.Err)
		}
		seqs = append(seqs, r.Seq)
	}
	if !slices.Equal(seqs, []int64{1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("acked seqs in send order: got %v, want 1..7", seqs)
	}
}

// TestAtAllQuota: at most AtAllPerDay @all messages per group per UTC day;
// refusals are rate_limited until the next day; other kinds pass.
func TestAtAllQuota(t *testing.T) {
	clk := newClock()
	st := openStore(t)
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{AtAllPerDay: 2}, Store: st, Now: clk.Now, EvalInterval: 5 * time.Millisecond})
	gid := newGroup(t, st, "alice")
	other := newGroup(t, st, "alice")
	sendKind := func(gid int64, id, kind string) fanout.SendResult {
		return e.SendWait(context.Background(), fanout.SendRequest{GID: gid, UID: "alice", ClientMsgID: id, Kind: kind, Body: []byte(`1`)})
	}
	for i := range 2 {
		if r := sendKind(gid, fmt.Sprint("all", i), store.KindAtAll); r.Err != nil {
			t.Fatalf("@all %d: %v", i, r.Err)
		}
	}
	// A retry of a stored @all is answered with its seq, not refused.
	if r := sendKind(gid, "all0", store.KindAtAll); r.Err != nil || !r.Duplicate {
		t.Errorf("retry of a stored @all: got %+v, want its seq", r)
	}
	r := sendKind(gid, "all2", store.KindAtAll)
	var re *fanout.RetryError
	if !errors.Is(r.Err, fanout.ErrAtAllQuota) || !errors.Is(r.Err, fanout.ErrRateLimited) || !errors.As(r.Err, &re) {
		t.Fatalf("third @all: got %v, want ErrAtAllQuota", r.Err)
	}
	if want := 12 * time.Hour; re.RetryAfter() != want {
		t.Errorf("retry after: got %v, want %v (next UTC midnight)", re.RetryAfter(), want)
	}
	if r := sendKind(gid, "text", ""); r.Err != nil {
		t.Errorf("text after the @all quota: %v", r.Err)
	}
	if r := sendKind(other, "all-other", store.KindAtAll); r.Err != nil {
		t.Errorf("@all in another group: %v", r.Err)
	}
	// Idle past the eviction of idle groups' state: the count stays.
	clk.Advance(3 * time.Minute)
	time.Sleep(50 * time.Millisecond) // sweeps at the new time
	if r := sendKind(other, "all-other2", store.KindAtAll); r.Err != nil {
		t.Errorf("second @all in another group: %v", r.Err)
	}
	if r := sendKind(other, "all-other3", store.KindAtAll); !errors.Is(r.Err, fanout.ErrAtAllQuota) {
		t.Fatalf("third @all in a group idle for 3 minutes after its first: got %v, want the quota used up", r.Err)
	}
	clk.Advance(12 * time.Hour)
	if r := sendKind(gid, "all2", store.KindAtAll); r.Err != nil {
		t.Errorf("@all the next day: %v", r.Err)
	}
}

// TestHotMoveKeepsOrder floods one group from one goroutine, so that it
// becomes hot (moved to the hot pool), cools (moved back) and becomes hot
// again while sends are in flight: acked seqs follow the send order and a
// member online throughout receives every seq once, in order.
func TestHotMoveKeepsOrder(t *testing.T) {
	st := openStore(t)
	pres, rec := newPresence(t), newRecorder()
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{LargeGroup: 1, GroupRate: -1, DownlinkRate: -1, HotMinRate: 100, HotGroupRate: 1e9, HotClearAfter: 100 * time.Millisecond, MergeWindow: 20 * time.Millisecond}, Store: st, Presence: pres, Pusher: rec, EvalInterval: 50 * time.Millisecond})
	gid := newGroup(t, st, "alice", "bob")
	if _, err := e.Connect(context.Background(), &testConn{"bob"}); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		acked []int64 // in send order
		next  int
	)
	sem := make(chan struct{}, 64)
	flood := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			sem <- struct{}{}
			mu.Lock()
			idx := next
			next++
			acked = append(acked, 0)
			mu.Unlock()
			e.Send(fanout.SendRequest{GID: gid, UID: "alice", ClientMsgID: fmt.Sprint(idx), Body: []byte(`1`), Done: func(r fanout.SendResult) {
				if r.Err == nil {
					mu.Lock()
					acked[idx] = r.Seq
					mu.Unlock()
				}
				<-sem
			}})
		}
	}
	var transitions []bool
	watch := func(want bool) {
		waitFor(t, fmt.Sprintf("hot=%v", want), func() bool { return e.IsHot(gid) == want })
		transitions = append(transitions, want)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		flood(time.Second)
	}()
	watch(true)
	// The route switches first; HotGroups follows when the hot worker
	// installed the group's state.
	waitFor(t, "HotGroups to list the group", func() bool {
		hg := e.HotGroups()
		return len(hg) == 1 && hg[0].GID == gid
	})
	<-done
	watch(false)
	done = make(chan struct{})
	go func() {
		defer close(done)
		flood(500 * time.Millisecond)
	}()
	watch(true)
	<-done
	for range cap(sem) {
		sem <- struct{}{}
	}
	mu.Lock()
	defer mu.Unlock()
	var last int64
	n := 0
	for i, s := range acked {
		if s == 0 {
			continue
		}
		if s <= last {
			t.Fatalf("send %d acked as seq %d after seq %d: order lost", i, s, last)
		}
		last = s
		n++
	}
	if n < 200 {
		t.Fatalf("only %d sends acked", n)
	}
	waitFor(t, "bob's pushes", func() bool { return len(rec.seqs("bob")) >= n })
	got := rec.seqs("bob")
	for i, s := range got {
		if s != int64(i+1) {
			t.Fatalf("bob's pushes not dense and in order at %d: %d", i, s)
		}
	}
	t.Logf("%d sends acked, transitions %v", n, transitions)
}

// countingStore counts the statements the engine issues.
type countingStore struct {
	store.Store
	appends, advances, actives atomic.Int64
	mu                         sync.Mutex
	advanced                   []advanceCall
}

type advanceCall struct {
	gid     int64
	uids    int
	lastSeq int64
}

func (s *countingStore) Append(ctx context.Context, reqs []store.AppendRequest, res []store.AppendResult) error {
	s.appends.Add(1)
	return s.Store.Append(ctx, reqs, res)
}

func (s *countingStore) AdvanceConversations(ctx context.Context, gid int64, uids []string, lastSeq int64) error {
	// Record after the write: a test that sees the call may read its effect.
	err := s.Store.AdvanceConversations(ctx, gid, uids, lastSeq)
	s.advances.Add(1)
	s.mu.Lock()
	s.advanced = append(s.advanced, advanceCall{gid, len(uids), lastSeq})
	s.mu.Unlock()
	return err
}

func (s *countingStore) ActiveMembersSince(ctx context.Context, gid int64, since time.Time) ([]string, error) {
	s.actives.Add(1)
	return s.Store.ActiveMembersSince(ctx, gid, since)
}

func (s *countingStore) calls() []advanceCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.advanced)
}

// TestTier2Coalesced: active offline members get conversations.last_seq
// advanced by at most one statement per group per merge window; online
// and silent members get nothing; @all does not advance it; hot groups and
// groups switched off by the operator write nothing.
func TestTier2Coalesced(t *testing.T) {
	st := &countingStore{Store: openStore(t)}
	ctx := context.Background()
	pres := newPresence(t)
	const window = 100 * time.Millisecond
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{MergeWindow: window, Tier2MinActiveShare: -1, HotFactor: -1}, Store: st, Presence: pres, Pusher: newRecorder()})
	var uids []string
	for i := range 30 {
		uids = append(uids, fmt.Sprintf("m%02d", i))
	}
	gid := newGroup(t, st, uids...)
	// m00-m09 online, m10-m19 active (seen within 7 days) offline,
	// m20-m29 silent (never seen).
	for _, uid := range uids[:10] {
		if _, err := e.Connect(ctx, &testConn{uid}); err != nil {
			t.Fatal(err)
		}
	}
	for _, uid := range uids[10:20] {
		if err := st.TouchUser(ctx, uid, time.Now().Add(-48*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	const msgs = 300
	var wg sync.WaitGroup
	for s := range 3 {
		wg.Go(func() {
			for i := range msgs / 3 {
				if r := send(e, gid, uids[s], fmt.Sprintf("%d-%d", s, i)); r.Err != nil {
					t.Errorf("send: %v", r.Err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	waitFor(t, "tier 2 to reach the last seq", func() bool {
		c := st.calls()
		return len(c) > 0 && c[len(c)-1].lastSeq == msgs
	})
	calls := st.calls()
	windows := int(elapsed/window) + 2
	if len(calls) > windows {
		t.Errorf("%d AdvanceConversations for %d messages in %v: want at most one per %v window (%d)", len(calls), msgs, elapsed, window, windows)
	}
	for _, c := range calls {
		if c.gid != gid || c.uids != 10 {
			t.Errorf("call %+v: want gid %d and the 10 active offline members", c, gid)
		}
	}
	conv := func(uid string) int64 {
		m, err := st.Conversations(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		return m[gid]
	}
	if got := conv("m15"); got != msgs {
		t.Errorf("active offline member: conversation at %d, want %d", got, msgs)
	}
	if got := conv("m05"); got != 0 {
		t.Errorf("online member: conversation at %d, want none", got)
	}
	if got := conv("m25"); got != 0 {
		t.Errorf("silent member: conversation at %d, want none", got)
	}
	actives := st.actives.Load()
	if actives > 2 {
		t.Errorf("%d ActiveMembersSince reads: want the active set cached per group", actives)
	}

	// @all reaches online members only: the index stays.
	if r := e.SendWait(ctx, fanout.SendRequest{GID: gid, UID: "m00", ClientMsgID: "all", Kind: store.KindAtAll, Body: []byte(`1`)}); r.Err != nil {
		t.Fatal(r.Err)
	}
	time.Sleep(3 * window)
	if got := conv("m15"); got != msgs {
		t.Errorf("after @all: conversation at %d, want %d", got, msgs)
	}

	// The operator's switch turns it off.
	off := false
	e.SetTier2(gid, &off)
	if s := e.Tier2(gid); s.Enabled || s.Override == nil {
		t.Errorf("Tier2 after override: got %+v", s)
	}
	before := st.advances.Load()
	if r := send(e, gid, "m00", "after-off"); r.Err != nil {
		t.Fatal(r.Err)
	}
	time.Sleep(3 * window)
	if got := st.advances.Load(); got != before {
		t.Errorf("tier 2 switched off: got %d more writes", got-before)
	}
	e.SetTier2(gid, nil)
	if s := e.Tier2(gid); !s.Enabled || s.Override != nil {
		t.Errorf("Tier2 after clearing the override: got %+v", s)
	}
}
