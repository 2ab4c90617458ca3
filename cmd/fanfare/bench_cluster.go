package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"

	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// bench cluster puts one group's members online across fanfared nodes in
// cluster mode (one Postgres, one Redis, as many nodes as the online count
// needs at -per-node connections each) and measures what a message costs
// there. For each -online count it starts fresh nodes on a Redis prefix of
// their own (the group and its members stay in the Postgres schema across
// counts), connects the members as kernel receivers (bench_kernel.go) in
// one worker process per node, each worker bound to a loopback source
// address of its own (127.0.0.2, .3, ...: every address has its own
// ephemeral ports), and publishes over HTTP at -rate, round-robin over the
// nodes, as the group's owner with the admin token. The receivers' ledger
// counts the server's seqs and repairs by pull what a gap, a resync or a
// summary says is missing, as a client does: lost is what no push and no
// pull brought by the end of the drain.
//
// Server CPU is the sum over the nodes from /proc over the measured
// window and the drain, gross and net of the nodes' idle CPU measured just
// before publishing (heartbeats, presence and bus upkeep). Memory is each
// node's RSS growth over its connections, and what a connection costs the
// machine with both its ends: the RSS growth of the nodes and the receiver
// processes plus the kernel slab's (sockets, files, epoll items), which is
// what bounds the online count of one machine.

// clusterFlags are the settings of bench cluster.
type clusterFlags struct {
	online                  string
	members                 int
	perNode                 int
	rate                    float64
	duration, warmup, drain time.Duration
	settle, idleWindow      time.Duration
	connectTimeout          time.Duration
	bodyBytes               int
	fanfared                string
	postgresURL, schema     string
	redisAddr               string
	loops, dials            int
	maxInflight             int
	lock                    string
	jsonOut                 bool
	jsonFile                string
	nodeArgs                string
	logDir                  string
	goMaxProcs              int
}

// clusterFDReserve is what a node's descriptor limit must keep beside its
// -per-node connections (listeners, Postgres and Redis pools, logs).
const clusterFDReserve = 500

func (f *clusterFlags) register(fs *cmdFlags, e *env) {
	fs.StringVar(&f.online, "online", "20000,50000,100000,200000", "members online at once, comma-separated: one run each, on fresh nodes")
	fs.IntVar(&f.members, "members", 0, "members of the group (created once, kept across runs); 0 = the largest -online")
	fs.IntVar(&f.perNode, "per-node", 18000, "most connections per fanfared node (and per receiver process): nodes = online / per-node, rounded up; below the descriptor limit minus a reserve of "+strconv.Itoa(clusterFDReserve))
	fs.Float64Var(&f.rate, "rate", 0.2, "messages published per second (each is one delivery per online member: at one write per delivery, 200,000 online at 1 msg/s need more than 2 cores; docs/benchmarks.md)")
	fs.DurationVar(&f.duration, "duration", 30*time.Second, "measured publishing time")
	fs.DurationVar(&f.warmup, "warmup", 5*time.Second, "publishing before the measurement starts")
	fs.DurationVar(&f.drain, "drain", 30*time.Second, "longest wait after the last publish for every receiver to have every message, by push or pull")
	fs.DurationVar(&f.settle, "settle", 5*time.Second, "wait after every receiver is connected before memory is read (then until the nodes' RSS stops growing, at most 20s more)")
	fs.DurationVar(&f.idleWindow, "idle-window", 5*time.Second, "how long the nodes' idle CPU is measured before publishing")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", 8*time.Minute, "bound on connecting every receiver of a run")
	fs.IntVar(&f.bodyBytes, "body-bytes", 100, "message body size (bytes of JSON)")
	fs.StringVar(&f.fanfared, "fanfared", "", "fanfared binary; empty = fanfared beside this binary, else on PATH")
	secretVar(fs.FlagSet, e, &f.postgresURL, "postgres-url", "FANFARE_POSTGRES_URL", "Postgres `URL` of a throwaway server the nodes share")
	fs.StringVar(&f.schema, "postgres-schema", "", "Postgres schema of the run's tables; empty = a fresh one, dropped at the end")
	fs.StringVar(&f.redisAddr, "redis-addr", e.getenv("FANFARE_REDIS_ADDR"), "Redis host:port the nodes share, a throwaway server; each run takes a key prefix of its own (FANFARE_REDIS_ADDR)")
	fs.IntVar(&f.loops, "loops", 1, "epoll loops per receiver process")
	fs.IntVar(&f.dials, "dials", 32, "concurrent dials per receiver process")
	fs.IntVar(&f.maxInflight, "max-inflight", 16, "most publish requests in flight")
	fs.StringVar(&f.lock, "lock", "", "a file to flock around each run (docs/benchmarks.md uses /tmp/fanfare-bench.lock); empty = none")
	fs.BoolVar(&f.jsonOut, "json", false, "print the results as JSON instead of a table")
	fs.StringVar(&f.jsonFile, "json-out", "", "also write the results as JSON to this file (after each run)")
	fs.StringVar(&f.nodeArgs, "node-args", "-presence-interval 30s", "more fanfared flags for every node, space-separated (the default keeps the presence count frames, pushed to every member each round while the count changes, from starving the connect phase; docs/benchmarks.md)")
	fs.StringVar(&f.logDir, "log-dir", "", "keep the nodes' logs (node-<online>-<n>.log) in this directory; empty = a temporary one, removed at the end")
	fs.IntVar(&f.goMaxProcs, "gomaxprocs", 1, "GOMAXPROCS of every node and receiver process: with dozens of processes on a few cores, one P each keeps the run queue short (Redis and Postgres get their turn); 0 = Go's default (the CPUs)")
}

