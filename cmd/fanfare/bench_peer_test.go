package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBenchPeerEndToEnd runs bench peer against fanfared and both raw
// servers (Centrifugo is pointed at a missing binary: its column must be
// skipped with a message), and checks that every published message reached
// every receiver once with a kernel timestamp, and that the tables and
// plots are written.
func TestBenchPeerEndToEnd(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fanfared")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fanfare-im/fanfare/cmd/fanfared").CombinedOutput(); err != nil {
		t.Fatalf("building fanfared: %v\n%s", err, out)
	}
	const subs = 30
	idle := []int{20, 40}
	run := func(t *testing.T, extra ...string) (*peerResult, string) {
		var out, errOut bytes.Buffer
		e := &env{getenv: func(string) string { return "" }, stdout: &out, stderr: &errOut}
		args := append([]string{"peer", "-fanfared", bin, "-centrifugo", filepath.Join(dir, "no-centrifugo"),
			"-subs", "30", "-pin", "unpinned", "-idle", "40,20", "-rate", "60", "-duration", "700ms", "-warmup", "100ms",
			"-drain", "5s", "-per-proc", "20", "-idle-settle", "0", "-lock", ""}, extra...)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := cmdBench(ctx, e, args); err != nil {
			t.Fatalf("bench peer: %v\n%s", err, errOut.String())
		}
		if !strings.Contains(errOut.String(), "centrifugo: skipped") {
			t.Errorf("no skip message for a missing centrifugo in:\n%s", errOut.String())
		}
		if !slicesContainsJSON(extra) {
			return nil, out.String()
		}
		var res peerResult
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("result %q: %v", out.String(), err)
		}
		return &res, errOut.String()
	}
	svgDir := filepath.Join(dir, "svg")
	res, logs := run(t, "-json", "-svg-dir", svgDir)
	if len(res.Skipped) != 1 {
		t.Errorf("got skipped %q, want centrifugo's", res.Skipped)
	}
	want := []string{serverFanfare, serverRawFrame, serverRawCoalesce}
	if len(res.Runs) != len(want) {
		t.Fatalf("got %d runs, want %d:\n%s", len(res.Runs), len(want), logs)
	}
	for i, r := range res.Runs {
		if r.Server != want[i] || r.Err != "" {
			t.Fatalf("run %d: got %s (error %q), want %s", i, r.Server, r.Err, want[i])
		}
		if r.Connected != subs || r.Acked != r.Published || r.Published < 40 {
			t.Errorf("%s: got %d connected, %d published, %d acked; want %d, >= 40 all acked", r.Server, r.Connected, r.Published, r.Acked, subs)
		}
		if r.Lost != 0 || r.Duplicates != 0 || r.Disconnects != 0 || r.BadFrames != 0 {
			t.Errorf("%s: got lost %d dup %d disconnects %d bad frames %d, want 0", r.Server, r.Lost, r.Duplicates, r.Disconnects, r.BadFrames)
		}
		// Every message of the window reached every receiver once.
		if r.Deliveries == 0 || r.Deliveries%subs != 0 || r.Deliveries != r.LatencyMS.Count {
			t.Errorf("%s: got %d deliveries (%d latencies), want a positive multiple of %d", r.Server, r.Deliveries, r.LatencyMS.Count, subs)
		}
		// A kernel timestamp is never before the send time, and on
		// loopback within the run.
		if r.LatencyMS.P50 <= 0 || r.LatencyMS.Max > 10_000 {
			t.Errorf("%s: got latency %+v", r.Server, r.LatencyMS)
		}
		if r.ServerCPUS <= 0 || r.USPerDelivery <= 0 {
			t.Errorf("%s: got server CPU %.3fs, %.2f us per delivery", r.Server, r.ServerCPUS, r.USPerDelivery)
		}
	}
	// Counts in ascending order, each for fanfare and raw-coalesced
	// (raw-frame is the same server idle).
	if len(res.Idle) != 4 {
		t.Fatalf("got idle runs %+v, want 4", res.Idle)
	}
	for i, r := range res.Idle {
		wantServer, wantN := []string{serverFanfare, serverRawCoalesce}[i%2], idle[i/2]
		if r.Server != wantServer || r.Idle != wantN || r.Err != "" || r.Connected != wantN || r.RSSAfterMB <= 0 {
			t.Errorf("idle run %d: got %+v, want %s with %d connections", i, r, wantServer, wantN)
		}
	}
	if m := res.idleMarginals(); len(m) != 2 || m[0].lo != 20 || m[0].hi != 40 {
		t.Errorf("got marginals %+v, want fanfare's and raw-coalesced's over 20 -> 40", m)
	}
	for _, name := range []string{"cpu.svg", "p99.svg", "idle.svg"} {
		b, err := os.ReadFile(filepath.Join(svgDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("<svg")) || !bytes.Contains(b, []byte(serverFanfare)) || !bytes.HasSuffix(b, []byte("</svg>\n")) {
			t.Errorf("%s: not a plot of the runs:\n%s", name, b)
		}
	}
	// The table, for people: one row per run with its ratio to the floor.
	var buf bytes.Buffer
	res.print(&buf)
	table := buf.String()
	for _, s := range append(want, "(1.00x)", "KB per connection", "KB per added connection", "| 20 → 40 |", "centrifugo: skipped") {
		if !strings.Contains(table, s) {
			t.Errorf("table lacks %q:\n%s", s, table)
		}
	}
}

