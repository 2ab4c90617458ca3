package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary act as a bench worker child process, the
// way `fanfare bench worker` does for the real binary.
func TestMain(m *testing.M) {
	if os.Getenv(floorServerEnv) == "1" { // started as bench floor-server: args after "bench floor-server"
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		e := &env{getenv: os.Getenv, stdout: os.Stdout, stderr: os.Stderr}
		err := benchFloorServer(ctx, e, os.Args[3:])
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench floor-server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(workerEnv) == "1" {
		if err := runWorker(context.Background(), os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "bench worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(workerEnv) == "upgrades" {
		if err := runUpgradeWorker(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench upgrade-worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestBenchBodyRoundTrip(t *testing.T) {
	for _, size := range []int{32, 100, 1000} {
		now := time.Now().UnixNano()
		b := benchBody(nil, now, size)
		if !json.Valid(b) {
			t.Fatalf("size %d: invalid JSON %s", size, b)
		}
		if len(b) != size {
			t.Fatalf("got %d bytes, want %d", len(b), size)
		}
		if got := sentAt(b); got != now {
			t.Fatalf("got t %d, want %d", got, now)
		}
	}
	// A store that re-encodes JSON (jsonb) may reorder keys and add spaces.
	if got := sentAt([]byte(`{"p": "xx", "t": 12345}`)); got != 12345 {
		t.Fatalf("got %d, want 12345 from a re-encoded body", got)
	}
	if got := sentAt([]byte(`{"x":1}`)); got != 0 {
		t.Fatalf("got %d, want 0 without t", got)
	}
}

func TestReceiverLedger(t *testing.T) {
	tests := []struct {
		name                          string
		seq0                          int64
		deliver                       []int64
		acked                         [][2]int64
		wantMissing, wantDup, wantOOO int64
	}{
		{"all in order", 10, seqs(11, 200), [][2]int64{{11, 200}}, 0, 0, 0},
		{"one lost", 0, []int64{1, 2, 4}, [][2]int64{{1, 4}}, 1, 0, 0},
		{"duplicate and out of order", 0, []int64{1, 3, 3, 2}, [][2]int64{{1, 3}}, 0, 1, 1},
		{"unacked delivered is fine", 0, []int64{1, 2, 3}, [][2]int64{{1, 1}, {3, 3}}, 0, 0, 0},
		{"nothing delivered across words", 5, nil, [][2]int64{{6, 300}}, 295, 0, 0},
		{"before seq0 ignored", 100, []int64{50, 101}, [][2]int64{{101, 101}}, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &receiver{seq0: tt.seq0, last: tt.seq0}
			for _, s := range tt.deliver {
				r.mark(s, true)
			}
			if got := r.missing(tt.acked); got != tt.wantMissing {
				t.Errorf("got missing %d, want %d", got, tt.wantMissing)
			}
			if r.dups != tt.wantDup || r.ooo != tt.wantOOO {
				t.Errorf("got dup %d ooo %d, want %d %d", r.dups, r.ooo, tt.wantDup, tt.wantOOO)
			}
		})
	}
}

func seqs(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func TestSeqRanges(t *testing.T) {
	got := seqRanges([]int64{5, 3, 4, 9, 1, 10, 4})
	want := [][2]int64{{1, 1}, {3, 5}, {9, 10}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestParseProc(t *testing.T) {
	stat := []byte("1234 (fan fared) (x)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 12 0 100 1000 50 18446744073709551615")
	cpu, err := parseStatCPU(stat)
	if err != nil || cpu != 3.25 {
		t.Fatalf("got %v, %v; want 3.25 s", cpu, err)
	}
	status := []byte("Name:\tfanfared\nVmPeak:\t  9999 kB\nVmRSS:\t  2048 kB\nThreads:\t5\n")
	if got := parseVmRSS(status); got != 2<<20 {
		t.Fatalf("got %d, want %d", got, 2<<20)
	}
	s, err := readProc(os.Getpid())
	if err != nil || s.RSS == 0 {
		t.Fatalf("got %+v, %v reading our own /proc", s, err)
	}
}

func TestBroadcastFlagsSourceAddrs(t *testing.T) {
	tests := []struct {
		bind, ws string
		online   int
		want     []string
		wantErr  bool
	}{
		{"auto", "ws://127.0.0.1:8081/ws", 100, nil, false},
		{"auto", "ws://127.0.0.1:8081/ws", 45000, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}, false},
		{"auto", "ws://10.0.0.1:8081/ws", 45000, nil, true},
		{"none", "ws://127.0.0.1:8081/ws", 45000, nil, false},
		{"10.0.0.5, 10.0.0.6", "ws://10.0.0.1:8081/ws", 30000, []string{"10.0.0.5", "10.0.0.6"}, false},
		{"10.0.0.5", "ws://10.0.0.1:8081/ws", 30000, nil, true},
	}
	for _, tt := range tests {
		f := broadcastFlags{bind: tt.bind, ws: tt.ws, online: tt.online, perAddr: 20000}
		got, err := f.sourceAddrs()
		if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
			t.Errorf("bind %q online %d: got %v, %v; want %v (error %v)", tt.bind, tt.online, got, err, tt.want, tt.wantErr)
		}
	}
}

// fanfared is a server process started from a freshly built binary, in
// embedded mode.
type fanfared struct {
	cmd      *exec.Cmd
	ws, http string
	admin    string
	secret   string
}

func startFanfared(t *testing.T) *fanfared {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "fanfared")
	build := exec.Command("go", "build", "-o", bin, "github.com/fanfare-im/fanfare/cmd/fanfared")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building fanfared: %v\n%s", err, out)
	}
	f := &fanfared{admin: "bench-test-admin", secret: "0123456789abcdef0123456789abcdef-bench"}
	f.cmd = exec.Command(bin, "-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-data-dir", filepath.Join(dir, "data"),
		"-jwt-secret", f.secret, "-admin-token", f.admin, "-log-level", "warn")
	stderr, err := f.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = f.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = f.cmd.Process.Kill()
			<-done
		}
	})
	wsRe := regexp.MustCompile(`WebSocket:\s+(ws://\S+)`)
	httpRe := regexp.MustCompile(`HTTP API:\s+(http://\S+)`)
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if m := wsRe.FindStringSubmatch(line); m != nil {
				f.ws = m[1]
			}
			if m := httpRe.FindStringSubmatch(line); m != nil {
				f.http = m[1]
				close(found)
			}
		}
	}()
	select {
	case <-found:
	case <-time.After(30 * time.Second):
		t.Fatal("fanfared did not print its addresses")
	}
	return f
}