func (f *clusterFlags) validate() error {
	var errs []error
	counts, err := f.onlineCounts()
	if err != nil {
		errs = append(errs, err)
	}
	var rl syscall.Rlimit
	limit := 0
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < 1<<31 {
		limit = int(rl.Cur)
	}
	switch {
	case f.perNode < 1:
		errs = append(errs, errors.New("-per-node must be positive"))
	case limit > 0 && f.perNode > limit-clusterFDReserve:
		errs = append(errs, fmt.Errorf("-per-node %d does not fit the descriptor limit %d minus a reserve of %d", f.perNode, limit, clusterFDReserve))
	}
	for _, n := range counts {
		if f.perNode > 0 && (n+f.perNode-1)/f.perNode > 249 {
			errs = append(errs, fmt.Errorf("-online %d needs more than 249 nodes (one source address 127.0.0.2..250 each): raise -per-node", n))
		}
		if f.members > 0 && n > f.members {
			errs = append(errs, fmt.Errorf("-online %d exceeds -members %d", n, f.members))
		}
	}
	if f.members < 0 {
		errs = append(errs, errors.New("-members must not be negative"))
	}
	if f.rate <= 0 || f.duration <= 0 || f.warmup < 0 || f.drain < 0 || f.settle < 0 || f.idleWindow < 0 || f.connectTimeout <= 0 {
		errs = append(errs, errors.New("-rate, -duration and -connect-timeout must be positive, -warmup, -drain, -settle and -idle-window not negative"))
	}
	if f.bodyBytes < 48 || f.bodyBytes > 32<<10 {
		errs = append(errs, errors.New("-body-bytes must be within 48..32768"))
	}
	if f.goMaxProcs < 0 {
		errs = append(errs, errors.New("-gomaxprocs must not be negative"))
	}
	if f.loops < 1 || f.loops > 64 || f.dials < 1 || f.maxInflight < 1 {
		errs = append(errs, errors.New("-loops within 1..64, -dials and -max-inflight positive"))
	}
	if f.postgresURL == "" || f.redisAddr == "" {
		errs = append(errs, errors.New("-postgres-url and -redis-addr are required (throwaway servers: .ci/bench-cluster starts them)"))
	}
	return errors.Join(errs...)
}

func (f *clusterFlags) onlineCounts() ([]int, error) {
	var out []int
	for _, s := range splitList(f.online) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-online: %q is not a positive count", s)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("-online: no count")
	}
	return out, nil
}

