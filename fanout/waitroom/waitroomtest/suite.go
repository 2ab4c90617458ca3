// Package waitroomtest is the conformance suite every waitroom.Backend
// passes: the in-process Memory backend with a virtual clock and the Redis
// backend with real (short) durations. One suite, several backends: the
// semantics cannot drift.
package waitroomtest

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

// Harness is one backend under test.
type Harness struct {
	Backend waitroom.Backend
	// Sleep lets d pass on the backend's clock: instant on a virtual
	// clock, a real sleep against Redis TIME.
	Sleep func(d time.Duration)
}

// Run runs the suite. newHarness is called once per subtest; subtests run
// in parallel, each in its own room.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	cases := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"EnterIdempotent", testEnterIdempotent},
		{"EnterConcurrentRefresh", testEnterConcurrent},
		{"VIPBiasOrder", testVIPBiasOrder},
		{"AdmitOrderAndOverdue", testAdmitOverdue},
		{"AheadMatchesAdmissionOrder", testAheadOrder},
		{"MaxActive", testMaxActive},
		{"TokenBucket", testTokenBucket},
		{"GraceKeepsPosition", testGrace},
		{"DecayAfterGrace", testDecay},
		{"HardTimeout", testHardTimeout},
		{"SessionEnds", testSessionEnds},
		{"SessionExpiry", testSessionExpiry},
		{"VIPShareCap", testShareCap},
		{"SmoothInsertion", testSmoothing},
		{"CapacityAndClosed", testCapacity},
		{"AdmitQuota", testAdmitQuota},
		{"QuotaAhead", testQuotaAhead},
		{"Restore", testRestore},
		{"ShardedOrder", testSharded},
		{"SnapshotStats", testSnapshotStats},
		{"Configs", testConfigs},
		{"Trim", testTrim},
		{"DeadNode", testDeadNode},
		{"TierCounts", testTierCounts},
		{"MaxWaitGuarantee", testMaxWaitGuarantee},
		{"MaxWaitQuota", testMaxWaitQuota},
		{"QuotaYields", testQuotaYields},
		{"Holders", testHolders},
		{"HoldsList", testHoldsList},
		{"DeadHolders", testDeadHolders},
		{"ScheduledStart", testScheduled},
		{"ScheduledCapped", testScheduledCapped},
		{"EndsAt", testEndsAt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, newHarness(t))
		})
	}
}

var roomSeq struct {
	sync.Mutex
	n int
}

// room returns a fresh valid config for a test, with fast defaults.
func room(t *testing.T, mut func(c *waitroom.RoomConfig)) *waitroom.RoomConfig {
	roomSeq.Lock()
	roomSeq.n++
	n := roomSeq.n
	roomSeq.Unlock()
	c := waitroom.RoomConfig{
		Name:      fmt.Sprintf("t%d-%d", time.Now().UnixNano()%1e9, n),
		MaxActive: 1000, AdmitRate: 1000, Smoothing: -1,
	}
	if mut != nil {
		mut(&c)
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("test room config: %v", err)
	}
	return &c
}

func ctx(t *testing.T) context.Context { return t.Context() }

func enter(t *testing.T, h Harness, c *waitroom.RoomConfig, uid string, level int) waitroom.EnterResult {
	t.Helper()
	r, err := h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: uid, Tier: level})
	if err != nil {
		t.Fatalf("Enter(%s): %v", uid, err)
	}
	return r
}

func admit(t *testing.T, h Harness, c *waitroom.RoomConfig, max int) []waitroom.Admission {
	t.Helper()
	r, err := h.Backend.Admit(ctx(t), c, waitroom.AdmitRequest{Max: max})
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	return r.Admitted
}

func snap(t *testing.T, h Harness, c *waitroom.RoomConfig, uids ...string) waitroom.Snapshot {
	t.Helper()
	s, err := h.Backend.Snapshot(ctx(t), c, uids, 0)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return s
}

func uidsOf(as []waitroom.Admission) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.UID
	}
	return out
}

func eqStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func testEnterIdempotent(t *testing.T, h Harness) {
	c := room(t, nil)
	r1 := enter(t, h, c, "u1", 0)
	if r1.Status != waitroom.EnterQueued {
		t.Fatalf("first enter: got %v, want queued", r1.Status)
	}
	r2 := enter(t, h, c, "u1", 0)
	if r2.Status != waitroom.EnterExisting {
		t.Fatalf("second enter: got %v, want existing", r2.Status)
	}
	if r2.Entry.Score != r1.Entry.Score || !r2.Entry.Join.Equal(r1.Entry.Join) {
		t.Fatalf("refresh changed the entry: got %+v, want %+v", r2.Entry, r1.Entry)
	}
	if r2.Waiting != 1 {
		t.Fatalf("waiting after refresh: got %d, want 1", r2.Waiting)
	}
	if got, want := r1.Entry.Score, waitroom.Score(r1.Entry.Join.Unix(), 0); got != want {
		t.Fatalf("normal score: got %v, want 1.3*join = %v", got, want)
	}
}

func testEnterConcurrent(t *testing.T, h Harness) {
	c := room(t, nil)
	const n = 50
	var wg sync.WaitGroup
	statuses := make([]waitroom.EnterStatus, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: "same-user", Tier: 2})
			statuses[i], errs[i] = r.Status, err
		}()
	}
	wg.Wait()
	queued := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Enter: %v", errs[i])
		}
		switch statuses[i] {
		case waitroom.EnterQueued:
			queued++
		case waitroom.EnterExisting:
		default:
			t.Fatalf("status: got %v, want queued or existing", statuses[i])
		}
	}
	if queued != 1 {
		t.Fatalf("queued: got %d, want exactly 1 of %d concurrent refreshes", queued, n)
	}
	s := snap(t, h, c, "same-user")
	if s.Waiting != 1 || s.VIPWaiting != 1 {
		t.Fatalf("after %d refreshes: got waiting=%d vip=%d, want 1 and 1", n, s.Waiting, s.VIPWaiting)
	}
}

func testVIPBiasOrder(t *testing.T, h Harness) {
	c := room(t, nil)
	enter(t, h, c, "n1", 0)
	enter(t, h, c, "n2", 0)
	v := enter(t, h, c, "v3", 3)
	want := waitroom.Score(v.Entry.Join.Unix(), -3600)
	if v.Entry.Score != want || v.Entry.Bias != -3600 {
		t.Fatalf("VIP3 entry: got score %v bias %v, want %v and -3600", v.Entry.Score, v.Entry.Bias, want)
	}
	if v.Ahead != 0 {
		t.Fatalf("VIP3 ahead: got %d, want 0", v.Ahead)
	}
	s := snap(t, h, c, "n1", "n2", "v3")
	got := []int64{s.Positions[0].Ahead, s.Positions[1].Ahead, s.Positions[2].Ahead}
	if got[0] != 1 || got[1] != 2 || got[2] != 0 {
		t.Fatalf("ahead n1,n2,v3: got %v, want [1 2 0]", got)
	}
	if len(s.Placements) == 0 || !math.IsInf(s.Placements[len(s.Placements)-1].Hi, 1) ||
		s.Placements[len(s.Placements)-1].Lo != v.Entry.Score {
		t.Fatalf("placements: got %+v, want last [%v, +Inf)", s.Placements, v.Entry.Score)
	}
	if v.PlacementSeq != s.Placements[len(s.Placements)-1].Seq || s.PlacementSeq != v.PlacementSeq {
		t.Fatalf("PlacementSeq: got %d (snapshot %d), want %d", v.PlacementSeq, s.PlacementSeq, s.Placements[len(s.Placements)-1].Seq)
	}
	enter(t, h, c, "v1", 1)
	s2, err := h.Backend.Snapshot(ctx(t), c, nil, v.PlacementSeq)
	if err != nil || len(s2.Placements) != 1 || s2.Placements[0].Seq != v.PlacementSeq+1 || s2.PlacementSeq != v.PlacementSeq+1 {
		t.Fatalf("placements since %d: got %+v, %v, want only the next one", v.PlacementSeq, s2.Placements, err)
	}
	if _, err := h.Backend.Leave(ctx(t), c, "v1"); err != nil {
		t.Fatal(err)
	}
	got2 := uidsOf(admit(t, h, c, 0))
	if !eqStrings(got2, []string{"v3", "n1", "n2"}) {
		t.Fatalf("admission order: got %v, want [v3 n1 n2]", got2)
	}
}

