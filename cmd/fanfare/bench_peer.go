package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/sys/unix"
)

// bench peer runs one fan-out workload against several servers, each
// started fresh for each run, and prints one table with ratios against
// the raw server that coalesces its writes (bench floor-server -mode
// coalesce, bench_floor.go): the floor. The receivers are kernel receivers (bench_kernel.go) in worker
// processes; publishing is one HTTP request per message for every server
// (fanfare: POST /v1/groups/{gid}/messages with the admin token;
// Centrifugo: its HTTP API's publish; raw: POST /publish), open loop at
// -rate. The server's CPU comes from /proc/PID/stat over the measured
// window and the drain, its memory from /proc/PID/status.

// Servers bench peer knows.
const (
	serverFanfare     = "fanfare"
	serverCentrifugo  = "centrifugo"
	serverRawFrame    = "raw-frame"
	serverRawCoalesce = "raw-coalesced"
)

// peerFlags are the settings of bench peer.
type peerFlags struct {
	servers                 string
	subs                    string
	pin                     string
	idle                    string
	rate                    float64
	duration, warmup, drain time.Duration
	bodyBytes               int
	fanfared, centrifugo    string
	perProc, loops          int
	maxInflight             int
	lock                    string
	svgDir                  string
	jsonOut                 bool
	jsonFile, from          string
	serverCore, recvCores   string
	idleSettle, idleHold    time.Duration
	fanfaredFlags           string
}

func (f *peerFlags) register(fs *cmdFlags) {
	fs.StringVar(&f.servers, "servers", strings.Join([]string{serverFanfare, serverCentrifugo, serverRawFrame, serverRawCoalesce}, ","), "servers to run, comma-separated: fanfare, centrifugo, raw-frame, raw-coalesced")
	fs.StringVar(&f.subs, "subs", "1000,9000", "subscriber counts, comma-separated; 0 or empty = no fan-out runs (only the idle ones)")
	fs.StringVar(&f.pin, "pin", "both", "pinned (server on -server-core, receivers on -recv-cores, with taskset), unpinned, or both")
	fs.StringVar(&f.idle, "idle", "9000,19000", "idle connection counts for the memory runs (RSS per connection), comma-separated; with two, the cost of each added connection and the fixed part are printed too; 0 or empty = skip them")
	fs.DurationVar(&f.idleSettle, "idle-settle", 3*time.Second, "wait after the idle connections are up before RSS is read (then until it stops growing, at most 20s)")
	fs.Float64Var(&f.rate, "rate", 50, "messages published per second")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "measured publishing time")
	fs.DurationVar(&f.warmup, "warmup", 2*time.Second, "publishing before the measurement starts")
	fs.DurationVar(&f.drain, "drain", 15*time.Second, "longest wait after the last publish for every receiver to have every message")
	fs.IntVar(&f.bodyBytes, "body-bytes", 100, "message body size (bytes of JSON)")
	fs.StringVar(&f.fanfared, "fanfared", "", "fanfared binary; empty = fanfared beside this binary, else on PATH")
	fs.StringVar(&f.fanfaredFlags, "fanfared-flags", "", "more flags for fanfared, space-separated (-pprof-addr 127.0.0.1:6060, -ws-loops 2)")
	fs.DurationVar(&f.idleHold, "idle-hold", 0, "keep each idle server and its connections this long after its RSS is read (to profile it)")
	fs.StringVar(&f.centrifugo, "centrifugo", "", "Centrifugo v6 binary; empty = centrifugo on PATH; when absent its column is skipped")
	fs.IntVar(&f.perProc, "per-proc", 5000, "most receivers per worker process")
	fs.IntVar(&f.loops, "loops", 1, "epoll loops per worker process")
	fs.IntVar(&f.maxInflight, "max-inflight", 64, "most publish requests in flight")
	fs.StringVar(&f.lock, "lock", "", "a file to flock around each run, so that other benchmarks sharing the machine wait for a quiet window; empty = none")
	fs.StringVar(&f.svgDir, "svg-dir", "", "write the plots (SVG) into this directory")
	fs.BoolVar(&f.jsonOut, "json", false, "print the results as JSON instead of tables")
	fs.StringVar(&f.jsonFile, "json-out", "", "also write the results as JSON to this file (after each point)")
	fs.StringVar(&f.from, "from", "", "run nothing: print the tables (and -svg-dir plots) of these -json-out files, comma-separated, merged in order")
	fs.StringVar(&f.serverCore, "server-core", "0", "taskset CPU list of the server when pinned")
	fs.StringVar(&f.recvCores, "recv-cores", "1", "taskset CPU list of the receivers when pinned")
}

