package fanout

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// memHotSet is an in-process HotSet: what a node last synced, without
// TTLs (expiry is the Redis backend's, tested there).
type memHotSet struct {
	mu    sync.Mutex
	marks map[string][]HotMark
	err   error
	calls int
}

func (m *memHotSet) Sync(_ context.Context, node string, marks []HotMark, _ time.Duration) ([]HotMark, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if m.err != nil {
		return nil, m.err
	}
	if m.marks == nil {
		m.marks = map[string][]HotMark{}
	}
	m.marks[node] = nil
	for _, h := range marks {
		h.Node = node
		m.marks[node] = append(m.marks[node], h)
	}
	var out []HotMark
	for _, ms := range m.marks {
		out = append(out, ms...)
	}
	return out, nil
}

// TestRemoteMarkKeepsGroupHot: a hot group whose own rate is calm stays in
// the hot pool while another node marks it, publishes no mark of its own,
// and cools HotClearAfter after the last mark went; a high local rate
// marks it.
func TestRemoteMarkKeepsGroupHot(t *testing.T) {
	clk := &fakeClock{t: time.Unix(10_000, 0)}
	e := testEngine(t, clk, Config{Tuning: Tuning{HotMinRate: 20, HotClearAfter: 10 * time.Second, GroupRate: -1, DownlinkRate: -1}, HotSet: &memHotSet{}, NodeID: "a"})
	s := e.hotSh[0]
	gs := s.newGroup(9, clk.now()) // arrived in the hot pool
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
	e.view.Store(&hotView{remote: map[int64][]HotMark{9: {{GID: 9, Node: "b", Rate: 400}}}, all: 1})
	run(30*time.Second, 1)
	if m, ok := moved(); ok {
		t.Fatalf("calm here but marked by node b for 30 s: got move %+v, want none", m)
	}
	if gs.marked {
		t.Error("calm here: got a local mark, want none")
	}
	run(time.Second, 50)
	if !gs.marked {
		t.Error("50/s here: got no local mark, want one")
	}
	// The last mark goes: the group cools after HotClearAfter of calm.
	e.view.Store(emptyHotView)
	run(9*time.Second, 1)
	if m, ok := moved(); ok {
		t.Fatalf("no mark for 9 s of 10: got move %+v", m)
	}
	if gs.marked {
		t.Error("calm again: the local mark stayed")
	}
	run(2*time.Second, 1)
	if m, ok := moved(); !ok || m.toHot || m.gid != 9 {
		t.Fatalf("no mark for 11 s: got %+v %v, want a move back", m, ok)
	}
}

// TestCoolMoveRetried: a hot group's move back to the ordinary pool that
// the controller's full queue refused is asked for again, not forgotten.
func TestCoolMoveRetried(t *testing.T) {
	clk := &fakeClock{t: time.Unix(10_000, 0)}
	e := testEngine(t, clk, Config{Tuning: Tuning{HotMinRate: 20, HotClearAfter: 10 * time.Second, GroupRate: -1, DownlinkRate: -1}, NodeID: "a"})
	s := e.hotSh[0]
	gs := s.newGroup(9, clk.now()) // arrived in the hot pool
	const step = 100 * time.Millisecond
	run := func(d time.Duration) {
		for i := 0; time.Duration(i)*step < d; i++ {
			clk.advance(step)
			feed(s, gs, clk.now(), i, 1, 1)
			s.evaluate(gs, clk.now())
		}
	}
	for len(e.moveReq) < cap(e.moveReq) { // the controller is busy
		e.moveReq <- moveRequest{gid: -1}
	}
	run(12 * time.Second) // calm past HotClearAfter: the request is refused
	for len(e.moveReq) > 0 {
		<-e.moveReq
	}
	run(time.Second)
	select {
	case m := <-e.moveReq:
		if m.gid != 9 || m.toHot {
			t.Fatalf("got move %+v, want group 9 out of the hot pool", m)
		}
	default:
		t.Fatal("the refused move back was never asked for again")
	}
}

