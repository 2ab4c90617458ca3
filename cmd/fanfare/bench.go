package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

func init() {
	register("bench", "bench broadcast: load on a running server (latency, deliveries/s, loss); bench room: a waiting-room simulation; bench peer: fanfare, Centrifugo and a raw server side by side; bench cluster: one group across nodes", cmdBench)
}

// workerEnv marks a child process started as a bench worker (the test
// binary's TestMain reads it; the fanfare binary gets "bench worker").
const workerEnv = "FANFARE_BENCH_WORKER"

// benchUsage is the usage of fanfare bench itself.
func benchUsage(w io.Writer) {
	fmt.Fprint(w, `usage: fanfare bench broadcast|room|polls|peer|cluster [flags]

benchmarks:
  broadcast  load on a running fanfared: creates a group, connects its members
             as receivers, sends at -rate and reports latency, deliveries/s and
             loss (the server's rate limits apply unless -limits off)
  room       a simulation: the waiting room's VIP surge run in this process on a
             virtual clock; no server is contacted
  polls      load on a running fanfared: enters -users visitors into a room over
             the HTTP polling path, then polls their status from -clients
             connections and reports polls/s and latency
  peer       the same fan-out workload against fanfare, Centrifugo and a raw
             write(2) server, each started fresh: one table of server CPU per
             delivery, latency, loss and idle memory, with ratios
  cluster    one group's members online across fanfared nodes in cluster mode
             (started here, on a given throwaway Postgres and Redis): latency,
             server CPU per delivery, memory per connection, loss, from 20k to
             200k online and beyond
  floor-server
             the raw floor of broadcast -floor and peer: a WebSocket server
             that writes every due frame to every connection in one write(2)

'fanfare bench <benchmark> -h' lists its flags.

`+exitStatus+"\n")
}

func cmdBench(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		benchUsage(e.stderr)
		return &usageError{cmd: "bench"}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		benchUsage(e.stdout)
		return nil
	case "broadcast":
		return benchBroadcast(ctx, e, args[1:])
	case "room":
		return benchRoom(ctx, e, args[1:])
	case "polls":
		return benchPolls(ctx, e, args[1:])
	case "peer":
		return benchPeer(ctx, e, args[1:])
	case "cluster":
		return benchCluster(ctx, e, args[1:])
	case "floor-server":
		return benchFloorServer(ctx, e, args[1:])
	case "worker": // hidden: a child process of bench broadcast and bench peer
		return runWorker(ctx, os.Stdin, e.stdout, e.stderr)
	case "upgrades": // hidden: WebSocket upgrades per second (bench_upgrades.go)
		return benchUpgrades(ctx, e, args[1:])
	case "upgrade-worker": // hidden: a child process of bench upgrades
		return runUpgradeWorker(ctx, os.Stdin, e.stdout)
	}
	return &usageError{cmd: "bench", msg: fmt.Sprintf("unknown benchmark %q (want broadcast, room, polls, peer or cluster)", args[0])}
}

// broadcastFlags are the settings of bench broadcast.
type broadcastFlags struct {
	http, ws, adminToken, secret string
	gid                          int64
	members, online, senders     int
	rate                         float64
	duration, warmup, drain      time.Duration
	connectTimeout               time.Duration
	bodyBytes                    int
	procs, perProc               int
	bind                         string
	perAddr                      int
	dials, readBuf               int
	serverPID                    int
	prefix                       string
	jsonOut                      bool
	maxInflight                  int
	cpuProfile                   string
	limits                       string
	receivers                    string
	leanLoops                    int
	floor                        string
}

// Receiver implementations of -receivers.
const (
	receiversSDK  = "sdk"
	receiversLean = "lean"
)