func testAdmitOverdue(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.MaxWait = 2 * time.Second })
	enter(t, h, c, "old", 0)
	h.Sleep(2100 * time.Millisecond)
	enter(t, h, c, "vip", 3)
	enter(t, h, c, "new", 0)
	s := snap(t, h, c, "old", "vip", "new")
	if s.Overdue != 1 {
		t.Fatalf("overdue: got %d, want 1", s.Overdue)
	}
	if a := []int64{s.Positions[0].Ahead, s.Positions[1].Ahead, s.Positions[2].Ahead}; a[0] != 0 || a[1] != 1 || a[2] != 2 {
		t.Fatalf("ahead old,vip,new: got %v, want [0 1 2] (overdue first)", a)
	}
	as := admit(t, h, c, 1)
	if len(as) != 1 || as[0].UID != "old" || !as[0].Overdue {
		t.Fatalf("first admission: got %+v, want old (overdue)", as)
	}
	as = admit(t, h, c, 0)
	if !eqStrings(uidsOf(as), []string{"vip", "new"}) || as[0].Overdue {
		t.Fatalf("then: got %+v, want vip, new by score", as)
	}
}

func testMaxActive(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.MaxActive = 3 })
	for i := range 5 {
		enter(t, h, c, fmt.Sprintf("u%d", i), 0)
	}
	if got := admit(t, h, c, 0); len(got) != 3 {
		t.Fatalf("admitted: got %d, want 3 (max_active)", len(got))
	}
	if got := admit(t, h, c, 0); len(got) != 0 {
		t.Fatalf("admitted while full: got %d, want 0", len(got))
	}
	if _, err := h.Backend.Leave(ctx(t), c, "u0"); err != nil {
		t.Fatal(err)
	}
	got := admit(t, h, c, 0)
	if len(got) != 1 || got[0].UID != "u3" {
		t.Fatalf("after one leaves: got %v, want [u3]", uidsOf(got))
	}
	s := snap(t, h, c)
	if s.Active != 3 || s.Waiting != 1 {
		t.Fatalf("stats: got active=%d waiting=%d, want 3 and 1", s.Active, s.Waiting)
	}
}

func testTokenBucket(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.AdmitRate = 2; c.AdmitBurst = 3 })
	for i := range 20 {
		enter(t, h, c, fmt.Sprintf("u%02d", i), 0)
	}
	start := time.Now()
	total := len(admit(t, h, c, 0))
	if total != 3 {
		t.Fatalf("first step: got %d, want burst 3", total)
	}
	h.Sleep(1100 * time.Millisecond)
	total += len(admit(t, h, c, 0))
	h.Sleep(1100 * time.Millisecond)
	total += len(admit(t, h, c, 0))
	elapsed := h.elapsedSince(start, 2200*time.Millisecond)
	if bound := 3 + int(2*elapsed.Seconds()); total > bound || total < 6 {
		t.Fatalf("admitted in %v: got %d, want between 6 and burst+rate*T = %d", elapsed, total, bound)
	}
}

// elapsedSince is the backend time that passed: virtual sleeps are instant,
// so the caller passes what it slept; real time is measured.
func (h Harness) elapsedSince(start time.Time, slept time.Duration) time.Duration {
	return max(time.Since(start), slept)
}

func testGrace(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Grace = 10 * time.Second })
	a := enter(t, h, c, "a", 0)
	b := enter(t, h, c, "b", 0)
	enter(t, h, c, "c", 0)
	_ = a
	d, err := h.Backend.Disconnect(ctx(t), c, "b", "")
	if err != nil || d.Prev != waitroom.EntryWaiting {
		t.Fatalf("Disconnect: got %+v, %v, want prev waiting", d, err)
	}
	s := snap(t, h, c, "b", "c")
	if s.Positions[0].State != waitroom.EntryAway || s.Positions[1].Ahead != 1 || s.Waiting != 2 || s.Away != 1 {
		t.Fatalf("while b away: got b=%v c.ahead=%d waiting=%d away=%d, want away, 1, 2, 1",
			s.Positions[0].State, s.Positions[1].Ahead, s.Waiting, s.Away)
	}
	h.Sleep(time.Second)
	r := enter(t, h, c, "b", 0)
	if r.Status != waitroom.EnterRestored || r.Entry.Score != b.Entry.Score || r.Ahead != 1 {
		t.Fatalf("reconnect within grace: got %v score %v ahead %d, want restored, %v, 1", r.Status, r.Entry.Score, r.Ahead, b.Entry.Score)
	}
	if got := uidsOf(admit(t, h, c, 0)); !eqStrings(got, []string{"a", "b", "c"}) {
		t.Fatalf("order after reconnect: got %v, want [a b c]", got)
	}
}

func testDecay(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Grace = time.Second; c.DecayRate = 2 })
	a := enter(t, h, c, "a", 0)
	h.Sleep(time.Second)
	enter(t, h, c, "b", 0)
	if _, err := h.Backend.Disconnect(ctx(t), c, "a", ""); err != nil {
		t.Fatal(err)
	}
	h.Sleep(3100 * time.Millisecond)
	r := enter(t, h, c, "a", 0)
	if r.Status != waitroom.EnterDecayed {
		t.Fatalf("reconnect after grace: got %v, want decayed", r.Status)
	}
	shift := r.Entry.Join.Unix() - a.Entry.Join.Unix()
	if shift < 4 || shift%2 != 0 { // away 3-4 s past 1 s grace at rate 2
		t.Fatalf("join shift: got %d s, want an even number >= 4", shift)
	}
	if want := math.Floor((a.Entry.Score+1.3*float64(shift))*1000+0.5) / 1000; r.Entry.Score != want {
		t.Fatalf("decayed score: got %v, want %v", r.Entry.Score, want)
	}
	if !r.Entry.First.Equal(a.Entry.First) {
		t.Fatalf("first join: got %v, want unchanged %v", r.Entry.First, a.Entry.First)
	}
	if got := uidsOf(admit(t, h, c, 0)); !eqStrings(got, []string{"b", "a"}) {
		t.Fatalf("order after decay: got %v, want [b a]", got)
	}
}

func testHardTimeout(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Grace = time.Second; c.HardTimeout = 2 * time.Second })
	enter(t, h, c, "a", 0)
	enter(t, h, c, "b", 0)
	for _, u := range []string{"a", "b"} {
		if _, err := h.Backend.Disconnect(ctx(t), c, u, ""); err != nil {
			t.Fatal(err)
		}
	}
	h.Sleep(3100 * time.Millisecond)
	m, err := h.Backend.Maintain(ctx(t), c, waitroom.MaintainRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(m.Dropped)
	if !eqStrings(m.Dropped, []string{"a", "b"}) {
		t.Fatalf("dropped: got %v, want [a b]", m.Dropped)
	}
	s := snap(t, h, c, "a")
	if s.Positions[0].State != waitroom.EntryNone || s.Away != 0 {
		t.Fatalf("after hard timeout: got state %v away %d, want none, 0", s.Positions[0].State, s.Away)
	}
	if r := enter(t, h, c, "a", 0); r.Status != waitroom.EnterQueued {
		t.Fatalf("enter after removal: got %v, want queued", r.Status)
	}
}

