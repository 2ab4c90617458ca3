package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// series returns n samples over runS seconds of f(t) plus noise of the
// given amplitude (deterministic).
func series(n int, runS float64, noise float64, f func(t float64) float64) (t, y []float64) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		ti := runS * float64(i) / float64(n-1)
		t = append(t, ti)
		y = append(y, f(ti)+noise*(2*r.Float64()-1))
	}
	return t, y
}

func TestJudgeTrend(t *testing.T) {
	gor := kindOf("node1.goroutines")
	rss := kindOf("node1.rss")
	const mib = 1 << 20
	tests := []struct {
		name     string
		kind     metricKind
		runS     float64
		n        int
		noise    float64
		f        func(t float64) float64
		wantFail bool
	}{
		{"flat goroutines with noise", gor, 120, 60, 10, func(float64) float64 { return 110 }, false},
		// A connection's goroutine leaked at 4 reconnects/s: 160 more per
		// 40 s.
		{"goroutine leak per reconnect", gor, 120, 60, 10, func(t float64) float64 { return 110 + 4*t }, true},
		{"warm-up growth then flat", rss, 120, 60, 2 * mib, func(t float64) float64 { return 40*mib + 30*mib*math.Min(t/30, 1) }, false},
		{"rss leak of 100 KB/s over 30 minutes", rss, 1800, 360, 4 * mib, func(t float64) float64 { return 60*mib + 100e3*t }, true},
		{"rss breathing (GC) without growth", rss, 1800, 360, 12 * mib, func(t float64) float64 { return 80*mib + 10*mib*math.Sin(t/20) }, false},
		{"one spike in the last third", gor, 120, 60, 3, func(t float64) float64 {
			if t > 100 && t < 104 {
				return 900
			}
			return 110
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, ys := series(tt.n, tt.runS, tt.noise, tt.f)
			got := judge("x."+tt.kind.name, tt.kind, ts, ys, tt.runS)
			if !got.Judged {
				t.Fatalf("not judged: %+v", got)
			}
			if got.Failed != tt.wantFail {
				t.Errorf("got failed %v, want %v: %+v", got.Failed, tt.wantFail, got)
			}
		})
	}
	// Too few samples in a third: not judged, not failed.
	ts, ys := series(8, 120, 0, func(t float64) float64 { return t * 100 })
	if got := judge("x.goroutines", gor, ts, ys, 120); got.Judged || got.Failed {
		t.Errorf("8 samples: got judged %v failed %v, want neither", got.Judged, got.Failed)
	}
}

func TestTheilSenIgnoresOutliers(t *testing.T) {
	ts, ys := series(50, 100, 0, func(t float64) float64 { return 2*t + 5 })
	ys[10], ys[30] = 1e6, -1e6
	if got := theilSen(ts, ys); math.Abs(got-2) > 0.01 {
		t.Errorf("got slope %v, want 2", got)
	}
	if got := median([]float64{3, 1, 2, 10}); got != 2.5 {
		t.Errorf("got median %v, want 2.5", got)
	}
}

func TestSeqSet(t *testing.T) {
	var s seqSet
	for _, v := range []int64{1, 2, 3, 64, 65, 130} {
		if !s.add(v) {
			t.Fatalf("add %d: not new", v)
		}
	}
	if s.add(64) {
		t.Error("add 64 twice: new")
	}
	if n, first := s.missing(1, 130); n != 124 || first != 4 {
		t.Errorf("missing(1,130): got %d first %d, want 124 first 4", n, first)
	}
	if n, _ := s.missing(64, 65); n != 0 {
		t.Errorf("missing(64,65): got %d, want 0", n)
	}
	if n, first := s.missing(129, 200); n != 71 || first != 129 {
		t.Errorf("missing(129,200): got %d first %d, want 71 first 129", n, first)
	}
	if s.min() != 1 || s.max() != 130 {
		t.Errorf("min %d max %d, want 1 and 130", s.min(), s.max())
	}
	if got := s.countAbove(3); got != 3 {
		t.Errorf("countAbove(3): got %d, want 3 (64, 65, 130)", got)
	}
	if got := s.countAbove(64); got != 2 {
		t.Errorf("countAbove(64): got %d, want 2", got)
	}
	if got := s.countAbove(0); got != 6 {
		t.Errorf("countAbove(0): got %d, want 6", got)
	}
}

