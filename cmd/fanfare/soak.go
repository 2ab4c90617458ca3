package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

func init() {
	register("soak", "a long mixed workload against fanfared nodes it starts itself: a ledger of every message and membership change, resource trends, a report", cmdSoak)
}

// Soak modes.
const (
	soakEmbedded = "embedded"
	soakCluster  = "cluster"
)

// soakFlags are the settings of fanfare soak.
type soakFlags struct {
	mode                     string
	duration, sampleEvery    time.Duration
	drain                    time.Duration
	out, fanfared            string
	postgresURL, redisAddr   string
	nodes                    int
	users, largeMembers      int
	largeGroups, smallGroups int
	smallMembers             int
	rate, largeShare, httpPc float64
	churn, membership, ops   float64
	degradeEvery, degradeFor time.Duration
	surgeEvery               time.Duration
	surgeNormal, surgeVIPs   int
}

func (f *soakFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&f.mode, "mode", soakEmbedded, "embedded (one node, its own data directory) or cluster (-nodes nodes on -postgres-url and -redis-addr)")
	fs.DurationVar(&f.duration, "duration", 2*time.Minute, "how long the workload runs (the first third is the warm-up of the resource test)")
	fs.DurationVar(&f.sampleEvery, "sample-every", 0, "resource sampling interval; 0 = duration/60 within 2s..10s")
	fs.DurationVar(&f.drain, "drain", 90*time.Second, "longest wait, after the workload, for every online client to have every message of its groups")
	fs.StringVar(&f.out, "out", "test-output/soak", "report directory (report.md, report.json, samples.csv, one SVG plot per resource)")
	fs.StringVar(&f.fanfared, "fanfared", "", "fanfared binary; empty = fanfared next to this binary")
	secretVar(fs, e, &f.postgresURL, "postgres-url", "FANFARE_POSTGRES_URL", "cluster mode: Postgres `URL` (a throwaway server: the soak creates a schema of its own)")
	fs.StringVar(&f.redisAddr, "redis-addr", e.getenv("FANFARE_REDIS_ADDR"), "cluster mode: Redis host:port, a throwaway server of the soak's own: DBSIZE counts every key in it (FANFARE_REDIS_ADDR)")
	fs.IntVar(&f.nodes, "nodes", 2, "cluster mode: fanfared nodes")
	fs.IntVar(&f.users, "users", 1500, "users online at once (each a client.Conn)")
	fs.IntVar(&f.largeGroups, "large-groups", 2, "large groups")
	fs.IntVar(&f.largeMembers, "large-members", 1200, "members of the first large group (each next one has half)")
	fs.IntVar(&f.smallGroups, "small-groups", 150, "small groups")
	fs.IntVar(&f.smallMembers, "small-members", 8, "members of a small group at the start")
	fs.Float64Var(&f.rate, "rate", 50, "messages per second, all groups together")
	fs.Float64Var(&f.largeShare, "large-share", 0.08, "fraction of the messages sent to large groups")
	fs.Float64Var(&f.httpPc, "http-share", 0.25, "fraction of the messages sent over HTTP instead of the socket")
	fs.Float64Var(&f.churn, "churn", 4, "reconnects per second (a client closes, stays away 0.2-3s, comes back with its cursors, often on another node)")
	fs.Float64Var(&f.membership, "membership", 2, "membership changes per second, in turn: a new user joins, an online user joins another group, a member is removed, a user leaves for good")
	fs.Float64Var(&f.ops, "ops", 10, "pulls, syncs and read marks per second")
	fs.DurationVar(&f.degradeEvery, "degrade-every", 20*time.Second, "how often a degradation level is forced through PUT /admin/v1/degrade")
	fs.DurationVar(&f.degradeFor, "degrade-for", 6*time.Second, "how long a forced level is held before it is cleared")
	fs.DurationVar(&f.surgeEvery, "surge-every", 30*time.Second, "how often a crowd enters the waiting room, VIPs last")
	fs.IntVar(&f.surgeNormal, "surge-normal", 40, "normal users per surge")
	fs.IntVar(&f.surgeVIPs, "surge-vips", 15, "VIPs per surge (tiers 1-3), entering a second after the others")
}