// clusterPoint is the outcome of one -online count.
type clusterPoint struct {
	Online  int        `json:"online"`
	Nodes   int        `json:"nodes"`
	Err     string     `json:"error,omitempty"`
	LoadAvg [2]float64 `json:"load"` // 1-minute load average before and after
	// Connected receivers, and those that could not connect (the first
	// error): what stopped a run that went too far.
	Connected     int     `json:"connected"`
	ConnectFailed int     `json:"connect_failed"`
	ConnectErr    string  `json:"connect_error,omitempty"`
	ConnectS      float64 `json:"connect_s"`
	Published     int64   `json:"published"`
	Acked         int64   `json:"acked"`
	PublishErrors int64   `json:"publish_errors"`
	PublishErr    string  `json:"publish_error,omitempty"`
	PublishLagS   float64 `json:"publish_lag_s"`
	// Deliveries are of the messages published in the window.
	Deliveries int64     `json:"deliveries"`
	LatencyMS  quantiles `json:"latency_ms"`
	Lost       int64     `json:"lost"`
	Duplicates int64     `json:"duplicates"`
	OutOfOrder int64     `json:"out_of_order"`
	Gaps       uint64    `json:"gaps"`
	Resyncs    int64     `json:"resyncs"`
	Summaries  int64     `json:"summaries"`
	Pulls      int64     `json:"pulls"`
	Pulled     uint64    `json:"pulled"`
	PullErrors int64     `json:"pull_errors"`
	BadFrames  int64     `json:"bad_frames"`
	// Disconnects are receivers the server closed before the end;
	// FirstClose the first close frame's code and reason (empty when the
	// connections ended without one).
	Disconnects int64   `json:"disconnects"`
	FirstClose  string  `json:"first_close,omitempty"`
	DrainS      float64 `json:"drain_s"`
	// ServerCPUS is the nodes' CPU over CPUWindowS (the measured window
	// and the drain); IdleCPUPerS their CPU per second before publishing.
	ServerCPUS  float64 `json:"server_cpu_s"`
	CPUWindowS  float64 `json:"cpu_window_s"`
	IdleCPUPerS float64 `json:"idle_cpu_per_s"`
	// USPerDelivery is ServerCPUS per delivery in microseconds;
	// NetUSPerDelivery leaves out the idle CPU of the same time.
	USPerDelivery    float64 `json:"us_per_delivery"`
	NetUSPerDelivery float64 `json:"net_us_per_delivery"`
	// NodeKBPerConn is each node's RSS growth per connection, the mean
	// over the nodes and the largest.
	NodeKBPerConn    float64   `json:"node_kb_per_conn"`
	NodeKBPerConnMax float64   `json:"node_kb_per_conn_max"`
	NodeRSSMB        []float64 `json:"node_rss_mb"`
	// MachineKBPerConn is what one connection costs the machine, both
	// ends: ProcsKBPerConn, the RSS growth of the nodes and the receiver
	// processes over the connections, plus SlabKBPerConn, the growth of
	// the kernel's slab (sockets, files, epoll items). MemAvailableKBPerConn
	// is the drop of MemAvailable over the connections: the same and the
	// rest of the machine, noisy on a shared one.
	MachineKBPerConn      float64 `json:"machine_kb_per_conn"`
	ProcsKBPerConn        float64 `json:"procs_kb_per_conn"`
	SlabKBPerConn         float64 `json:"slab_kb_per_conn"`
	MemAvailableKBPerConn float64 `json:"mem_available_kb_per_conn"`
	MemAvailableMB        float64 `json:"mem_available_mb"` // with every receiver connected
	// NodesStartMB is the drop of MemAvailable while the nodes started,
	// before any receiver connected.
	NodesStartMB   float64 `json:"nodes_start_mb"`
	TCPInUse       int64   `json:"tcp_inuse"`  // /proc/net/sockstat
	TCPMemMB       float64 `json:"tcp_mem_mb"` // pages of TCP buffers, /proc/net/sockstat
	Conntrack      int64   `json:"conntrack"`  // nf_conntrack_count (-1 when absent)
	GeneratorRSSMB float64 `json:"generator_rss_mb"`
}

// clusterResult is everything bench cluster measured.
type clusterResult struct {
	Rate      float64        `json:"rate"`
	DurationS float64        `json:"duration_s"`
	BodyBytes int            `json:"body_bytes"`
	Members   int            `json:"members"`
	PerNode   int            `json:"per_node"`
	GID       int64          `json:"gid"`
	AddS      float64        `json:"members_added_s"`
	Points    []clusterPoint `json:"points"`
}