func (f *broadcastFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&f.http, "http", envOr(e, "FANFARE_HTTP", "http://127.0.0.1:8080"), "fanfared HTTP API base URL (FANFARE_HTTP)")
	fs.StringVar(&f.ws, "ws", envOr(e, "FANFARE_WS", "ws://127.0.0.1:8081/ws"), "fanfared chat socket URL (FANFARE_WS)")
	secretVar(fs, e, &f.adminToken, "admin-token", "FANFARE_ADMIN_TOKEN", "admin `token`, to create the group and its members")
	secretVar(fs, e, &f.secret, "jwt-secret", "FANFARE_JWT_SECRET", "HS256 `secret` to mint member tokens")
	fs.Int64Var(&f.gid, "gid", 0, "use this existing group (members are added idempotently); 0 = create one")
	fs.IntVar(&f.members, "members", 1000, "members of the group")
	fs.IntVar(&f.online, "online", 0, "members connected as receivers; 0 = all")
	fs.IntVar(&f.senders, "senders", 1, "sender connections (extra members)")
	fs.Float64Var(&f.rate, "rate", 100, "messages per second, all senders together")
	fs.DurationVar(&f.duration, "duration", 30*time.Second, "measured sending time")
	fs.DurationVar(&f.warmup, "warmup", 5*time.Second, "sending before the measurement starts")
	fs.DurationVar(&f.drain, "drain", 15*time.Second, "longest wait, after the last ack, for every receiver to have every acked message")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", 10*time.Minute, "bound on connecting all receivers")
	fs.IntVar(&f.bodyBytes, "body-bytes", 100, "message body size (bytes of JSON)")
	fs.IntVar(&f.procs, "procs", 0, "receiver processes; 0 = as few as -per-proc allows (1 = in this process)")
	fs.IntVar(&f.perProc, "per-proc", 19000, "most receivers per process (the fd limit is 20,000)")
	fs.StringVar(&f.bind, "bind", "auto", "receiver source addresses: auto (127.0.0.2, .3, ... when -online exceeds -conns-per-addr on loopback), none, or a comma-separated list")
	fs.IntVar(&f.perAddr, "conns-per-addr", 20000, "receivers per source address (loopback allows ~28k per address pair)")
	fs.IntVar(&f.dials, "dials", 128, "concurrent dials per process")
	fs.IntVar(&f.readBuf, "read-buf", 1024, "socket read buffer per receiver (bytes)")
	fs.IntVar(&f.serverPID, "server-pid", 0, "fanfared's pid, to report its CPU seconds per million deliveries and RSS (same machine)")
	fs.StringVar(&f.prefix, "prefix", "", "member uid prefix; empty = bench-<random>-")
	fs.BoolVar(&f.jsonOut, "json", false, "print the result as JSON")
	fs.IntVar(&f.maxInflight, "max-inflight", 1024, "most sends awaiting their ack, per sender")
	fs.StringVar(&f.limits, "limits", "keep", "server rate limits during the run: keep, or off (disable the user_group, user_all, group, downlink, frame_send and frame_user rules through PUT /admin/v1/limits, and restore them after)")
	fs.StringVar(&f.receivers, "receivers", receiversSDK, "receiver implementation: sdk (a client.Conn per member: what apps run; repairs gaps by pull) or lean (raw frames on a few event loops, a small fraction of the CPU per frame; never pulls, so a dropped push counts as lost)")
	fs.IntVar(&f.leanLoops, "lean-loops", 2, "event loops per process for -receivers lean")
	fs.StringVar(&f.floor, "floor", "", "control `URL` of a bench floor-server (http://127.0.0.1:18092): run against the raw coalescing floor instead of fanfared (-ws is the floor's socket; no group, no senders: the floor sends the schedule itself); empty = fanfared")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write this process's CPU profile (senders, and receivers when -procs is 1) to a file")
}

func (f *broadcastFlags) validate() error {
	var errs []error
	if f.floor != "" {
		// The floor takes any token: these only let the receivers sign one.
		f.adminToken = "floor"
		if len(f.secret) < auth.MinSecretBytes {
			f.secret = strings.Repeat("f", auth.MinSecretBytes)
		}
	}
	if f.adminToken == "" {
		errs = append(errs, errors.New("no admin token: pass -admin-token or set FANFARE_ADMIN_TOKEN"))
	}
	if len(f.secret) < auth.MinSecretBytes {
		errs = append(errs, fmt.Errorf("-jwt-secret (FANFARE_JWT_SECRET) must be at least %d bytes", auth.MinSecretBytes))
	}
	if f.members < 1 {
		errs = append(errs, errors.New("-members must be at least 1"))
	}
	if f.online == 0 {
		f.online = f.members
	}
	if f.online < 0 || f.online > f.members {
		errs = append(errs, fmt.Errorf("-online %d must be within 0..-members %d", f.online, f.members))
	}
	if f.senders < 1 {
		errs = append(errs, errors.New("-senders must be at least 1"))
	}
	if f.rate <= 0 {
		errs = append(errs, errors.New("-rate must be positive"))
	}
	if f.duration <= 0 || f.warmup < 0 || f.drain < 0 {
		errs = append(errs, errors.New("-duration must be positive, -warmup and -drain not negative"))
	}
	if f.bodyBytes < 32 || f.bodyBytes > 60<<10 {
		errs = append(errs, errors.New("-body-bytes must be within 32..61440"))
	}
	if f.procs < 0 || f.perProc < 1 || f.perAddr < 1 || f.dials < 1 || f.readBuf < 256 || f.maxInflight < 1 {
		errs = append(errs, errors.New("-procs, -per-proc, -conns-per-addr, -dials, -read-buf (>= 256), -max-inflight must be positive"))
	}
	if f.receivers != receiversSDK && f.receivers != receiversLean {
		errs = append(errs, fmt.Errorf("-receivers %q: want sdk or lean", f.receivers))
	}
	if f.leanLoops < 1 || f.leanLoops > 64 {
		errs = append(errs, errors.New("-lean-loops must be within 1..64"))
	}
	if f.limits != "keep" && f.limits != "off" {
		errs = append(errs, fmt.Errorf("-limits %q: want keep or off", f.limits))
	}
	if u, err := url.Parse(f.ws); err != nil || (u.Scheme != "ws" && u.Scheme != "wss") {
		errs = append(errs, fmt.Errorf("-ws %q is not a ws:// URL", f.ws))
	}
	return errors.Join(errs...)
}