func (f *peerFlags) validate() error {
	var errs []error
	for _, s := range splitList(f.servers) {
		if !slices.Contains([]string{serverFanfare, serverCentrifugo, serverRawFrame, serverRawCoalesce}, s) {
			errs = append(errs, fmt.Errorf("-servers: unknown server %q", s))
		}
	}
	if _, err := f.subCounts(); err != nil {
		errs = append(errs, err)
	}
	if _, err := f.idleCounts(); err != nil {
		errs = append(errs, err)
	}
	if f.pin != "both" && f.pin != "pinned" && f.pin != "unpinned" {
		errs = append(errs, fmt.Errorf("-pin %q: want pinned, unpinned or both", f.pin))
	}
	if f.rate <= 0 || f.duration <= 0 || f.warmup < 0 || f.drain < 0 || f.idleSettle < 0 || f.idleHold < 0 {
		errs = append(errs, errors.New("-rate and -duration must be positive, -warmup, -drain, -idle-settle and -idle-hold not negative"))
	}
	if f.bodyBytes < 48 || f.bodyBytes > 60<<10 {
		errs = append(errs, errors.New("-body-bytes must be within 48..61440"))
	}
	if f.perProc < 1 || f.loops < 1 || f.loops > 64 || f.maxInflight < 1 {
		errs = append(errs, errors.New("-per-proc, -max-inflight must be positive, -loops within 1..64"))
	}
	return errors.Join(errs...)
}

func (f *peerFlags) subCounts() ([]int, error) {
	var out []int
	for _, s := range splitList(f.subs) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("-subs: %q is not a count", s)
		}
		if n > 0 {
			out = append(out, n)
		}
	}
	return out, nil
}

// idleCounts are the -idle counts (none for "0" or "").
func (f *peerFlags) idleCounts() ([]int, error) {
	var out []int
	for _, s := range splitList(f.idle) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("-idle: %q is not a count", s)
		}
		if n > 0 && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

func (f *peerFlags) pins() []bool {
	switch f.pin {
	case "pinned":
		return []bool{true}
	case "unpinned":
		return []bool{false}
	}
	return []bool{true, false}
}

func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// peerRun is the outcome of one server at one point.
type peerRun struct {
	Server string `json:"server"`
	Subs   int    `json:"subs"`
	Pinned bool   `json:"pinned"`
	Err    string `json:"error,omitempty"`
	// Load is the 1-minute load average when the run started.
	Load          float64 `json:"load"`
	Connected     int     `json:"connected"`
	Published     int64   `json:"published"`
	Acked         int64   `json:"acked"`
	PublishErrors int64   `json:"publish_errors"`
	Deliveries    int64   `json:"deliveries"` // of messages published in the window
	// MsgPerS is the window's deliveries per subscriber over the time
	// the window's publishes took to be answered (at least the window):
	// below -rate when the server could not keep up.
	MsgPerS float64 `json:"msg_per_s"`
	// PublishLagS is the worst delay of a publish behind its schedule
	// (-max-inflight publishes were outstanding).
	PublishLagS float64 `json:"publish_lag_s"`
	// Saturated says the publisher stopped early, more than -duration
	// (at least 10s) behind its schedule.
	Saturated   bool      `json:"saturated,omitempty"`
	LatencyMS   quantiles `json:"latency_ms"`
	Lost        int64     `json:"lost"`
	Duplicates  int64     `json:"duplicates"`
	Disconnects int64     `json:"disconnects"`
	BadFrames   int64     `json:"bad_frames"`
	DrainS      float64   `json:"drain_s"`
	ServerCPUS  float64   `json:"server_cpu_s"`
	// USPerDelivery is server CPU microseconds per delivery;
	// DeliveriesPerCPUS its inverse, deliveries per server CPU-second.
	USPerDelivery     float64 `json:"us_per_delivery"`
	DeliveriesPerCPUS float64 `json:"deliveries_per_cpu_s"`
}

// peerIdle is one server's memory with idle connections.
type peerIdle struct {
	Server      string  `json:"server"`
	Idle        int     `json:"idle"` // connections asked for
	Err         string  `json:"error,omitempty"`
	Load        float64 `json:"load"`
	Connected   int     `json:"connected"`
	RSSBeforeMB float64 `json:"rss_before_mb"`
	RSSAfterMB  float64 `json:"rss_after_mb"`
	KBPerConn   float64 `json:"kb_per_conn"`
	SettleS     float64 `json:"settle_s"`
}