func testSessionEnds(t *testing.T, h Harness) {
	c := room(t, nil)
	enter(t, h, c, "a", 1)
	enter(t, h, c, "b", 0)
	if got := admit(t, h, c, 0); len(got) != 2 {
		t.Fatalf("admitted: got %d, want 2", len(got))
	}
	if r := enter(t, h, c, "a", 1); r.Status != waitroom.EnterActive {
		t.Fatalf("enter while active: got %v, want active", r.Status)
	}
	d, err := h.Backend.Disconnect(ctx(t), c, "a", "")
	if err != nil || d.Prev != waitroom.EntryActive || d.Ended == nil || d.Ended.Reason != waitroom.EndDisconnect || d.Ended.Tier != 1 {
		t.Fatalf("disconnect active: got %+v, %v, want ended by disconnect", d, err)
	}
	d, err = h.Backend.Leave(ctx(t), c, "b")
	if err != nil || d.Ended == nil || d.Ended.Reason != waitroom.EndLeave {
		t.Fatalf("leave active: got %+v, %v, want ended by leave", d, err)
	}
	d, err = h.Backend.Leave(ctx(t), c, "b")
	if err != nil || d.Prev != waitroom.EntryNone || d.Ended != nil {
		t.Fatalf("second leave: got %+v, %v, want no-op", d, err)
	}
	if s := snap(t, h, c); s.Active != 0 || s.Waiting != 0 {
		t.Fatalf("after ends: got active=%d waiting=%d, want 0 0", s.Active, s.Waiting)
	}
}

func testSessionExpiry(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.AccessTokenTTL = time.Second; c.MaxActive = 1 })
	enter(t, h, c, "a", 0)
	enter(t, h, c, "b", 0)
	as := admit(t, h, c, 0)
	if len(as) != 1 || as[0].Expires.Sub(as[0].Admitted) != time.Second {
		t.Fatalf("admission: got %+v, want one with a 1 s session", as)
	}
	h.Sleep(2100 * time.Millisecond)
	m, err := h.Backend.Maintain(ctx(t), c, waitroom.MaintainRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Ended) != 1 || m.Ended[0].UID != "a" || m.Ended[0].Reason != waitroom.EndExpired {
		t.Fatalf("expired: got %+v, want a by expiry", m.Ended)
	}
	if got := uidsOf(admit(t, h, c, 0)); !eqStrings(got, []string{"b"}) {
		t.Fatalf("next admission: got %v, want [b]", got)
	}
}

func testShareCap(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.VIPShareCap = 0.5 })
	enter(t, h, c, "n1", 0)
	v1 := enter(t, h, c, "v1", 1) // share 0/1
	v2 := enter(t, h, c, "v2", 1) // share 1/2 = cap: full bias
	v3 := enter(t, h, c, "v3", 1) // share 2/3 > 0.5: bias * 0.5/(2/3)
	if v1.Entry.Bias != -600 || v2.Entry.Bias != -600 {
		t.Fatalf("bias under the cap: got %v %v, want -600", v1.Entry.Bias, v2.Entry.Bias)
	}
	if want := math.Floor(-600*0.5/(2.0/3.0)*1000+0.5) / 1000; v3.Entry.Bias != want {
		t.Fatalf("bias over the cap: got %v, want %v", v3.Entry.Bias, want)
	}
	if v3.Entry.Score != waitroom.Score(v3.Entry.Join.Unix(), v3.Entry.Bias) {
		t.Fatalf("score: got %v, want 1.3*join+reduced bias", v3.Entry.Score)
	}
}

func testSmoothing(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Smoothing = 4 * time.Second })
	enter(t, h, c, "a-normal", 0)
	v := enter(t, h, c, "v", 2)
	target := waitroom.Score(v.Entry.Join.Unix(), -1800)
	if start := waitroom.Score(v.Entry.Join.Unix(), 0); v.Entry.Score != start {
		t.Fatalf("initial VIP score: got %v, want the normal score %v", v.Entry.Score, start)
	}
	prev := v.Entry.Score
	sawStep := false
	for range 6 {
		h.Sleep(time.Second)
		m, err := h.Backend.Maintain(ctx(t), c, waitroom.MaintainRequest{})
		if err != nil {
			t.Fatal(err)
		}
		s := snap(t, h, c, "v")
		sc := s.Positions[0].Score
		if sc > prev || sc < target {
			t.Fatalf("smoothing step: got %v after %v, want within [%v, %v]", sc, prev, target, prev)
		}
		if sc < prev && sc > target {
			sawStep = true
		}
		if m.Stepped > 0 {
			p := s.Placements[len(s.Placements)-1]
			if !(p.Lo == sc && p.Hi == prev) {
				t.Fatalf("step placement: got [%v, %v), want [%v, %v)", p.Lo, p.Hi, sc, prev)
			}
		}
		prev = sc
	}
	if prev != target {
		t.Fatalf("after smoothing time: got %v, want target %v", prev, target)
	}
	if !sawStep {
		t.Fatalf("no intermediate step seen: insertion was not gradual")
	}
}

func testCapacity(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) {
		c.AdmitRate, c.TargetWait, c.SafetyFactor = 1, 10*time.Second, 0.5 // L_max = 5
	})
	for i := range 5 {
		if r := enter(t, h, c, fmt.Sprintf("u%d", i), 0); r.Status != waitroom.EnterQueued {
			t.Fatalf("enter %d: got %v, want queued", i, r.Status)
		}
	}
	r := enter(t, h, c, "u5", 0)
	if r.Status != waitroom.EnterRejected || r.Reject != waitroom.RejectRoomFull || r.RetryAfter < time.Second {
		t.Fatalf("beyond L_max: got %v %v retry %v, want rejected room_full retry >= 1s", r.Status, r.Reject, r.RetryAfter)
	}
	if r := enter(t, h, c, "u0", 0); r.Status != waitroom.EnterExisting {
		t.Fatalf("refresh when full: got %v, want existing", r.Status)
	}
	if s := snap(t, h, c); s.LMax != 5 {
		t.Fatalf("L_max: got %d, want 5", s.LMax)
	}
	c2 := *c
	c2.State = waitroom.StateClosed
	if r := enter(t, h, &c2, "x", 0); r.Status != waitroom.EnterRejected || r.Reject != waitroom.RejectRoomClosed {
		t.Fatalf("closed room: got %v %v, want rejected room_closed", r.Status, r.Reject)
	}
	if got := admit(t, h, &c2, 0); len(got) == 0 {
		t.Fatalf("closed room admits nobody: want it to drain")
	}
}

// testAdmitQuota: with a VIP share of 2/3 the VIPs, though all ranked
// ahead, get two admissions in three while normal users wait, Ahead
// predicts each user's turn exactly, and with no normal user left the VIPs
// take every admission (the idle share is lent).
func testAdmitQuota(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) {
		c.AdmitRate, c.AdmitBurst, c.MaxActive = 100, 100, 1000
		c.VIPAdmitShare = 2.0 / 3
		c.Smoothing = -1
	})
	var uids []string
	for i := range 6 {
		uids = append(uids, fmt.Sprintf("n%d", i))
		enter(t, h, c, uids[len(uids)-1], 0)
	}
	for i := range 7 {
		uids = append(uids, fmt.Sprintf("v%d", i))
		enter(t, h, c, uids[len(uids)-1], 1)
	}
	order := []string{"v0", "v1", "n0", "v2", "v3", "n1", "v4", "v5", "n2", "v6", "n3", "n4", "n5"}
	s := snap(t, h, c, uids...)
	for i, p := range s.Positions {
		if j := slices.Index(order, uids[i]); p.Ahead != int64(j) {
			t.Errorf("Ahead of %s: got %d, want %d (admission order %v)", uids[i], p.Ahead, j, order)
		}
	}
	if got := uidsOf(admit(t, h, c, 9)); !eqStrings(got, order[:9]) {
		t.Fatalf("quota 2/3: got %v, want %v", got, order[:9])
	}
	// The counts carry over between steps: VIPs have had 6 of 9.
	if got := uidsOf(admit(t, h, c, 2)); !eqStrings(got, []string{"v6", "n3"}) {
		t.Fatalf("next step: got %v, want [v6 n3]", got)
	}
	for i := range 6 {
		enter(t, h, c, fmt.Sprintf("w%d", i), 2)
	}
	// v6 was the last VIP, so the counts started over: the new VIPs rank
	// ahead of n4 and n5 but yield to them at their share; once no normal
	// user is left, VIPs take everything.
	want := []string{"w0", "w1", "n4", "w2", "w3", "n5", "w4", "w5"}
	if got := uidsOf(admit(t, h, c, 0)); !eqStrings(got, want) {
		t.Fatalf("last step: got %v, want %v", got, want)
	}
	// The counts also start over when the last VIP leaves between steps.
	c2 := room(t, func(c *waitroom.RoomConfig) { c.VIPAdmitShare = 2.0 / 3 })
	for _, u := range []string{"v0", "v1", "v2"} {
		enter(t, h, c2, u, 1)
	}
	enter(t, h, c2, "n0", 0)
	enter(t, h, c2, "n1", 0)
	if got := uidsOf(admit(t, h, c2, 2)); !eqStrings(got, []string{"v0", "v1"}) {
		t.Fatalf("second room: got %v, want [v0 v1]", got)
	}
	if _, err := h.Backend.Leave(ctx(t), c2, "v2"); err != nil {
		t.Fatal(err)
	}
	enter(t, h, c2, "w0", 3)
	enter(t, h, c2, "w1", 3)
	if got := uidsOf(admit(t, h, c2, 3)); !eqStrings(got, []string{"w0", "w1", "n0"}) {
		t.Fatalf("after the last VIP left: got %v, want [w0 w1 n0] (counts from zero)", got)
	}
	// Off: plain score order.
	off := room(t, func(c *waitroom.RoomConfig) { c.VIPAdmitShare, c.Smoothing = -1, -1 })
	enter(t, h, off, "n", 0)
	enter(t, h, off, "v1", 1)
	enter(t, h, off, "v2", 1)
	if got := uidsOf(admit(t, h, off, 3)); !eqStrings(got, []string{"v1", "v2", "n"}) {
		t.Fatalf("quota off: got %v, want [v1 v2 n]", got)
	}
}

