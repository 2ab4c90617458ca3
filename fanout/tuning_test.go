package fanout_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
)

// waitWithin is waitFor with its own deadline, for tests whose point is
// that something happens sooner than an old setting would allow.
func waitWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestTuningValidate: every invalid field is reported, by its JSON name,
// wrapped in ErrInvalidTuning; SetTuning then changes nothing.
func TestTuningValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*fanout.Tuning)
		want []string // substrings of the error; nil = valid
	}{
		{"zero is every default", func(*fanout.Tuning) {}, nil},
		{"negatives that disable", func(tn *fanout.Tuning) {
			tn.GroupRate, tn.DownlinkRate, tn.HotFactor, tn.AtAllPerDay = -1, -1, -1, -1
			tn.StoreLatencyAlarm, tn.Tier2MinActiveShare = -1, -1
		}, nil},
		{"largest merge window", func(tn *fanout.Tuning) { tn.MergeWindow = 10 * time.Second }, nil},
		{"merge window negative", func(tn *fanout.Tuning) { tn.MergeWindow = -time.Millisecond }, []string{"merge_window"}},
		{"merge window too long", func(tn *fanout.Tuning) { tn.MergeWindow = 11 * time.Second }, []string{"merge_window"}},
		{"negative counts", func(tn *fanout.Tuning) {
			tn.MaxMerge, tn.GroupBuffer, tn.LargeGroup, tn.Tier2MaxMembers = -1, -2, -3, -4
		}, []string{"max_merge", "group_buffer", "large_group_members", "tier2_max_members"}},
		{"fractions out of range", func(tn *fanout.Tuning) {
			tn.QueueSafety, tn.DownlinkFraction, tn.EgressFraction, tn.ClearFraction = 1.5, -0.1, 2, 1
		}, []string{"queue_safety", "downlink_fraction", "egress_fraction", "trigger_clear_fraction"}},
		{"not finite", func(tn *fanout.Tuning) { tn.GroupRate, tn.HotFactor = math.NaN(), math.Inf(1) }, []string{"group_rate", "hot_factor"}},
		{"negative durations", func(tn *fanout.Tuning) {
			tn.ClearAfter, tn.HotClearAfter, tn.ActiveWindow, tn.QueueTargetWait = -1, -1, -1, -1
		}, []string{"trigger_clear_after", "hot_clear_after", "active_window", "queue_target_wait"}},
		{"hot rates negative", func(tn *fanout.Tuning) { tn.HotMinRate, tn.HotGroupRate = -1, -2 }, []string{"hot_min_rate", "hot_group_rate"}},
		{"share above 1", func(tn *fanout.Tuning) { tn.Tier2MinActiveShare = 1.5 }, []string{"tier2_min_active_share"}},
	}
	e := enginetest.Start(t, fanout.Config{Store: openStore(t)})
	before := e.Tuning()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tn fanout.Tuning
			tt.mod(&tn)
			err := tn.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				return
			}
			if !errors.Is(err, fanout.ErrInvalidTuning) {
				t.Fatalf("got %v, want ErrInvalidTuning", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
			if err := e.SetTuning(tn); !errors.Is(err, fanout.ErrInvalidTuning) {
				t.Errorf("SetTuning: got %v, want ErrInvalidTuning", err)
			}
			if got := e.Tuning(); got != before {
				t.Errorf("a refused SetTuning changed the tuning: %v", got.Diff(before))
			}
		})
	}
	// New refuses the same values in Config.
	cfg := fanout.Config{Tuning: fanout.Tuning{MergeWindow: time.Minute, QueueSafety: 2}, Store: openStore(t)}
	if _, err := fanout.New(cfg); !errors.Is(err, fanout.ErrInvalidTuning) {
		t.Errorf("New with an invalid tuning: got %v, want ErrInvalidTuning", err)
	}
}