func benchCluster(ctx context.Context, e *env, args []string) error {
	fs := newFlags("bench cluster", "[-online 20000,50000,100000,200000] [-per-node 18000] [-rate 1] -postgres-url URL -redis-addr ADDR [...]", `
Puts -online members of one group online at once across fanfared nodes in
cluster mode, on the given throwaway Postgres and Redis: as many fresh
nodes as -per-node needs for each count, kernel-timestamping receivers in
one process per node, each bound to a loopback source address of its own.
Publishes -rate messages over HTTP and checks the ledger: every receiver
got every acknowledged message, by push or by a pull after a gap, a resync
or a summary (lost 0). Prints, per count: send->receive p50/p99, server
CPU per delivery (all nodes, gross and net of their idle CPU), RSS per
connection per node, machine memory per connection, and the growth of
each from the first count.`)
	var f clusterFlags
	f.register(fs, e)
	if err := fs.parse(e, args); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return fs.usageErr("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	le := *e
	le.stderr = &lockedWriter{w: e.stderr}
	res, err := runCluster(ctx, &le, &f)
	if res != nil {
		if f.jsonOut {
			enc := json.NewEncoder(e.stdout)
			enc.SetIndent("", "  ")
			if jerr := enc.Encode(res); jerr != nil && err == nil {
				err = jerr
			}
		} else {
			res.print(e.stdout)
		}
	}
	return err
}

// clusterSecret signs the receivers' tokens and is the nodes' admin
// token.
const clusterSecret = "bench-cluster-secret-0123456789abcdef0123456789"

// clusterOwner is the group's owner, as whom every message is published.
const clusterOwner = "pub"

// clusterRun is the state of one bench cluster across its counts.
type clusterRun struct {
	f      *clusterFlags
	e      *env
	dir    string
	gid    int64
	n      int64 // publishes so far (their ids)
	res    *clusterResult
	logf   func(string, ...any)
	schema string
	logDir string // the nodes' logs, node-<online>-<n>.log
	online int    // of the run under way
}

func runCluster(ctx context.Context, e *env, f *clusterFlags) (*clusterResult, error) {
	counts, _ := f.onlineCounts()
	members := f.members
	if members == 0 {
		members = slices.Max(counts)
	}
	bin, err := findBinary(f.fanfared, "fanfared")
	if err != nil {
		return nil, fmt.Errorf("-fanfared: %w", err)
	}
	f.fanfared = bin
	dir, err := os.MkdirTemp("", "fanfare-cluster-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "limits.json"), []byte(peerFanfareLimits), 0o644); err != nil {
		return nil, err
	}
	c := &clusterRun{f: f, e: e, dir: dir, schema: f.schema, logDir: f.logDir,
		res:  &clusterResult{Rate: f.rate, DurationS: f.duration.Seconds(), BodyBytes: f.bodyBytes, Members: members, PerNode: f.perNode},
		logf: func(format string, a ...any) { fmt.Fprintf(e.stderr, "bench cluster: "+format+"\n", a...) }}
	if c.logDir == "" {
		c.logDir = dir
	} else if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return nil, err
	}
	if c.schema == "" {
		c.schema = "bench_" + randHex(4)
		if err := createSchema(ctx, f.postgresURL, c.schema); err != nil {
			return nil, err
		}
		defer func() {
			if err := dropSchema(f.postgresURL, c.schema); err != nil {
				c.logf("dropping schema %s: %v", c.schema, err)
			}
		}()
	}
	for _, n := range counts {
		if ctx.Err() != nil {
			return c.res, ctx.Err()
		}
		var p clusterPoint
		err := withLock(f.lock, func() error {
			var err error
			p, err = c.point(ctx, n)
			return err
		})
		if err != nil {
			p.Err = err.Error()
			c.logf("%d online: %v", n, err)
		} else {
			c.logf("%d online on %d nodes: p50 %.1f ms, p99 %.1f ms, %.2f us/delivery (%.2f net), %.2f KB/conn per node, %.2f KB/conn machine, lost %d, pulled %d (load %.1f -> %.1f)",
				n, p.Nodes, p.LatencyMS.P50, p.LatencyMS.P99, p.USPerDelivery, p.NetUSPerDelivery, p.NodeKBPerConn, p.MachineKBPerConn, p.Lost, p.Pulled, p.LoadAvg[0], p.LoadAvg[1])
		}
		c.res.Points = append(c.res.Points, p)
		c.save()
		if p.Connected == 0 && p.Err != "" && c.gid == 0 {
			return c.res, err // nothing ran: the next counts would fail the same way
		}
	}
	return c.res, nil
}

func (c *clusterRun) save() {
	if c.f.jsonFile == "" {
		return
	}
	b, _ := json.MarshalIndent(c.res, "", "  ")
	if err := os.WriteFile(c.f.jsonFile, append(b, '\n'), 0o644); err != nil {
		c.logf("-json-out: %v", err)
	}
}

func dropSchema(url, schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	return err
}

// clusterNode is one fanfared process of a run.
type clusterNode struct {
	n        int
	cmd      *exec.Cmd
	http, ws string
	log      string
	done     chan struct{}
}

func (nd *clusterNode) pid() int { return nd.cmd.Process.Pid }

// stop ends the node (SIGTERM, then SIGKILL after 20s).
func (nd *clusterNode) stop() {
	_ = nd.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-nd.done:
	case <-time.After(20 * time.Second):
		_ = nd.cmd.Process.Kill()
		<-nd.done
	}
}

// startNode starts node n and waits for its /readyz.
func (c *clusterRun) startNode(ctx context.Context, n int, args []string) (*clusterNode, error) {
	wsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	nd := &clusterNode{n: n, http: "http://" + httpAddr, ws: "ws://" + wsAddr + "/ws",
		log: filepath.Join(c.logDir, "node-"+strconv.Itoa(c.online)+"-"+strconv.Itoa(n)+".log"), done: make(chan struct{})}
	logf, err := os.Create(nd.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	args = append([]string{"-ws-addr", wsAddr, "-http-addr", httpAddr, "-node-id", "bench-n" + strconv.Itoa(n)}, args...)
	nd.cmd = exec.Command(c.f.fanfared, args...)
	nd.cmd.Stdout, nd.cmd.Stderr = logf, logf
	nd.cmd.Env = soakChildEnv()
	if c.f.goMaxProcs > 0 {
		nd.cmd.Env = append(nd.cmd.Env, "GOMAXPROCS="+strconv.Itoa(c.f.goMaxProcs))
	}
	if err := nd.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting node %d: %w", n, err)
	}
	go func() { _ = nd.cmd.Wait(); close(nd.done) }()
	switch err := waitReady(ctx, nd.http, nd.done); {
	case err == nil:
		return nd, nil
	case errors.Is(err, errExited):
		b, _ := os.ReadFile(nd.log)
		return nil, fmt.Errorf("node %d exited at start: %s", n, lastLines(b, 5))
	default:
		nd.stop()
		return nil, fmt.Errorf("node %d: %w", n, err)
	}
}