// testQuotaAhead: for a queue that does not change, Ahead under the
// admission quota is exactly the number of users admitted first, for
// several shares and mixes of levels, when the normal users came before
// the VIPs: the case the quota is for (Ahead does not model the quota
// yielding to VIPs who came before a normal user; see QuotaAhead).
func testQuotaAhead(t *testing.T, h Harness) {
	for i, share := range []float64{0.1, 0.3, 0.5, 0.55, 0.6, 2.0 / 3, 0.7, 0.75, 0.9, 0.99} {
		c := room(t, func(c *waitroom.RoomConfig) {
			c.VIPAdmitShare, c.VIPShareCap = share, 1
		})
		var uids []string
		levels := map[string]int{}
		for j := range 30 {
			uid := fmt.Sprintf("u%02d", j)
			uids = append(uids, uid)
			// levels by a fixed pattern per share: VIP-heavy to VIP-light
			levels[uid] = []int{1, 0, 3, 2, 0, 0, 1}[(j*(i%4+1))%7]
		}
		for _, vips := range []bool{false, true} {
			for _, uid := range uids {
				if (levels[uid] > 0) == vips {
					enter(t, h, c, uid, levels[uid])
				}
			}
		}
		s := snap(t, h, c, uids...)
		got := uidsOf(admit(t, h, c, 0))
		if len(got) != len(uids) {
			t.Fatalf("share %.3g: admitted %d of %d", share, len(got), len(uids))
		}
		for k, p := range s.Positions {
			if j := slices.Index(got, uids[k]); p.Ahead != int64(j) {
				t.Errorf("share %.3g: Ahead of %s (level %d) %d, admitted at %d (order %v)", share, uids[k], p.Entry.Tier, p.Ahead, j, got)
			}
		}
	}
}

func testRestore(t *testing.T, h Harness) {
	c := room(t, nil)
	now := enter(t, h, c, "late", 0).Now
	past := now.Add(-100 * time.Second).Truncate(time.Second)
	r, err := h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: "early", Tier: 1,
		Restore: &waitroom.Restore{Join: past, First: past.Add(-time.Second), Bias: -600}})
	if err != nil || r.Status != waitroom.EnterQueued || !r.Entry.Join.Equal(past) || r.Entry.Score != waitroom.Score(past.Unix(), -600) {
		t.Fatalf("restore waiting: got %+v, %v, want queued at join %v", r, err, past)
	}
	exp := now.Add(time.Hour).Truncate(time.Second)
	r, err = h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: "act", Restore: &waitroom.Restore{
		Join: past, First: past, Active: true, Admitted: past, Expires: exp}})
	if err != nil || r.Status != waitroom.EnterActive || !r.Entry.Expires.Equal(exp) {
		t.Fatalf("restore active: got %+v, %v, want active until %v", r, err, exp)
	}
	enter(t, h, c, "queued-here", 0)
	r, err = h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: "queued-here", Restore: &waitroom.Restore{
		Join: past, First: past, Active: true, Admitted: past, Expires: exp}})
	if err != nil || r.Status != waitroom.EnterActive {
		t.Fatalf("restore active over a queued entry: got %+v, %v, want active", r, err)
	}
	if got := uidsOf(admit(t, h, c, 0)); !eqStrings(got, []string{"early", "late"}) {
		t.Fatalf("order: got %v, want [early late]", got)
	}
	if s := snap(t, h, c); s.Active != 4 || s.Waiting != 0 {
		t.Fatalf("active/waiting: got %d/%d, want 4/0", s.Active, s.Waiting)
	}
}

func testSharded(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Shards = 4 })
	type e struct {
		uid   string
		score float64
	}
	var all []e
	for i := range 40 {
		uid := fmt.Sprintf("user-%02d", i)
		r := enter(t, h, c, uid, i%4)
		all = append(all, e{uid, r.Entry.Score})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].score != all[j].score {
			return all[i].score < all[j].score
		}
		return all[i].uid < all[j].uid
	})
	want := make([]string, len(all))
	uids := make([]string, len(all))
	for i, x := range all {
		want[i], uids[i] = x.uid, x.uid
	}
	s := snap(t, h, c, uids...)
	for i, p := range s.Positions {
		if p.Ahead != int64(i) {
			t.Fatalf("ahead of %s: got %d, want %d", p.UID, p.Ahead, i)
		}
	}
	var got []string
	for len(got) < 40 {
		as := admit(t, h, c, 7)
		if len(as) == 0 {
			t.Fatalf("admission stalled after %d", len(got))
		}
		got = append(got, uidsOf(as)...)
	}
	if !eqStrings(got, want) {
		t.Fatalf("sharded admission order: got %v, want %v", got, want)
	}
}

func testSnapshotStats(t *testing.T, h Harness) {
	c := room(t, nil)
	enter(t, h, c, "a", 0)
	enter(t, h, c, "b", 2)
	enter(t, h, c, "c", 0)
	enter(t, h, c, "d", 0)
	if _, err := h.Backend.Disconnect(ctx(t), c, "d", ""); err != nil {
		t.Fatal(err)
	}
	admit(t, h, c, 1)
	s := snap(t, h, c, "a", "b", "zz")
	if s.Waiting != 2 || s.Away != 1 || s.Active != 1 || s.VIPWaiting != 0 || s.Admitted5m != 1 || s.Rate <= 0 {
		t.Fatalf("stats: got %+v, want waiting 2 away 1 active 1 vip 0 admitted 1 rate>0", s.Stats)
	}
	if s.Positions[1].State != waitroom.EntryActive || s.Positions[0].State != waitroom.EntryWaiting ||
		s.Positions[0].Ahead != 0 || s.Positions[2].State != waitroom.EntryNone || s.Positions[2].UID != "zz" {
		t.Fatalf("positions: got %+v", s.Positions)
	}
	m, err := h.Backend.Maintain(ctx(t), c, waitroom.MaintainRequest{})
	if err != nil || m.Rate <= 0 || m.LMax <= 0 {
		t.Fatalf("maintain: got %+v, %v, want rate and L_max > 0", m, err)
	}
}

