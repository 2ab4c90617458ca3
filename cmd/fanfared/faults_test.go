package main

// Network-fault tests (docs/reliability.md, "Network faults"): real nodes
// whose links to Postgres and Redis, or whose clients' links, go through
// internal/faultproxy. Each test puts one fault in force under a running
// ledger (senders that retry each message under its id until acked,
// receivers on the Go SDK), checks what clients and the node show during
// the fault, removes it, waits for the node to recover by itself and checks
// the ledger: every acked message stored exactly once in order, every
// online client complete.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws/wsutil"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/internal/faultproxy"
	"github.com/fanfare-im/fanfare/store/postgres/pgtest"
)

// faultNode is a cluster node whose Postgres and Redis links go through
// proxies of its own.
type faultNode struct {
	*testServer
	name   string
	pg, rd *faultproxy.Proxy
}

// faultArgs are the flags every fault test's node runs with: a 1 s
// heartbeat and a 3 s idle timeout so that dead clients are found in
// seconds, a 1 s hysteresis so that levels clear quickly, and HTTP
// requests cut at 2 s.
var faultArgs = []string{"-heartbeat", "1s", "-idle-timeout", "3s", "-trigger-clear-after", "1s", "-ready-every", "0",
	"-http-request-timeout", "2s"}

// startFaultNodes starts n cluster nodes (node-a, node-b, ...) on one
// Postgres schema and Redis prefix of their own, each through its own
// pair of proxies, with faultArgs and extra.
func startFaultNodes(t *testing.T, n int, extra ...string) []*faultNode {
	t.Helper()
	url := pgtest.URL(t)
	schema := pgtest.Schema(t, url)
	prefix := "t" + randomHex(6) + ":"
	pgu, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*faultNode
	for i := range n {
		name := fmt.Sprintf("node-%c", 'a'+i)
		pg := faultproxy.Start(t, pgu.Host)
		rd := faultproxy.Start(t, redisAddr(t))
		u := *pgu
		u.Host = pg.Addr()
		args := []string{"-node-id", name, "-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-jwt-secret", testSecret,
			"-admin-token", "test-admin-token", "-log-level", "info", "-shutdown-timeout", "5s", "-limits-file", unlimited(t),
			"-postgres-url", u.String(), "-postgres-schema", schema, "-redis-addr", rd.Addr(), "-redis-prefix", prefix}
		args = append(append(args, faultArgs...), extra...)
		ts := startArgs(t, args)
		// Runs before the node's own cleanup (LIFO): a fault left in
		// force would make the drain wait on a dead link.
		t.Cleanup(func() { pg.Clear(); rd.Clear() })
		nodes = append(nodes, &faultNode{testServer: ts, name: name, pg: pg, rd: rd})
	}
	return nodes
}

// faultHTTP bounds every request of these tests: a request that does not
// come back in 20 s under a fault is a hang, and fails the test.
var faultHTTP = &http.Client{Timeout: 20 * time.Second}