// startNodes starts k fresh nodes on a Redis prefix of their own: the
// first alone (it applies the schema), the others together.
func (c *clusterRun) startNodes(ctx context.Context, k int) ([]*clusterNode, error) {
	f := c.f
	args := []string{"-postgres-url", f.postgresURL, "-postgres-schema", c.schema, "-redis-addr", f.redisAddr,
		"-redis-prefix", "bench" + randHex(3) + ":", "-expected-nodes", strconv.Itoa(k),
		"-jwt-secret", clusterSecret, "-admin-token", clusterSecret, "-room-token-secret", randHex(32),
		"-limits-file", filepath.Join(c.dir, "limits.json"),
		"-group-rate", "-1", "-downlink-rate", "-1", "-hot-factor", "-1", "-max-conns-per-user", "0",
		"-max-conns", strconv.Itoa(f.perNode + 100), "-shutdown-timeout", "5s", "-log-level", "warn"}
	args = append(args, strings.Fields(f.nodeArgs)...)
	nodes := make([]*clusterNode, k)
	first, err := c.startNode(ctx, 1, args)
	if err != nil {
		return nil, err
	}
	nodes[0] = first
	var wg sync.WaitGroup
	errs := make([]error, k)
	for i := 1; i < k; i++ {
		wg.Go(func() { nodes[i], errs[i] = c.startNode(ctx, i+1, args) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		stopNodes(nodes)
		return nil, err
	}
	return nodes, nil
}

func stopNodes(nodes []*clusterNode) {
	var wg sync.WaitGroup
	for _, nd := range nodes {
		if nd != nil {
			wg.Go(nd.stop)
		}
	}
	wg.Wait()
}

// clusterMemberUID is the uid of member i.
func clusterMemberUID(i int) string { return "m" + strconv.Itoa(i) }

// createGroup creates the group and adds its members in chunks of 5,000
// (the store takes 10,000 at most per call), a few requests at once over
// the nodes.
func (c *clusterRun) createGroup(ctx context.Context, nodes []*clusterNode) error {
	start := time.Now()
	adm := &adminClient{base: nodes[0].http, token: clusterSecret}
	g, err := adm.createGroup(ctx, "bench-cluster", clusterOwner)
	if err != nil {
		return err
	}
	members := c.res.Members
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan [2]int)
	)
	for w := range 4 {
		a := &adminClient{base: nodes[w%len(nodes)].http, token: clusterSecret}
		wg.Go(func() {
			for rg := range next {
				uids := make([]string, 0, rg[1]-rg[0]+1)
				if rg[0] == 0 {
					uids = append(uids, clusterOwner) // the owner publishes: admin sends are as the owner, a member
				}
				for i := rg[0]; i < rg[1]; i++ {
					uids = append(uids, clusterMemberUID(i))
				}
				if err := a.addMembers(ctx, g.GID, uids); err != nil {
					mu.Lock()
					first = firstErr(first, err)
					mu.Unlock()
				}
			}
		})
	}
	for lo := 0; lo < members; lo += 5000 {
		next <- [2]int{lo, min(lo+5000, members)}
	}
	close(next)
	wg.Wait()
	if first != nil {
		return fmt.Errorf("adding members: %w", first)
	}
	c.gid = g.GID
	c.res.GID = g.GID
	c.res.AddS = time.Since(start).Seconds()
	c.logf("group %d: %d members added in %.1fs", g.GID, members, c.res.AddS)
	return nil
}