func (f *soakFlags) validate() error {
	var errs []error
	switch f.mode {
	case soakEmbedded:
		f.nodes = 1
	case soakCluster:
		if f.postgresURL == "" || f.redisAddr == "" {
			errs = append(errs, errors.New("cluster mode needs -postgres-url and -redis-addr (throwaway servers: make soak starts them)"))
		}
		if f.nodes < 1 || f.nodes > 8 {
			errs = append(errs, errors.New("-nodes must be within 1..8"))
		}
	default:
		errs = append(errs, fmt.Errorf("-mode %q: want embedded or cluster", f.mode))
	}
	if f.duration < 30*time.Second {
		errs = append(errs, errors.New("-duration must be at least 30s (a third of it is the warm-up)"))
	}
	if f.sampleEvery == 0 {
		f.sampleEvery = min(max(f.duration/60, 2*time.Second), 10*time.Second)
	}
	if f.sampleEvery < 500*time.Millisecond || f.sampleEvery > f.duration/15 {
		errs = append(errs, errors.New("-sample-every must be within 500ms..duration/15 (each judged third needs samples)"))
	}
	if f.users < 10 || f.largeGroups < 0 || f.smallGroups < 1 || f.smallMembers < 2 || f.largeMembers < 2 || f.largeMembers > f.users {
		errs = append(errs, errors.New("-users >= 10, -small-groups >= 1, -small-members >= 2, -large-members within 2..-users"))
	}
	if f.rate <= 0 || f.rate > 2000 || f.churn < 0 || f.membership < 0 || f.ops < 0 {
		errs = append(errs, errors.New("-rate within (0, 2000]; -churn, -membership, -ops not negative"))
	}
	if f.largeShare < 0 || f.largeShare > 1 || f.httpPc < 0 || f.httpPc > 1 {
		errs = append(errs, errors.New("-large-share and -http-share are fractions"))
	}
	if f.degradeEvery <= f.degradeFor || f.degradeFor <= 0 {
		errs = append(errs, errors.New("-degrade-for must be positive and below -degrade-every"))
	}
	if f.surgeEvery <= 0 || f.surgeNormal < 0 || f.surgeVIPs < 0 {
		errs = append(errs, errors.New("-surge-every positive, -surge-normal and -surge-vips not negative"))
	}
	if f.drain <= 0 {
		errs = append(errs, errors.New("-drain must be positive"))
	}
	return errors.Join(errs...)
}

func cmdSoak(ctx context.Context, e *env, args []string) error {
	fs := newFlags("soak", "[-mode embedded|cluster] [-duration D] [-out DIR] [-postgres-url URL -redis-addr ADDR] [...]", `
Starts fresh fanfared processes (one in embedded mode; -nodes on the given
throwaway Postgres and Redis in cluster mode) and runs a mixed workload
against them for -duration, through the Go SDK: many small groups and a few
large ones, sends over the socket and over HTTP, pulls, syncs and read
marks, members joining and removed, users leaving and new ones arriving,
reconnect churn across nodes, a waiting room with a VIP surge, and
degradation levels forced and cleared through the admin API. Every send's
outcome and every membership change goes into a ledger; at the end the
store is read and checked (nothing acked lost or stored twice, no hole in
any group's seqs), and so is every user's deliveries (none before its
join_seq or after its removal, none twice, every user online at the end
has everything of its groups). fanfared's RSS, Go heap, goroutines and
open descriptors, and in cluster mode Redis's keys and memory and
Postgres's connections, are sampled all along; the run fails when one of
them trends up after the warm-up (docs/reliability.md, "Soak"). The
report (markdown, JSON, CSV, SVG plots) goes to -out. make soak runs it.
`)
	var f soakFlags
	f.register(fs.FlagSet, e)
	replot := fs.String("replot", "", "no run: redraw the report (report.md and the plots) of the run in this `directory` (its report.json and samples.csv) into -out")
	if err := fs.parse(e, args); err != nil {
		return err
	}
	if *replot != "" {
		return replotSoak(*replot, f.out)
	}
	if err := f.validate(); err != nil {
		return fs.usageErr("%v", err)
	}
	if f.fanfared == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		f.fanfared = filepath.Join(filepath.Dir(exe), "fanfared")
	}
	if _, err := os.Stat(f.fanfared); err != nil {
		return fmt.Errorf("fanfared binary: %w (make build, or pass -fanfared)", err)
	}
	if err := os.MkdirAll(f.out, 0o755); err != nil {
		return err
	}
	s := &soak{f: &f, e: e, led: newLedger(), users: map[string]*soakUser{}}
	res, err := s.run(ctx)
	if res != nil {
		if werr := writeSoakReport(f.out, res); werr != nil {
			err = errors.Join(err, werr)
		}
		fmt.Fprintf(e.stdout, "fanfare soak %s: %s; report in %s\n", f.mode, res.Outcome, f.out)
		if err == nil && res.Failed() {
			err = errors.New("soak failed: " + strings.Join(res.Failures, "; "))
		}
	}
	return err
}