// TestLedgerFindsEachFault builds a ledger where each check has one
// thing to find.
func TestLedgerFindsEachFault(t *testing.T) {
	l := newLedger()
	l.addGroup(1, false)
	l.joined(1, "a", 1)
	l.joined(1, "b", 3)
	l.joined(1, "c", 1)
	l.removed(1, "c", 2) // c removed when last_seq was 2
	for i, id := range []string{"m1", "m2", "m3", "m4", "m5"} {
		l.sending(1, id, "a", i%2 == 0)
		l.sent(1, id, int64(i+1), nil)
	}
	l.sending(1, "m6", "a", false)
	l.sent(1, "m6", 0, errors.New("timeout"))
	// The store: seq 4 missing (a hole; m4 acked there is lost), m2
	// stored twice (seqs 2 and 6), m6 (not acked) at 7.
	stored := map[int64][]storedMsg{1: {
		{1, "a", "m1"}, {2, "a", "m2"}, {3, "a", "m3"}, {5, "a", "m5"}, {6, "a", "m2"}, {7, "a", "m6"},
	}}
	last := map[int64]int64{1: 7}
	// a got everything but 7; b got 2 (before its join) and 3..7; c got
	// 1..3 (3 after its removal); d is no member.
	deliver := func(uid string, seqs ...int64) {
		for _, s := range seqs {
			l.user(uid).deliver(1, s, "", false)
		}
	}
	deliver("a", 1, 2, 3, 4, 5, 6)
	deliver("b", 2, 3, 4, 5, 6, 7)
	deliver("c", 1, 2, 3)
	deliver("d", 1)
	l.user("a").deliver(1, 6, "", false) // twice
	l.user("b").deliver(1, 5, "m5", true)
	l.user("b").deliver(1, 1, "", false) // out of order and before join
	for i := range maxTrail + 2 {        // the oldest two fall out of the trail
		l.note("a", 1, float64(i), fmt.Sprintf("step %d", i))
	}
	v := &verdict{}
	l.checkStore(v, stored, last)
	incomplete := l.checkDeliveries(v, stored, last, map[string]bool{"a": true, "b": true, "c": true}, true)
	if len(incomplete) != 1 || !strings.Contains(incomplete[0], "its steps: 2.0s step 2, ") || strings.Contains(incomplete[0], "step 1,") {
		t.Errorf("incomplete a, with its last %d steps: got %q", maxTrail, incomplete)
	}
	want := verdict{Groups: 1, Stored: 6, Acked: 5, Unacked: 1, UnackedStored: 1, Lost: 1, Duplicated: 1, Holes: 1,
		Joins: 3, Removals: 1, BeforeJoin: 2, AfterRemoval: 1, NotMember: 1, DeliveryDups: 2, Reorders: 1,
		OnlineChecked: 3, Incomplete: 1, MissingMessages: 1}
	got := *v
	got.Problems, got.Deliveries = nil, 0
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if !v.Failed() {
		t.Error("Failed() false")
	}
	if !strings.Contains(strings.Join(v.Problems, "\n"), "seq 4 missing") {
		t.Errorf("problems do not name the hole: %q", v.Problems)
	}
	// A clean ledger passes.
	l2 := newLedger()
	l2.addGroup(1, false)
	l2.joined(1, "a", 1)
	l2.sending(1, "m1", "a", false)
	l2.sent(1, "m1", 1, nil)
	l2.user("a").deliver(1, 1, "m1", true)
	v2 := &verdict{}
	st2 := map[int64][]storedMsg{1: {{1, "a", "m1"}}}
	l2.checkStore(v2, st2, map[int64]int64{1: 1})
	l2.checkDeliveries(v2, st2, map[int64]int64{1: 1}, map[string]bool{"a": true}, true)
	if v2.Failed() {
		t.Errorf("clean ledger failed: %s %q", v2.summary(), v2.Problems)
	}
}