// firstErr keeps the first error.
func firstErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// lastSeq reads the group's last seq as its owner.
func (c *clusterRun) lastSeq(ctx context.Context, node *clusterNode) (int64, error) {
	signer, err := auth.NewSigner(auth.SignerConfig{Secret: []byte(clusterSecret)})
	if err != nil {
		return 0, err
	}
	tok, err := signer.Sign(clusterOwner, 0, time.Hour)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, node.http+"/v1/groups/"+strconv.FormatInt(c.gid, 10)+"/messages?from_seq="+strconv.FormatInt(1<<50, 10), nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("reading the group's last seq: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var page wire.Messages
	if err := json.Unmarshal(b, &page); err != nil {
		return 0, err
	}
	return page.LastSeq, nil
}

// point runs one online count on fresh nodes.
func (c *clusterRun) point(ctx context.Context, online int) (p clusterPoint, err error) {
	f := c.f
	k := (online + f.perNode - 1) / f.perNode
	p = clusterPoint{Online: online, Nodes: k}
	c.online = online
	p.LoadAvg[0] = loadAvg()
	defer func() { p.LoadAvg[1] = loadAvg() }()
	memStart := memAvailable()
	c.logf("%d online: starting %d nodes", online, k)
	nodes, err := c.startNodes(ctx, k)
	if err != nil {
		return p, err
	}
	defer stopNodes(nodes)
	if c.gid == 0 {
		if err := c.createGroup(ctx, nodes); err != nil {
			return p, err
		}
	}
	seq0, err := c.lastSeq(ctx, nodes[0])
	if err != nil {
		return p, err
	}
	time.Sleep(time.Second) // the nodes' start-up settles
	rssBefore := make([]int64, k)
	for i, nd := range nodes {
		s, err := readProc(nd.pid())
		if err != nil {
			return p, err
		}
		rssBefore[i] = s.RSS
	}
	memBefore, slabBefore := memAvailable(), meminfo("Slab:")

	// Receivers: worker i connects its share to node i from 127.0.0.(2+i).
	per := (online + k - 1) / k
	connStart := time.Now()
	var workers []*workerProc
	defer func() {
		for _, w := range workers {
			w.kill()
		}
	}()
	for i, nd := range nodes {
		lo, hi := i*per, min((i+1)*per, online)
		spec := workerSpec{WS: nd.ws, GID: c.gid, Prefix: "m", Lo: lo, Hi: hi, Secret: clusterSecret,
			Addrs: []string{"127.0.0." + strconv.Itoa(2+i)}, PerAddr: per + 1, Seq0: seq0, Dials: f.dials, ReadBuf: 4096,
			Drain: f.drain, Deadline: f.connectTimeout, Receivers: receiversKernel, Loops: f.loops, Peer: peerFanfare, Seqs: true, GCPercent: 50, GoMaxProcs: f.goMaxProcs}
		w, err := startChild(ctx, c.e, i)
		if err != nil {
			return p, err
		}
		workers = append(workers, w)
		if err := w.enc.Encode(spec); err != nil {
			return p, err
		}
	}
	conns := make([]int, k)
	for i, w := range workers {
		var r workerReady
		if err := w.dec.Decode(&r); err != nil {
			return p, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
		conns[i] = r.Ready
		p.Connected += r.Ready
		p.ConnectFailed += r.Failed
		if p.ConnectErr == "" {
			p.ConnectErr = r.FirstErr
		}
	}
	p.ConnectS = time.Since(connStart).Seconds()
	c.logf("%d online: %d connected in %.1fs (%d failed%s)", online, p.Connected, p.ConnectS, p.ConnectFailed,
		map[bool]string{true: ": " + p.ConnectErr, false: ""}[p.ConnectErr != ""])
	if p.Connected == 0 {
		return p, fmt.Errorf("no receiver connected: %s", p.ConnectErr)
	}

	// Memory once the nodes' RSS has settled.
	nodeRSS := func() (total int64, each []int64) {
		each = make([]int64, k)
		for i, nd := range nodes {
			if s, err := readProc(nd.pid()); err == nil {
				each[i] = s.RSS
				total += s.RSS
			}
		}
		return total, each
	}
	if !sleepCtx(ctx, f.settle) {
		return p, ctx.Err()
	}
	total, each := nodeRSS()
	for settle := time.Now(); time.Since(settle) < 20*time.Second; {
		if !sleepCtx(ctx, time.Second) {
			return p, ctx.Err()
		}
		t, e := nodeRSS()
		grew := t > total+total/100
		total, each = t, e
		if !grew {
			break
		}
	}
	var sum float64
	for i := range nodes {
		p.NodeRSSMB = append(p.NodeRSSMB, float64(each[i])/(1<<20))
		if conns[i] > 0 {
			kb := float64(each[i]-rssBefore[i]) / 1024 / float64(conns[i])
			sum += kb
			p.NodeKBPerConnMax = max(p.NodeKBPerConnMax, kb)
		}
	}
	p.NodeKBPerConn = sum / float64(k)
	memAfter := memAvailable()
	p.MemAvailableMB = float64(memAfter) / (1 << 20)
	if memBefore > 0 && memAfter > 0 {
		p.MemAvailableKBPerConn = float64(memBefore-memAfter) / 1024 / float64(p.Connected)
		p.NodesStartMB = float64(memStart-memBefore) / (1 << 20)
	}
	p.TCPInUse, p.TCPMemMB = sockstatTCP()
	p.Conntrack = conntrackCount()
	_, grss := generatorUse(workers)
	p.GeneratorRSSMB = float64(grss) / (1 << 20)
	var before int64
	for _, b := range rssBefore {
		before += b
	}
	p.ProcsKBPerConn = float64(total-before+grss) / 1024 / float64(p.Connected)
	p.SlabKBPerConn = float64(meminfo("Slab:")-slabBefore) / 1024 / float64(p.Connected)
	p.MachineKBPerConn = p.ProcsKBPerConn + p.SlabKBPerConn

	// Idle CPU of the nodes.
	nodeCPU := func() float64 {
		var s float64
		for _, nd := range nodes {
			if ps, err := readProc(nd.pid()); err == nil {
				s += ps.CPU
			}
		}
		return s
	}
	idle0, idleAt := nodeCPU(), time.Now()
	if !sleepCtx(ctx, f.idleWindow) {
		return p, ctx.Err()
	}
	if d := time.Since(idleAt).Seconds(); d > 0 && f.idleWindow > 0 {
		p.IdleCPUPerS = (nodeCPU() - idle0) / d
	}

	// Publish: warmup, then the measured window.
	start := time.Now().Add(100 * time.Millisecond)
	measureFrom, measureTo := start.Add(f.warmup), start.Add(f.warmup+f.duration)
	for _, w := range workers {
		if err := w.enc.Encode(workerCmd{Op: "go", MeasureFrom: measureFrom.UnixNano(), MeasureTo: measureTo.UnixNano()}); err != nil {
			return p, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
	}
	var cpuBefore float64
	var cpuAt time.Time
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		if sleepUntil(ctx, measureFrom) {
			cpuBefore, cpuAt = nodeCPU(), time.Now()
		}
	}()
	ps := c.publish(ctx, nodes, start, measureTo)
	<-sampled
	if ctx.Err() != nil {
		return p, ctx.Err()
	}
	p.Published, p.Acked, p.PublishErrors = ps.published, int64(len(ps.acked)), ps.errs
	p.PublishLagS = ps.lag.Seconds()
	if ps.firstErr != nil {
		p.PublishErr = ps.firstErr.Error()
		c.logf("%d online: %d publish errors, first: %v", online, ps.errs, ps.firstErr)
	}
	ranges := seqRanges(ps.acked)
	for _, w := range workers {
		if err := w.enc.Encode(workerCmd{Op: "stop", Acked: ranges}); err != nil {
			return p, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
	}
	hist := newLatencyHist()
	for _, w := range workers {
		var wr workerResult
		if err := w.dec.Decode(&wr); err != nil {
			return p, fmt.Errorf("worker %d: %w", w.n, w.failure(err))
		}
		p.Deliveries += wr.Measured
		p.Lost += wr.Lost
		p.Duplicates += wr.Duplicates
		p.OutOfOrder += wr.OutOfOrder
		p.Gaps += wr.Gaps
		p.Resyncs += wr.Resyncs
		p.Summaries += wr.Summaries
		p.Pulls += wr.Pulls
		p.Pulled += wr.Pulled
		p.PullErrors += wr.PullErrors
		p.BadFrames += wr.BadFrames
		p.Disconnects += wr.Disconnects
		if p.FirstClose == "" {
			p.FirstClose = wr.FirstClose
		}
		p.DrainS = max(p.DrainS, wr.DrainS)
		if wr.Latency != nil {
			hist.Merge(hdrhistogram.Import(wr.Latency))
		}
	}
	// Every worker is drained.
	p.ServerCPUS = nodeCPU() - cpuBefore
	p.CPUWindowS = time.Since(cpuAt).Seconds()
	p.LatencyMS = quantilesOf(hist)
	if p.Deliveries > 0 {
		p.USPerDelivery = p.ServerCPUS * 1e6 / float64(p.Deliveries)
		p.NetUSPerDelivery = max(0, p.ServerCPUS-p.IdleCPUPerS*p.CPUWindowS) * 1e6 / float64(p.Deliveries)
	}
	for _, w := range workers {
		if err := w.wait(); err != nil {
			c.logf("worker %d: %v", w.n, err)
		}
	}
	workers = nil
	return p, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	return sleepUntil(ctx, time.Now().Add(d))
}

// publish posts one message per 1/rate from start until end, open loop
// (at most -max-inflight outstanding), round-robin over the nodes, and
// returns the seqs the nodes answered.
func (c *clusterRun) publish(ctx context.Context, nodes []*clusterNode, start, end time.Time) (st peerPubStats) {
	f := c.f
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: f.maxInflight, MaxConnsPerHost: f.maxInflight}}
	defer hc.CloseIdleConnections()
	interval := time.Duration(float64(time.Second) / f.rate)
	sem := make(chan struct{}, f.maxInflight)
	var mu sync.Mutex
	var wg sync.WaitGroup
	k := 0
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
		c.n++
		id := "b" + strconv.FormatInt(c.n, 10)
		url := nodes[k%len(nodes)].http + "/v1/groups/" + strconv.FormatInt(c.gid, 10) + "/messages"
		k++
		req := append([]byte(`{"id":"`+id+`","body":`), peerBody(next.UnixNano(), c.n, f.bodyBytes)...)
		req = append(req, '}')
		mu.Lock()
		st.lag = max(st.lag, time.Since(next))
		mu.Unlock()
		wg.Go(func() {
			defer func() { <-sem }()
			rb, err := postJSON(ctx, hc, url, req, "Authorization", "Bearer "+clusterSecret, "X-Idempotency-Key", id)
			var ack struct {
				Seq int64 `json:"seq"`
			}
			if err == nil {
				if err = json.Unmarshal(rb, &ack); err == nil && ack.Seq <= 0 {
					err = fmt.Errorf("publish answered %s", bytes.TrimSpace(rb))
				}
			}
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
			st.acked = append(st.acked, ack.Seq)
		})
	}
	wg.Wait()
	return st
}