// soakNode is one fanfared process.
type soakNode struct {
	n        int
	cmd      *exec.Cmd
	http, ws string
	done     chan struct{} // closed when the process has exited
	exitErr  error         // set before done is closed
	stopping atomic.Bool
	adm      *adminClient
	proxy    *cutProxy // in front of ws: connections the churn cuts
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startNode starts fanfared with args plus its addresses and waits for
// /readyz.
func (s *soak) startNode(ctx context.Context, n int, args []string) (*soakNode, error) {
	wsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(s.f.out, fmt.Sprintf("node%d.log", n)))
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	args = append([]string{"-ws-addr", wsAddr, "-http-addr", httpAddr, "-node-id", "soak-n" + strconv.Itoa(n)}, args...)
	cmd := exec.Command(s.f.fanfared, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = soakChildEnv()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting node %d: %w", n, err)
	}
	nd := &soakNode{n: n, cmd: cmd, http: "http://" + httpAddr, ws: "ws://" + wsAddr, done: make(chan struct{})}
	nd.adm = &adminClient{base: nd.http, token: s.adminToken}
	go func() {
		nd.exitErr = cmd.Wait()
		close(nd.done)
	}()
	switch err := waitReady(ctx, nd.http, nd.done); {
	case err == nil:
		return nd, nil
	case errors.Is(err, errExited):
		return nil, fmt.Errorf("node %d exited at start (%v); see %s/node%d.log", n, nd.exitErr, s.f.out, n)
	default:
		nd.kill()
		return nil, fmt.Errorf("node %d: %w", n, err)
	}
}

// errExited is waitReady's answer for a process that exited first.
var errExited = errors.New("exited before it was ready")

// waitReady polls base's /readyz every 100 ms until it answers 200 (nil),
// done is closed (errExited), ctx ends, or 60 s pass.
func waitReady(ctx context.Context, base string, done <-chan struct{}) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return errExited
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after 60s: %v", err)
		}
	}
}

// soakChildEnv is this process's environment without the FANFARE_
// variables, so that a node is configured by its flags only.
func soakChildEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FANFARE_") {
			out = append(out, kv)
		}
	}
	return out
}

// stop sends SIGTERM and waits for a clean exit (a graceful drain), then
// SIGKILL after bound.
func (nd *soakNode) stop(bound time.Duration) (time.Duration, error) {
	nd.stopping.Store(true)
	start := time.Now()
	_ = nd.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-nd.done:
		return time.Since(start), nd.exitErr
	case <-time.After(bound):
		nd.kill()
		return time.Since(start), fmt.Errorf("node %d did not exit within %v of SIGTERM", nd.n, bound)
	}
}

func (nd *soakNode) kill() {
	nd.stopping.Store(true)
	_ = nd.cmd.Process.Kill()
	<-nd.done
}

// crashed reports a node that exited without being asked to.
func (nd *soakNode) crashed() error {
	select {
	case <-nd.done:
		if !nd.stopping.Load() {
			return fmt.Errorf("node %d exited during the soak: %v", nd.n, nd.exitErr)
		}
	default:
	}
	return nil
}

// soakLimits turns off the per-user and per-connection rate limits (the
// soak's users send faster than people do); group limits, quotas and
// levels stay.
const soakLimits = `{"rules":{"user_group":{"limit":0},"user_all":{"limit":0},"pull":{"limit":0},"connect":{"limit":0},` +
	`"room_enter":{"limit":0},"frame_send":{"limit":0},"frame_pull":{"limit":0},"frame_read":{"limit":0},` +
	`"frame_ping":{"limit":0},"frame_other":{"limit":0},"frame_user":{"limit":0},"frame_denied":{"limit":0}}}`