// get requests path with tok and returns the status and the body; a
// transport error (a hang included) fails the test.
func (ts *testServer) fget(path, tok string) (int, []byte) {
	ts.t.Helper()
	req, err := http.NewRequest("GET", ts.http+path, nil)
	if err != nil {
		ts.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := faultHTTP.Do(req)
	if err != nil {
		ts.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// readyStatus returns /readyz's status.
func (ts *testServer) readyStatus() int {
	st, _ := ts.fget("/readyz", "")
	return st
}

// nodeLevel returns the node's effective degradation level.
func (ts *testServer) nodeLevel() int {
	ts.t.Helper()
	st, b := ts.fget("/admin/v1/degrade", ts.admin)
	var d wire.DegradeStatus
	if st != http.StatusOK || json.Unmarshal(b, &d) != nil {
		ts.t.Fatalf("degrade status: %d %s", st, b)
	}
	return d.Node.Level
}

// metricValue returns the value of one series of /metrics (0 when absent).
func (ts *testServer) metricValue(series string) float64 {
	ts.t.Helper()
	return scrapeValues(ts.t, ts)[series]
}

// pollUntil polls cond every 20 ms until it holds, failing the test with
// what after d.
func pollUntil(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// ledger drives one group: senders send numbered messages and retry each
// under its own id until acked; receivers record what they get.
type faultLedger struct {
	t   *testing.T
	gid int64
	ctx context.Context

	mu    sync.Mutex
	acked map[string]int64
	acks  []ackRecord
	errs  map[string]int // attempt errors by code, as clients saw them
	recv  []*faultRecv

	stop atomic.Bool
	wg   sync.WaitGroup
}

// ackRecord is one acked send: when it was acked and how long it took from
// its first attempt.
type ackRecord struct {
	uid string
	at  time.Time
	lat time.Duration
}

// faultRecv is one receiving client.
type faultRecv struct {
	uid    string
	conn   *client.Conn
	mu     sync.Mutex
	seqs   []int64
	dups   int
	levels []int // EventDegraded levels, in order
	// pushDelay are the delays of pushed (not pulled) messages, from the
	// server's message time to their delivery here, with when they came.
	pushDelay []ackRecord
	resync    int
	discon    int
}

func newFaultLedger(t *testing.T, gid int64) *faultLedger {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l := &faultLedger{t: t, gid: gid, ctx: ctx, acked: map[string]int64{}, errs: map[string]int{}}
	t.Cleanup(l.finish) // before the ctx is canceled (LIFO)
	return l
}

// endpoint is where a client reaches a node: its own ports, or a client
// link's proxies in front of them.
type endpoint struct{ ws, http string }

func (ts *testServer) endpoint() endpoint { return endpoint{ts.ws, ts.http} }

// dial opens an SDK connection as uid through ep, with the node's 1 s
// heartbeat and no SDK retries (the senders retry themselves, to see each
// attempt's answer).
func (l *faultLedger) dial(ts *testServer, ep endpoint, uid string, onMsg func(client.Message), onEv func(client.Event)) *client.Conn {
	l.t.Helper()
	c, err := client.Dial(l.ctx, client.Config{URL: ep.ws + "/ws", HTTPURL: ep.http, Token: ts.token(uid, 0),
		BackoffMin: 20 * time.Millisecond, BackoffMax: 300 * time.Millisecond, MaxRetries: -1, SendTimeout: 3 * time.Second,
		HandshakeTimeout: 3 * time.Second, DialTimeout: 3 * time.Second, PollInterval: 500 * time.Millisecond,
		HTTPClient: faultHTTP, OnMessage: onMsg, OnEvent: onEv})
	if err != nil {
		l.t.Fatalf("dial %s: %v", uid, err)
	}
	l.t.Cleanup(func() { c.Close() })
	return c
}

// receiver connects uid and tracks the group from its start.
func (l *faultLedger) receiver(ts *testServer, ep endpoint, uid string) *faultRecv {
	r := &faultRecv{uid: uid}
	r.conn = l.dial(ts, ep, uid, func(m client.Message) {
		if m.GID != l.gid {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if n := len(r.seqs); n > 0 && m.Seq <= r.seqs[n-1] {
			r.dups++
			return
		}
		r.seqs = append(r.seqs, m.Seq)
		if !m.Pulled {
			now := time.Now()
			r.pushDelay = append(r.pushDelay, ackRecord{uid: m.From, at: now, lat: now.Sub(time.UnixMilli(m.TS))})
		}
	}, func(ev client.Event) {
		r.mu.Lock()
		defer r.mu.Unlock()
		switch ev.Kind {
		case client.EventDegraded:
			r.levels = append(r.levels, ev.Level)
		case client.EventResync:
			r.resync++
		case client.EventDisconnected:
			r.discon++
		}
	})
	r.conn.Track(l.gid, 0)
	l.mu.Lock()
	l.recv = append(l.recv, r)
	l.mu.Unlock()
	return r
}

// sender connects uid and sends until finish, one message at a time, each
// retried under its id until acked (give up after 60 s: a hang).
func (l *faultLedger) sender(ts *testServer, ep endpoint, uid string) {
	c := l.dial(ts, ep, uid, nil, nil)
	l.wg.Go(func() {
		for i := 0; !l.stop.Load(); i++ {
			id := fmt.Sprintf("%s-%d", uid, i)
			first := time.Now()
			for {
				a, err := c.Send(l.ctx, l.gid, json.RawMessage(strconv.Quote(id)), client.WithID(id))
				if err == nil {
					l.mu.Lock()
					l.acked[id] = a.Seq
					l.acks = append(l.acks, ackRecord{uid: uid, at: time.Now(), lat: time.Since(first)})
					l.mu.Unlock()
					// At most about 100 messages a second per sender: enough
					// traffic to show every fault, little CPU on a busy
					// machine.
					time.Sleep(10 * time.Millisecond)
					break
				}
				if l.ctx.Err() != nil {
					return
				}
				l.mu.Lock()
				l.errs[errCode(err)]++
				l.mu.Unlock()
				if time.Since(first) > 60*time.Second {
					l.t.Errorf("send %s: no ack in 60 s, last error %v", id, err)
					return
				}
				// Retry pacing, as a client would (not a synchronisation).
				time.Sleep(50 * time.Millisecond)
				if l.stop.Load() && !errors.Is(err, client.ErrTimeout) && !errors.Is(err, client.ErrConnLost) {
					break // refused: never stored, no need to insist at the end
				}
			}
		}
	})
}

// errCode names an attempt's error as the client saw it: the server's code,
// or the SDK's timeout or connection loss.
func errCode(err error) string {
	var se *client.Error
	switch {
	case errors.As(err, &se):
		return se.Code
	case errors.Is(err, client.ErrTimeout):
		return "timeout"
	case errors.Is(err, client.ErrConnLost):
		return "conn_lost"
	case errors.Is(err, client.ErrIDInFlight):
		return "in_flight"
	}
	return err.Error()
}

func (l *faultLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// waitAcks waits until n more messages than now were acked.
func (l *faultLedger) waitAcks(n int, d time.Duration, what string) {
	l.t.Helper()
	want := l.count() + n
	pollUntil(l.t, d, fmt.Sprintf("%s: %d acks", what, want), func() bool { return l.count() >= want })
}

// errors returns the attempt errors by code since the last call.
func (l *faultLedger) takeErrors() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.errs
	l.errs = map[string]int{}
	return e
}

// latency returns the median and the largest ack latency of the messages
// uid sent ("" = every sender) acked since from, and their number.
func (l *faultLedger) latency(from time.Time, uid string) (p50, worst time.Duration, n int) {
	l.mu.Lock()
	var ls []time.Duration
	for _, a := range l.acks {
		if !a.at.Before(from) && (uid == "" || a.uid == uid) {
			ls = append(ls, a.lat)
		}
	}
	l.mu.Unlock()
	if len(ls) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ls)
	return ls[len(ls)/2], ls[len(ls)-1], len(ls)
}

// finish stops the senders and waits for them.
func (l *faultLedger) finish() {
	l.stop.Store(true)
	l.wg.Wait()
}

// check stops the senders, then checks the store through ts (every acked
// id stored once under its acked seq, seqs dense) and that every receiver
// got every stored message once, in order, within d. It returns the number
// of stored messages.
func (l *faultLedger) check(ts *testServer, d time.Duration) int {
	l.t.Helper()
	l.finish()
	t := l.t
	stored, byID := l.stored(ts)
	l.mu.Lock()
	for id, seq := range l.acked {
		if byID[id] != seq {
			t.Errorf("%s acked as seq %d, stored as %d", id, seq, byID[id])
		}
	}
	acked := len(l.acked)
	recv := slices.Clone(l.recv)
	l.mu.Unlock()
	complete := func(r *faultRecv, total int64) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		n := len(r.seqs)
		return n > 0 && r.seqs[n-1] == total
	}
	// A receiver whose last pushes were lost (a bus publish dropped
	// during the fault) is told by the group's tail hint (-bus-tail-delay)
	// to pull them: no later message is needed.
	total := int64(len(stored))
	for _, r := range recv {
		pollUntil(t, d, fmt.Sprintf("receiver %s complete up to seq %d", r.uid, total), func() bool { return complete(r, total) })
		r.mu.Lock()
		if int64(len(r.seqs)) != total || r.dups > 0 {
			t.Errorf("receiver %s: %d messages up to seq %d, %d duplicates", r.uid, len(r.seqs), total, r.dups)
		}
		r.mu.Unlock()
	}
	t.Logf("ledger: %d acked, %d stored (%d of them ledger messages), %d receivers complete",
		acked, total, len(byID), len(recv))
	return int(total)
}

// stored reads the group's messages through ts, checks that seqs are dense
// and that no ledger id is stored twice, and returns them with the seq of
// each ledger id.
func (l *faultLedger) stored(ts *testServer) ([]wire.Msg, map[string]int64) {
	t := l.t
	t.Helper()
	var stored []wire.Msg
	tok := ts.token("ledger-reader", 0)
	for from := int64(1); ; {
		st, b := ts.fget(fmt.Sprintf("/v1/groups/%d/messages?from_seq=%d", l.gid, from), tok)
		var page wire.MessagesPage
		if st != http.StatusOK || json.Unmarshal(b, &page) != nil {
			t.Fatalf("ledger pull: %d %.200s", st, b)
		}
		stored = append(stored, page.Messages...)
		if len(page.Messages) == 0 || page.Messages[len(page.Messages)-1].Seq >= page.LastSeq {
			break
		}
		from = page.Messages[len(page.Messages)-1].Seq + 1
	}
	byID := map[string]int64{}
	for i, m := range stored {
		if m.Seq != int64(i+1) {
			t.Fatalf("stored seqs not dense: seq %d at index %d", m.Seq, i)
		}
		id, err := strconv.Unquote(string(m.Body))
		if err != nil {
			continue // not a ledger message
		}
		if prev, ok := byID[id]; ok {
			t.Fatalf("%s stored twice: seqs %d and %d", id, prev, m.Seq)
		}
		byID[id] = m.Seq
	}
	return stored, byID
}

// pushes returns the median push delay of the messages pushed to r since
// from, and their number.
func (r *faultRecv) pushes(from time.Time) (p50 time.Duration, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ls []time.Duration
	for _, a := range r.pushDelay {
		if !a.at.Before(from) {
			ls = append(ls, a.lat)
		}
	}
	if len(ls) == 0 {
		return 0, 0
	}
	slices.Sort(ls)
	return ls[len(ls)/2], len(ls)
}

// pushesFrom counts the messages of sender uid pushed to r since from.
func (r *faultRecv) pushesFrom(uid string, from time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, d := range r.pushDelay {
		if d.uid == uid && d.at.After(from) {
			n++
		}
	}
	return n
}

// events returns a receiver's degraded levels, resyncs and disconnects.
func (r *faultRecv) events() (levels []int, resync, discon int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.levels), r.resync, r.discon
}

// faultLogf records one figure of a fault test (docs/reliability.md quotes
// them); go test -v shows them.
func faultLogf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("FAULT "+t.Name()+": "+format, args...)
}

// twoNodeLedger starts two nodes, a group, two receivers on each node and
// one sender on each, and waits for traffic to flow.
func twoNodeLedger(t *testing.T, extra ...string) ([]*faultNode, *faultLedger) {
	t.Helper()
	nodes := startFaultNodes(t, 2, extra...)
	a, b := nodes[0], nodes[1]
	uids := []string{"ra1", "ra2", "rb1", "rb2", "sa", "sb"}
	gid := a.createGroup(append(uids, "ledger-reader")...)
	l := newFaultLedger(t, gid)
	l.receiver(a.testServer, a.endpoint(), "ra1")
	l.receiver(a.testServer, a.endpoint(), "ra2")
	l.receiver(b.testServer, b.endpoint(), "rb1")
	l.receiver(b.testServer, b.endpoint(), "rb2")
	l.sender(a.testServer, a.endpoint(), "sa")
	l.sender(b.testServer, b.endpoint(), "sb")
	l.waitAcks(40, 30*time.Second, "before the fault")
	return nodes, l
}

// pushesCross waits until a message sent on from reaches a receiver on the
// other node by push: the bus works both ways again.
func crossed(l *faultLedger, r *faultRecv, since int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.seqs)
	return n > 0 && r.seqs[n-1] > since
}