// memAvailable is /proc/meminfo's MemAvailable in bytes (0 when unknown).
func memAvailable() int64 { return meminfo("MemAvailable:") }

// meminfo is the field of /proc/meminfo named key ("Slab:"), in bytes (0
// when unknown).
func meminfo(key string) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte(key)); ok {
			if f := bytes.Fields(rest); len(f) >= 1 {
				kb, _ := strconv.ParseInt(string(f[0]), 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// sockstatTCP reads the TCP line of /proc/net/sockstat: sockets in use
// and the pages of their buffers, in MB.
func sockstatTCP() (inuse int64, memMB float64) {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return 0, 0
	}
	for line := range bytes.Lines(b) {
		rest, ok := bytes.CutPrefix(line, []byte("TCP:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		for i := 0; i+1 < len(f); i += 2 {
			v, _ := strconv.ParseInt(string(f[i+1]), 10, 64)
			switch string(f[i]) {
			case "inuse":
				inuse = v
			case "mem":
				memMB = float64(v*int64(os.Getpagesize())) / (1 << 20)
			}
		}
	}
	return inuse, memMB
}

// conntrackCount is the kernel's tracked connections, -1 without
// connection tracking.
func conntrackCount() int64 {
	b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
	if err != nil {
		return -1
	}
	v, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return -1
	}
	return v
}

// print writes the results for people: one row per count, then each
// measure's growth from the first count.
func (r *clusterResult) print(w io.Writer) {
	fmt.Fprintf(w, "fanfare bench cluster: group %d of %d members, %.3g msg/s of %d bytes for %.0fs, fresh nodes of at most %d connections per count\n\n",
		r.GID, r.Members, r.Rate, r.BodyBytes, r.DurationS, r.PerNode)
	fmt.Fprintf(w, "%8s %5s %9s %8s %8s %9s %9s %9s %9s %8s %6s %7s %7s %5s  %s\n",
		"online", "nodes", "connect s", "p50 ms", "p99 ms", "us/deliv", "net us/d", "KB/conn", "machine", "lost", "pulled", "resyncs", "discon", "load", "error")
	for _, p := range r.Points {
		fmt.Fprintf(w, "%8d %5d %9.1f %8.1f %8.1f %9.2f %9.2f %9.2f %9.2f %8d %6d %7d %7d %5.1f  %s\n",
			p.Connected, p.Nodes, p.ConnectS, p.LatencyMS.P50, p.LatencyMS.P99, p.USPerDelivery, p.NetUSPerDelivery,
			p.NodeKBPerConn, p.MachineKBPerConn, p.Lost, p.Pulled, p.Resyncs, p.Disconnects, p.LoadAvg[0], clusterPointErr(p))
	}
	var base *clusterPoint
	for i := range r.Points {
		if r.Points[i].Err == "" && r.Points[i].Deliveries > 0 {
			base = &r.Points[i]
			break
		}
	}
	if base == nil {
		return
	}
	ratio := func(a, b float64) string {
		if b <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	fmt.Fprintf(w, "\ngrowth from %d online:\n", base.Connected)
	fmt.Fprintf(w, "%8s %8s %8s %9s %9s %9s\n", "online", "p50", "p99", "us/deliv", "net us/d", "KB/conn")
	for _, p := range r.Points {
		if p.Err != "" || p.Deliveries == 0 {
			continue
		}
		fmt.Fprintf(w, "%8d %8s %8s %9s %9s %9s\n", p.Connected, ratio(p.LatencyMS.P50, base.LatencyMS.P50), ratio(p.LatencyMS.P99, base.LatencyMS.P99),
			ratio(p.USPerDelivery, base.USPerDelivery), ratio(p.NetUSPerDelivery, base.NetUSPerDelivery), ratio(p.NodeKBPerConn, base.NodeKBPerConn))
	}
}

func clusterPointErr(p clusterPoint) string {
	switch {
	case p.Err != "":
		return p.Err
	case p.ConnectFailed > 0:
		return fmt.Sprintf("%d failed to connect: %s", p.ConnectFailed, p.ConnectErr)
	case p.PublishErrors > 0:
		return fmt.Sprintf("%d publish errors: %s", p.PublishErrors, p.PublishErr)
	}
	return ""
}