// TestTuningDefaults: zero fields are filled as Config documents them,
// derived defaults from the same Tuning.
func TestTuningDefaults(t *testing.T) {
	e := enginetest.Start(t, fanout.Config{Store: openStore(t)})
	def := e.Tuning()
	if err := e.SetTuning(fanout.Tuning{GroupRate: 50, MergeWindow: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	set := e.Tuning()
	tests := []struct {
		name      string
		got, want any
	}{
		{"merge window", def.MergeWindow, 200 * time.Millisecond},
		{"max merge", def.MaxMerge, 256},
		{"group rate", def.GroupRate, 20.0},
		{"group buffer = 2 x group rate", def.GroupBuffer, 40},
		{"hot group rate = group rate / 2", def.HotGroupRate, 10.0},
		{"hot group buffer", def.HotGroupBuffer, 20},
		{"queue safety", def.QueueSafety, 0.6},
		{"active window", def.ActiveWindow, 7 * 24 * time.Hour},
		{"set merge window", set.MergeWindow, 300 * time.Millisecond},
		{"set group rate", set.GroupRate, 50.0},
		{"derived group buffer", set.GroupBuffer, 100},
		{"derived hot min rate", set.HotMinRate, 50.0},
		{"derived hot group rate", set.HotGroupRate, 25.0},
		{"derived hot group buffer", set.HotGroupBuffer, 50},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if got, want := set.Diff(def), []string{"merge_window", "group_rate", "group_buffer", "hot_min_rate", "hot_group_rate", "hot_group_buffer"}; !slices.Equal(got, want) {
		t.Errorf("Diff: got %v, want %v", got, want)
	}
}

// TestTuningJSON: durations are strings, names snake_case; decoding wants
// the whole document and names what is wrong.
func TestTuningJSON(t *testing.T) {
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{StoreLatencyAlarm: -1}, Store: openStore(t)})
	tn := e.Tuning()
	b, err := json.Marshal(tn)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"merge_window": "200ms", "store_latency_alarm": "-1ns", "group_rate": 20.0, "tier2_off": false, "active_window": "168h0m0s"} {
		if raw[k] != want {
			t.Errorf("%s: got %v (%T), want %v", k, raw[k], raw[k], want)
		}
	}
	if got, want := len(raw), len(fanout.TuningNames()); got != want {
		t.Errorf("got %d fields, want %d", got, want)
	}
	var back fanout.Tuning
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back != tn {
		t.Errorf("round trip differs in %v", back.Diff(tn))
	}

	with := func(k string, v any) string {
		m := map[string]any{}
		json.Unmarshal(b, &m)
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		out, _ := json.Marshal(m)
		return string(out)
	}
	bad := []struct {
		name, doc string
		want      []string
	}{
		{"missing fields", with("merge_window", nil), []string{"missing merge_window", "GET it"}},
		{"unknown field", with("merge_windw", "1s"), []string{`json: unknown field "merge_windw"`}},
		{"duration as number", with("merge_window", 200), []string{"merge_window", "duration string"}},
		{"bad duration", with("trigger_clear_after", "5 s"), []string{"trigger_clear_after"}},
		{"integer as fraction", with("max_merge", 1.5), []string{"max_merge", "integer"}},
		{"bool as string", with("tier2_off", "yes"), []string{"tier2_off", "true or false"}},
		{"not an object", `[1]`, []string{"cannot unmarshal"}},
		{"null", `null`, []string{"object"}},
	}
	for _, tt := range bad {
		var got fanout.Tuning
		err := json.Unmarshal([]byte(tt.doc), &got)
		if err == nil {
			t.Errorf("%s: got nil error", tt.name)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", tt.name, err, w)
			}
		}
	}
}

// TestSetTuningMergeWindow: a running engine picks up a shorter merge
// window at once, for pushes (the workers' ticks) and for tier 2 (its own
// ticker): a message held by a 10 s window is pushed and written within
// the new one.
func TestSetTuningMergeWindow(t *testing.T) {
	st := openStore(t)
	pres, rec := newPresence(t), newRecorder()
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{MergeWindow: 10 * time.Second, Tier2MinActiveShare: -1, HotFactor: -1}, Store: st, Presence: pres, Pusher: rec})
	ctx := context.Background()
	gid := newGroup(t, st, "alice", "bob", "carol")
	if _, err := e.Connect(ctx, &testConn{"bob"}); err != nil {
		t.Fatal(err)
	}
	if err := st.TouchUser(ctx, "carol", time.Now().Add(-time.Hour)); err != nil { // active, offline
		t.Fatal(err)
	}
	l1 := fanout.L1Merge
	e.Levels().Force(gid, &l1, 0)
	conv := func() int64 {
		m, err := st.Conversations(ctx, "carol")
		if err != nil {
			t.Fatal(err)
		}
		return m[gid]
	}
	for i := range 3 {
		if r := send(e, gid, "alice", fmt.Sprint(i)); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	time.Sleep(300 * time.Millisecond) // several worker ticks
	if got := rec.seqs("bob"); len(got) != 0 {
		t.Fatalf("pushed %v inside a 10 s window", got)
	}
	if got := conv(); got != 0 {
		t.Fatalf("tier 2 wrote seq %d inside a 10 s window", got)
	}

	tn := e.Tuning()
	tn.MergeWindow = 20 * time.Millisecond
	if err := e.SetTuning(tn); err != nil {
		t.Fatal(err)
	}
	waitWithin(t, 3*time.Second, "the held batch pushed", func() bool { return len(rec.seqs("bob")) == 3 })
	waitWithin(t, 3*time.Second, "tier 2 written", func() bool { return conv() == 3 })
	if got := rec.seqs("bob"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Errorf("bob got %v, want [1 2 3]", got)
	}
	// And the short window keeps working for new messages.
	if r := send(e, gid, "alice", "after"); r.Err != nil {
		t.Fatal(r.Err)
	}
	waitWithin(t, 3*time.Second, "the next window pushed", func() bool { return len(rec.seqs("bob")) == 4 })
}