func testConfigs(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) {
		c.VIPBias = map[int]time.Duration{1: 60 * time.Second}
		c.VIPAdmitShare = -1
		c.Site = &waitroom.Site{TargetURL: "https://shop.example/", TokenIn: waitroom.TokenInCookie, Anonymous: true,
			Title: "Sale", Colors: waitroom.SiteColors{Accent: "#f06"}, Strings: map[string]map[string]string{"en": {"eta": "soon"}}}
	})
	if err := h.Backend.SaveConfig(ctx(t), *c); err != nil {
		t.Fatal(err)
	}
	got, err := h.Backend.LoadConfigs(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var found *waitroom.RoomConfig
	for i := range got {
		if got[i].Name == c.Name {
			found = &got[i]
		}
	}
	// Every field survives the round trip.
	if found == nil || !reflect.DeepEqual(*found, *c) {
		t.Fatalf("loaded config: got %+v, want %+v", found, c)
	}
	enter(t, h, c, "x", 0)
	enter(t, h, c, "vip", 2)
	if err := h.Backend.DeleteRoom(ctx(t), c.Name); err != nil {
		t.Fatal(err)
	}
	got, _ = h.Backend.LoadConfigs(ctx(t))
	for _, g := range got {
		if g.Name == c.Name {
			t.Fatalf("room %s still configured after DeleteRoom", c.Name)
		}
	}
	if s := snap(t, h, c, "x", "vip"); s.Waiting != 0 || s.VIPWaiting != 0 || s.Positions[0].State != waitroom.EntryNone ||
		s.Positions[1].State != waitroom.EntryNone {
		t.Fatalf("room data after DeleteRoom: got %+v", s)
	}
}

func testTrim(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Grace = time.Second; c.HardTimeout = time.Hour })
	enter(t, h, c, "a", 0)
	enter(t, h, c, "b", 0)
	if _, err := h.Backend.Disconnect(ctx(t), c, "a", ""); err != nil {
		t.Fatal(err)
	}
	h.Sleep(2100 * time.Millisecond)
	n, err := h.Backend.Trim(ctx(t), c)
	if err != nil || n != 1 {
		t.Fatalf("Trim: got %d, %v, want 1 stale entry removed", n, err)
	}
	if s := snap(t, h, c, "a"); s.Away != 0 || s.Waiting != 1 || s.Positions[0].State != waitroom.EntryNone {
		t.Fatalf("after trim: got %+v", s.Stats)
	}
}

// testAheadOrder: with several overdue users, VIPs and normal users mixed
// over shards, every user's Ahead is exactly its place in the admission
// order.
func testAheadOrder(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.MaxWait = 2 * time.Second; c.Shards = 3 })
	var uids []string
	for i := range 8 {
		u := fmt.Sprintf("old%d", i)
		enter(t, h, c, u, i%4)
		uids = append(uids, u)
	}
	h.Sleep(2100 * time.Millisecond)
	for i := range 12 {
		u := fmt.Sprintf("new%02d", i)
		enter(t, h, c, u, (i*7)%4)
		uids = append(uids, u)
	}
	s := snap(t, h, c, uids...)
	if s.Overdue != 8 {
		t.Fatalf("overdue: got %d, want 8", s.Overdue)
	}
	want := make([]string, len(uids))
	for _, p := range s.Positions {
		if p.Ahead < 0 || p.Ahead >= int64(len(uids)) || want[p.Ahead] != "" {
			t.Fatalf("ahead of %s: got %d, not a distinct place in 0..%d (%+v)", p.UID, p.Ahead, len(uids)-1, s.Positions)
		}
		want[p.Ahead] = p.UID
	}
	var got []string
	for len(got) < len(uids) {
		as := admit(t, h, c, 1)
		if len(as) != 1 {
			t.Fatalf("admission stalled after %v", got)
		}
		got = append(got, as[0].UID)
	}
	if !eqStrings(got, want) {
		t.Fatalf("admission order: got %v, want the order of Ahead %v", got, want)
	}
}