// TestSyncHot: a round publishes the groups this node marks (and only
// those), reads the others', asks for the move of a group hot only
// elsewhere and lists it in HotGroups; when the set fails the view falls
// back to the local one and the failure is logged once.
func TestSyncHot(t *testing.T) {
	clk := &fakeClock{t: time.Unix(10_000, 0)}
	hs := &memHotSet{}
	var logs bytes.Buffer
	e := testEngine(t, clk, Config{HotSet: hs, NodeID: "a", Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	since := time.UnixMilli(9_000_000)
	e.hotInfo[1] = hotInfo{HotGroup: HotGroup{GID: 1, Rate: 80, Baseline: 2, Since: since}, marked: true}
	e.hotInfo[2] = hotInfo{HotGroup: HotGroup{GID: 2, Rate: 3, Baseline: 2, Since: since}} // cooling
	e.hot.Store(&map[int64]struct{}{1: {}, 2: {}})
	hs.marks = map[string][]HotMark{
		"b": {{GID: 1, Node: "b", Rate: 70, Hot: true, Since: since.Add(time.Second)}, {GID: 3, Node: "b", Rate: 90, Hot: true, Since: since.Add(2 * time.Second)}},
		"c": {{GID: 3, Node: "c", Rate: 10, Hot: true, Since: since.Add(time.Second)}, {GID: 4, Node: "c", Rate: 5}},
	}
	e.demand[5] = 7 // limited here, not hot
	e.demand[1] = 80
	ctx := context.Background()
	e.syncHot(ctx, e.localMarks())
	if got := hs.marks["a"]; len(got) != 2 || got[0].GID != 1 || got[0].Rate != 80 || !got[0].Hot || !got[0].Since.Equal(since) ||
		got[1].GID != 5 || got[1].Rate != 7 || got[1].Hot {
		t.Errorf("published: got %+v, want gid 1 hot and gid 5's offered rate", got)
	}
	for gid, want := range map[int64]float64{1: 70, 3: 100, 4: 5, 5: 0} {
		if got := e.remoteDemand(gid); got != want {
			t.Errorf("remote offered rate of gid %d: got %v, want %v", gid, got, want)
		}
	}
	select {
	case m := <-e.moveReq:
		if m.gid != 3 || !m.toHot || m.rate != 100 || (m.by != "b" && m.by != "c") {
			t.Errorf("move request: got %+v, want gid 3 to hot at 100/s", m)
		}
	default:
		t.Error("no move requested for gid 3, hot on b and c")
	}
	select {
	case m := <-e.moveReq:
		t.Errorf("second move request %+v: gid 1 is in the hot pool already", m)
	default:
	}
	if e.remoteHot(2) || !e.remoteHot(1) || !e.remoteHot(3) || e.remoteHot(4) {
		t.Errorf("remote view: 1=%v 2=%v 3=%v 4=%v, want true false true false", e.remoteHot(1), e.remoteHot(2), e.remoteHot(3), e.remoteHot(4))
	}
	hg := e.HotGroups()
	type row struct {
		gid    int64
		source HotSource
		nodes  string
		since  time.Time
	}
	var got []row
	for _, g := range hg {
		var nodes []string
		for _, m := range g.Marks {
			nodes = append(nodes, m.Node)
		}
		got = append(got, row{g.GID, g.Source, strings.Join(nodes, ","), g.Since})
	}
	want := []row{
		{1, HotLocal, "a,b", since},
		{2, HotCooling, "", since},
		{3, HotRemote, "b,c", since.Add(time.Second)}, // the earliest mark
	}
	if len(got) != len(want) {
		t.Fatalf("HotGroups: got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].gid != want[i].gid || got[i].source != want[i].source || got[i].nodes != want[i].nodes || !got[i].since.Equal(want[i].since) {
			t.Errorf("HotGroups[%d]: got %+v, want %+v", i, got[i], want[i])
		}
	}

	hs.err = errors.New("connection refused")
	for range 3 {
		e.syncHot(ctx, e.localMarks())
	}
	if e.remoteHot(1) || e.remoteHot(3) || e.remoteDemand(4) != 0 {
		t.Error("hot set down: other nodes' marks still followed")
	}
	if hg := e.HotGroups(); len(hg) != 2 || hg[0].Source != HotLocal || len(hg[0].Marks) != 1 {
		t.Errorf("hot set down: HotGroups %+v, want this node's two", hg)
	}
	if n := strings.Count(logs.String(), "hot set unavailable"); n != 1 {
		t.Errorf("3 failed rounds logged %d times, want once", n)
	}
	hs.err = nil
	e.syncHot(ctx, e.localMarks())
	if !e.remoteHot(3) || strings.Count(logs.String(), "hot set reachable again") != 1 {
		t.Errorf("hot set back: remote view %v, logs %s", e.remoteHot(3), logs.String())
	}
}

// TestHotSetConfig: a HotSet needs a node id and a TTL above two periods.
func TestHotSetConfig(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string // "" = valid
	}{
		{Config{Store: nopStore{}, HotSet: &memHotSet{}, NodeID: "a"}, ""},
		{Config{Store: nopStore{}, HotSet: &memHotSet{}}, "NodeID is required"},
		{Config{Store: nopStore{}, HotSet: &memHotSet{}, NodeID: "a", HotSync: 5 * time.Second}, "HotTTL (10s) must exceed 2 x HotSync (5s)"},
		{Config{Store: nopStore{}, HotSet: &memHotSet{}, NodeID: "a", HotSync: time.Second, HotTTL: 2001 * time.Millisecond}, ""},
		{Config{Store: nopStore{}, HotSync: -1}, "must not be negative"},
	}
	for i, tt := range tests {
		err := tt.cfg.Validate()
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%d: got %v, want %q", i, err, tt.want)
		}
	}
}