// lastSeq is the highest acked seq so far.
func (l *faultLedger) lastSeq() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m int64
	for _, s := range l.acked {
		m = max(m, s)
	}
	return m
}

func joinErrs(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// TestFaultPostgresLatency: 250 ms ± 50 ms each way between node a and
// Postgres. Commits on a take a round trip more; past -store-latency-alarm
// (300 ms here, well above what a loaded test machine shows without the
// fault) node a goes to L3 (its clients get degraded 3 and poll), stays
// ready, and returns to L0 by itself once the latency is gone.
func TestFaultPostgresLatency(t *testing.T) {
	nodes, l := twoNodeLedger(t, "-store-latency-alarm", "300ms")
	a := nodes[0]
	pollUntil(t, 30*time.Second, "node a at L0 before the fault", func() bool { return a.nodeLevel() == 0 })
	base := time.Now()
	l.waitAcks(20, 30*time.Second, "baseline")
	p50b, worstb, _ := l.latency(base, "sa")

	lat := faultproxy.Faults{Latency: 250 * time.Millisecond, Jitter: 50 * time.Millisecond}
	a.pg.Set(faultproxy.Upstream, lat)
	a.pg.Set(faultproxy.Downstream, lat)
	start := time.Now()
	took := pollUntil(t, 30*time.Second, "node a at L3 (store latency)", func() bool { return a.nodeLevel() == wire.LevelWriteOnly })
	var ewma float64
	pollUntil(t, 30*time.Second, "commit latency EWMA above the 300 ms alarm", func() bool {
		ewma = a.metricValue("fanfare_store_commit_latency_ewma_seconds")
		return ewma > 0.3
	})
	l.waitAcks(10, 30*time.Second, "under latency")
	p50f, worstf, n := l.latency(start, "sa")
	if st := a.readyStatus(); st != http.StatusOK {
		t.Errorf("readyz on node a under store latency: %d, want 200 (slow is not down)", st)
	}
	pollUntil(t, 10*time.Second, "receiver on node a told L3", func() bool {
		lv, _, _ := l.recv[0].events()
		return slices.Contains(lv, wire.LevelWriteOnly)
	})
	if len(a.logw.logged("degradation level changed", "store commit latency")) == 0 {
		t.Error("no log record of the level change with its cause")
	}
	errs := l.takeErrors()

	a.pg.Clear()
	cleared := time.Now()
	rec := pollUntil(t, 30*time.Second, "node a back to L0", func() bool { return a.nodeLevel() == 0 })
	l.waitAcks(20, 30*time.Second, "after recovery")
	p50a, _, _ := l.latency(cleared.Add(rec), "sa")
	l.check(a.testServer, 30*time.Second)
	faultLogf(t, "node a's sender: ack p50/max before %v/%v, under fault %v/%v (%d acks), after %v; L3 after %v, EWMA %.3fs; readyz 200; errors %s; L0 %v after the fault ended",
		p50b, worstb, p50f, worstf, n, p50a, took.Round(time.Millisecond), ewma, joinErrs(errs), rec.Round(time.Millisecond))
}

// pulledSince returns how many messages r got by pull, of how many.
func (r *faultRecv) stats() client.Stats { return r.conn.Stats() }

// recvDelta is what receivers got between two snapshots: messages, of
// which by pull.
func recvDelta(before, after client.Stats) string {
	return fmt.Sprintf("%d delivered, %d by pull", after.Delivered-before.Delivered, after.Pulled-before.Pulled)
}

// TestFaultRedisLatency: 30 ms ± 20 ms each way between node a and Redis,
// below the Redis client's 200 ms read timeout. Nothing fails: the limiter
// stays on Redis, sends are acked as fast (no Redis round trip on the send
// path), and pushes between the nodes are late by about a round trip.
func TestFaultRedisLatency(t *testing.T) {
	nodes, l := twoNodeLedger(t)
	a := nodes[0]
	base := time.Now()
	l.waitAcks(20, 30*time.Second, "baseline")
	pushB, _ := l.recv[2].pushes(base)
	ackB, _, _ := l.latency(base, "sa")

	lat := faultproxy.Faults{Latency: 30 * time.Millisecond, Jitter: 20 * time.Millisecond}
	a.rd.Set(faultproxy.Upstream, lat)
	a.rd.Set(faultproxy.Downstream, lat)
	start := time.Now()
	l.waitAcks(100, 30*time.Second, "under latency")
	pushF, nf := l.recv[2].pushes(start)
	ackF, worstF, _ := l.latency(start, "sa")
	if v := a.metricValue("fanfare_limiter_fallback_active"); v != 0 {
		t.Errorf("limiter fallback active under 30 ms Redis latency")
	}
	// Not L4 and ready (a loaded machine may put any node at L3 for its
	// own commit latency; Redis latency must not).
	lvF, stF := a.nodeLevel(), a.readyStatus()
	if lvF == wire.LevelReject || stF != http.StatusOK {
		t.Errorf("node a under Redis latency: level %d, readyz %d; want below 4, 200", lvF, stF)
	}
	errs := l.takeErrors()
	a.rd.Clear()
	cleared := time.Now()
	l.waitAcks(40, 30*time.Second, "after")
	pushA, _ := l.recv[2].pushes(cleared)
	l.check(a.testServer, 30*time.Second)
	faultLogf(t, "push delay at node b p50 before %v, under fault %v (%d pushes), after %v; node a ack p50 before %v, under fault %v (max %v); level %d, readyz %d, fallback off; errors %s",
		pushB, pushF, nf, pushA, ackB, ackF, worstF, lvF, stF, joinErrs(errs))
}

// TestFaultBandwidth: node a's link to Postgres capped at 32 KiB/s each
// way. Small commits still pass (a few hundred bytes each); a pull of a
// full page waits for its bytes. Nothing is refused, nothing is lost, and
// pulls are fast again once the cap is gone.
func TestFaultBandwidth(t *testing.T) {
	nodes, l := twoNodeLedger(t)
	a := nodes[0]
	l.waitAcks(400, 60*time.Second, "history for full pages")
	tok := a.token("ledger-reader", 0)
	pull := func() time.Duration {
		start := time.Now()
		if st, b := a.fget(fmt.Sprintf("/v1/groups/%d/messages?from_seq=1", l.gid), tok); st != http.StatusOK {
			t.Fatalf("pull: %d %s", st, b)
		}
		return time.Since(start)
	}
	before := pull()
	capped := faultproxy.Faults{BytesPerSecond: 32 << 10}
	a.pg.Set(faultproxy.Upstream, capped)
	a.pg.Set(faultproxy.Downstream, capped)
	start := time.Now()
	during := pull()
	l.waitAcks(20, 30*time.Second, "under the cap")
	ackF, worstF, n := l.latency(start, "sa")
	if lv := a.nodeLevel(); lv == wire.LevelReject {
		t.Errorf("node a at L4 under a bandwidth cap")
	}
	lvF, st := a.nodeLevel(), a.readyStatus()
	errs := l.takeErrors()
	a.pg.Clear()
	after := pull()
	l.check(a.testServer, 30*time.Second)
	faultLogf(t, "pull of a 200-message page: %v before, %v at 32 KiB/s, %v after; node a ack p50 %v max %v (%d acks) under the cap; level %d, readyz %d; errors %s",
		before, during, after, ackF, worstF, n, lvF, st, joinErrs(errs))
	if during < 2*before {
		t.Logf("note: the capped pull was not much slower (%v vs %v)", during, before)
	}
}

// TestFaultRedisBlackhole: node a's requests to Redis are held (one way:
// a's writes succeed, nothing reaches Redis, nothing comes back); Postgres
// is fine. Sends are acked on both nodes; pushes stop crossing between the
// nodes, and receivers fill the gaps by pull when a local push reveals
// them; node a stays ready at L0. When the link is back the bus recovers
// by itself and pushes cross again.
func TestFaultRedisBlackhole(t *testing.T) {
	nodes, l := twoNodeLedger(t)
	a, b := nodes[0], nodes[1]
	s0 := l.recv[2].stats()
	pubErrs := a.metricValue("fanfare_bus_publish_errors_total")
	downLogs := len(a.logw.logged("bus backend unavailable"))
	a.rd.Set(faultproxy.Upstream, faultproxy.Faults{Blackhole: true})
	start := time.Now()
	// node a notices: its bus publishes fail (a Warn record, the publish
	// error counter).
	took := pollUntil(t, 30*time.Second, "node a reports the bus down", func() bool {
		return len(a.logw.logged("bus backend unavailable")) > downLogs && a.metricValue("fanfare_bus_publish_errors_total") > pubErrs
	})
	l.waitAcks(100, 30*time.Second, "during the blackhole")
	sa, _, _ := l.latency(start, "sa")
	sb, _, _ := l.latency(start, "sb")
	crossedDuring := l.recv[2].pushesFrom("sa", start.Add(took))
	if lv, st := a.nodeLevel(), a.readyStatus(); lv == wire.LevelReject || st != http.StatusOK {
		t.Errorf("node a without Redis: level %d, readyz %d; want below 4, 200 (Redis is not on the ack path)", lv, st)
	}
	s1 := l.recv[2].stats()
	errs := l.takeErrors()

	a.rd.Clear()
	cleared := time.Now()
	// Pushes from a reach b again: rb1 gets one of sa's messages by push.
	rec := pollUntil(t, 30*time.Second, "a push crosses from node a to node b", func() bool {
		return l.recv[2].pushesFrom("sa", cleared) > 0
	})
	pollUntil(t, 30*time.Second, "node a logs the bus back", func() bool { return len(a.logw.logged("publishing resumed")) > 0 })
	l.check(b.testServer, 30*time.Second)
	faultLogf(t, "ack p50 during: node a %v, node b %v; node a reported the bus down after %v; receiver on b during the fault: %s, %d pushes of node a's messages; level 0, readyz 200 on a; errors %s; pushes crossed again %v after the fault ended",
		sa, sb, took.Round(time.Millisecond), recvDelta(s0, s1), crossedDuring, joinErrs(errs), rec.Round(time.Millisecond))
}

// TestFaultPostgresBlackhole: Postgres's replies to node a are held (one
// way: a's statements reach Postgres and commit, nothing comes back).
// Sends on a time out and are answered unavailable after the commit
// timeout (5 s); a goes to L4 and /readyz answers 503; node b is not
// affected. Retries under the same id get the original seq once the link
// is back (a commit whose answer was lost is not stored twice), a returns
// to L0 and ready by itself.
func TestFaultPostgresBlackhole(t *testing.T) {
	nodes, l := twoNodeLedger(t)
	a, b := nodes[0], nodes[1]
	a.pg.Set(faultproxy.Downstream, faultproxy.Faults{Blackhole: true})
	start := time.Now()
	toL4 := pollUntil(t, 30*time.Second, "node a at L4", func() bool { return a.nodeLevel() == wire.LevelReject })
	pollUntil(t, 10*time.Second, "node a not ready", func() bool { return a.readyStatus() == http.StatusServiceUnavailable })
	pollUntil(t, 10*time.Second, "receiver on node a told L4", func() bool {
		lv, _, _ := l.recv[0].events()
		return slices.Contains(lv, wire.LevelReject)
	})
	// A pull on a is answered (unavailable), not left hanging.
	pst, _ := a.fget(fmt.Sprintf("/v1/groups/%d/messages?from_seq=1", l.gid), a.token("ledger-reader", 0))
	bStart := time.Now()
	l.waitAcks(30, 30*time.Second, "node b's sender during a's outage")
	bP50, _, bN := l.latency(bStart, "sb")
	if st := b.readyStatus(); st != http.StatusOK {
		t.Errorf("node b readyz during a's outage: %d", st)
	}
	errs := l.takeErrors()
	during := time.Since(start)

	a.pg.Clear()
	cleared := time.Now()
	rec := pollUntil(t, 30*time.Second, "node a back to L0 and ready", func() bool {
		return a.nodeLevel() == 0 && a.readyStatus() == http.StatusOK
	})
	l.waitAcks(20, 30*time.Second, "after recovery")
	stuck, _, _ := l.latency(cleared, "sa")
	total := l.check(a.testServer, 30*time.Second)
	faultLogf(t, "L4 after %v; readyz 503; pull on a answered %d; clients saw %s; node b acked %d (p50 %v) while a was down (fault held %v); L0 and ready %v after the fault ended; node a's acks after: p50 %v; %d stored",
		toL4.Round(time.Millisecond), pst, joinErrs(errs), bN, bP50, during.Round(time.Millisecond), rec.Round(time.Millisecond), stuck, total)
	if pst != http.StatusServiceUnavailable {
		t.Errorf("pull on a during the outage: %d, want 503", pst)
	}
}

// TestFaultResetMidReply: node a's connections are reset (RST) in the
// middle of a reply: to Postgres after every 4 KiB of replies, a few
// dozen commits or one page of a pull; to Redis after every 512 bytes.
// The pools open new connections, the bus subscriber reconnects; a send
// whose ack was cut is answered unavailable and its retry gets the
// original seq. Nothing hangs, nothing is stored twice, and once the resets
// stop nothing fails any more.
func TestFaultResetMidReply(t *testing.T) {
	for _, target := range []string{"postgres", "redis"} {
		t.Run(target, func(t *testing.T) {
			nodes, l := twoNodeLedger(t)
			a := nodes[0]
			p, n := a.pg, int64(4<<10)
			if target == "redis" {
				p, n = a.rd, 512
			}
			p.Set(faultproxy.Downstream, faultproxy.Faults{ResetAfter: n})
			start := time.Now()
			pollUntil(t, 30*time.Second, "resets", func() bool { return p.Stats().Resets >= 5 })
			l.waitAcks(50, 30*time.Second, "under resets")
			p50, worst, acks := l.latency(start, "sa")
			pst, _ := a.fget(fmt.Sprintf("/v1/groups/%d/messages?from_seq=1", l.gid), a.token("ledger-reader", 0))
			lv, rd := a.nodeLevel(), a.readyStatus()
			resets := p.Stats().Resets
			errs := l.takeErrors()
			p.Clear()
			l.waitAcks(50, 30*time.Second, "after the resets")
			after := l.takeErrors()
			total := l.check(a.testServer, 30*time.Second)
			faultLogf(t, "%d resets in %v; node a ack p50 %v max %v (%d acks); pull of a page answered %d; level %d, readyz %d; clients saw %s; after: %s; %d stored",
				resets, time.Since(start).Round(time.Millisecond), p50, worst, acks, pst, lv, rd, joinErrs(errs), joinErrs(after), total)
			for code, k := range after {
				if code != "timeout" && code != "conn_lost" {
					t.Errorf("after the resets stopped: %d %s errors", k, code)
				}
			}
		})
	}
}

// TestFaultPartitionRedis: node a loses Redis entirely (both directions
// held, new connections hear nothing) but still reaches Postgres. Sends on
// both nodes are acked, a stays ready at L0, pushes no longer cross
// between the nodes (receivers fill the gaps by pull when a local push
// shows them), cluster-wide online counts on a are refused; after the
// partition heals the bus resumes by itself.
func TestFaultPartitionRedis(t *testing.T) {
	nodes, l := twoNodeLedger(t)
	a, b := nodes[0], nodes[1]
	s0 := l.recv[0].stats()
	a.rd.Partition(true)
	start := time.Now()
	took := pollUntil(t, 30*time.Second, "node a reports the bus down", func() bool {
		return len(a.logw.logged("bus backend unavailable")) > 0
	})
	l.waitAcks(100, 30*time.Second, "during the partition")
	pa, _, _ := l.latency(start, "sa")
	pb, _, _ := l.latency(start, "sb")
	lv, rd := a.nodeLevel(), a.readyStatus()
	onl, _ := a.fget(fmt.Sprintf("/admin/v1/groups/%d/online", l.gid), a.admin)
	fromB := l.recv[0].pushesFrom("sb", start.Add(took))
	s1 := l.recv[0].stats()
	errs := l.takeErrors()
	if lv == wire.LevelReject || rd != http.StatusOK {
		t.Errorf("node a cut from Redis: level %d, readyz %d; want below 4, 200", lv, rd)
	}
	a.rd.Partition(false)
	healed := time.Now()
	rec := pollUntil(t, 30*time.Second, "pushes cross from b to a again", func() bool { return l.recv[0].pushesFrom("sb", healed) > 0 })
	rec2 := pollUntil(t, 30*time.Second, "pushes cross from a to b again", func() bool { return l.recv[2].pushesFrom("sa", healed) > 0 })
	total := l.check(b.testServer, 30*time.Second)
	faultLogf(t, "bus down reported after %v; ack p50 node a %v, node b %v; level %d, readyz %d, online count on a %d; receiver on a: %s, %d pushes of b's messages after the report; errors %s; pushes crossed again b->a %v, a->b %v after the heal; %d stored",
		took.Round(time.Millisecond), pa, pb, lv, rd, onl, recvDelta(s0, s1), fromB, joinErrs(errs), rec.Round(time.Millisecond), rec2.Round(time.Millisecond), total)
}

// TestFaultPartitionPostgres: node a loses Postgres (both directions held)
// but still reaches Redis. a goes to L4 and answers 503 on /readyz, its
// sends are refused unavailable; node b goes on, and b's messages still
// reach a's receivers (the bus carries committed batches; a pushes or the
// receivers pull them from b's side once a is back). After the heal a
// returns to L0 by itself and every retried send is stored once.
func TestFaultPartitionPostgres(t *testing.T) {
	nodes, l := twoNodeLedger(t)
	a, b := nodes[0], nodes[1]
	a.pg.Partition(true)
	start := time.Now()
	toL4 := pollUntil(t, 30*time.Second, "node a at L4", func() bool { return a.nodeLevel() == wire.LevelReject })
	pollUntil(t, 10*time.Second, "node a not ready", func() bool { return a.readyStatus() == http.StatusServiceUnavailable })
	atL4 := time.Now()
	l.waitAcks(30, 30*time.Second, "node b during a's partition")
	bP50, _, bN := l.latency(atL4, "sb")
	fromB := l.recv[0].pushesFrom("sb", atL4)
	if st := b.readyStatus(); st != http.StatusOK || b.nodeLevel() == wire.LevelReject {
		t.Errorf("node b while a is cut from Postgres: readyz %d, level %d", st, b.nodeLevel())
	}
	errs := l.takeErrors()
	held := time.Since(start)
	a.pg.Partition(false)
	rec := pollUntil(t, 30*time.Second, "node a back to L0 and ready", func() bool {
		return a.nodeLevel() == 0 && a.readyStatus() == http.StatusOK
	})
	l.waitAcks(20, 30*time.Second, "after the heal")
	total := l.check(a.testServer, 30*time.Second)
	faultLogf(t, "L4 after %v; readyz 503; clients saw %s; node b acked %d (p50 %v) meanwhile, %d of them pushed to a receiver on a; partition held %v; L0 and ready %v after the heal; %d stored",
		toL4.Round(time.Millisecond), joinErrs(errs), bN, bP50, fromB, held.Round(time.Millisecond), rec.Round(time.Millisecond), total)
}

// clientLink is a client's link to a node: proxies in front of its socket
// and HTTP ports, faults applied to both.
type clientLink struct {
	ws, http *faultproxy.Proxy
}

func newClientLink(t *testing.T, ts *testServer) *clientLink {
	t.Helper()
	return &clientLink{ws: faultproxy.Start(t, strings.TrimPrefix(ts.ws, "ws://")), http: faultproxy.Start(t, strings.TrimPrefix(ts.http, "http://"))}
}

func (cl *clientLink) endpoint() endpoint {
	return endpoint{"ws://" + cl.ws.Addr(), "http://" + cl.http.Addr()}
}

func (cl *clientLink) set(d faultproxy.Direction, f faultproxy.Faults) {
	cl.ws.Set(d, f)
	cl.http.Set(d, f)
}

func (cl *clientLink) partition(on bool) {
	cl.ws.Partition(on)
	cl.http.Partition(on)
}

func (cl *clientLink) clear() {
	cl.ws.Clear()
	cl.http.Clear()
}

// sockets returns the node's open WebSocket connections and TCP
// connections (handshakes and closings included).
func (ts *testServer) sockets() (ws, tcp float64) {
	m := scrapeValues(ts.t, ts)
	return m["fanfare_ws_connections"], m["fanfare_ws_tcp_connections"]
}

// TestFaultClientLinks: faults on the link between one client and a node
// (cluster mode); a control receiver and the sender connect directly. The
// node must serve the others as before, detect a dead or stuck client by
// its heartbeat (1 s) and idle timeout (3 s) or by its outbound bound, and
// free its connection; the client must get everything once its link is
// back.
func TestFaultClientLinks(t *testing.T) {
	// One node for every case, each case with a group, a ledger and a link
	// of its own (the cases run one after another, so the node's socket
	// counts are the case's). The smallest outbound bound (one page of the
	// largest message): a link slower than a group's traffic fills it in
	// a second.
	n := startFaultNodes(t, 1, "-outbound-bytes", strconv.Itoa(36<<10))[0]
	setup := func(t *testing.T) (*faultLedger, *clientLink) {
		t.Helper()
		gid := n.createGroup("via", "direct", "sender", "sender2", "stuck", "ledger-reader")
		l := newFaultLedger(t, gid)
		link := newClientLink(t, n.testServer)
		l.receiver(n.testServer, n.endpoint(), "direct")
		l.sender(n.testServer, n.endpoint(), "sender")
		return l, link
	}
	// freeAll waits until the node holds no more connections than before
	// the case: every case's clients are closed by its cleanup.
	ws0, tcp0 := n.sockets()
	settle := func(t *testing.T) {
		pollUntil(t, 30*time.Second, "the node back to its connections before the case", func() bool {
			w, tc := n.sockets()
			return w <= ws0 && tc <= tcp0
		})
	}

	t.Run("latency", func(t *testing.T) {
		t.Cleanup(func() { settle(t) })
		l, link := setup(t)
		lat := faultproxy.Faults{Latency: 50 * time.Millisecond, Jitter: 25 * time.Millisecond}
		link.set(faultproxy.Upstream, lat)
		link.set(faultproxy.Downstream, lat)
		l.receiver(n.testServer, link.endpoint(), "via")
		l.sender(n.testServer, link.endpoint(), "sender2")
		start := time.Now()
		l.waitAcks(60, 30*time.Second, "under latency")
		slow, worst, k := l.latency(start, "sender2")
		fast, _, _ := l.latency(start, "sender")
		pv, _ := l.recv[1].pushes(start)
		pd, _ := l.recv[0].pushes(start)
		if slow < 100*time.Millisecond {
			t.Errorf("ack p50 over a 100-150 ms round trip: %v", slow)
		}
		link.clear()
		total := l.check(n.testServer, 30*time.Second)
		faultLogf(t, "ack p50 over the slow link %v (max %v, %d acks), direct %v; push delay p50 over the slow link %v, direct %v; %d stored", slow, worst, k, fast, pv, pd, total)
	})

	// bulk sends 16 KiB messages from four direct connections until done
	// says so, failing after 60 s: several MiB a second, more than the
	// kernel's buffers in front of a slow reader take for long.
	bulk := func(t *testing.T, l *faultLedger, what string, dialed func(), done func() bool) time.Duration {
		t.Helper()
		body := json.RawMessage(`{"bulk":"` + strings.Repeat("b", 16<<10) + `"}`)
		start := time.Now()
		var stop atomic.Bool
		var failed atomic.Value
		var wg sync.WaitGroup
		for range 4 {
			c := l.dial(n.testServer, n.endpoint(), "sender2", nil, nil)
			wg.Go(func() {
				for !stop.Load() {
					if _, err := c.Send(l.ctx, l.gid, body); err != nil {
						failed.Store(err)
						return
					}
				}
			})
		}
		defer func() { stop.Store(true); wg.Wait() }()
		if dialed != nil {
			dialed()
		}
		pollUntil(t, 60*time.Second, what, func() bool {
			if err := failed.Load(); err != nil {
				t.Fatalf("bulk send: %v", err)
			}
			return done()
		})
		return time.Since(start)
	}

	t.Run("bandwidth", func(t *testing.T) {
		t.Cleanup(func() { settle(t) })
		l, link := setup(t)
		link.ws.SetSocketBuffers(16 << 10)
		link.ws.Set(faultproxy.Downstream, faultproxy.Faults{BytesPerSecond: 8 << 10})
		via := l.receiver(n.testServer, link.endpoint(), "via")
		drops0 := n.metricValue("fanfare_ws_pushes_dropped_total")
		resyncs0 := n.metricValue("fanfare_ws_resyncs_total")
		took := bulk(t, l, "pushes dropped for the slow client", nil, func() bool {
			return n.metricValue("fanfare_ws_pushes_dropped_total") > drops0
		})
		link.clear()
		total := l.check(n.testServer, 60*time.Second)
		drops := n.metricValue("fanfare_ws_pushes_dropped_total") - drops0
		resyncs := n.metricValue("fanfare_ws_resyncs_total") - resyncs0
		_, resync, discon := via.events()
		st := via.stats()
		faultLogf(t, "first drop after %v of 16 KiB messages from 4 senders, the client at 8 KiB/s; %.0f pushes dropped, %.0f resyncs sent (%d seen by the client), %d disconnects; the slow client got %d messages, %d by pull; %d stored",
			took.Round(time.Millisecond), drops, resyncs, resync, discon, st.Delivered, st.Pulled, total)
	})

	t.Run("stops-reading", func(t *testing.T) {
		// A client that keeps pinging but reads nothing (its replies are
		// held on the link): the node drops its pushes past the bound and
		// closes it, by the hard bound or at the idle timeout (a ping
		// whose pong cannot be written does not count).
		t.Cleanup(func() { settle(t) })
		l, link := setup(t)
		link.ws.SetSocketBuffers(16 << 10)
		stuck := &testServer{t: t, ws: "ws://" + link.ws.Addr(), signer: n.signer}
		rc := stuck.dialRaw("stuck")
		link.ws.Set(faultproxy.Downstream, faultproxy.Faults{Blackhole: true})
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if err := wsutilPing(rc); err != nil {
						t.Logf("the stuck client's ping: %v", err)
						return
					}
				}
			}
		})
		defer func() { close(stop); wg.Wait() }()
		slow0 := n.metricValue("fanfare_ws_slow_closed_total")
		var w1 float64
		took := bulk(t, l, "the stuck client's connection freed", func() { w1, _ = n.sockets() }, func() bool {
			w, _ := n.sockets()
			return w < w1
		})
		slow := n.metricValue("fanfare_ws_slow_closed_total") - slow0
		link.clear()
		total := l.check(n.testServer, 30*time.Second)
		faultLogf(t, "connection freed %v after the client stopped reading (%.0f closed by the hard outbound bound, else the idle timeout); %d stored, the other clients complete", took.Round(time.Millisecond), slow, total)
	})

	for _, c := range []struct {
		name string
		set  func(*clientLink)
		// redials: the client's redials reach the node during the fault
		// (their answers are held), so the node holds one short-lived
		// connection of it at a time instead of none.
		redials bool
	}{
		{"half-open", func(cl *clientLink) { cl.partition(true) }, false},
		{"blackhole-up", func(cl *clientLink) { cl.set(faultproxy.Upstream, faultproxy.Faults{Blackhole: true}) }, false},
		{"blackhole-down", func(cl *clientLink) { cl.set(faultproxy.Downstream, faultproxy.Faults{Blackhole: true}) }, true},
		{"resets", func(cl *clientLink) { cl.set(faultproxy.Downstream, faultproxy.Faults{ResetAfter: 2 << 10}) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Cleanup(func() { settle(t) })
			l, link := setup(t)
			w1, _ := n.sockets()
			via := l.receiver(n.testServer, link.endpoint(), "via")
			pollUntil(t, 10*time.Second, "the client's connection open", func() bool { w, _ := n.sockets(); return w > w1 })
			l.waitAcks(20, 30*time.Second, "before the fault")
			c.set(link)
			start := time.Now()
			pollUntil(t, 30*time.Second, "the client notices", func() bool { _, _, d := via.events(); return d > 0 })
			noticed := time.Since(start)
			var freed time.Duration
			if !c.redials {
				// The node frees the connection by itself: idle timeout, then
				// the close timeout for a close frame nobody acknowledges.
				pollUntil(t, 30*time.Second, "the node frees the client's connection", func() bool { w, _ := n.sockets(); return w <= w1 })
				freed = time.Since(start)
			}
			l.waitAcks(30, 30*time.Second, "during the fault")
			// Nothing piles up: at most the one redial in flight.
			peak := 0.0
			for range 20 {
				w, _ := n.sockets()
				peak = max(peak, w-w1)
			}
			if peak > 1 {
				t.Errorf("the node holds %v connections of the faulty client", peak)
			}
			link.clear()
			healed := time.Now()
			back := pollUntil(t, 30*time.Second, "the client reconnected", func() bool { return via.conn.Connected() })
			total := l.check(n.testServer, 30*time.Second)
			_, _, discon := via.events()
			faultLogf(t, "client noticed after %v (%d disconnects in all); node freed the connection after %v (0 = it was the client's own close); at most %v of its connections held during the fault; reconnected %v after the heal, complete %v after; %d stored",
				noticed.Round(time.Millisecond), discon, freed.Round(time.Millisecond), peak, back.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond), total)
		})
	}
}

// wsutilPing sends one protocol ping frame.
func wsutilPing(rc *rawConn) error {
	return wsutil.WriteClientText(rc.rw, []byte(`{"type":"ping"}`))
}