// testDeadNode: a node that stops heartbeating loses its users: waiting
// ones become away (grace counted from its last heartbeat), admitted
// sessions end by disconnect; a user who reconnects through a live node
// moves to it and survives.
func testDeadNode(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Grace = time.Minute })
	in := func(uid, node string) waitroom.EnterResult {
		t.Helper()
		r, err := h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: uid, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	in("a", "A")
	in("b", "A")
	in("c", "B")
	in("d", "A")
	if r := in("d", "B"); r.Entry.Node != "B" { // d's socket moved to B
		t.Fatalf("node after reconnect through B: got %q, want B", r.Entry.Node)
	}
	if got := uidsOf(admit(t, h, c, 1)); !eqStrings(got, []string{"a"}) {
		t.Fatalf("admitted: got %v, want [a]", got)
	}
	beat := func(node string) waitroom.MaintainResult {
		t.Helper()
		m, err := h.Backend.Maintain(ctx(t), c, waitroom.MaintainRequest{Node: node, NodeTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	beat("A")
	hb := beat("B").Now
	h.Sleep(1500 * time.Millisecond)
	beat("B")
	h.Sleep(1600 * time.Millisecond)
	m := beat("B") // A silent for > 2 s
	if len(m.Ended) != 1 || m.Ended[0].UID != "a" || m.Ended[0].Reason != waitroom.EndDisconnect || m.Orphans != 1 {
		t.Fatalf("sweep of dead node A: got ended %+v orphans %d, want a by disconnect and 1 orphan", m.Ended, m.Orphans)
	}
	s := snap(t, h, c, "b", "c", "d")
	if s.Positions[0].State != waitroom.EntryAway || s.Positions[0].AwaySince.After(hb) ||
		s.Positions[1].State != waitroom.EntryWaiting || s.Positions[2].State != waitroom.EntryWaiting {
		t.Fatalf("after the sweep: got %+v, want b away since A's last beat, c and d waiting", s.Positions)
	}
	if r := in("b", "B"); r.Status != waitroom.EnterRestored || r.Ahead != 0 {
		t.Fatalf("b back through B: got %v ahead %d, want restored at the front", r.Status, r.Ahead)
	}
	if m := beat("B"); len(m.Ended) != 0 || m.Orphans != 0 {
		t.Fatalf("second sweep: got %+v, want nothing left of A", m)
	}
}

// testTierCounts checks Stats.WaitingByTier against a recount of who is
// waiting after every kind of change: enters of every tier (and clamped
// ones), a no-op re-enter, restores, admissions, leaves, disconnects with a
// return within grace and after it, hard-timeout drops, a dead node's
// orphans, and a deleted room that starts over.
func testTierCounts(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Shards = 3; c.Grace = time.Second; c.HardTimeout = 2 * time.Second })
	var uids []string
	tiers := map[string]int{}
	in := func(uid string, tier int, node string) {
		t.Helper()
		if _, ok := tiers[uid]; !ok {
			uids = append(uids, uid)
			tiers[uid] = min(max(tier, 0), waitroom.MaxTier)
		}
		if _, err := h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: uid, Tier: tier, Node: node}); err != nil {
			t.Fatalf("Enter(%s): %v", uid, err)
		}
	}
	check := func(step string) {
		t.Helper()
		s := snap(t, h, c, uids...)
		var want [waitroom.MaxTier + 1]int64
		for _, p := range s.Positions {
			if p.State == waitroom.EntryWaiting {
				if p.Tier != tiers[p.UID] {
					t.Fatalf("%s: %s has tier %d, entered with %d", step, p.UID, p.Tier, tiers[p.UID])
				}
				want[p.Tier]++
			}
		}
		var sum, vip int64
		for l, n := range s.WaitingByTier {
			sum += n
			if l > 0 {
				vip += n
			}
		}
		if s.WaitingByTier != want || sum != s.Waiting || vip != s.VIPWaiting {
			t.Fatalf("%s: waiting by tier %v (sum %d, VIP %d), recount %v, waiting %d, VIP %d",
				step, s.WaitingByTier, sum, vip, want, s.Waiting, s.VIPWaiting)
		}
	}
	check("empty room")
	for i := range 40 {
		in(fmt.Sprintf("u%02d", i), i%4, "")
	}
	in("over", 9, "")   // clamped to MaxTier
	in("under", -2, "") // clamped to 0
	in("u05", 1, "")    // already waiting: no change
	check("after enters")
	past := time.Now().Add(-30 * time.Second).Truncate(time.Second)
	for i, tier := range []int{2, 0} {
		uid := fmt.Sprintf("restored%d", i)
		uids, tiers[uid] = append(uids, uid), tier
		if _, err := h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: uid, Tier: tier,
			Restore: &waitroom.Restore{Join: past, First: past}}); err != nil {
			t.Fatalf("restore %s: %v", uid, err)
		}
	}
	// a restored active session over a waiting entry takes it out of the queue
	if _, err := h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: "u03", Restore: &waitroom.Restore{
		Join: past, First: past, Active: true, Admitted: past, Expires: time.Now().Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	check("after restores")
	if n := len(admit(t, h, c, 9)); n != 9 {
		t.Fatalf("admitted %d, want 9", n)
	}
	check("after admissions")
	for _, u := range []string{"u10", "u11", "u12", "u13", "u20"} {
		if _, err := h.Backend.Leave(ctx(t), c, u); err != nil {
			t.Fatal(err)
		}
	}
	check("after leaves")
	back := []string{"u14", "u15", "u16", "u17"}
	gone := []string{"u21", "u22", "u23", "u24", "u25", "u26"}
	for _, u := range append(append([]string(nil), back...), gone...) {
		if _, err := h.Backend.Disconnect(ctx(t), c, u, ""); err != nil {
			t.Fatal(err)
		}
	}
	check("after disconnects")
	for _, u := range back[:2] {
		in(u, tiers[u], "") // within grace
	}
	check("after returns within grace")
	h.Sleep(1500 * time.Millisecond)
	for _, u := range back[2:] {
		in(u, tiers[u], "") // past grace: decayed, still queued
	}
	check("after returns past grace")
	for i := range 4 {
		in(fmt.Sprintf("n%d", i), i, "dead")
	}
	if _, err := h.Backend.Maintain(ctx(t), c, waitroom.MaintainRequest{Node: "dead", NodeTimeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	check("with a node's users")
	h.Sleep(2100 * time.Millisecond)
	m, err := h.Backend.Maintain(ctx(t), c, waitroom.MaintainRequest{Node: "live", NodeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// the dead node's users are away since its last beat, over 2 s ago:
	// dropped with the disconnected ones still away
	if m.Orphans != 4 || len(m.Dropped) < 4 {
		t.Fatalf("maintain: got %d orphans, dropped %v, want 4 and the away users of %v", m.Orphans, m.Dropped, gone)
	}
	check("after hard timeout and a dead node")
	if n := len(admit(t, h, c, 0)); n == 0 {
		t.Fatal("admitted nobody in the final admission")
	}
	check("after admitting the rest")
	if err := h.Backend.DeleteRoom(ctx(t), c.Name); err != nil {
		t.Fatal(err)
	}
	check("after delete")
	in("u00", 0, "")
	in("u01", 1, "")
	check("in the room started over")
}

// testMaxWaitGuarantee: with admit_rate 1 (burst 1, so the guarantee counts
// 1/1.1 per second) and max_wait 12 s the room promises C = 10 admissions;
// normal users need a VIP reserve of 3, so 7 get in; VIPs pass while
// everyone can spare one more admission, and past that queue without a
// head start or are refused room_full with an honest retry hint.
func testMaxWaitGuarantee(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) {
		c.AdmitRate, c.AdmitBurst, c.MaxWait, c.TargetWait = 1, 1, 12*time.Second, time.Hour
	})
	if got := waitroom.Capacity(c); got != 10 {
		t.Fatalf("Capacity: got %d, want 10", got)
	}
	if got := waitroom.VIPReserve(c); got != 3 {
		t.Fatalf("VIPReserve: got %d, want 3", got)
	}
	for i := range 7 {
		if r := enter(t, h, c, fmt.Sprintf("n%d", i), 0); r.Status != waitroom.EnterQueued {
			t.Fatalf("normal %d: got %v, want queued", i, r.Status)
		}
	}
	r := enter(t, h, c, "n7", 0)
	if r.Status != waitroom.EnterRejected || r.Reject != waitroom.RejectRoomFull || r.RetryAfter != 2*time.Second {
		t.Fatalf("8th normal: got %v %q retry %v, want rejected room_full after 2s (1 admission at 1/1.1 per s)", r.Status, r.Reject, r.RetryAfter)
	}
	for i := range 3 {
		r := enter(t, h, c, fmt.Sprintf("v%d", i), 3)
		if r.Status != waitroom.EnterQueued || r.Entry.Bias >= 0 {
			t.Fatalf("VIP %d: got %v bias %v, want queued with a head start", i, r.Status, r.Entry.Bias)
		}
	}
	s := snap(t, h, c)
	if s.Owed != 10 || s.MinSlack != 0 || s.Capacity != 10 {
		t.Fatalf("stats: owed %d min slack %d capacity %d, want 10, 0, 10", s.Owed, s.MinSlack, s.Capacity)
	}
	if r := enter(t, h, c, "v3", 3); r.Status != waitroom.EnterRejected || r.Reject != waitroom.RejectRoomFull {
		t.Fatalf("VIP past capacity: got %v %q, want room_full", r.Status, r.Reject)
	}
	if got := admit(t, h, c, 1); len(got) != 1 || got[0].Late || got[0].UID != "v0" {
		t.Fatalf("admit: got %+v, want v0, not late", got)
	}
	r = enter(t, h, c, "v4", 3)
	if r.Status != waitroom.EnterQueued || r.Entry.Bias != 0 {
		t.Fatalf("VIP when nobody can spare a pass: got %v bias %v, want queued without a head start", r.Status, r.Entry.Bias)
	}
	if s := snap(t, h, c); s.MaxWaitViolations != 0 || s.Owed != 10 || s.MinSlack != 0 {
		t.Fatalf("after: violations %d owed %d min slack %d", s.MaxWaitViolations, s.Owed, s.MinSlack)
	}
}

// testMaxWaitQuota: the max-wait promise of VIPs under the admission quota
// (vip_admit_share 1/2). Ten VIPs fill a room of capacity 10 (admit_rate 1,
// burst 1, max_wait 12 s), then a normal user tries to enter at every
// admission step and is taken once the guarantee has room (after four
// admissions). Their slacks did not count those normal users, so the quota
// must not put them in a VIP's place: every VIP is admitted before any
// normal user, none late, and the normal users follow.
func testMaxWaitQuota(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) {
		c.AdmitRate, c.AdmitBurst, c.MaxWait, c.TargetWait = 1, 1, 12*time.Second, time.Hour
		c.VIPAdmitShare = 0.5
	})
	for i := range 10 {
		if r := enter(t, h, c, fmt.Sprintf("v%d", i), 1+i%3); r.Status != waitroom.EnterQueued {
			t.Fatalf("VIP %d: got %v %q, want queued", i, r.Status, r.Reject)
		}
	}
	if r := enter(t, h, c, "v10", 1); r.Status != waitroom.EnterRejected || r.Reject != waitroom.RejectRoomFull {
		t.Fatalf("11th VIP: got %v %q, want room_full", r.Status, r.Reject)
	}
	var order []string
	taken := 0
	for step := range 14 {
		for _, a := range admit(t, h, c, 1) {
			if a.Late {
				t.Errorf("step %d: %s admitted late (join %v, admitted %v)", step, a.UID, a.Join, a.Admitted)
			}
			order = append(order, a.UID)
		}
		if r := enter(t, h, c, fmt.Sprintf("n%02d", step), 0); r.Status == waitroom.EnterQueued {
			taken++
		}
		h.Sleep(1100 * time.Millisecond) // one token at the guarantee's rate (1/1.1 s)
	}
	lastVIP, firstNormal := -1, len(order)
	for i, u := range order {
		if u[0] == 'v' {
			lastVIP = i
		} else if i < firstNormal {
			firstNormal = i
		}
	}
	if lastVIP != 9 || firstNormal != 10 || len(order) < 13 || taken < 3 {
		t.Fatalf("admissions %v (%d normal users taken): want the ten VIPs, then the normal users", order, taken)
	}
	if s := snap(t, h, c); s.MaxWaitViolations != 0 {
		t.Fatalf("violations %d", s.MaxWaitViolations)
	}
}