// TestSetTuningGroupRate: on an injected clock, a raised group rate
// releases buffered sends at the new rate, and a shrunk buffer refuses
// the oldest buffered sends at the next admission.
func TestSetTuningGroupRate(t *testing.T) {
	clk := newClock()
	st := openStore(t)
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{LargeGroup: 1, GroupRate: 2, GroupBuffer: 10, HotFactor: -1}, Store: st, Now: clk.Now})
	gid := newGroup(t, st, "alice")
	o := newOutcome()
	for i := range 2 { // the burst: one second of rate
		o.send(e, gid, "alice", fmt.Sprintf("b%d", i), "")
	}
	waitFor(t, "the burst acked", func() bool {
		_, a := o.get("b0")
		_, b := o.get("b1")
		return a && b
	})
	for i := range 6 {
		o.send(e, gid, "alice", fmt.Sprintf("q%d", i), "")
	}
	answered := func() (n int) {
		for i := range 6 {
			if _, ok := o.get(fmt.Sprintf("q%d", i)); ok {
				n++
			}
		}
		return n
	}
	clk.Advance(100 * time.Millisecond) // 0.2 tokens at 2/s: nothing
	time.Sleep(100 * time.Millisecond)
	if n := answered(); n != 0 {
		t.Fatalf("%d buffered sends answered at 2 msg/s after 100 ms", n)
	}

	// Shrink the buffer to 4: the next send pushes out the three oldest.
	tn := e.Tuning()
	tn.GroupBuffer = 4
	if err := e.SetTuning(tn); err != nil {
		t.Fatal(err)
	}
	o.send(e, gid, "alice", "q6", "")
	waitFor(t, "three refusals", func() bool { return answered() == 3 })
	for _, id := range []string{"q0", "q1", "q2"} {
		if r, _ := o.get(id); !errors.Is(r.Err, fanout.ErrRateLimited) {
			t.Errorf("%s: got %v, want ErrRateLimited", id, r.Err)
		}
	}

	// Raise the rate to 100/s: 100 ms of clock releases all four.
	tn.GroupRate = 100
	if err := e.SetTuning(tn); err != nil {
		t.Fatal(err)
	}
	clk.Advance(100 * time.Millisecond)
	o.wg.Wait()
	var seqs []int64
	for _, id := range []string{"b0", "b1", "q3", "q4", "q5", "q6"} {
		r, _ := o.get(id)
		if r.Err != nil {
			t.Fatalf("%s: %v", id, r.Err)
		}
		seqs = append(seqs, r.Seq)
	}
	if !slices.Equal(seqs, []int64{1, 2, 3, 4, 5, 6}) {
		t.Errorf("acked seqs in send order: got %v, want 1..6", seqs)
	}
}

// TestSetTuningUnderLoad: tuning swapped continuously while sends flow
// loses, duplicates and reorders nothing (and, under -race, races with
// nothing).
func TestSetTuningUnderLoad(t *testing.T) {
	st := openStore(t)
	pres, rec := newPresence(t), newRecorder()
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{LargeGroup: 1, GroupRate: -1, HotFactor: -1}, Store: st, Presence: pres, Pusher: rec, Shards: 2})
	gid := newGroup(t, st, "alice", "bob")
	if _, err := e.Connect(context.Background(), &testConn{"bob"}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		windows := []time.Duration{5 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			tn := e.Tuning()
			tn.MergeWindow = windows[i%len(windows)]
			tn.MaxMerge = 1 + i%64
			tn.DownlinkRate = float64(1 + i%50)
			if err := e.SetTuning(tn); err != nil {
				t.Error(err)
				return
			}
		}
	})
	const n = 400
	for i := range n {
		if r := send(e, gid, "alice", fmt.Sprint(i)); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	close(stop)
	wg.Wait()
	waitFor(t, "every push", func() bool { return len(rec.seqs("bob")) >= n })
	got := rec.seqs("bob")
	for i, s := range got {
		if s != int64(i+1) {
			t.Fatalf("push %d: got seq %d, want %d (pushes must stay dense and in order)", i, s, i+1)
		}
	}
}