func slicesContainsJSON(args []string) bool {
	for _, a := range args {
		if a == "-json" {
			return true
		}
	}
	return false
}

func TestKernelStamp(t *testing.T) {
	// One SCM_TIMESTAMPNS control message as the kernel lays it out.
	oob := make([]byte, 32)
	le := func(b []byte, v uint64) {
		for i := range 8 {
			b[i] = byte(v >> (8 * i))
		}
	}
	le(oob[0:], 32)
	oob[8], oob[12] = 1, 35 // SOL_SOCKET, SCM_TIMESTAMPNS
	le(oob[16:], 1700000000)
	le(oob[24:], 123456789)
	if got, want := kernelStamp(oob), int64(1700000000_123456789); got != want {
		t.Fatalf("got %d, want %d", got, want)
	}
	if got := kernelStamp(oob[:20]); got != 0 {
		t.Fatalf("got %d from a truncated message, want 0", got)
	}
	if got := kernelStamp(nil); got != 0 {
		t.Fatalf("got %d without control messages, want 0", got)
	}
}

func TestPeerBodyFields(t *testing.T) {
	b := peerBody(1234567890123, 42, 100)
	if len(b) != 100 || !json.Valid(b) {
		t.Fatalf("got %d bytes %s, want 100 of JSON", len(b), b)
	}
	if n, ts := benchField(b, `"n":`), benchField(b, `"t":`); n != 42 || ts != 1234567890123 {
		t.Fatalf("got n %d t %d", n, ts)
	}
	// Centrifugo's push wraps the body; the fields are still found.
	push := append(append([]byte(`{"push":{"channel":"bench:room","pub":{"data":`), b...), `,"offset":7}}}`...)
	if n := benchField(push, `"n":`); n != 42 {
		t.Fatalf("got n %d in a Centrifugo push", n)
	}
}

// TestFindBinaryAbsolute: a relative -centrifugo or -fanfared is made
// absolute, since the servers are started in directories of their own
// (a relative path failed there: "taskset: failed to execute").
func TestFindBinaryAbsolute(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "srv"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	p, err := findBinary("srv", "srv")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "srv"); p != want {
		t.Fatalf("got %q, want %q", p, want)
	}
	if _, err := findBinary("missing", "missing"); err == nil {
		t.Fatal("a missing binary was found")
	}
}

// TestPeerTableNoDeliveries: a run without an acknowledged publish in its
// window shows n/a, not a CPU per delivery or latency of 0.
func TestPeerTableNoDeliveries(t *testing.T) {
	res := &peerResult{Rate: 50, Runs: []peerRun{
		{Server: serverCentrifugo, Subs: 9000, Pinned: true, Saturated: true, PublishErrors: 68, ServerCPUS: 12},
		{Server: serverRawCoalesce, Subs: 9000, Pinned: true, Deliveries: 4500000, ServerCPUS: 9, USPerDelivery: 2, DeliveriesPerCPUS: 5e5},
	}}
	var buf bytes.Buffer
	res.print(&buf)
	want := "| 9000 | one core | centrifugo | 0.0 of 50, gave up | n/a | n/a | n/a | n/a | 0 | 68 | 0 | 0.0 |"
	if !strings.Contains(buf.String(), want) {
		t.Fatalf("table lacks %q:\n%s", want, buf.String())
	}
}