// peerResult is everything bench peer measured.
type peerResult struct {
	Rate      float64    `json:"rate"`
	DurationS float64    `json:"duration_s"`
	BodyBytes int        `json:"body_bytes"`
	Skipped   []string   `json:"skipped,omitempty"`
	Runs      []peerRun  `json:"runs"`
	Idle      []peerIdle `json:"idle,omitempty"`
}

func benchPeer(ctx context.Context, e *env, args []string) error {
	fs := newFlags("bench peer", "[-servers LIST] [-subs 1000,9000] [-pin both] [-idle 9000,19000] [-centrifugo PATH] [...]", `
Runs the same fan-out workload against fanfare, Centrifugo and a raw
write(2) server (one write per frame, and coalesced), each started fresh
for each run: -subs subscribers of one group or channel, -rate messages of
-body-bytes published over HTTP, pinned (server on -server-core, receivers
on -recv-cores) and unpinned. Receivers are kernel-timestamping epoll
receivers in worker processes. Prints one table: deliveries per server
CPU-second, server CPU per delivery, send->receive p50/p99, lost messages,
each with its ratio to the coalescing raw server; then RSS per idle
connection at each -idle count (with two counts, also the cost of each
added connection and the fixed part). Centrifugo is skipped, with a message,
when -centrifugo is not found.`)
	var f peerFlags
	f.register(fs)
	if err := fs.parse(e, args); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return fs.usageErr("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	le := *e
	le.stderr = &lockedWriter{w: e.stderr}
	var res *peerResult
	var err error
	if f.from != "" {
		res, err = loadPeerResults(splitList(f.from))
	} else {
		res, err = runPeer(ctx, &le, &f)
	}
	if err != nil {
		return err
	}
	if f.svgDir != "" {
		if err := res.writePlots(f.svgDir); err != nil {
			return err
		}
	}
	if f.jsonOut {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	res.print(e.stdout)
	return nil
}

// peerSecret signs the receivers' tokens (fanfare and Centrifugo); the
// servers are started with it.
const peerSecret = "bench-peer-secret-0123456789abcdef0123456789"

func runPeer(ctx context.Context, e *env, f *peerFlags) (*peerResult, error) {
	logf := func(format string, a ...any) { fmt.Fprintf(e.stderr, "bench peer: "+format+"\n", a...) }
	res := &peerResult{Rate: f.rate, DurationS: f.duration.Seconds(), BodyBytes: f.bodyBytes}
	servers := splitList(f.servers)
	if slices.Contains(servers, serverFanfare) {
		p, err := findBinary(f.fanfared, "fanfared")
		if err != nil {
			return nil, fmt.Errorf("-fanfared: %w", err)
		}
		f.fanfared = p
	}
	if slices.Contains(servers, serverCentrifugo) {
		p, err := findBinary(f.centrifugo, "centrifugo")
		if err != nil {
			msg := fmt.Sprintf("centrifugo: skipped (%v); install it with `go install github.com/centrifugal/centrifugo/v6@v6.9.1` and pass -centrifugo", err)
			logf("%s", msg)
			res.Skipped = append(res.Skipped, msg)
			servers = slices.DeleteFunc(servers, func(s string) bool { return s == serverCentrifugo })
		} else {
			f.centrifugo = p
		}
	}
	save := func() {
		if f.jsonFile == "" {
			return
		}
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(f.jsonFile, append(b, '\n'), 0o644); err != nil {
			logf("-json-out: %v", err)
		}
	}
	// One lock per point: its servers run back to back in one quiet
	// window, so that their ratios compare like with like.
	subs, _ := f.subCounts()
	for _, n := range subs {
		for _, pinned := range f.pins() {
			err := withLock(f.lock, func() error {
				for _, s := range servers {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					r, err := runPeerOne(ctx, e, f, s, n, pinned)
					if err != nil {
						logf("%s, %d subscribers, pinned %v: %v", s, n, pinned, err)
						r = peerRun{Server: s, Subs: n, Pinned: pinned, Err: err.Error()}
					} else {
						logf("%s, %d subscribers, pinned %v: %.2f us/delivery, p50 %.1f ms, p99 %.1f ms, %.1f msg/s, lost %d, publish errors %d (load %.1f)",
							s, n, pinned, r.USPerDelivery, r.LatencyMS.P50, r.LatencyMS.P99, r.MsgPerS, r.Lost, r.PublishErrors, r.Load)
					}
					res.Runs = append(res.Runs, r)
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
			save()
		}
	}
	idle, _ := f.idleCounts()
	for _, n := range idle {
		err := withLock(f.lock, func() error {
			for _, s := range servers {
				if s == serverRawFrame && slices.Contains(servers, serverRawCoalesce) {
					continue // idle, the two raw modes are the same server
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				r, err := runPeerIdle(ctx, e, f, s, n)
				if err != nil {
					logf("%s, %d idle: %v", s, n, err)
					r = peerIdle{Server: s, Idle: n, Err: err.Error()}
				} else {
					logf("%s, %d idle: %.2f KB per connection (load %.1f)", s, r.Connected, r.KBPerConn, r.Load)
				}
				res.Idle = append(res.Idle, r)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		save()
	}
	return res, nil
}

// findBinary returns flag when set (it must exist), else name beside this
// executable, else name on PATH; the path is absolute, since the servers
// run in directories of their own.
func findBinary(flag, name string) (string, error) {
	if flag != "" {
		if _, err := os.Stat(flag); err != nil {
			return "", err
		}
		return filepath.Abs(flag)
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", err
	}
	return filepath.Abs(p)
}

// withLock runs fn holding an exclusive flock on path (none when empty).
func withLock(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	lf, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return fmt.Errorf("-lock: %w", err)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("-lock: %w", err)
	}
	defer unix.Flock(int(lf.Fd()), unix.LOCK_UN)
	return fn()
}

// loadAvg is the 1-minute load average (0 when unknown).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(bytes.Fields(b)[0]), 64)
	return v
}

// peerServer is one freshly started server.
type peerServer struct {
	kind    string
	cmd     *exec.Cmd
	dir     string
	ws      string // subscribers' URL
	publish func(ctx context.Context, hc *http.Client, body []byte, n int64) error
	peer    string
	channel string
	prefix  string
	done    chan struct{}
}

func (s *peerServer) pid() int { return s.cmd.Process.Pid }

// stop ends the server (SIGTERM, then SIGKILL) and removes its directory.
func (s *peerServer) stop() {
	_ = s.cmd.Process.Signal(unix.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	_ = os.RemoveAll(s.dir)
}

// taskset prefixes argv with taskset when cpus is set.
func taskset(cpus string, argv ...string) []string {
	if cpus == "" {
		return argv
	}
	return append([]string{"taskset", "-c", cpus}, argv...)
}

// startPeerServer starts server kind fresh, ready for subs subscribers.
func startPeerServer(ctx context.Context, e *env, f *peerFlags, kind string, subs int, cpus string) (*peerServer, error) {
	dir, err := os.MkdirTemp("", "fanfare-peer-")
	if err != nil {
		return nil, err
	}
	s := &peerServer{kind: kind, dir: dir, prefix: "u", done: make(chan struct{})}
	fail := func(err error) (*peerServer, error) {
		if s.cmd != nil && s.cmd.Process != nil {
			s.stop()
		} else {
			_ = os.RemoveAll(dir)
		}
		return nil, err
	}
	var argv []string
	var env []string
	var ready *regexp.Regexp
	var out io.ReadCloser
	switch kind {
	case serverFanfare:
		limits := filepath.Join(dir, "limits.json")
		if err := os.WriteFile(limits, []byte(peerFanfareLimits), 0o644); err != nil {
			return fail(err)
		}
		argv = taskset(cpus, f.fanfared, "-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-data-dir", filepath.Join(dir, "data"),
			"-jwt-secret", peerSecret, "-admin-token", peerSecret, "-limits-file", limits,
			"-group-rate", "-1", "-downlink-rate", "-1", "-hot-factor", "-1", "-max-conns-per-user", "0", "-log-level", "warn")
		argv = append(argv, strings.Fields(f.fanfaredFlags)...)
		ready = regexp.MustCompile(`HTTP API:\s+(http://\S+)`)
	case serverCentrifugo:
		port, err := freePort()
		if err != nil {
			return fail(err)
		}
		cfg := filepath.Join(dir, "config.json")
		if err := os.WriteFile(cfg, centrifugoConfig(port), 0o644); err != nil {
			return fail(err)
		}
		argv = taskset(cpus, f.centrifugo, "--config", cfg)
		base := "127.0.0.1:" + strconv.Itoa(port)
		s.ws = "ws://" + base + "/connection/websocket"
		s.peer, s.channel = peerCentrifugo, "bench:room"
		s.publish = func(ctx context.Context, hc *http.Client, body []byte, n int64) error {
			req := append([]byte(`{"channel":"bench:room","data":`), body...)
			req = append(req, '}')
			rb, err := postJSON(ctx, hc, "http://"+base+"/api/publish", req, "X-API-Key", peerSecret, "X-Idempotency-Key", strconv.FormatInt(n, 10))
			if err == nil && bytes.Contains(rb, []byte(`"error"`)) {
				err = fmt.Errorf("centrifugo: %s", bytes.TrimSpace(rb))
			}
			return err
		}
	case serverRawFrame, serverRawCoalesce:
		exe, err := os.Executable()
		if err != nil {
			return fail(err)
		}
		mode := rawFrame
		if kind == serverRawCoalesce {
			mode = rawCoalesce
		}
		argv = taskset(cpus, exe, "bench", "floor-server", "-ws-addr", "127.0.0.1:0", "-control-addr", "127.0.0.1:0", "-mode", mode)
		env = []string{floorServerEnv + "=1"}
		ready = regexp.MustCompile(`bench floor-server: ws (\S+), control (\S+)`)
	}
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Env = append(os.Environ(), env...)
	// A server outlives no bench peer that is killed.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	s.cmd.Dir = dir
	switch kind {
	case serverFanfare, serverRawFrame, serverRawCoalesce:
		out, err = s.cmd.StderrPipe()
	default:
		var logf *os.File
		if logf, err = os.Create(filepath.Join(dir, "server.log")); err == nil {
			s.cmd.Stdout, s.cmd.Stderr = logf, logf
		}
	}
	if err != nil {
		return fail(err)
	}
	if err := s.cmd.Start(); err != nil {
		return fail(fmt.Errorf("starting %s: %w", kind, err))
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	var addr string
	if ready != nil {
		found := make(chan []string, 1)
		wsLine := regexp.MustCompile(`WebSocket:\s+(ws://\S+)`)
		go func() {
			sc := bufio.NewScanner(out)
			sent := false
			for sc.Scan() {
				m := ready.FindStringSubmatch(sc.Text())
				switch {
				case m != nil && !sent:
					found <- m
					sent = true
				case kind == serverFanfare:
					if m := wsLine.FindStringSubmatch(sc.Text()); m != nil {
						s.ws = m[1]
					}
				case kind != serverFanfare:
					fmt.Fprintf(e.stderr, "bench peer: %s: %s\n", kind, sc.Text())
				}
			}
		}()
		select {
		case m := <-found:
			addr = m[1]
			if kind == serverRawFrame || kind == serverRawCoalesce {
				s.ws, addr = "ws://"+m[1]+"/ws", m[2]
			}
		case <-s.done:
			return fail(fmt.Errorf("%s exited before it was ready", kind))
		case <-time.After(30 * time.Second):
			return fail(fmt.Errorf("%s did not say it was ready in 30s", kind))
		}
	}
	switch kind {
	case serverFanfare:
		adm := &adminClient{base: addr, token: peerSecret}
		g, err := adm.createGroup(ctx, "bench-peer", "pub")
		if err != nil {
			return fail(err)
		}
		uids := make([]string, subs, subs+1)
		for i := range uids {
			uids[i] = s.prefix + strconv.Itoa(i)
		}
		uids = append(uids, "pub") // the owner publishes; admin sends are as the owner
		for chunk := range slices.Chunk(uids, 5000) {
			if err := adm.addMembers(ctx, g.GID, chunk); err != nil {
				return fail(err)
			}
		}
		s.peer = peerFanfare
		url := addr + "/v1/groups/" + strconv.FormatInt(g.GID, 10) + "/messages"
		s.publish = func(ctx context.Context, hc *http.Client, body []byte, n int64) error {
			req := append([]byte(`{"id":"`), strconv.FormatInt(n, 10)...)
			req = append(req, `","body":`...)
			req = append(req, body...)
			req = append(req, '}')
			_, err := postJSON(ctx, hc, url, req, "Authorization", "Bearer "+peerSecret, "X-Idempotency-Key", strconv.FormatInt(n, 10))
			return err
		}
	case serverRawFrame, serverRawCoalesce:
		// The floor's frames are fanfare's push frames: the same receivers.
		s.peer = peerFanfare
		s.publish = func(ctx context.Context, hc *http.Client, body []byte, n int64) error {
			_, err := postJSON(ctx, hc, "http://"+addr+"/publish", body, "X-Idempotency-Key", strconv.FormatInt(n, 10))
			return err
		}
	case serverCentrifugo:
		// Ready when its API answers.
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := postJSON(ctx, http.DefaultClient, strings.TrimSuffix(strings.Replace(s.ws, "ws://", "http://", 1), "/connection/websocket")+"/api/info", []byte("{}"), "X-API-Key", peerSecret)
			if err == nil {
				break
			}
			select {
			case <-s.done:
				log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
				return fail(fmt.Errorf("centrifugo exited: %s", lastLines(log, 5)))
			default:
			}
			if time.Now().After(deadline) {
				return fail(fmt.Errorf("centrifugo not ready in 30s: %v", err))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return s, nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// peerFanfareLimits turns off fanfared's per-user, connect and frame rate
// limits (the same rules as docs/examples/limits-unlimited.json).
const peerFanfareLimits = `{"rules": {"user_group": {"limit": 0}, "user_all": {"limit": 0}, "pull": {"limit": 0}, "connect": {"limit": 0},
 "frame_send": {"limit": 0}, "frame_pull": {"limit": 0}, "frame_read": {"limit": 0}, "frame_ping": {"limit": 0},
 "frame_other": {"limit": 0}, "frame_user": {"limit": 0}, "frame_denied": {"limit": 0}}}`

// centrifugoConfig is a Centrifugo v6 configuration: memory engine (the
// default), HS256 connection tokens, the HTTP API keyed with peerSecret,
// and a namespace "bench" with history that clients may subscribe to.
func centrifugoConfig(port int) []byte {
	cfg := map[string]any{
		"http_server": map[string]any{"address": "127.0.0.1", "port": port},
		"log":         map[string]any{"level": "error"},
		"engine":      map[string]any{"type": "memory"},
		"client": map[string]any{
			"token":           map[string]any{"hmac_secret_key": peerSecret},
			"allowed_origins": []string{"*"},
		},
		"http_api": map[string]any{"key": peerSecret},
		"channel": map[string]any{
			"namespaces": []any{map[string]any{
				"name": "bench", "history_size": 100, "history_ttl": "300s", "allow_subscribe_for_client": true,
			}},
		},
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	return b
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// postJSON posts body and returns the answer's body; a status outside 2xx
// is an error. hdr are header name, value pairs; publishes carry an
// X-Idempotency-Key, which lets the transport retry a request whose
// reused connection the server had closed before answering.
func postJSON(ctx context.Context, hc *http.Client, url string, body []byte, hdr ...string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return rb, fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(rb))
	}
	return rb, nil
}

// startPeerWorkers starts the kernel receivers of subs subscribers of s.
func startPeerWorkers(ctx context.Context, e *env, f *peerFlags, s *peerServer, subs int, cpus string) ([]*workerProc, int, error) {
	procs := (subs + f.perProc - 1) / f.perProc
	per := (subs + procs - 1) / procs
	var workers []*workerProc
	killAll := func() {
		for _, w := range workers {
			w.kill()
		}
	}
	for n := range procs {
		lo, hi := n*per, min((n+1)*per, subs)
		if lo >= hi {
			break
		}
		spec := workerSpec{WS: s.ws, Prefix: s.prefix, Lo: lo, Hi: hi, Secret: peerSecret, PerAddr: subs, Dials: 64, ReadBuf: 4096,
			Drain: f.drain, Deadline: 5 * time.Minute, Receivers: receiversKernel, Loops: f.loops, Peer: s.peer, Channel: s.channel}
		w, err := startChild(ctx, e, n, taskset(cpus)...)
		if err != nil {
			killAll()
			return nil, 0, err
		}
		workers = append(workers, w)
		if err := w.enc.Encode(spec); err != nil {
			killAll()
			return nil, 0, err
		}
	}
	connected := 0
	for _, w := range workers {
		var r workerReady
		if err := w.dec.Decode(&r); err != nil {
			killAll()
			return nil, 0, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
		connected += r.Ready
		if r.Failed > 0 {
			killAll()
			return nil, 0, fmt.Errorf("%d of %d receivers failed to connect: %s", r.Failed, r.Ready+r.Failed, r.FirstErr)
		}
	}
	return workers, connected, nil
}

// runPeerOne runs the workload once against a fresh server.
func runPeerOne(ctx context.Context, e *env, f *peerFlags, kind string, subs int, pinned bool) (peerRun, error) {
	r := peerRun{Server: kind, Subs: subs, Pinned: pinned, Load: loadAvg()}
	srvCPUs, recvCPUs := "", ""
	if pinned {
		srvCPUs, recvCPUs = f.serverCore, f.recvCores
	}
	s, err := startPeerServer(ctx, e, f, kind, subs, srvCPUs)
	if err != nil {
		return r, err
	}
	defer s.stop()
	workers, connected, err := startPeerWorkers(ctx, e, f, s, subs, recvCPUs)
	if err != nil {
		return r, err
	}
	defer func() {
		for _, w := range workers {
			w.kill()
		}
	}()
	r.Connected = connected
	time.Sleep(300 * time.Millisecond) // subscriptions settle

	start := time.Now().Add(100 * time.Millisecond)
	measureFrom, measureTo := start.Add(f.warmup), start.Add(f.warmup+f.duration)
	for _, w := range workers {
		if err := w.enc.Encode(workerCmd{Op: "go", MeasureFrom: measureFrom.UnixNano(), MeasureTo: measureTo.UnixNano()}); err != nil {
			return r, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
	}
	var before procSample
	sampled := make(chan error, 1)
	go func() {
		if !sleepUntil(ctx, measureFrom) {
			sampled <- ctx.Err()
			return
		}
		var err error
		before, err = readProc(s.pid())
		sampled <- err
	}()
	ps := peerPublish(ctx, f, s, start, measureTo)
	if err := <-sampled; err != nil {
		return r, err
	}
	r.Published, r.Acked, r.PublishErrors = ps.published, int64(len(ps.acked)), ps.errs
	r.PublishLagS = ps.lag.Seconds()
	r.Saturated = ps.gaveUp
	if ps.errs > 0 {
		fmt.Fprintf(e.stderr, "bench peer: %s: %d publish errors, first: %v\n", kind, ps.errs, ps.firstErr)
	}
	// Sustained: the window's messages over the time their publishes took
	// (the window itself when the server kept up).
	window := max(f.duration, ps.lastDone.Sub(measureFrom))
	ranges := seqRanges(ps.acked)
	for _, w := range workers {
		if err := w.enc.Encode(workerCmd{Op: "stop", Acked: ranges}); err != nil {
			return r, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
	}
	hist := newLatencyHist()
	for i, w := range workers {
		var wr workerResult
		if err := w.dec.Decode(&wr); err != nil {
			return r, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
		if i == 0 {
			// Every receiver of this worker is drained; the others are
			// close behind (they drain in parallel).
			after, err := readProc(s.pid())
			if err != nil {
				return r, err
			}
			r.ServerCPUS = after.CPU - before.CPU
		}
		r.Deliveries += wr.Measured
		r.Lost += wr.Lost
		r.Duplicates += wr.Duplicates
		r.Disconnects += wr.Disconnects
		r.BadFrames += wr.BadFrames
		r.DrainS = max(r.DrainS, wr.DrainS)
		if wr.Latency != nil {
			hist.Merge(hdrhistogram.Import(wr.Latency))
		}
	}
	r.LatencyMS = quantilesOf(hist)
	r.MsgPerS = float64(r.Deliveries) / float64(max(1, connected)) / window.Seconds()
	if r.Deliveries > 0 {
		r.USPerDelivery = r.ServerCPUS * 1e6 / float64(r.Deliveries)
	}
	if r.ServerCPUS > 0 {
		r.DeliveriesPerCPUS = float64(r.Deliveries) / r.ServerCPUS
	}
	return r, nil
}

// peerPublish publishes at f.rate from start until end, open loop (each
// publish at its time, at most -max-inflight outstanding), and returns
// the "n" of every acknowledged publish.
func peerPublish(ctx context.Context, f *peerFlags, s *peerServer, start, end time.Time) (st peerPubStats) {
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: f.maxInflight, MaxConnsPerHost: f.maxInflight}}
	defer hc.CloseIdleConnections()
	interval := time.Duration(float64(time.Second) / f.rate)
	sem := make(chan struct{}, f.maxInflight)
	var mu sync.Mutex
	var wg sync.WaitGroup
	n := int64(0)
	for next := start; next.Before(end); next = next.Add(interval) {
		if !sleepUntil(ctx, next) {
			break
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		lag := time.Since(next)
		if lag > max(f.duration, 10*time.Second) {
			// The server cannot take the rate: stop instead of holding the
			// bench lock for minutes; what was published is measured.
			st.gaveUp = true
			break
		}
		n++
		body := peerBody(next.UnixNano(), n, f.bodyBytes)
		k := n
		mu.Lock()
		st.lag = max(st.lag, lag)
		mu.Unlock()
		wg.Go(func() {
			defer func() { <-sem }()
			err := s.publish(ctx, hc, body, k)
			mu.Lock()
			defer mu.Unlock()
			st.published++
			st.lastDone = time.Now()
			if err != nil {
				st.errs++
				if st.firstErr == nil {
					st.firstErr = err
				}
				return
			}
			st.acked = append(st.acked, k)
		})
	}
	wg.Wait()
	return st
}

// peerPubStats is what the publisher did.
type peerPubStats struct {
	acked           []int64
	published, errs int64
	firstErr        error
	lag             time.Duration // worst delay of a publish behind its schedule
	lastDone        time.Time     // when the last publish was answered (or failed)
	gaveUp          bool          // stopped: more than -duration (at least 10s) behind schedule
}

// peerBody is a bench body {"t":<ns>,"n":<k>,"p":"xx..."} of size bytes.
func peerBody(t, n int64, size int) []byte {
	b := append(make([]byte, 0, size), `{"t":`...)
	b = strconv.AppendInt(b, t, 10)
	b = append(b, `,"n":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, `,"p":"`...)
	for len(b) < size-2 {
		b = append(b, 'x')
	}
	return append(b, '"', '}')
}

// runPeerIdle connects n receivers to a fresh server, lets them settle
// and reads the server's RSS growth per connection.
func runPeerIdle(ctx context.Context, e *env, f *peerFlags, kind string, n int) (peerIdle, error) {
	r := peerIdle{Server: kind, Idle: n, Load: loadAvg()}
	s, err := startPeerServer(ctx, e, f, kind, n, "")
	if err != nil {
		return r, err
	}
	defer s.stop()
	time.Sleep(f.idleSettle / 3) // the server's start-up settles
	before, err := readProc(s.pid())
	if err != nil {
		return r, err
	}
	workers, connected, err := startPeerWorkers(ctx, e, f, s, n, "")
	if err != nil {
		return r, err
	}
	defer func() {
		for _, w := range workers {
			w.kill()
		}
	}()
	r.Connected = connected
	// Settled: after -idle-settle, RSS has not grown by more than 1% over
	// a second (at most 20s).
	settle := time.Now()
	time.Sleep(f.idleSettle)
	after, _ := readProc(s.pid())
	for time.Since(settle) < 20*time.Second {
		time.Sleep(time.Second)
		cur, err := readProc(s.pid())
		if err != nil {
			return r, err
		}
		grew := cur.RSS > after.RSS+after.RSS/100
		after = cur
		if !grew {
			break
		}
	}
	r.SettleS = time.Since(settle).Seconds()
	r.RSSBeforeMB = float64(before.RSS) / (1 << 20)
	r.RSSAfterMB = float64(after.RSS) / (1 << 20)
	if connected > 0 {
		r.KBPerConn = float64(after.RSS-before.RSS) / 1024 / float64(connected)
	}
	if f.idleHold > 0 {
		fmt.Fprintf(e.stderr, "bench peer: %s, %d idle: holding pid %d for %v\n", kind, connected, s.pid(), f.idleHold)
		sleepUntil(ctx, time.Now().Add(f.idleHold))
	}
	for _, w := range workers {
		_ = w.enc.Encode(workerCmd{Op: "stop"})
	}
	return r, nil
}

// loadPeerResults merges the -json-out files of several runs, in order.
func loadPeerResults(files []string) (*peerResult, error) {
	var out *peerResult
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		var r peerResult
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if out == nil {
			out = &r
			continue
		}
		out.Runs = append(out.Runs, r.Runs...)
		out.Idle = append(out.Idle, r.Idle...)
		for _, s := range r.Skipped {
			if !slices.Contains(out.Skipped, s) {
				out.Skipped = append(out.Skipped, s)
			}
		}
	}
	if out == nil {
		return nil, errors.New("-from: no file")
	}
	return out, nil
}