// TestQueueAndLatencyMetrics: every worker exports its queue depth and
// bound; every acked send is observed once in fanfare_send_latency_seconds.
func TestQueueAndLatencyMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	st := openStore(t)
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{QueueMinBound: 100}, Store: st, Metrics: fanout.NewMetrics(reg), Shards: 3, HotShards: 2})
	gid := newGroup(t, st, "alice")
	const sends = 7
	for i := range sends {
		if r := send(e, gid, "alice", fmt.Sprint(i)); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	send(e, gid, "alice", "0") // a duplicate is acked too
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]int{}
	for _, f := range fams {
		switch f.GetName() {
		case "fanfare_shard_queue_depth", "fanfare_shard_queue_bound":
			pools := map[string]int{}
			for _, m := range f.GetMetric() {
				var pool string
				for _, l := range m.GetLabel() {
					if l.GetName() == "pool" {
						pool = l.GetValue()
					}
				}
				pools[pool]++
				v := m.GetGauge().GetValue()
				if f.GetName() == "fanfare_shard_queue_bound" && (v < 100 || v > 8192) {
					t.Errorf("bound %v outside min bound..capacity", v)
				}
				if f.GetName() == "fanfare_shard_queue_depth" && v != 0 {
					t.Errorf("idle queue depth %v, want 0", v)
				}
			}
			if pools["normal"] != 3 || pools["hot"] != 2 {
				t.Errorf("%s: got series per pool %v, want normal 3, hot 2", f.GetName(), pools)
			}
			byName[f.GetName()]++
		case "fanfare_send_latency_seconds":
			h := f.GetMetric()[0].GetHistogram()
			if got := h.GetSampleCount(); got != sends+1 {
				t.Errorf("send latency count: got %d, want %d", got, sends+1)
			}
			if h.GetSampleSum() <= 0 {
				t.Errorf("send latency sum %v, want > 0", h.GetSampleSum())
			}
			byName[f.GetName()]++
		}
	}
	if len(byName) != 3 {
		t.Errorf("got families %v, want the depth, bound and latency families", byName)
	}
}

// TestTuningSettingsDefaults: what the usage text of each setting says zero
// means ("; 0 = 200ms") is the default the engine fills in; every field has
// a setting with a name, a group and a usage text.
func TestTuningSettingsDefaults(t *testing.T) {
	var filled fanout.Tuning
	e := enginetest.Start(t, fanout.Config{Store: openStore(t)})
	filled = e.Tuning()
	settings := fanout.TuningSettings()
	if got, want := len(settings), reflect.TypeFor[fanout.Tuning]().NumField(); got != want {
		t.Fatalf("got %d settings, want one a field (%d)", got, want)
	}
	checked := 0
	for _, s := range settings {
		if s.Name == "" || s.Group == "" || s.Usage == "" {
			t.Errorf("setting %+v lacks a name, group or usage", s)
		}
		_, zero, ok := strings.Cut(s.Usage, "; 0 = ")
		if !ok {
			continue
		}
		zero, _, _ = strings.Cut(zero, ",")
		got := s.Field(&filled)
		var want any
		switch p := got.(type) {
		case *time.Duration:
			d, err := time.ParseDuration(zero)
			if err != nil {
				continue // a derived default ("2 x group-rate")
			}
			got, want = *p, d
		case *int:
			n, err := strconv.Atoi(zero)
			if err != nil {
				continue
			}
			got, want = *p, n
		case *float64:
			f, err := strconv.ParseFloat(zero, 64)
			if err != nil {
				continue
			}
			got, want = *p, f
		default:
			continue
		}
		checked++
		if got != want {
			t.Errorf("%s: usage says 0 = %s, engine filled %v", s.Name, zero, got)
		}
	}
	if checked < 20 {
		t.Errorf("checked %d defaults, want the 20-odd plain ones", checked)
	}
}
