package fanout

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/embedded"
)

func TestRateRing(t *testing.T) {
	const w = 100 * time.Millisecond
	t0 := time.Unix(1000, 0)
	var r rateRing
	for i := range 10 {
		r.add(t0.Add(time.Duration(i)*w), w, 5) // 50 events over 1 s
	}
	tests := []struct {
		at   time.Duration
		want float64
	}{
		{900 * time.Millisecond, 50},
		{1000 * time.Millisecond, 45}, // the first bucket slid out
		{1500 * time.Millisecond, 20},
		{1900 * time.Millisecond, 0},
		{time.Hour, 0},
	}
	for _, tt := range tests {
		if got := r.rate(t0.Add(tt.at), w); got != tt.want {
			t.Errorf("rate at +%v: got %v, want %v", tt.at, got, tt.want)
		}
	}
	// A clock that goes backwards counts into the newest bucket.
	r.add(t0, w, 3)
	if got := r.rate(t0.Add(time.Hour), w); got != 3 {
		t.Errorf("after a backwards add: got %v, want 3", got)
	}
}

func TestHysteresis(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var h hysteresis
	steps := []struct {
		at           time.Duration
		above, calm  bool
		wantOn, flip bool
	}{
		{0, false, true, false, false},
		{1 * time.Second, true, false, true, true},
		{2 * time.Second, false, true, true, false},  // calm starts
		{4 * time.Second, false, false, true, false}, // between thresholds: calm resets
		{5 * time.Second, false, true, true, false},  // calm restarts
		{9 * time.Second, false, true, true, false},  // 4 s calm: not yet
		{10 * time.Second, false, true, false, true}, // 5 s calm: clears
	}
	for _, s := range steps {
		flip := h.update(t0.Add(s.at), s.above, s.calm, 5*time.Second)
		if h.on != s.wantOn || flip != s.flip {
			t.Errorf("+%v: got on=%v changed=%v, want on=%v changed=%v", s.at, h.on, flip, s.wantOn, s.flip)
		}
	}
}