// TestLocalMarksBounded: past MaxHotMarks a node publishes its hot marks
// and then its busiest limited groups, and counts the rest.
func TestLocalMarksBounded(t *testing.T) {
	clk := &fakeClock{t: time.Unix(10_000, 0)}
	reg := prometheus.NewRegistry()
	e := testEngine(t, clk, Config{HotSet: &memHotSet{}, NodeID: "a", Metrics: NewMetrics(reg)})
	e.hotInfo[1] = hotInfo{HotGroup: HotGroup{GID: 1, Rate: 1}, marked: true}
	for gid := int64(2); gid < MaxHotMarks+6; gid++ {
		e.demand[gid] = float64(gid)
	}
	marks := e.localMarks()
	if len(marks) != MaxHotMarks || !marks[0].Hot || marks[1].GID != MaxHotMarks+5 || marks[len(marks)-1].GID != 7 {
		t.Fatalf("got %d marks, first %+v, second %+v, last %+v; want %d: the hot one, then the busiest", len(marks), marks[0], marks[1], marks[len(marks)-1], MaxHotMarks)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "fanfare_hot_marks_dropped_total" {
			if got := mf.GetMetric()[0].GetCounter().GetValue(); got != 5 {
				t.Errorf("dropped: got %v, want 5", got)
			}
			return
		}
	}
	t.Error("fanfare_hot_marks_dropped_total not exported")
}

// TestMemberFeedConfig: the feed's grace, kick gap and pending bound
// default when 0 and are rejected when negative.
func TestMemberFeedConfig(t *testing.T) {
	c := Config{Store: nopStore{}}
	c.fill()
	if c.MemberFeedGrace != 2*time.Second || c.MemberFeedKickGap != 100*time.Millisecond || c.MemberFeedPendingMax != 100000 {
		t.Fatalf("defaults: %v %v %v", c.MemberFeedGrace, c.MemberFeedKickGap, c.MemberFeedPendingMax)
	}
	for i, cfg := range []Config{
		{Store: nopStore{}, MemberFeedGrace: -1},
		{Store: nopStore{}, MemberFeedKickGap: -1},
		{Store: nopStore{}, MemberFeedPendingMax: -1},
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "MemberFeedGrace, MemberFeedKickGap and MemberFeedPendingMax") {
			t.Errorf("%d: got %v", i, err)
		}
	}
}