// testQuotaYields: the admission quota (share 1/2) puts a normal user in a
// VIP's place only if the normal user was there before every waiting VIP;
// otherwise it yields to the VIPs and counts nothing for either class.
func testQuotaYields(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.VIPAdmitShare = 0.5 })
	for _, u := range []string{"v0", "v1", "v2"} {
		enter(t, h, c, u, 1)
	}
	enter(t, h, c, "n0", 0)
	enter(t, h, c, "n1", 0)
	// v0 within the share; n0 came after v1 and v2: the quota yields.
	if got := uidsOf(admit(t, h, c, 5)); !eqStrings(got, []string{"v0", "v1", "v2", "n0", "n1"}) {
		t.Fatalf("VIPs first: got %v, want [v0 v1 v2 n0 n1]", got)
	}
	// Normal users first: the quota holds the VIPs to their share, and a
	// normal user who came after them waits for them.
	enter(t, h, c, "m0", 0)
	enter(t, h, c, "m1", 0)
	for _, u := range []string{"w0", "w1", "w2"} {
		enter(t, h, c, u, 2)
	}
	enter(t, h, c, "z0", 0)
	if got := uidsOf(admit(t, h, c, 6)); !eqStrings(got, []string{"w0", "m0", "w1", "m1", "w2", "z0"}) {
		t.Fatalf("normal users first: got %v, want [w0 m0 w1 m1 w2 z0]", got)
	}
}

// testDeadHolders: a user held by two nodes that both die is away since
// the latest heartbeat of the two, whatever order the sweep takes them in;
// a node's set naming a user whose holders do not list it changes nothing.
func testDeadHolders(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Grace = time.Minute })
	beat := func(node string) time.Time {
		t.Helper()
		m, err := h.Backend.Maintain(ctx(t), c, waitroom.MaintainRequest{Node: node, NodeTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return m.Now
	}
	beat("A")
	beat("B")
	for _, n := range []string{"B", "A"} {
		if _, err := h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: "u", Node: n}); err != nil {
			t.Fatal(err)
		}
	}
	h.Sleep(1100 * time.Millisecond)
	hbA := beat("A") // A beats last, B earlier; the sweep takes A first in Memory
	h.Sleep(3100 * time.Millisecond)
	beat("C")
	s := snap(t, h, c, "u")
	if p := s.Positions[0]; p.State != waitroom.EntryAway || !p.AwaySince.Equal(hbA) {
		t.Fatalf("u after A and B died: %v away since %v, want away since A's last heartbeat %v", p.State, p.AwaySince, hbA)
	}
}

// testHoldsList: Holds lists the users a node holds, sorted; a node's
// Disconnect takes the user off its list only, a Leave off every list.
func testHoldsList(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Grace = time.Minute })
	holds := func(node string) []string {
		t.Helper()
		uids, err := h.Backend.Holds(ctx(t), c, node)
		if err != nil {
			t.Fatal(err)
		}
		return uids
	}
	for _, e := range []struct{ uid, node string }{{"u2", "a"}, {"u1", "a"}, {"u2", "b"}, {"u3", "b"}} {
		if _, err := h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: e.uid, Node: e.node}); err != nil {
			t.Fatal(err)
		}
	}
	if got := holds("a"); !eqStrings(got, []string{"u1", "u2"}) {
		t.Fatalf("Holds(a) = %v, want [u1 u2]", got)
	}
	if got := holds("c"); len(got) != 0 {
		t.Fatalf("Holds(c) = %v, want none", got)
	}
	if _, err := h.Backend.Disconnect(ctx(t), c, "u2", "a"); err != nil {
		t.Fatal(err)
	}
	if got := holds("a"); !eqStrings(got, []string{"u1"}) {
		t.Fatalf("after a's disconnect of u2: Holds(a) = %v, want [u1]", got)
	}
	if got := holds("b"); !eqStrings(got, []string{"u2", "u3"}) {
		t.Fatalf("after a's disconnect of u2: Holds(b) = %v, want [u2 u3]", got)
	}
	if _, err := h.Backend.Leave(ctx(t), c, "u3"); err != nil {
		t.Fatal(err)
	}
	if got := holds("b"); !eqStrings(got, []string{"u2"}) {
		t.Fatalf("after u3 left: Holds(b) = %v, want [u2]", got)
	}
}