// soakRoom is the waiting room of the workload.
const soakRoom = "soak"

// soak is one run.
type soak struct {
	f          *soakFlags
	e          *env
	led        *ledger
	nodes      []*soakNode
	signer     *auth.Signer
	adminToken string
	tmp        string
	rdb        *redis.Client
	pgURL      string
	start      time.Time

	mu     sync.Mutex
	users  map[string]*soakUser
	all    []*soakUser
	small  []int64
	large  []int64
	nextID atomic.Int64

	auditor *soakUser
	room    roomStats
	levels  []levelEvent
	samples []sample
	errs    []string // workload errors (the first few)
	nerrs   int
}

func (s *soak) logf(format string, a ...any) {
	fmt.Fprintf(s.e.stderr, "soak %s %6.1fs: %s\n", s.f.mode, time.Since(s.start).Seconds(), fmt.Sprintf(format, a...))
}

// fail records a workload error that makes the run fail (a request that
// should have worked did not).
func (s *soak) fail(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	s.mu.Lock()
	s.nerrs++
	if len(s.errs) < 20 {
		s.errs = append(s.errs, msg)
	}
	s.mu.Unlock()
	s.logf("error: %s", msg)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// run sets up, runs the workload, checks and tears down.
func (s *soak) run(ctx context.Context) (*soakResult, error) {
	s.start = time.Now()
	f := s.f
	var err error
	if s.tmp, err = os.MkdirTemp("", "fanfare-soak-"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(s.tmp)
	secret := randHex(32)
	s.adminToken = "soak-admin-" + randHex(16)
	if s.signer, err = auth.NewSigner(auth.SignerConfig{Secret: []byte(secret)}); err != nil {
		return nil, err
	}
	limits := filepath.Join(s.tmp, "limits.json")
	if err := os.WriteFile(limits, []byte(soakLimits), 0o600); err != nil {
		return nil, err
	}
	common := []string{"-jwt-secret", secret, "-admin-token", s.adminToken, "-room-token-secret", randHex(32),
		"-log-level", "info", "-limits-file", limits, "-shutdown-timeout", "20s"}
	if f.mode == soakCluster {
		schema := "soak_" + randHex(4)
		if err := createSchema(ctx, f.postgresURL, schema); err != nil {
			return nil, err
		}
		s.pgURL = f.postgresURL
		s.rdb = redis.NewClient(&redis.Options{Addr: f.redisAddr})
		defer s.rdb.Close()
		if err := s.rdb.Ping(ctx).Err(); err != nil {
			return nil, fmt.Errorf("redis %s: %w", f.redisAddr, err)
		}
		common = append(common, "-postgres-url", f.postgresURL, "-postgres-schema", schema, "-redis-addr", f.redisAddr,
			"-redis-prefix", "soak"+randHex(3)+":", "-expected-nodes", strconv.Itoa(f.nodes))
	}
	defer func() {
		for _, nd := range s.nodes {
			if nd.cmd.ProcessState == nil {
				nd.kill()
			}
		}
	}()
	for n := 1; n <= f.nodes; n++ {
		args := common
		if f.mode == soakEmbedded {
			args = append(slicesClone(common), "-data-dir", filepath.Join(s.tmp, "data"+strconv.Itoa(n)))
		}
		nd, err := s.startNode(ctx, n, args)
		if err != nil {
			return nil, err
		}
		if nd.proxy, err = startProxy(strings.TrimPrefix(nd.ws, "ws://")); err != nil {
			return nil, err
		}
		defer nd.proxy.close()
		s.nodes = append(s.nodes, nd)
		s.logf("node %d up: pid %d, %s, %s", n, nd.cmd.Process.Pid, nd.http, nd.ws)
	}
	if err := s.setup(ctx); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	res := s.workload(ctx)
	return res, nil
}

func slicesClone(a []string) []string { return append([]string(nil), a...) }

func createSchema(ctx context.Context, url, schema string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
	return err
}

// pgConnections counts the client backends of the Postgres server but the
// sampler's own.
func pgConnections(ctx context.Context, c *pgx.Conn) (float64, error) {
	var n int64
	err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()").Scan(&n)
	return float64(n), err
}

// members adds uids to gid and returns their join seqs.
func (s *soak) addMembers(ctx context.Context, nd *soakNode, gid int64, uids []string) (map[string]int64, error) {
	var resp wire.MembersResponse
	// Adding is idempotent (a member already there keeps its join_seq),
	// so a transient failure is retried.
	if err := s.adminOn(ctx, nd, http.MethodPost, "/v1/groups/"+strconv.FormatInt(gid, 10)+"/members", wire.AddMembersRequest{UIDs: uids}, &resp); err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(resp.Members))
	for _, m := range resp.Members {
		out[m.UID] = m.JoinSeq
	}
	for _, u := range uids {
		if out[u] == 0 {
			return nil, fmt.Errorf("add %s to group %d: no join_seq in the answer", u, gid)
		}
	}
	return out, nil
}

// node returns a random node.
func (s *soak) node() *soakNode { return s.nodes[mrand.N(len(s.nodes))] }

// setup creates the groups, the users and their connections, and the
// waiting room.
func (s *soak) setup(ctx context.Context) error {
	f := s.f
	nd := s.nodes[0]
	s.auditor = s.newUser("soak-auditor", 0)
	for i := range f.users {
		s.newUser(fmt.Sprintf("soak-u%05d", i), 0)
	}
	create := func(name string, large bool, uids []string) error {
		g, err := nd.adm.createGroup(ctx, name, s.auditor.uid)
		if err != nil {
			return err
		}
		s.led.addGroup(g.GID, large)
		uids = append([]string{s.auditor.uid}, uids...)
		for lo := 0; lo < len(uids); lo += 5000 {
			joins, err := s.addMembers(ctx, nd, g.GID, uids[lo:min(lo+5000, len(uids))])
			if err != nil {
				return err
			}
			for uid, js := range joins {
				s.led.joined(g.GID, uid, js)
				s.users[uid].groups[g.GID] = true
			}
		}
		if large {
			s.large = append(s.large, g.GID)
		} else {
			s.small = append(s.small, g.GID)
		}
		return nil
	}
	uids := make([]string, len(s.all)-1)
	for i, u := range s.all[1:] {
		uids[i] = u.uid
	}
	for i := range f.largeGroups {
		n := max(f.largeMembers>>i, 2)
		// The first large group takes the first users, the next ones the
		// last: some users are in two.
		members := uids[:n]
		if i%2 == 1 {
			members = uids[len(uids)-n:]
		}
		if err := create(fmt.Sprintf("soak-large-%d", i), true, members); err != nil {
			return err
		}
	}
	for i := range f.smallGroups {
		picked := map[string]bool{}
		var members []string
		for len(members) < f.smallMembers {
			u := uids[mrand.N(len(uids))]
			if !picked[u] {
				picked[u] = true
				members = append(members, u)
			}
		}
		if err := create(fmt.Sprintf("soak-small-%d", i), false, members); err != nil {
			return err
		}
	}
	s.logf("%d large and %d small groups, %d users", len(s.large), len(s.small), len(s.all))
	roomCfg := wire.RoomConfig{Room: soakRoom, MaxActive: 8, AdmitRate: 25, MaxWaitS: 60, GraceS: 5, TargetWaitS: 60,
		HardTimeoutS: 30, AccessTokenTTLS: 60, SmoothingS: -1}
	if err := nd.adm.do(ctx, http.MethodPost, "/admin/v1/rooms", roomCfg, nil); err != nil {
		return fmt.Errorf("creating the waiting room: %w", err)
	}
	// Connect everybody, a few at a time.
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var failed atomic.Int64
	var firstErr atomic.Value
	for i, u := range s.all {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			cur := map[int64]int64{}
			for gid := range u.groups {
				cur[gid] = 0
			}
			u.cursors = cur
			if err := s.dial(ctx, u, s.nodes[i%len(s.nodes)]); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d of %d users could not connect: %v", n, len(s.all), firstErr.Load())
	}
	s.logf("%d users connected in %v", len(s.all), time.Since(start).Round(time.Millisecond))
	return nil
}

// levelEvent is one forced level, for the report.
type levelEvent struct {
	T     float64 `json:"t"`
	Node  int     `json:"node"`
	Scope string  `json:"scope"`
	GID   int64   `json:"gid,omitempty"`
	Level int     `json:"level"`
	For   float64 `json:"for_s"`
}

// opsBound bounds the wait for the requests in flight at the deadline:
// each has a bound of its own (a send 90 s, a waiting-room entrant 2.5
// minutes, a reconnect a few dials of 30 s).
const opsBound = 5 * time.Minute

// workload runs every driver until the deadline, then drains and checks.
func (s *soak) workload(ctx context.Context) *soakResult {
	f := s.f
	res := &soakResult{Mode: f.mode, Nodes: f.nodes, DurationS: f.duration.Seconds(), Flags: f.describe(), Started: time.Now().UTC().Format(time.RFC3339)}
	wctx, stop := context.WithTimeout(ctx, f.duration)
	defer stop()
	s.start = time.Now()
	cpu0 := s.cpuNow()
	// ops are the requests in flight of every driver: they finish on
	// their own bounded contexts after the deadline.
	var drivers, ops sync.WaitGroup
	every := func(rate float64, fn func()) {
		if rate <= 0 {
			return
		}
		drivers.Go(func() {
			t := time.NewTicker(time.Duration(float64(time.Second) / rate))
			defer t.Stop()
			for {
				select {
				case <-wctx.Done():
					return
				case <-t.C:
					fn()
				}
			}
		})
	}
	sendSem := make(chan struct{}, 256)
	every(f.rate, func() {
		select {
		case sendSem <- struct{}{}:
			ops.Go(func() { defer func() { <-sendSem }(); s.sendOne(ctx) })
		default:
			s.led.count("sends skipped (256 in flight)", 1)
		}
	})
	every(f.churn, func() { s.churnOne(ctx, &ops) })
	var turn atomic.Int64
	every(f.membership, func() {
		k := turn.Add(1)
		ops.Go(func() { s.membershipOne(ctx, int(k%4)) })
	})
	opSem := make(chan struct{}, 32)
	every(f.ops, func() {
		select {
		case opSem <- struct{}{}:
			ops.Go(func() { defer func() { <-opSem }(); s.readOne(ctx) })
		default:
		}
	})
	drivers.Go(func() { s.degradeLoop(wctx, ctx) })
	drivers.Go(func() { s.roomLoop(wctx, ctx, &ops) })
	sampled := make(chan struct{})
	go func() { defer close(sampled); s.sampleLoop(wctx, res) }()

	<-wctx.Done()
	drivers.Wait()
	s.logf("workload over; waiting for the requests in flight")
	opsDone := make(chan struct{})
	go func() { ops.Wait(); close(opsDone) }()
	select {
	case <-opsDone:
	case <-time.After(opsBound):
		// Every request has a bound of its own below this one: something
		// hangs. Say so and check what can be checked.
		res.Failures = append(res.Failures, fmt.Sprintf("requests still in flight %v after the workload ended", opsBound))
	}
	<-sampled
	cpu1 := s.cpuNow()
	for i := range cpu0 {
		res.CPUPercent = append(res.CPUPercent, 100*(cpu1[i]-cpu0[i])/time.Since(s.start).Seconds())
	}
	for _, nd := range s.nodes {
		if err := nd.crashed(); err != nil {
			res.Failures = append(res.Failures, err.Error())
		}
	}
	if ctx.Err() != nil {
		res.Failures = append(res.Failures, "interrupted")
		res.finish(s)
		return res
	}
	s.clearLevels(ctx)
	s.check(ctx, res)
	s.closeAll()
	for _, nd := range s.nodes {
		nd.proxy.close()
	}
	for _, nd := range s.nodes {
		took, err := nd.stop(30 * time.Second)
		res.Shutdown = append(res.Shutdown, took.Seconds())
		if err != nil {
			res.Failures = append(res.Failures, fmt.Sprintf("node %d shutdown: %v", nd.n, err))
		}
	}
	res.finish(s)
	return res
}

// cpuNow returns the CPU seconds used so far by each node, then by this
// process (the load generator).
func (s *soak) cpuNow() []float64 {
	var out []float64
	for _, nd := range s.nodes {
		p, _ := readProc(nd.cmd.Process.Pid)
		out = append(out, p.CPU)
	}
	p, _ := readProc(os.Getpid())
	return append(out, p.CPU)
}

func (f *soakFlags) describe() map[string]string {
	return map[string]string{
		"users": strconv.Itoa(f.users), "large_groups": strconv.Itoa(f.largeGroups), "large_members": strconv.Itoa(f.largeMembers),
		"small_groups": strconv.Itoa(f.smallGroups), "small_members": strconv.Itoa(f.smallMembers),
		"rate": fmt.Sprint(f.rate), "large_share": fmt.Sprint(f.largeShare), "http_share": fmt.Sprint(f.httpPc),
		"churn": fmt.Sprint(f.churn), "membership": fmt.Sprint(f.membership), "ops": fmt.Sprint(f.ops),
		"degrade_every": f.degradeEvery.String(), "degrade_for": f.degradeFor.String(), "surge_every": f.surgeEvery.String(),
		"surge": fmt.Sprintf("%d normal + %d VIPs", f.surgeNormal, f.surgeVIPs), "sample_every": f.sampleEvery.String(),
	}
}

// sampleLoop samples every resource until ctx ends.
func (s *soak) sampleLoop(ctx context.Context, res *soakResult) {
	var pg *pgx.Conn
	if s.pgURL != "" {
		c, err := pgx.Connect(ctx, s.pgURL)
		if err != nil {
			s.fail("sampler: postgres: %v", err)
		} else {
			pg = c
			defer pg.Close(context.Background())
		}
	}
	t := time.NewTicker(s.f.sampleEvery)
	defer t.Stop()
	for {
		s.sampleOnce(ctx, pg)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *soak) sampleOnce(ctx context.Context, pg *pgx.Conn) {
	sm := sample{T: time.Since(s.start).Seconds(), Values: map[string]float64{}}
	if sm.T > s.f.duration.Seconds() {
		return
	}
	for _, nd := range s.nodes {
		if nd.crashed() != nil {
			continue
		}
		pid := nd.cmd.Process.Pid
		name := "node" + strconv.Itoa(nd.n) + "."
		if p, err := readProc(pid); err == nil {
			sm.Values[name+"rss"] = float64(p.RSS)
		}
		if n, err := procFDs(pid); err == nil {
			sm.Values[name+"fds"] = float64(n)
		}
		heap, gor, err := scrapeGo(ctx, nd.http)
		if err != nil && ctx.Err() == nil {
			heap, gor, err = scrapeGo(ctx, nd.http) // a keep-alive connection closed under it
		}
		if err == nil {
			sm.Values[name+"heap"] = heap
			sm.Values[name+"goroutines"] = gor
		} else if ctx.Err() == nil {
			s.fail("sampler: node %d /metrics: %v", nd.n, err)
		}
	}
	if s.rdb != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if n, err := s.rdb.DBSize(rctx).Result(); err == nil {
			sm.Values["redis.redis_keys"] = float64(n)
		}
		if info, err := s.rdb.Info(rctx, "memory").Result(); err == nil {
			if v, err := redisInfoField(info, "used_memory"); err == nil {
				sm.Values["redis.redis_mem"] = v
			}
		}
		cancel()
	}
	if pg != nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if n, err := pgConnections(pctx, pg); err == nil {
			sm.Values["postgres.pg_conns"] = n
		}
		cancel()
	}
	s.mu.Lock()
	s.samples = append(s.samples, sm)
	s.mu.Unlock()
}

// idCounter makes client_msg_ids unique within the run.
func (s *soak) newSendID(uid string) string {
	return uid + "-" + strconv.FormatInt(s.nextID.Add(1), 10)
}

// soakBody is a message body: the send id (checked against deliveries)
// and padding.
type soakBody struct {
	ID string `json:"id"`
	P  string `json:"p"`
}

func bodyID(raw []byte) string {
	var b soakBody
	if json.Unmarshal(raw, &b) != nil {
		return ""
	}
	return b.ID
}

// closeAll closes every client.
func (s *soak) closeAll() {
	s.mu.Lock()
	all := append([]*soakUser(nil), s.all...)
	s.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for _, u := range all {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.closeConn(u, userGone)
		})
	}
	wg.Wait()
}

// drainBody discards a response body.
func drainBody(r io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r, 1<<20))
	r.Close()
}