// testEngine builds an engine that is not running, for calling worker code
// directly on an injected clock.
func testEngine(t testing.TB, clk *fakeClock, cfg Config) *Engine {
	t.Helper()
	st, err := embedded.Open(embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg.Store = st
	cfg.Now = clk.now
	if cfg.LargeGroup == 0 {
		cfg.LargeGroup = 1
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// feed records step i (of 10 per second) of arrivals and commits per
// second at now, spreading the remainders so that each second holds
// exactly the rates.
func feed(s *shard, gs *gstate, now time.Time, i, arrivals, commits int) {
	part := func(r int) int { return (i%10+1)*r/10 - (i%10)*r/10 }
	gs.arrivals.add(now, s.bucketWidth(), part(arrivals))
	gs.commits.add(now, s.bucketWidth(), part(commits))
}

// TestGroupTriggersFireAndClear drives one group through L1 (downlink) and
// L2 (group rate) and back, on the injected clock, checking hysteresis.
func TestGroupTriggersFireAndClear(t *testing.T) {
	clk := &fakeClock{t: time.Unix(10_000, 0)}
	e := testEngine(t, clk, Config{Tuning: Tuning{HotFactor: -1, ClearAfter: 3 * time.Second}})
	var causes []string
	e.levels.OnChange(func(gid int64, from, to Level, cause string) { causes = append(causes, cause) })
	s := e.shards[0]
	gs := s.newGroup(7, clk.now())

	// Each phase runs for its duration with the given per-second rates,
	// evaluated every 100 ms; want is the automatic level at its end.
	phases := []struct {
		name         string
		dur          time.Duration
		offered, com int // per second
		want         Level
	}{
		{"quiet", 2 * time.Second, 2, 2, L0Normal},
		{"downlink 9/s > 80% of 10/s", 1 * time.Second, 9, 9, L1Merge},
		{"7/s: below the trigger, above the clear threshold", 5 * time.Second, 7, 7, L1Merge},
		{"3/s for 2 s: not calm long enough", 2 * time.Second, 3, 3, L1Merge},
		{"3/s for 2 more s: cleared", 2 * time.Second, 3, 3, L0Normal},
		{"offered 30/s > group rate 20/s", 1 * time.Second, 30, 20, L2Summary},
		{"offered 15/s, committed 15/s: L2 holds", 4 * time.Second, 15, 15, L2Summary},
		{"offered 8/s: L2 clears after 3 s, L1 holds (8 > 4)", 4 * time.Second, 8, 8, L1Merge},
		{"quiet again", 5 * time.Second, 0, 0, L0Normal},
	}
	const step = 100 * time.Millisecond
	for _, p := range phases {
		for i := 0; time.Duration(i)*step < p.dur; i++ {
			clk.advance(step)
			feed(s, gs, clk.now(), i, p.offered, p.com)
			s.evaluate(gs, clk.now())
		}
		if got := e.levels.Auto(7); got != p.want {
			t.Fatalf("%s: got auto level %d, want %d", p.name, got, p.want)
		}
		if got := e.levels.Effective(7); got != p.want {
			t.Fatalf("%s: got effective level %d, want %d", p.name, got, p.want)
		}
	}
	// The ramp to 30/s passes the downlink threshold first.
	if len(causes) != 6 {
		t.Errorf("got %d level changes %q, want 6 (L1, L0, L1, L2, L1, L0)", len(causes), causes)
	}
	for _, c := range causes {
		if c == "" {
			t.Errorf("a level change without a cause: %q", causes)
		}
	}

	// A small group (LargeGroup not reached) never triggers.
	e2 := testEngine(t, clk, Config{Tuning: Tuning{LargeGroup: 1000, HotFactor: -1}})
	s2 := e2.shards[0]
	small := s2.newGroup(8, clk.now())
	small.meta.members.Store(999)
	for i := range 20 {
		clk.advance(step)
		feed(s2, small, clk.now(), i, 100, 100)
		s2.evaluate(small, clk.now())
	}
	if got := e2.levels.Auto(8); got != L0Normal {
		t.Errorf("group of 999 members under LargeGroup 1000: got level %d, want 0", got)
	}
}

// TestHotDetection: a group 10x above its baseline (and above the minimum
// rate) asks to become hot; it asks to cool only after its rate stayed
// low for HotClearAfter.
func TestHotDetection(t *testing.T) {
	clk := &fakeClock{t: time.Unix(10_000, 0)}
	e := testEngine(t, clk, Config{Tuning: Tuning{HotMinRate: 20, HotClearAfter: 10 * time.Second, BaselineTau: time.Minute, GroupRate: -1, DownlinkRate: -1}})
	s := e.shards[0]
	gs := s.newGroup(9, clk.now())
	const step = 100 * time.Millisecond
	run := func(d time.Duration, perSec int) {
		for i := 0; time.Duration(i)*step < d; i++ {
			clk.advance(step)
			feed(s, gs, clk.now(), i, perSec, perSec)
			s.evaluate(gs, clk.now())
		}
	}
	moved := func() (moveRequest, bool) {
		select {
		case m := <-e.moveReq:
			return m, true
		default:
			return moveRequest{}, false
		}
	}
	// Baseline about 3/s: 25/s is above the minimum but below 10x.
	run(5*time.Minute, 3)
	run(2*time.Second, 25)
	if m, ok := moved(); ok {
		t.Fatalf("25/s against a baseline of %.1f/s: got move %+v, want none", gs.baseline, m)
	}
	run(30*time.Second, 3)
	run(2*time.Second, 50)
	m, ok := moved()
	if !ok || !m.toHot || m.gid != 9 {
		t.Fatalf("50/s against a baseline of %.1f/s: got %+v %v, want a move to hot", gs.baseline, m, ok)
	}
	// The controller would hand the group over; emulate the arrival.
	gs.moving, gs.hot, gs.cool = false, true, hysteresis{on: true}
	base := gs.baseline
	run(20*time.Second, 50)
	if gs.baseline != base {
		t.Errorf("baseline moved while hot: %v -> %v", base, gs.baseline)
	}
	if got := e.levels.Auto(9); got != L1Merge {
		t.Errorf("hot group: got auto level %d, want at least L1", got)
	}
	run(9*time.Second, 5)
	if m, ok := moved(); ok {
		t.Fatalf("cooling for 9 s of 10: got move %+v", m)
	}
	run(2*time.Second, 5)
	if m, ok := moved(); !ok || m.toHot {
		t.Fatalf("cooled for 11 s: got %+v %v, want a move back", m, ok)
	}
}

// TestNodeTriggers: egress and commit latency raise the node to L3 and
// clear with hysteresis; failed commits plus a failed ping raise L4, which
// clears after StoreClearProbes good pings.
func TestNodeTriggers(t *testing.T) {
	cfg := Config{Tuning: Tuning{EgressBandwidth: 1000, ClearAfter: 3 * time.Second, StoreLatencyAlarm: 500 * time.Millisecond}}
	cfg.Store = nopStore{}
	cfg.fill()
	tn := cfg.Tuning
	clk := &fakeClock{t: time.Unix(10_000, 0)}
	var n nodeTriggers
	var total int64
	pingErr := error(nil)
	pings := 0
	ping := func() error { pings++; return pingErr }
	type step struct {
		name        string
		egressPerS  int64
		commitNanos int64 // mean commit latency this second
		fails, oks  int64
		pingDown    bool
		want        Level
	}
	steps := []step{
		{"idle", 0, 0, 0, 0, false, L0Normal},
		{"egress 700 B/s > 60% of 1000", 700, 0, 0, 10, false, L3WriteOnly},
		{"egress 400 B/s: between", 400, 0, 0, 10, false, L3WriteOnly},
		{"egress 200 B/s: calm 0 s", 200, 0, 0, 10, false, L3WriteOnly},
		{"calm 1 s", 200, 0, 0, 10, false, L3WriteOnly},
		{"calm 2 s", 200, 0, 0, 10, false, L3WriteOnly},
		{"calm 3 s: cleared", 200, 0, 0, 10, false, L0Normal},
		{"slow commits 2 s", 0, int64(2 * time.Second), 0, 10, false, L3WriteOnly},
		{"fast commits", 0, int64(time.Millisecond), 0, 10, false, L3WriteOnly},
		{"fast commits", 0, int64(time.Millisecond), 0, 10, false, L3WriteOnly},
		{"fast commits", 0, int64(time.Millisecond), 0, 10, false, L3WriteOnly},
		{"fast commits", 0, int64(time.Millisecond), 0, 10, false, L3WriteOnly},
		{"fast commits", 0, int64(time.Millisecond), 0, 10, false, L3WriteOnly},
		{"fast commits: cleared", 0, int64(time.Millisecond), 0, 10, false, L0Normal},
		{"failures but some commits ok", 0, 0, 3, 1, true, L0Normal},
		{"failures, none ok, ping fails", 0, 0, 3, 0, true, L4Reject},
		{"L4: ping still fails", 0, 0, 0, 0, true, L4Reject},
		{"ping ok 1", 0, 0, 0, 0, false, L4Reject},
		{"ping ok 2", 0, 0, 0, 0, false, L4Reject},
		{"ping fails again: count restarts", 0, 0, 0, 0, true, L4Reject},
		{"ping ok 1", 0, 0, 0, 0, false, L4Reject},
		{"ping ok 2", 0, 0, 0, 0, false, L4Reject},
		{"ping ok 3: cleared", 0, 0, 0, 0, false, L0Normal},
	}
	for i, s := range steps {
		clk.advance(time.Second)
		total += s.egressPerS
		pingErr = nil
		if s.pingDown {
			pingErr = errors.New("connection refused")
		}
		var commits int64
		if s.commitNanos > 0 {
			commits = 1
		}
		lv, cause := n.observe(&tn, clk.now(), nodeSample{egressBytes: total, commitNanos: s.commitNanos, commits: commits, fails: s.fails, oks: s.oks}, ping)
		if lv != s.want {
			t.Fatalf("step %d %q: got L%d (%s), want L%d", i, s.name, lv, cause, s.want)
		}
		if cause == "" {
			t.Fatalf("step %d: empty cause", i)
		}
	}
	if pings != 8 {
		t.Errorf("got %d pings, want 8 (once on failures without success, then each interval while down)", pings)
	}
}

// nopStore satisfies store.Store for tests that never call it.
type nopStore struct{ store.Store }

// TestNodePart: a cluster-wide limit split in proportion to the offered
// rates, at least 1/s (or the whole limit when it is lower) per node.
func TestNodePart(t *testing.T) {
	for _, tt := range []struct{ limit, local, remote, want float64 }{
		{20, 15, 0, 20},  // alone
		{20, 15, 15, 10}, // even
		{20, 30, 10, 15}, // 3:1
		{20, 0, 50, 1},   // nothing offered here yet: the floor
		{20, 0.1, 99.9, 1},
		{0.5, 0, 10, 0.5}, // a limit below the floor
	} {
		if got := nodePart(tt.limit, tt.local, tt.remote); got != tt.want {
			t.Errorf("nodePart(%v, %v, %v) = %v, want %v", tt.limit, tt.local, tt.remote, got, tt.want)
		}
	}
}

// BenchmarkGroupLimit is the cost of a group's limit, alone on its node
// and shared with other nodes (HotSet): "admit" is the per-send part (the
// limit and one token), "evaluate" the per-evaluation part (every
// RateWindow/10 per active group, never per message), which publishes the
// offered rate when shared.
func BenchmarkGroupLimit(b *testing.B) {
	for _, shared := range []bool{false, true} {
		clk := &fakeClock{t: time.Unix(10_000, 0)}
		cfg := Config{Tuning: Tuning{HotFactor: -1, DownlinkRate: -1}}
		if shared {
			cfg.HotSet, cfg.NodeID = &memHotSet{}, "a"
		}
		e := testEngine(b, clk, cfg)
		if shared {
			e.view.Store(&hotView{demand: map[int64]float64{7: 15}})
		}
		s := e.shards[0]
		gs := s.newGroup(7, clk.now())
		feed(s, gs, clk.now(), 0, 15, 15)
		s.evaluate(gs, clk.now())
		b.Run(fmt.Sprintf("admit/shared=%v", shared), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				clk.advance(time.Millisecond)
				rate, burst, _, _ := s.limits(gs)
				gs.bucket.take(clk.now(), rate, burst)
			}
		})
		// The sender check of a large group, answered from its cache (the
		// store is asked once per sender and MemberCacheTTL).
		b.Run(fmt.Sprintf("check/shared=%v", shared), func(b *testing.B) {
			b.ReportAllocs()
			t := &task{send: SendRequest{GID: 7, UID: "alice"}}
			s.tn = e.tune.Load()
			_ = s.checkSender(gs, t, clk.now())
			for b.Loop() {
				_ = s.checkSender(gs, t, clk.now())
			}
		})
		b.Run(fmt.Sprintf("evaluate/shared=%v", shared), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				clk.advance(100 * time.Millisecond)
				feed(s, gs, clk.now(), i, 15, 15)
				s.evaluate(gs, clk.now())
				i++
			}
		})
	}
}

// TestBacklogCountsAsDemand: a node whose sends stopped with sends still
// buffered keeps a fair part of a shared limit (the backlog is demand), not
// the 1/s floor.
func TestBacklogCountsAsDemand(t *testing.T) {
	clk := &fakeClock{t: time.Unix(10_000, 0)}
	e := testEngine(t, clk, Config{Tuning: Tuning{HotFactor: -1, DownlinkRate: -1, GroupRate: 20}, HotSet: &memHotSet{}, NodeID: "a"})
	e.view.Store(&hotView{demand: map[int64]float64{7: 20}})
	s := e.shards[0]
	gs := s.newGroup(7, clk.now())
	for range 10 {
		gs.queue.push(&task{})
	}
	clk.advance(5 * time.Second) // no arrivals in the window
	s.evaluate(gs, clk.now())
	if rate, _, _, _ := s.limits(gs); rate < 6 || rate > 7 {
		t.Errorf("part of 20/s with 10 buffered here and 20/s elsewhere: got %.2f/s, want 20 x 10/30", rate)
	}
	if got := e.demand[7]; got != 10 {
		t.Errorf("published demand: got %v, want 10 (the backlog over a 1 s window)", got)
	}
}