// testHolders: an entry lists every node that entered the user; a node's
// Disconnect only takes it off the list while another holds the user
// (Departure.Held, nothing else changes), and the last one's disconnects
// it: a waiting user becomes away, an admitted session ends. A dead node
// is taken off the lists the same way; Disconnect with no node and Leave
// take every holder at once.
func testHolders(t *testing.T, h Harness) {
	c := room(t, func(c *waitroom.RoomConfig) { c.Grace = time.Minute; c.MaxActive = 1 })
	in := func(uid, node string) waitroom.EnterResult {
		t.Helper()
		r, err := h.Backend.Enter(ctx(t), c, waitroom.EnterRequest{UID: uid, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	out := func(uid, node string) waitroom.Departure {
		t.Helper()
		d, err := h.Backend.Disconnect(ctx(t), c, uid, node)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	state := func(uid string) waitroom.Entry {
		t.Helper()
		return snap(t, h, c, uid).Positions[0].Entry
	}
	// A session held by A and B lasts until both let it go.
	in("s", "A")
	in("s", "B")
	if got := uidsOf(admit(t, h, c, 1)); !eqStrings(got, []string{"s"}) {
		t.Fatalf("admitted %v, want [s]", got)
	}
	if d := out("s", "A"); !d.Held || d.Ended != nil || d.Prev != waitroom.EntryActive {
		t.Fatalf("A lets s go: got %+v, want held by B", d)
	}
	if e := state("s"); e.State != waitroom.EntryActive || e.Node != "B" {
		t.Fatalf("s after A: %+v, want active on B", e)
	}
	if d := out("s", "B"); d.Held || d.Ended == nil || d.Ended.Reason != waitroom.EndDisconnect {
		t.Fatalf("B lets s go: got %+v, want the session ended by disconnect", d)
	}
	// A visitor that moved from A to B: A's timeout changes nothing.
	in("a", "A")
	if r := in("a", "B"); r.Status != waitroom.EnterExisting || r.Entry.Node != "B" {
		t.Fatalf("a through B: got %v node %q, want existing on B", r.Status, r.Entry.Node)
	}
	if d := out("a", "A"); !d.Held || d.Prev != waitroom.EntryWaiting {
		t.Fatalf("A's disconnect of a: got %+v, want held by B", d)
	}
	if e := state("a"); e.State != waitroom.EntryWaiting || e.Node != "B" {
		t.Fatalf("a after A's disconnect: %+v, want waiting on B", e)
	}
	if d := out("a", "A"); !d.Held { // again: A no longer holds a
		t.Fatalf("A's second disconnect of a: got %+v, want held by B", d)
	}
	if d := out("a", "B"); d.Held || d.Prev != waitroom.EntryWaiting {
		t.Fatalf("B's disconnect of a: got %+v, want a away", d)
	}
	if e := state("a"); e.State != waitroom.EntryAway || e.Node != "" {
		t.Fatalf("a after both: %+v, want away, no node", e)
	}
	if r := in("a", "A"); r.Status != waitroom.EnterRestored || r.Entry.Node != "A" {
		t.Fatalf("a back through A: got %v node %q, want restored on A", r.Status, r.Entry.Node)
	}
	// Polled in turn (A, B, A), then only A: B's timeout changes nothing.
	in("b", "A")
	in("b", "B")
	if r := in("b", "A"); r.Entry.Node != "A" {
		t.Fatalf("b through A again: node %q, want A", r.Entry.Node)
	}
	if d := out("b", "B"); !d.Held {
		t.Fatalf("B's disconnect of b: got %+v, want held by A", d)
	}
	// A dies: b (held by A only) becomes away; d, held by A and C, stays.
	in("d", "A")
	in("d", "C")
	beat := func(node string) waitroom.MaintainResult {
		t.Helper()
		m, err := h.Backend.Maintain(ctx(t), c, waitroom.MaintainRequest{Node: node, NodeTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	beat("A")
	beat("C")
	h.Sleep(1500 * time.Millisecond)
	beat("C")
	h.Sleep(1600 * time.Millisecond)
	m := beat("C")      // A silent for > 2 s
	if m.Orphans != 2 { // a and b
		t.Fatalf("sweep of A: %d orphans, want 2 (a and b; d is held by C)", m.Orphans)
	}
	s := snap(t, h, c, "a", "b", "d")
	if s.Positions[0].State != waitroom.EntryAway || s.Positions[1].State != waitroom.EntryAway ||
		s.Positions[2].State != waitroom.EntryWaiting || s.Positions[2].Node != "C" {
		t.Fatalf("after the sweep: %+v, want a and b away, d waiting on C", s.Positions)
	}
	if d := out("d", "C"); d.Held {
		t.Fatalf("C's disconnect of d: got %+v, want d away (A is gone)", d)
	}
	// No node: every holder at once; Leave too.
	in("g", "B")
	in("g", "C")
	if d := out("g", ""); d.Held || state("g").State != waitroom.EntryAway {
		t.Fatalf("disconnect of g by no node: %+v, state %v, want away", d, state("g").State)
	}
	in("f", "B")
	in("f", "C")
	if _, err := h.Backend.Leave(ctx(t), c, "f"); err != nil {
		t.Fatal(err)
	}
	if e := state("f"); e.State != waitroom.EntryNone {
		t.Fatalf("f after leave: %+v, want gone", e)
	}
	if d := out("f", "B"); d.Held || d.Prev != waitroom.EntryNone {
		t.Fatalf("disconnect after leave: %+v, want nothing", d)
	}
}

// backendNow is the backend's clock, read through a scratch room.
func backendNow(t *testing.T, h Harness) time.Time {
	t.Helper()
	return snap(t, h, room(t, nil)).Now
}

// testScheduled: before starts_at entrants wait in the pre-queue (no
// position, nobody admitted); at the start the pre-queue is ordered by a
// random shuffle with the VIP bias on top, join = the start, exactly once
// even with several admission steps racing.
func testScheduled(t *testing.T, h Harness) {
	start := backendNow(t, h).Add(2 * time.Second)
	c := room(t, func(c *waitroom.RoomConfig) { c.StartsAt = start; c.AdmitRate = 1000; c.VIPAdmitShare = -1 })
	const n = 40
	var order []string
	for i := range n {
		uid := fmt.Sprintf("p%02d", i)
		order = append(order, uid)
		r := enter(t, h, c, uid, 0)
		if r.Status != waitroom.EnterQueued || r.Entry.State != waitroom.EntryScheduled || r.PreQueue != int64(i+1) {
			t.Fatalf("pre-queue entry %d: got %v state %v pre %d", i, r.Status, r.Entry.State, r.PreQueue)
		}
	}
	if r := enter(t, h, c, "vip", 3); r.Entry.State != waitroom.EntryScheduled {
		t.Fatalf("VIP pre-queue entry: got %v", r.Entry.State)
	}
	if r := enter(t, h, c, "p00", 0); r.Status != waitroom.EnterExisting || r.Entry.State != waitroom.EntryScheduled {
		t.Fatalf("enter again: got %v %v, want existing, scheduled", r.Status, r.Entry.State)
	}
	if _, err := h.Backend.Disconnect(ctx(t), c, "p01", ""); err != nil {
		t.Fatal(err)
	}
	enter(t, h, c, "p01", 0) // back before the start
	if got := admit(t, h, c, 0); len(got) != 0 {
		t.Fatalf("admitted before the start: %v", uidsOf(got))
	}
	s := snap(t, h, c, "p00")
	if s.PreQueue != n+1 || s.Waiting != 0 || s.Positions[0].State != waitroom.EntryScheduled || s.Owed != n+1 {
		t.Fatalf("before the start: pre %d waiting %d state %v owed %d", s.PreQueue, s.Waiting, s.Positions[0].State, s.Owed)
	}
	h.Sleep(start.Sub(backendNow(t, h)) + 1100*time.Millisecond)
	// Several nodes' admission steps race at the start.
	var mu sync.Mutex
	var got []waitroom.Admission
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := h.Backend.Admit(ctx(t), c, waitroom.AdmitRequest{})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got = append(got, r.Admitted...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	got = append(got, admit(t, h, c, 0)...)
	slices.SortStableFunc(got, func(a, b waitroom.Admission) int { return a.Admitted.Compare(b.Admitted) })
	uids := uidsOf(got)
	if len(uids) != n+1 {
		t.Fatalf("admitted %d at the start, want %d", len(uids), n+1)
	}
	seen := map[string]bool{}
	for _, a := range got {
		if seen[a.UID] {
			t.Fatalf("%s admitted twice", a.UID)
		}
		seen[a.UID] = true
		if a.Join.Unix() != c.StartS() || a.Late {
			t.Fatalf("%s: join %v (want the start %v), late %v", a.UID, a.Join, start, a.Late)
		}
	}
	if uids[0] != "vip" {
		t.Fatalf("the VIP was not admitted first: %v", uids)
	}
	if slices.Equal(uids[1:], order) {
		t.Fatalf("pre-queue admitted in join order: not shuffled")
	}
	if s := snap(t, h, c); s.PreQueue != 0 || s.Owed != 0 {
		t.Fatalf("after the start: pre %d owed %d", s.PreQueue, s.Owed)
	}
	// Arrivals after the start queue behind, as usual.
	if r := enter(t, h, c, "late", 0); r.Status != waitroom.EnterQueued || r.Entry.State != waitroom.EntryWaiting {
		t.Fatalf("after the start: got %v %v", r.Status, r.Entry.State)
	}
}

// testScheduledCapped: the pre-queue is bounded like the queue: what could
// not be admitted within max_wait of the start is refused room_full.
func testScheduledCapped(t *testing.T, h Harness) {
	start := backendNow(t, h).Add(time.Hour)
	c := room(t, func(c *waitroom.RoomConfig) {
		c.StartsAt, c.AdmitRate, c.AdmitBurst, c.MaxWait, c.TargetWait = start, 1, 1, 12*time.Second, time.Hour
	})
	for i := range 7 {
		if r := enter(t, h, c, fmt.Sprintf("n%d", i), 0); r.Entry.State != waitroom.EntryScheduled {
			t.Fatalf("normal %d: got %v %v", i, r.Status, r.Entry.State)
		}
	}
	if r := enter(t, h, c, "n7", 0); r.Reject != waitroom.RejectRoomFull || r.RetryAfter <= 0 {
		t.Fatalf("8th: got %v %q %v, want room_full with a hint", r.Status, r.Reject, r.RetryAfter)
	}
	if _, err := h.Backend.Leave(ctx(t), c, "n0"); err != nil {
		t.Fatal(err)
	}
	if r := enter(t, h, c, "n7", 0); r.Entry.State != waitroom.EntryScheduled {
		t.Fatalf("after a leave: got %v %q", r.Status, r.Reject)
	}
	if s := snap(t, h, c); s.PreQueue != 7 {
		t.Fatalf("pre-queue %d, want 7", s.PreQueue)
	}
}

// testEndsAt: from ends_at new entrants are refused room_closed; the users
// already waiting stay and are admitted.
func testEndsAt(t *testing.T, h Harness) {
	end := backendNow(t, h).Add(2 * time.Second)
	c := room(t, func(c *waitroom.RoomConfig) { c.EndsAt = end })
	enter(t, h, c, "in", 0)
	h.Sleep(end.Sub(backendNow(t, h)) + 1100*time.Millisecond)
	if r := enter(t, h, c, "out", 0); r.Reject != waitroom.RejectRoomClosed {
		t.Fatalf("after ends_at: got %v %q, want room_closed", r.Status, r.Reject)
	}
	if r := enter(t, h, c, "in", 0); r.Status != waitroom.EnterExisting {
		t.Fatalf("already waiting after ends_at: got %v", r.Status)
	}
	if got := uidsOf(admit(t, h, c, 0)); !eqStrings(got, []string{"in"}) {
		t.Fatalf("admitted after ends_at: %v, want [in]", got)
	}
}