func TestSVGPlotWellFormed(t *testing.T) {
	ts, ys := series(30, 120, 5, func(t float64) float64 { return 100 + t })
	svg := svgPlot("goroutines <&> test", kindOf("n.goroutines"), []plotLine{{label: "node1", t: ts, y: ys}, {label: "node2", t: ts, y: ys}},
		120, []levelEvent{{T: 20, Node: 1, Scope: "group", GID: 3, Level: 2, For: 6}})
	d := xml.NewDecoder(strings.NewReader(svg))
	polylines := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
		}
	}
	if polylines != 2 {
		t.Errorf("got %d polylines, want 2", polylines)
	}
	// An empty or constant series still draws.
	if s := svgPlot("flat", kindOf("n.rss"), []plotLine{{label: "x", t: []float64{0, 1}, y: []float64{5, 5}}}, 1, nil); !strings.Contains(s, "polyline") {
		t.Error("constant series: no polyline")
	}
}

func TestPromValues(t *testing.T) {
	text := "# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 57\ngo_memstats_heap_inuse_bytes 1.2e+07\nother{a=\"b\"} 1\n"
	v, err := promValues(strings.NewReader(text), "go_goroutines", "go_memstats_heap_inuse_bytes")
	if err != nil || v["go_goroutines"] != 57 || v["go_memstats_heap_inuse_bytes"] != 1.2e7 {
		t.Fatalf("got %v %v", v, err)
	}
	if _, err := promValues(strings.NewReader(text), "missing"); err == nil {
		t.Error("a missing metric: no error")
	}
	if got, err := redisInfoField("# Memory\r\nused_memory:1024\r\nused_memory_human:1K\r\n", "used_memory"); err != nil || got != 1024 {
		t.Errorf("redisInfoField: got %v %v", got, err)
	}
}

// TestCutProxy relays an echo server and resets a connection on cutOne.
func TestCutProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p, err := startProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, []byte("ping")) {
		t.Fatalf("echo through the proxy: %q %v", buf, err)
	}
	// The relay registers the pair right after dialing: wait for it.
	for deadline := time.Now().Add(10 * time.Second); !p.cutOne(); {
		if time.Now().After(deadline) {
			t.Fatal("no connection to cut")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := c.Read(buf); err == nil {
		t.Fatal("read after the cut succeeded")
	}
}

func TestSoakFlagsValidate(t *testing.T) {
	e := &env{getenv: func(string) string { return "" }, stdout: io.Discard, stderr: io.Discard}
	fs := newFlags("soak", "", "")
	var f soakFlags
	f.register(fs.FlagSet, e)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := f.validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if f.sampleEvery != 2*time.Second {
		t.Errorf("sample interval for 2m: got %v, want 2s", f.sampleEvery)
	}
	f.mode = soakCluster
	if err := f.validate(); err == nil || !strings.Contains(err.Error(), "-postgres-url") {
		t.Errorf("cluster without servers: got %v", err)
	}
	f.mode, f.duration = soakEmbedded, 10*time.Second
	if err := f.validate(); err == nil {
		t.Error("-duration 10s accepted")
	}
}

// TestSoakReplot writes a report and redraws it from its report.json and
// samples.csv: the same markdown comes out.
func TestSoakReplot(t *testing.T) {
	dir, out := t.TempDir(), t.TempDir()
	r := &soakResult{Mode: soakCluster, Nodes: 2, DurationS: 120, Flags: map[string]string{"sample_every": "2s"},
		Ledger: &verdict{Groups: 3, Stored: 10, Acked: 10}, Counters: map[string]int64{"acked": 10}, CPUPercent: []float64{10, 12, 8}}
	for i := range 60 {
		r.Samples = append(r.Samples, sample{T: float64(i) * 2, Values: map[string]float64{
			"node1.goroutines": 100 + float64(i%3), "node2.rss": 40 << 20, "redis.redis_keys": 400}})
	}
	r.Trends = judgeAll(r.Samples, r.DurationS)
	r.Outcome = "PASS"
	if err := writeSoakReport(dir, r); err != nil {
		t.Fatal(err)
	}
	if err := replotSoak(dir, out); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"report.md", "soak-cluster-goroutines.svg", "soak-cluster-rss.svg", "soak-cluster-redis_keys.svg"} {
		a, err1 := os.ReadFile(filepath.Join(dir, f))
		b, err2 := os.ReadFile(filepath.Join(out, f))
		if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs after replot (%v, %v)", f, err1, err2)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if !strings.Contains(string(md), "| node1.goroutines | 60 |") || !strings.Contains(string(md), "node 1 10%, node 2 12%; the load generator 8%") {
		t.Errorf("report.md lacks the table row or the CPU line:\n%s", md)
	}
}