// sourceAddrs returns the source addresses for the receivers.
func (f *broadcastFlags) sourceAddrs() ([]string, error) {
	switch f.bind {
	case "none", "":
		return nil, nil
	case "auto":
		if f.online <= f.perAddr {
			return nil, nil
		}
		u, _ := url.Parse(f.ws)
		ip := net.ParseIP(u.Hostname())
		if u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("-online %d exceeds -conns-per-addr %d and the server is not on loopback: pass -bind with source addresses", f.online, f.perAddr)
		}
		n := (f.online + f.perAddr - 1) / f.perAddr
		if n > 250 {
			return nil, fmt.Errorf("-online %d needs %d source addresses: raise -conns-per-addr", f.online, n)
		}
		addrs := make([]string, n)
		for i := range addrs {
			addrs[i] = "127.0.0." + strconv.Itoa(2+i)
		}
		return addrs, nil
	}
	addrs := strings.Split(f.bind, ",")
	for i, a := range addrs {
		addrs[i] = strings.TrimSpace(a)
		if net.ParseIP(addrs[i]) == nil {
			return nil, fmt.Errorf("-bind: %q is not an IP address", a)
		}
	}
	if len(addrs)*f.perAddr < f.online {
		return nil, fmt.Errorf("-bind: %d addresses x -conns-per-addr %d < -online %d", len(addrs), f.perAddr, f.online)
	}
	return addrs, nil
}