func TestBenchBroadcastEndToEnd(t *testing.T) {
	srv := startFanfared(t)
	adm := &adminClient{base: srv.http, token: srv.admin}
	var limitsBefore json.RawMessage
	var se *statusError
	if err := adm.do(context.Background(), "GET", "/admin/v1/limits", nil, &limitsBefore); errors.As(err, &se) && se.status == 404 {
		limitsBefore = nil // a server without runtime limits
	} else if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if limitsBefore == nil {
			return
		}
		var after json.RawMessage
		if err := adm.do(context.Background(), "GET", "/admin/v1/limits", nil, &after); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(after, limitsBefore) {
			t.Errorf("limits not restored:\ngot  %s\nwant %s", after, limitsBefore)
		}
	})
	for _, tc := range []struct {
		procs     int
		bind      string
		receivers string
	}{{1, "none", receiversSDK}, {2, "127.0.0.2,127.0.0.3", receiversSDK}, {1, "none", receiversLean}, {2, "127.0.0.2,127.0.0.3", receiversLean}} {
		procs := tc.procs
		t.Run("procs="+strconv.Itoa(procs)+"/bind="+tc.bind+"/receivers="+tc.receivers, func(t *testing.T) {
			var out, errOut bytes.Buffer
			e := &env{getenv: func(string) string { return "" }, stdout: &out, stderr: &errOut}
			args := []string{"broadcast", "-http", srv.http, "-ws", srv.ws, "-admin-token", srv.admin, "-jwt-secret", srv.secret,
				"-members", "60", "-online", "40", "-senders", "2", "-rate", "100", "-duration", "1s", "-warmup", "300ms",
				"-procs", strconv.Itoa(procs), "-server-pid", strconv.Itoa(srv.cmd.Process.Pid), "-json",
				"-bind", tc.bind, "-conns-per-addr", "20", "-limits", "off", "-receivers", tc.receivers}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := cmdBench(ctx, e, args); err != nil {
				t.Fatalf("bench: %v\n%s", err, errOut.String())
			}
			var r broadcastResult
			if err := json.Unmarshal(out.Bytes(), &r); err != nil {
				t.Fatalf("result %q: %v", out.String(), err)
			}
			if r.Connected != 40 || r.ConnectFailed != 0 || r.Procs != procs {
				t.Fatalf("got %d connected, %d failed, %d procs; want 40, 0, %d", r.Connected, r.ConnectFailed, r.Procs, procs)
			}
			if r.Acked != r.Sent || r.Sent < 100 {
				t.Fatalf("got %d sent, %d acked (errors %v), want >= 100 all acked", r.Sent, r.Acked, r.SendErrors)
			}
			if r.Lost != 0 || r.Duplicates != 0 || r.OutOfOrder != 0 || r.BadFrames != 0 || r.Disconnects != 0 {
				t.Fatalf("got lost %d dup %d ooo %d bad frames %d disconnects %d, want 0", r.Lost, r.Duplicates, r.OutOfOrder, r.BadFrames, r.Disconnects)
			}
			if r.Receivers != tc.receivers || r.GeneratorUSPerDelivery <= 0 {
				t.Fatalf("got receivers %q, %.2f us per delivery", r.Receivers, r.GeneratorUSPerDelivery)
			}
			// Every message of the window reached every receiver once.
			if r.Deliveries != r.LatencyMS.Count || r.Deliveries%40 != 0 || r.Deliveries == 0 {
				t.Fatalf("got %d deliveries (%d latencies), want a positive multiple of 40", r.Deliveries, r.LatencyMS.Count)
			}
			if r.LatencyMS.P50 <= 0 || r.LatencyMS.P99 < r.LatencyMS.P50 {
				t.Fatalf("got latency %+v", r.LatencyMS)
			}
			if len(r.Warnings) != 0 {
				t.Fatalf("got warnings %q for a run within the server's limits", r.Warnings)
			}
			if r.Server == nil || r.Server.RSSAfterMB <= 0 {
				t.Fatalf("got server use %+v, want RSS", r.Server)
			}
		})
	}
}