func benchBroadcast(ctx context.Context, e *env, args []string) error {
	fs := newFlags("bench broadcast", "[-members N] [-online N] [-senders S] [-rate R] [-duration D] [-limits keep|off] [...]", `
Load on a running fanfared: creates a group (or uses -gid), adds -members
members and -senders senders, connects -online members as receivers (in
-procs processes), sends -rate messages per second for -warmup + -duration
and reports send->receive latency (p50/p99/p999), deliveries/s, the ledger
of lost, duplicated and reordered messages and, with -server-pid, the
server's CPU per million deliveries. It reads the server's limits and
tuning first and warns when they would throttle the run: with -limits keep
(the default) the server's per-user send limits apply to the senders
(docs/benchmarks.md shows how the published runs turn them off).`)
	var f broadcastFlags
	f.register(fs.FlagSet, e)
	if err := fs.parse(e, args); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return fs.usageErr("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	addrs, err := f.sourceAddrs()
	if err != nil {
		return fs.usageErr("%v", err)
	}
	if f.prefix == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		f.prefix = "bench-" + hex.EncodeToString(b[:]) + "-"
	}
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	// Worker processes and goroutines share stderr.
	le := *e
	le.stderr = &lockedWriter{w: e.stderr}
	res, err := runBroadcast(ctx, &le, &f, addrs)
	if err != nil {
		return err
	}
	if f.jsonOut {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	res.print(e.stdout)
	return nil
}

// broadcastResult is the outcome of one bench broadcast run.
type broadcastResult struct {
	restore func(context.Context) error // the server's limits, after -limits off

	GID           int64            `json:"gid"`
	Members       int              `json:"members"`
	Online        int              `json:"online"`
	Connected     int              `json:"connected"`
	ConnectFailed int              `json:"connect_failed"`
	ConnectErr    string           `json:"connect_error,omitempty"`
	ConnectS      float64          `json:"connect_s"`
	Procs         int              `json:"procs"`
	Receivers     string           `json:"receivers"`
	SourceAddrs   []string         `json:"source_addrs,omitempty"`
	Senders       int              `json:"senders"`
	Rate          float64          `json:"rate"`
	DurationS     float64          `json:"duration_s"`
	WarmupS       float64          `json:"warmup_s"`
	BodyBytes     int              `json:"body_bytes"`
	Sent          int64            `json:"sent"`
	Acked         int64            `json:"acked"`
	SendErrors    map[string]int64 `json:"send_errors,omitempty"`
	// SendLagMS is the worst delay of a send behind its schedule: large
	// values mean the generator itself was saturated.
	SendLagMS    float64   `json:"send_lag_ms"`
	AckLatencyMS quantiles `json:"ack_latency_ms"`
	// Deliveries are receiver deliveries of the messages sent in the
	// measured window; DeliveriesPerS divides them by the window.
	Deliveries     int64     `json:"deliveries"`
	DeliveriesPerS float64   `json:"deliveries_per_s"`
	LatencyMS      quantiles `json:"latency_ms"`
	// Lost counts (receiver, acked seq) pairs not delivered by the end of
	// the drain.
	Lost       int64  `json:"lost"`
	Duplicates int64  `json:"duplicates"`
	OutOfOrder int64  `json:"out_of_order"`
	Pulled     uint64 `json:"pulled"`
	SDKDups    uint64 `json:"sdk_duplicates_dropped"`
	Gaps       uint64 `json:"gaps"`
	Resyncs    int64  `json:"resyncs"`
	Degraded   int64  `json:"degraded_events"`
	Reconnects uint64 `json:"reconnects"`
	// Summaries, BadFrames and Disconnects are counted by lean receivers
	// only: L2 summary frames, frames they could not parse, connections
	// lost before the end.
	Summaries     int64    `json:"summaries"`
	BadFrames     int64    `json:"bad_frames"`
	Disconnects   int64    `json:"disconnects"`
	DrainS        float64  `json:"drain_s"`
	Server        *procUse `json:"server,omitempty"`
	GeneratorCPUS float64  `json:"generator_cpu_s"`
	// GeneratorUSPerDelivery is GeneratorCPUS per delivery of the window,
	// in microseconds (senders included; they are a small share).
	GeneratorUSPerDelivery float64 `json:"generator_us_per_delivery"`
	// GeneratorRSSMB is the generator's resident memory (all processes)
	// once every receiver is connected.
	GeneratorRSSMB float64 `json:"generator_rss_mb"`
	// Warnings name what in the server's limits and tuning would hold the
	// run back (throttleWarnings): its numbers then measure the limits.
	Warnings []string `json:"warnings,omitempty"`
}

// quantiles summarizes a latency histogram in milliseconds.
type quantiles struct {
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
	Mean  float64 `json:"mean"`
	Count int64   `json:"count"`
}

func quantilesOf(h *hdrhistogram.Histogram) quantiles {
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return quantiles{
		P50: ms(h.ValueAtQuantile(50)), P99: ms(h.ValueAtQuantile(99)), P999: ms(h.ValueAtQuantile(99.9)),
		Max: ms(h.Max()), Mean: h.Mean() / 1000, Count: h.TotalCount(),
	}
}

// procUse is the server's resource use over the measured window.
type procUse struct {
	PID               int     `json:"pid"`
	CPUS              float64 `json:"cpu_s"`
	CPUSPerMillion    float64 `json:"cpu_s_per_million_deliveries"`
	RSSBeforeMB       float64 `json:"rss_before_mb"`
	RSSAfterMB        float64 `json:"rss_after_mb"`
	RSSPerConnKB      float64 `json:"rss_per_conn_kb,omitempty"`
	RSSAtStartMB      float64 `json:"rss_before_connect_mb"`
	CPUConnectPhaseS  float64 `json:"cpu_connect_phase_s"`
	SampledWindowSecs float64 `json:"cpu_window_s"`
}

func runBroadcast(ctx context.Context, e *env, f *broadcastFlags, addrs []string) (*broadcastResult, error) {
	logf := func(format string, a ...any) { fmt.Fprintf(e.stderr, "bench: "+format+"\n", a...) }
	res := &broadcastResult{Members: f.members, Online: f.online, Senders: f.senders, Rate: f.rate, Receivers: f.receivers,
		DurationS: f.duration.Seconds(), WarmupS: f.warmup.Seconds(), BodyBytes: f.bodyBytes, SourceAddrs: addrs}
	var serverStart procSample
	if f.serverPID > 0 {
		s, err := readProc(f.serverPID)
		if err != nil {
			return nil, fmt.Errorf("-server-pid: %w", err)
		}
		serverStart = s
	}

	var (
		gid, seq0 int64
		senders   []*client.Conn
		fc        floorClient
	)
	defer func() {
		for _, c := range senders {
			c.Close()
		}
	}()
	if f.floor != "" {
		fc = floorClient{base: strings.TrimRight(f.floor, "/")}
		gid = 1
		s0, err := fc.seq(ctx)
		if err != nil {
			return nil, err
		}
		seq0 = s0
	} else {
		g, s0, ss, err := prepareBroadcast(ctx, f, res, logf)
		senders = ss
		if res.restore != nil {
			defer func() {
				rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := res.restore(rctx); err != nil {
					logf("restoring the server's limits: %v", err)
				}
			}()
		}
		if err != nil {
			return nil, err
		}
		gid, seq0 = g, s0
	}
	res.GID = gid

	// Receivers.
	procs := max(f.procs, (f.online+f.perProc-1)/f.perProc)
	res.Procs = procs
	workers, err := startWorkers(ctx, e, f, procs, gid, seq0, addrs)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, w := range workers {
			w.kill()
		}
	}()
	connStart := time.Now()
	for _, w := range workers {
		var r workerReady
		if err := w.dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
		res.Connected += r.Ready
		res.ConnectFailed += r.Failed
		if res.ConnectErr == "" {
			res.ConnectErr = r.FirstErr
		}
	}
	res.ConnectS = time.Since(connStart).Seconds()
	_, rss := generatorUse(workers)
	res.GeneratorRSSMB = float64(rss) / (1 << 20)
	logf("%d of %d receivers connected in %.1fs (%d failed%s)", res.Connected, f.online, res.ConnectS, res.ConnectFailed,
		map[bool]string{true: ": " + res.ConnectErr, false: ""}[res.ConnectErr != ""])
	if res.Connected == 0 {
		return nil, fmt.Errorf("no receiver connected: %s", res.ConnectErr)
	}

	// Send: warmup, then the measured window.
	start := time.Now().Add(100 * time.Millisecond)
	measureFrom, measureTo := start.Add(f.warmup), start.Add(f.warmup+f.duration)
	for _, w := range workers {
		if err := w.enc.Encode(workerCmd{Op: "go", MeasureFrom: measureFrom.UnixNano(), MeasureTo: measureTo.UnixNano()}); err != nil {
			return nil, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
	}
	var serverBefore procSample
	var genBefore float64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		if !sleepUntil(ctx, measureFrom) {
			return
		}
		if f.serverPID > 0 {
			serverBefore, _ = readProc(f.serverPID)
		}
		genBefore = generatorCPU(workers)
	}()
	var ss senderStats
	if f.floor != "" {
		logf("the floor sends %.0f msg/s for %v + %v warmup", f.rate, f.duration, f.warmup)
		fr, err := fc.run(ctx, floorRun{Rate: f.rate, Start: start.UnixNano(), Until: measureTo.UnixNano(), BodyBytes: f.bodyBytes, GID: gid})
		if err != nil {
			return nil, err
		}
		logf("%s", floorSummary(fr))
		ss = senderStats{errors: map[string]int64{}, ackHist: newLatencyHist()}
		for q := fr.First; q <= fr.Last; q++ {
			ss.acked = append(ss.acked, q)
		}
		ss.sent = int64(len(ss.acked))
	} else {
		logf("sending %.0f msg/s from %d senders for %v + %v warmup", f.rate, f.senders, f.duration, f.warmup)
		ss = runSenders(ctx, senders, gid, f, start, measureFrom, measureTo)
	}
	<-sampled
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	res.Sent, res.Acked, res.SendErrors = ss.sent, int64(len(ss.acked)), ss.errors
	res.AckLatencyMS = quantilesOf(ss.ackHist)
	res.SendLagMS = float64(ss.maxLag.Microseconds()) / 1000
	acked := seqRanges(ss.acked)

	// Stop: every worker waits for its receivers to have every acked seq.
	for _, w := range workers {
		if err := w.enc.Encode(workerCmd{Op: "stop", Acked: acked}); err != nil {
			return nil, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
	}
	hist := newLatencyHist()
	var drainDone bool
	for _, w := range workers {
		var r workerResult
		if err := w.dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
		if !drainDone {
			// Every receiver is drained: sample before the workers exit.
			drainDone = true
			res.GeneratorCPUS = generatorCPU(workers) - genBefore
			if f.serverPID > 0 {
				after, err := readProc(f.serverPID)
				if err == nil {
					res.Server = serverUse(f.serverPID, serverStart, serverBefore, after)
				}
			}
		}
		res.Deliveries += r.Measured
		res.Lost += r.Lost
		res.Duplicates += r.Duplicates
		res.OutOfOrder += r.OutOfOrder
		res.Pulled += r.Pulled
		res.SDKDups += r.SDKDups
		res.Gaps += r.Gaps
		res.Resyncs += r.Resyncs
		res.Degraded += r.Degraded
		res.Reconnects += r.Reconnects
		res.Summaries += r.Summaries
		res.BadFrames += r.BadFrames
		res.Disconnects += r.Disconnects
		res.DrainS = max(res.DrainS, r.DrainS)
		if r.Latency != nil {
			hist.Merge(hdrhistogram.Import(r.Latency))
		}
	}
	for _, w := range workers {
		if err := w.wait(); err != nil {
			logf("worker %d: %v", w.n, err)
		}
	}
	res.LatencyMS = quantilesOf(hist)
	res.DeliveriesPerS = float64(res.Deliveries) / f.duration.Seconds()
	if res.Deliveries > 0 {
		res.GeneratorUSPerDelivery = res.GeneratorCPUS * 1e6 / float64(res.Deliveries)
	}
	if res.Server != nil {
		if res.Deliveries > 0 {
			res.Server.CPUSPerMillion = res.Server.CPUS / (float64(res.Deliveries) / 1e6)
		}
		if res.Connected > 0 {
			res.Server.RSSPerConnKB = (res.Server.RSSAfterMB - res.Server.RSSAtStartMB) * 1024 / float64(res.Connected+f.senders)
		}
	}
	return res, nil
}

// prepareBroadcast creates the group and its members on fanfared and
// connects the senders; it returns the group, its last seq before the run
// and the senders (also on error: the caller closes them).
func prepareBroadcast(ctx context.Context, f *broadcastFlags, res *broadcastResult, logf func(string, ...any)) (gid, seq0 int64, senders []*client.Conn, err error) {
	// The group and its members.
	adm := &adminClient{base: strings.TrimRight(f.http, "/"), token: f.adminToken}
	lim, tn, err := adm.serverThrottle(ctx)
	if err != nil {
		return 0, 0, senders, err
	}
	res.Warnings = throttleWarnings(f, lim, tn)
	for _, w := range res.Warnings {
		logf("warning: %s", w)
	}
	if f.limits == "off" {
		restore, err := adm.disableSendLimits(ctx)
		if err != nil {
			return 0, 0, senders, err
		}
		res.restore = restore
		logf("server rate limits on sends and downlink disabled for the run")
	}
	senderUID := func(j int) string { return f.prefix + "s" + strconv.Itoa(j) }
	gid = f.gid
	if gid == 0 {
		g, err := adm.createGroup(ctx, f.prefix+"group", senderUID(0))
		if err != nil {
			return 0, 0, senders, err
		}
		gid = g.GID
	}
	uids := make([]string, 0, f.members+f.senders)
	for j := range f.senders {
		uids = append(uids, senderUID(j))
	}
	for i := range f.members {
		uids = append(uids, f.prefix+strconv.Itoa(i))
	}
	addStart := time.Now()
	for chunk := range slices.Chunk(uids, 5000) {
		if err := adm.addMembers(ctx, gid, chunk); err != nil {
			return 0, 0, senders, err
		}
	}
	logf("group %d: %d members + %d senders added in %v", gid, f.members, f.senders, time.Since(addStart).Round(time.Millisecond))

	// Senders first: they learn the group's last_seq.
	signer, err := auth.NewSigner(auth.SignerConfig{Secret: []byte(f.secret)})
	if err != nil {
		return 0, 0, senders, err
	}
	senders = make([]*client.Conn, 0, f.senders)
	for j := range f.senders {
		tok, err := signer.Sign(senderUID(j), 0, 24*time.Hour)
		if err != nil {
			return 0, 0, senders, err
		}
		c, err := client.Dial(ctx, client.Config{URL: f.ws, Token: tok, OnMessage: func(client.Message) {}, OnEvent: func(client.Event) {}})
		if err != nil {
			return 0, 0, senders, fmt.Errorf("sender %d: %w", j, err)
		}
		senders = append(senders, c)
	}
	page, err := senders[0].Pull(ctx, gid, 1<<50, 0)
	if err != nil {
		return 0, 0, senders, fmt.Errorf("reading the group's last_seq: %w", err)
	}
	return gid, page.LastSeq, senders, nil

}

func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// senderStats is what the senders did.
type senderStats struct {
	sent    int64
	acked   []int64
	errors  map[string]int64
	ackHist *hdrhistogram.Histogram
	maxLag  time.Duration // worst delay of a send behind its schedule
}

// runSenders sends at f.rate from start until measureTo, open loop: each
// send is scheduled at its time whether or not earlier ones were acked
// (bounded by -max-inflight per sender). It returns when every send has
// its answer.
func runSenders(ctx context.Context, senders []*client.Conn, gid int64, f *broadcastFlags, start, measureFrom, measureTo time.Time) senderStats {
	st := senderStats{errors: map[string]int64{}, ackHist: newLatencyHist()}
	var mu sync.Mutex
	interval := time.Duration(float64(time.Second) * float64(len(senders)) / f.rate)
	var wg sync.WaitGroup
	for j, c := range senders {
		wg.Go(func() {
			sem := make(chan struct{}, f.maxInflight)
			var inflight sync.WaitGroup
			defer inflight.Wait()
			next := start.Add(time.Duration(j) * interval / time.Duration(len(senders)))
			for next.Before(measureTo) {
				if !sleepUntil(ctx, next) {
					return
				}
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				// Latency counts from the scheduled time, not from when this
				// goroutine got to run: a saturated generator shows up as
				// latency and as lag instead of silently sending less
				// (coordinated omission).
				sentAt := next
				if lag := time.Since(next); lag > 0 {
					mu.Lock()
					st.maxLag = max(st.maxLag, lag)
					mu.Unlock()
				}
				body := benchBody(make([]byte, 0, f.bodyBytes), sentAt.UnixNano(), f.bodyBytes)
				measured := !sentAt.Before(measureFrom)
				inflight.Go(func() {
					defer func() { <-sem }()
					sctx, cancel := context.WithTimeout(ctx, time.Minute)
					ack, err := c.Send(sctx, gid, json.RawMessage(body))
					cancel()
					took := time.Since(sentAt)
					mu.Lock()
					defer mu.Unlock()
					st.sent++
					if err != nil {
						code := "other"
						var ce *client.Error
						if errors.As(err, &ce) {
							code = ce.Code
						} else if errors.Is(err, client.ErrConnLost) {
							code = "connection_lost"
						} else if errors.Is(err, context.DeadlineExceeded) {
							code = "timeout"
						}
						st.errors[code]++
						return
					}
					st.acked = append(st.acked, ack.Seq)
					if measured {
						_ = st.ackHist.RecordValue(max(took.Microseconds(), 1))
					}
				})
				next = next.Add(interval)
			}
		})
	}
	wg.Wait()
	return st
}

// seqRanges sorts seqs and returns them as inclusive ranges.
func seqRanges(seqs []int64) [][2]int64 {
	s := slices.Clone(seqs)
	slices.Sort(s)
	var out [][2]int64
	for _, v := range s {
		if n := len(out); n > 0 && v <= out[n-1][1]+1 {
			out[n-1][1] = max(out[n-1][1], v)
			continue
		}
		out = append(out, [2]int64{v, v})
	}
	return out
}

// workerProc is one running worker: a child process or a goroutine.
type workerProc struct {
	n    int
	pid  int // 0 = in this process
	enc  *json.Encoder
	dec  *json.Decoder
	wait func() error
	kill func()
	errc chan error // in-process worker's outcome
}

// failure adds the worker's own error, if it ended, to err.
func (w *workerProc) failure(err error) error {
	if w.errc != nil {
		select {
		case werr := <-w.errc:
			if werr != nil {
				return werr
			}
		case <-time.After(time.Second):
		}
	}
	return err
}

// startWorkers starts procs workers over the online members.
func startWorkers(ctx context.Context, e *env, f *broadcastFlags, procs int, gid, seq0 int64, addrs []string) ([]*workerProc, error) {
	per := (f.online + procs - 1) / procs
	var out []*workerProc
	for n := range procs {
		lo, hi := n*per, min((n+1)*per, f.online)
		if lo >= hi {
			break
		}
		spec := workerSpec{WS: f.ws, GID: gid, Prefix: f.prefix, Lo: lo, Hi: hi, Secret: f.secret,
			Addrs: addrs, PerAddr: f.perAddr, Seq0: seq0, Dials: f.dials, ReadBuf: f.readBuf,
			Drain: f.drain, Deadline: f.connectTimeout, Receivers: f.receivers, Loops: f.leanLoops}
		var w *workerProc
		var err error
		if procs == 1 {
			w = startInProcess(ctx, e, n)
		} else if w, err = startChild(ctx, e, n); err != nil {
			for _, o := range out {
				o.kill()
			}
			return nil, err
		}
		if err := w.enc.Encode(spec); err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

func startInProcess(ctx context.Context, e *env, n int) *workerProc {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := runWorker(wctx, inR, outW, e.stderr)
		outW.CloseWithError(fmt.Errorf("worker ended: %v", err))
		inR.Close()
		errc <- err
	}()
	return &workerProc{
		n: n, enc: json.NewEncoder(inW), dec: json.NewDecoder(outR), errc: errc,
		wait: func() error { <-done; return nil },
		kill: func() { cancel(); inW.Close(); <-done },
	}
}

// startChild starts worker n as a child process; wrap, when given, is a
// command line that runs it (taskset -c 1).
func startChild(ctx context.Context, e *env, n int, wrap ...string) (*workerProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	argv := append(wrap, exe, "bench", "worker")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	cmd.Stderr = e.stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting worker %d: %w", n, err)
	}
	var once sync.Once
	var werr error
	wait := func() error {
		once.Do(func() { in.Close(); werr = cmd.Wait() })
		return werr
	}
	return &workerProc{
		n: n, pid: cmd.Process.Pid, enc: json.NewEncoder(in), dec: json.NewDecoder(out),
		wait: wait,
		kill: func() {
			_ = cmd.Process.Kill()
			_ = wait()
		},
	}, nil
}

// generatorCPU is the CPU seconds used so far by this process and the
// worker processes.
func generatorCPU(workers []*workerProc) float64 {
	cpu, _ := generatorUse(workers)
	return cpu
}

// generatorUse sums the CPU seconds and resident bytes of this process
// and the worker processes.
func generatorUse(workers []*workerProc) (cpu float64, rss int64) {
	s, _ := readProc(os.Getpid())
	cpu, rss = s.CPU, s.RSS
	for _, w := range workers {
		if w.pid > 0 {
			if c, err := readProc(w.pid); err == nil {
				cpu += c.CPU
				rss += c.RSS
			}
		}
	}
	return cpu, rss
}

func serverUse(pid int, atStart, before, after procSample) *procUse {
	return &procUse{
		PID:               pid,
		CPUS:              after.CPU - before.CPU,
		RSSAtStartMB:      float64(atStart.RSS) / (1 << 20),
		RSSBeforeMB:       float64(before.RSS) / (1 << 20),
		RSSAfterMB:        float64(after.RSS) / (1 << 20),
		CPUConnectPhaseS:  before.CPU - atStart.CPU,
		SampledWindowSecs: after.At.Sub(before.At).Seconds(),
	}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// adminClient calls the admin endpoints the benchmark needs.
type adminClient struct {
	base, token string
}

func (a *adminClient) do(ctx context.Context, method, path string, body, out any) error {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return &statusError{status: resp.StatusCode, msg: fmt.Sprintf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(rb))}
	}
	if out != nil {
		return json.Unmarshal(rb, out)
	}
	return nil
}

// statusError is an admin API answer outside 2xx.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

// disableSendLimits sets the limit of senderRules to 0 (disabled) and
// returns a function that puts the previous document back.
func (a *adminClient) disableSendLimits(ctx context.Context) (restore func(context.Context) error, err error) {
	return a.disableRules(ctx, senderRules)
}

// disableRules sets the limit of the named rules to 0 (disabled) and
// returns a function that puts the previous document back.
func (a *adminClient) disableRules(ctx context.Context, names []string) (restore func(context.Context) error, err error) {
	var prev json.RawMessage
	if err := a.do(ctx, http.MethodGet, "/admin/v1/limits", nil, &prev); err != nil {
		var se *statusError
		if errors.As(err, &se) && se.status == http.StatusNotFound {
			// A server without runtime limits: nothing to disable.
			return func(context.Context) error { return nil }, nil
		}
		return nil, fmt.Errorf("-limits off: %w", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(prev, &doc); err != nil {
		return nil, fmt.Errorf("-limits off: %w", err)
	}
	rules, _ := doc["rules"].(map[string]any)
	if rules == nil {
		rules = map[string]any{}
		doc["rules"] = rules
	}
	for _, name := range names {
		r, _ := rules[name].(map[string]any)
		if r == nil {
			r = map[string]any{"algorithm": "gcra", "window": "1s"}
			rules[name] = r
		}
		r["limit"] = 0
	}
	if err := a.do(ctx, http.MethodPut, "/admin/v1/limits", doc, nil); err != nil {
		return nil, fmt.Errorf("-limits off: %w", err)
	}
	return func(ctx context.Context) error {
		return a.do(ctx, http.MethodPut, "/admin/v1/limits", prev, nil)
	}, nil
}

func (a *adminClient) createGroup(ctx context.Context, name, owner string) (wire.Group, error) {
	var g wire.Group
	err := a.do(ctx, http.MethodPost, "/v1/groups", wire.CreateGroupRequest{Name: name, Owner: owner}, &g)
	return g, err
}

func (a *adminClient) addMembers(ctx context.Context, gid int64, uids []string) error {
	return a.do(ctx, http.MethodPost, "/v1/groups/"+strconv.FormatInt(gid, 10)+"/members", wire.AddMembersRequest{UIDs: uids}, nil)
}

// print writes the result for people.
func (r *broadcastResult) print(w io.Writer) {
	fmt.Fprintf(w, "fanfare bench broadcast: group %d, %d members, %d online (%d connected, %d failed, %.1fs, %d procs, %s receivers)\n",
		r.GID, r.Members, r.Online, r.Connected, r.ConnectFailed, r.ConnectS, r.Procs, r.Receivers)
	fmt.Fprintf(w, "  senders   %d at %.0f msg/s for %.0fs (+%.0fs warmup), %d-byte bodies\n", r.Senders, r.Rate, r.DurationS, r.WarmupS, r.BodyBytes)
	errs := "none"
	if len(r.SendErrors) > 0 {
		b, _ := json.Marshal(r.SendErrors)
		errs = string(b)
	}
	fmt.Fprintf(w, "  sends     %d sent, %d acked, errors %s; ack p50 %.2f ms, p99 %.2f ms, p999 %.2f ms; worst lag behind schedule %.1f ms\n",
		r.Sent, r.Acked, errs, r.AckLatencyMS.P50, r.AckLatencyMS.P99, r.AckLatencyMS.P999, r.SendLagMS)
	fmt.Fprintf(w, "  delivered %d in the window, %.0f deliveries/s\n", r.Deliveries, r.DeliveriesPerS)
	fmt.Fprintf(w, "  latency   send->receive p50 %.2f ms, p99 %.2f ms, p999 %.2f ms, max %.2f ms\n",
		r.LatencyMS.P50, r.LatencyMS.P99, r.LatencyMS.P999, r.LatencyMS.Max)
	fmt.Fprintf(w, "  ledger    lost (acked, not delivered by the end of the drain) %d, duplicates %d, out of order %d (pulled %d, pushes deduped %d, gaps %d, resyncs %d, degraded notices %d, reconnects %d; drain %.1fs)\n",
		r.Lost, r.Duplicates, r.OutOfOrder, r.Pulled, r.SDKDups, r.Gaps, r.Resyncs, r.Degraded, r.Reconnects, r.DrainS)
	if r.Receivers == receiversLean {
		fmt.Fprintf(w, "  lean      summaries %d, unreadable frames %d, disconnects %d\n", r.Summaries, r.BadFrames, r.Disconnects)
	}
	if s := r.Server; s != nil {
		fmt.Fprintf(w, "  server    pid %d: %.2f CPU s over %.1fs = %.2f CPU s per million deliveries; RSS %.0f MB before connect, %.0f MB -> %.0f MB (%.1f KB per connection)\n",
			s.PID, s.CPUS, s.SampledWindowSecs, s.CPUSPerMillion, s.RSSAtStartMB, s.RSSBeforeMB, s.RSSAfterMB, s.RSSPerConnKB)
	}
	fmt.Fprintf(w, "  generator %.2f CPU s in the window (%.2f us per delivery); RSS %.0f MB with every receiver connected\n", r.GeneratorCPUS, r.GeneratorUSPerDelivery, r.GeneratorRSSMB)
	for _, s := range r.Warnings {
		fmt.Fprintf(w, "  warning   %s\n", s)
	}
}
