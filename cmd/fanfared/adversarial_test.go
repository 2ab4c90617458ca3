package main

// The adversarial end-to-end suite: one subtest per class of attack (or
// unlucky use) found by the hardening review, each driven over real sockets
// against a real fanfared, asserting the behaviour a client may rely on.
// Where the exact answer is a design choice (an error code for a flood, the
// name of a new bound), a case asserts the observable invariant instead (no
// message leaks, bounded memory, an eventual close, other users unaffected,
// nothing lost) and says so in its comment.

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
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/postgres/pgtest"
)

// advRedisPort is the throwaway Redis of the cluster outage case: the top
// of cmd/fanfared's range (internal/redistest/doc.go), below the ports
// pgtest.StartThrowaway takes from the bottom.
const advRedisPort = 25447

// TestAdversarial runs every class of the hardening review once.
func TestAdversarial(t *testing.T) {
	t.Run("join_window", func(t *testing.T) {
		for _, mode := range modes {
			t.Run(mode, func(t *testing.T) { advJoinWindow(t, mode) })
		}
	})
	t.Run("ping_flood", advPingFlood)
	t.Run("max_body_pull", func(t *testing.T) {
		for _, mode := range modes {
			t.Run(mode, func(t *testing.T) { advMaxBodyPull(t, mode) })
		}
	})
	t.Run("removal_redis_down", advRemovalRedisDown)
	t.Run("non_member_flood", func(t *testing.T) {
		for _, mode := range modes {
			t.Run(mode, func(t *testing.T) { advNonMemberFlood(t, mode) })
		}
	})
	t.Run("read_flood", advReadFlood)
	t.Run("rooms_restart", advRoomsRestart)
	t.Run("secrets_help", advSecretsHelp)
	t.Run("conns_per_ip", advConnsPerIP)
	t.Run("edge_input", func(t *testing.T) {
		for _, mode := range modes {
			t.Run(mode, func(t *testing.T) { advEdgeInput(t, mode) })
		}
	})
}

// advHTTP bounds every request of the suite: a server that hangs fails the
// case instead of the whole test binary.
var advHTTP = &http.Client{Timeout: 20 * time.Second}

// advDo is testServer.do with a bounded client; it returns the status and
// the raw body.
func advDo(t *testing.T, base, method, path, tok string, body any, out any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := advHTTP.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: decode %.200q: %v", method, path, raw, err)
		}
	}
	return resp.StatusCode, raw
}

// advRead reads one server text message and decodes it, returning its
// size on the wire too.
func advRead(rc *rawConn, d time.Duration) (wire.ServerFrame, int, error) {
	rc.c.SetReadDeadline(time.Now().Add(d))
	b, err := wsutil.ReadServerText(rc.rw)
	if err != nil {
		return nil, 0, err
	}
	f, err := wire.DecodeServer(b)
	return f, len(b), err
}

// advSpan is the range of gid's seqs a push frame carries (ok false for
// other frames and groups).
func advSpan(f wire.ServerFrame, gid int64) (lo, hi int64, ok bool) {
	switch m := f.(type) {
	case *wire.Msg:
		if m.GID == gid {
			return m.Seq, m.Seq, true
		}
	case *wire.Batch:
		if m.GID == gid && len(m.Messages) > 0 {
			lo, hi = m.Messages[0].Seq, m.Messages[0].Seq
			for _, x := range m.Messages {
				lo, hi = min(lo, x.Seq), max(hi, x.Seq)
			}
			return lo, hi, true
		}
	case *wire.Summary:
		if m.GID == gid {
			return m.First.Seq, m.LastSeq, true
		}
	}
	return 0, 0, false
}

// advSendWS sends one message as rc and waits for its answer: the ack's
// seq, or the error frame.
func advSendWS(t *testing.T, rc *rawConn, gid int64, id, body string) (int64, *wire.Error) {
	t.Helper()
	rc.send(fmt.Sprintf(`{"type":"send","id":%q,"gid":%d,"body":%s}`, id, gid, body))
	deadline := time.Now().Add(15 * time.Second)
	for {
		f, err := rc.tryRead(time.Until(deadline))
		if err != nil {
			t.Fatalf("send %s: no answer: %v", id, err)
		}
		switch f := f.(type) {
		case *wire.Ack:
			if f.ID == id {
				return f.Seq, nil
			}
		case *wire.Error:
			if f.ID == id {
				return 0, f
			}
		}
	}
}

// advWaitSeq reads rc until a push of gid covering seq arrives (true), or
// d passes (false).
func advWaitSeq(rc *rawConn, gid, seq int64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		f, err := rc.tryRead(time.Until(deadline))
		if err != nil {
			return false
		}
		if lo, hi, ok := advSpan(f, gid); ok && lo <= seq && seq <= hi {
			return true
		}
	}
}

// advJoinWindow (class 1): pushes held in an open merge window (the group
// at L1, forced through the admin API) go only to those who were members
// when each message was committed. A member added while messages wait in
// the window gets none below its join_seq, and still gets the messages
// from its join_seq on; a member removed while the window is open gets
// none committed after its removal. In cluster mode the observers are
// online on both nodes, so node b checks the remote batches parked in its
// window.
func advJoinWindow(t *testing.T, mode string) {
	const window = time.Second
	var nodes []*testServer
	if mode == "embedded" {
		nodes = []*testServer{startServer(t, mode, "-merge-window", window.String())}
	} else {
		a, b := startTwoNodes(t, "-merge-window", window.String())
		nodes = []*testServer{a, b}
	}
	head, tail := nodes[0], nodes[len(nodes)-1]
	gid := head.createGroup("sender", "watch", "gone")
	sender := head.dialRaw("sender")
	var watch, gone, late []*rawConn
	for _, n := range nodes {
		watch = append(watch, n.dialRaw("watch"))
		gone = append(gone, n.dialRaw("gone"))
		late = append(late, n.dialRaw("late")) // not a member yet
	}
	send := func(id string) int64 {
		t.Helper()
		seq, e := advSendWS(t, sender, gid, id, fmt.Sprintf("%q", id))
		if e != nil {
			t.Fatalf("send %s: %+v", id, e)
		}
		return seq
	}
	// Every node pushes the group (a remote node subscribes within its
	// flush interval).
	for i, deadline := 0, time.Now().Add(15*time.Second); ; i++ {
		seq := send(fmt.Sprintf("probe-%d", i))
		all := true
		for _, w := range watch {
			all = advWaitSeq(w, gid, seq, 300*time.Millisecond) && all
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the group's pushes did not reach every node in 15 s")
		}
	}
	for _, n := range nodes {
		n.degrade(wire.ScopeGroup, gid, lv(1), 0)
	}
	for _, w := range watch {
		for {
			d, _ := readUntil[*wire.Degraded](w, 10*time.Second)
			if d.GID == gid && d.Level == 1 {
				break
			}
		}
	}
	// align returns right after the last node flushed its window, so
	// that what follows happens while the next window is open.
	align := func(tag string) {
		t.Helper()
		seq := send(tag)
		if !advWaitSeq(watch[len(watch)-1], gid, seq, 10*window) {
			t.Fatalf("%s: seq %d not flushed on %s within %v", tag, seq, tail.srv.cfg.NodeID, 10*window)
		}
	}

	// A member added during the window.
	align("align-join")
	start := time.Now()
	last := send("w1")
	last = max(last, send("w2"))
	last = max(last, send("w3"))
	join := head.addMembers(gid, "late")[0].JoinSeq
	if join != last+1 {
		t.Fatalf("late's join_seq %d, want %d", join, last+1)
	}
	after := send("w4")
	if el := time.Since(start); el > window/2 {
		t.Logf("the join phase took %v of a %v window: its messages may have been flushed before the join", el, window)
	}
	if !advWaitSeq(watch[len(watch)-1], gid, after, 10*window) {
		t.Fatalf("seq %d not flushed within %v", after, 10*window)
	}
	for i, rc := range late {
		got := false
		deadline := time.Now().Add(5 * window)
		for !got {
			f, err := rc.tryRead(time.Until(deadline))
			if err != nil {
				t.Fatalf("late on %s: no push from its join_seq %d on: %v", nodes[i].srv.cfg.NodeID, join, err)
			}
			if lo, hi, ok := advSpan(f, gid); ok {
				if lo < join {
					t.Errorf("late on %s (join_seq %d) was pushed seqs %d..%d: messages from before it joined", nodes[i].srv.cfg.NodeID, join, lo, hi)
				}
				got = hi >= join
			}
			if r, ok := f.(*wire.Resync); ok && r.GID == gid {
				got = true
			}
		}
	}

	// A member removed during the window.
	align("align-remove")
	before := send("r1")
	if st, _ := advDo(t, head.http, "DELETE", fmt.Sprintf("/v1/groups/%d/members/gone", gid), head.admin, nil, nil); st != http.StatusNoContent {
		t.Fatalf("remove gone: status %d", st)
	}
	removed := send("r2")
	if !advWaitSeq(watch[len(watch)-1], gid, removed, 10*window) {
		t.Fatalf("seq %d not flushed within %v", removed, 10*window)
	}
	for i, rc := range gone {
		for _, f := range quietFrames(rc, 300*time.Millisecond) {
			if lo, hi, ok := advSpan(f, gid); ok && hi > before {
				t.Errorf("gone on %s, removed after seq %d, was pushed seqs %d..%d", nodes[i].srv.cfg.NodeID, before, lo, hi)
			}
		}
	}
}

// advRSS is the process's resident set in bytes (Linux).
func advRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

func advHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// advDialTiny opens a WebSocket as uid with a tiny receive buffer (4 KiB
// SO_RCVBUF, set before connect so the window stays small) and returns it
// without reading anything, hello included.
func advDialTiny(t *testing.T, ts *testServer, uid string) net.Conn {
	t.Helper()
	d := ws.Dialer{NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		nd := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			}); err != nil {
				return err
			}
			return serr
		}}
		return nd.DialContext(ctx, network, addr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, _, err := d.Dial(ctx, ts.ws+"/ws?token="+ts.token(uid, 0))
	if err != nil {
		t.Fatalf("dial %s: %v", uid, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// advPingFlood (class 2): clients with a 4 KiB receive window send
// WebSocket pings (125-byte payloads, the largest control frame) as fast
// as they can for 4 s and never read (-outbound-bytes 64 KiB, so the hard
// bound is 256 KiB). Asserted: the server's Go heap (in-process, after a
// GC) grows by less than the hard bound plus 2 MiB per flooder, i.e. every
// pong counts against the outbound bounds; each flooder is closed by the
// server (during the flood, or when it finally reads it meets the end of
// the stream within 5 s, having been sent no more than the hard bound
// plus 4 MiB of kernel buffers); another user's pings and sends are
// answered within 2 s throughout.
func advPingFlood(t *testing.T) {
	ts := startServer(t, "embedded", "-outbound-bytes", "65536")
	gid := ts.createGroup("other", "peer")
	other := ts.dialRaw("other")
	const flooders, slack = 3, 2 << 20
	hard := int64(4 * ts.srv.cfg.OutboundBytes) // socket.Config.OutboundHardBound's default
	heap0, rss0 := advHeap(), advRSS(t)

	payload := bytes.Repeat([]byte{'p'}, 125)
	var frames bytes.Buffer
	for range 512 {
		if err := ws.WriteFrame(&frames, ws.MaskFrame(ws.NewPingFrame(payload))); err != nil {
			t.Fatal(err)
		}
	}
	chunk := frames.Bytes()
	conns := make([]net.Conn, flooders)
	for i := range conns {
		conns[i] = advDialTiny(t, ts, fmt.Sprintf("flood%d", i))
	}
	floodFor := 4 * time.Second
	stop := time.Now().Add(floodFor)
	var wg sync.WaitGroup
	written := make([]int64, flooders)
	cut := make([]error, flooders) // the write error: the server closed it
	for i, c := range conns {
		wg.Go(func() {
			for time.Now().Before(stop) {
				c.SetWriteDeadline(stop)
				n, err := c.Write(chunk)
				written[i] += int64(n)
				if err != nil {
					if !errors.Is(err, os.ErrDeadlineExceeded) {
						cut[i] = err
					}
					return
				}
			}
		})
	}
	// Meanwhile another user is served as usual.
	var worst time.Duration
	var peakHeap int64
	for i := 0; time.Now().Before(stop); i++ {
		t0 := time.Now()
		if _, e := advSendWS(t, other, gid, fmt.Sprintf("s%d", i), "1"); e != nil {
			t.Errorf("send during the ping flood: %+v", e)
		}
		worst = max(worst, time.Since(t0))
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peakHeap = max(peakHeap, int64(ms.HeapInuse)-heap0)
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	grown, rssGrown := advHeap()-heap0, advRSS(t)-rss0
	t.Logf("flood: %d flooders wrote %v bytes of pings; server heap grew %d MiB (peak %d MiB), RSS %d MiB; other user's worst round trip %v",
		flooders, written, grown>>20, peakHeap>>20, rssGrown>>20, worst)
	if limit := int64(flooders) * (hard + slack); grown > limit {
		t.Errorf("server heap grew %.1f MiB under %d ping flooders, want under %.1f MiB (the hard bound %d KiB + 2 MiB each)", float64(grown)/(1<<20), flooders, float64(limit)/(1<<20), hard>>10)
	}
	if worst > 2*time.Second {
		t.Errorf("another user's send round trip took %v during the flood, want under 2 s", worst)
	}
	var rg sync.WaitGroup
	defer rg.Wait()
	for i, c := range conns {
		if cut[i] != nil {
			continue // closed by the server during the flood
		}
		rg.Go(func() { advDrained(t, i, c, hard, floodFor) })
	}
}

// advDrained reads what the server still sends a ping flooder once its
// flood is over.
func advDrained(t *testing.T, i int, c net.Conn, hard int64, floodFor time.Duration) {
	// No more than the server may hold for the connection (the hard
	// bound) plus what the kernels' buffers hold (4 MiB), then the end (a
	// close frame and EOF, or a reset).
	most := hard + 4<<20
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := io.CopyN(io.Discard, c, most+1)
	switch {
	case err == nil:
		t.Errorf("flooder %d: read %d KiB after the flood and the server is still sending: it held more than the hard bound (%d KiB) for it", i, n>>10, hard>>10)
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Errorf("flooder %d: not closed 5 s after a %v ping flood (read %d KiB)", i, floodFor, n>>10)
	}
}

// advMaxBodyPull (class 3): 150 messages whose bodies are at the store's
// body bound and 200 messages of 22 KB, pulled from seq 1. Over WebSocket
// every answer is a messages frame no larger than the connection's hard
// outbound bound (4 x -outbound-bytes) and the socket stays open; over
// HTTP every page is within the same byte bound; paging from the last seq
// of each page gets every message, in order, with its body. The Go SDK
// catching up both groups delivers all 350 messages without a reconnect.
func advMaxBodyPull(t *testing.T, mode string) {
	// The store-latency alarm is off: the bulk load below is set-up, and
	// its slow commits must not raise the node to L3 (which refuses new
	// connections) before the pulls.
	ts := startServer(t, mode, "-store-latency-alarm", "-1ms")
	hard := 4 * ts.srv.cfg.OutboundBytes
	type set struct {
		name  string
		n     int
		bytes int // body size, JSON quotes included
		gid   int64
	}
	sets := []*set{{name: "max", n: 150, bytes: store.DefaultMaxBodyBytes}, {name: "22k", n: 200, bytes: 22000}}
	body := func(s *set, i int) string {
		tag := fmt.Sprintf("%s-%d-", s.name, i)
		return `"` + tag + strings.Repeat("x", s.bytes-2-len(tag)) + `"`
	}
	t0 := time.Now()
	for _, s := range sets {
		s.gid = ts.createGroup("owner", "reader")
	}
	// The owner sends them over one socket, 32 in flight (the engine
	// commits them in batches), and sends again what the node refuses as
	// overloaded; pushes of its own messages past its outbound bound
	// become resyncs, which it ignores.
	owner := ts.dialRaw("owner")
	owner.send(`{"type":"ping","id":"ready"}`)
	readUntil[*wire.Pong](owner, 10*time.Second)
	type pending struct {
		s *set
		i int
	}
	var queue []pending
	byID := map[string]pending{}
	for _, s := range sets {
		for i := range s.n {
			p := pending{s, i}
			queue = append(queue, p)
			byID[fmt.Sprintf("%s-%d", s.name, i)] = p
		}
	}
	inflight := 0
	for acked := 0; acked < 350; {
		for inflight < 32 && len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			owner.send(fmt.Sprintf(`{"type":"send","id":"%s-%d","gid":%d,"body":%s}`, p.s.name, p.i, p.s.gid, body(p.s, p.i)))
			inflight++
		}
		f, err := owner.tryRead(30 * time.Second)
		if err != nil {
			t.Fatalf("storing the messages: %d acked, then %v", acked, err)
		}
		switch f := f.(type) {
		case *wire.Ack:
			acked++
			inflight--
		case *wire.Error:
			p, ok := byID[f.ID]
			if !ok || f.Code != wire.CodeOverloaded {
				t.Fatalf("storing the messages: %+v", f)
			}
			inflight--
			queue = append(queue, p)
			time.Sleep(time.Duration(f.RetryAfterMS) * time.Millisecond)
		}
	}
	owner.c.Close()
	t.Logf("stored 350 messages in %v", time.Since(t0))
	check := func(how string, s *set, got []wire.Msg) {
		t.Helper()
		if len(got) != s.n {
			t.Errorf("%s %s: got %d messages, want %d", how, s.name, len(got), s.n)
			return
		}
		for i, m := range got {
			if m.Seq != int64(i+1) || len(m.Body) != s.bytes {
				t.Errorf("%s %s: message %d has seq %d and a %d-byte body, want seq %d, %d bytes", how, s.name, i, m.Seq, len(m.Body), i+1, s.bytes)
				return
			}
		}
	}

	// wsPull pages through s over a socket of its own; a failure ends
	// this transport's part only.
	wsPull := func(s *set) {
		rc := ts.dialRaw("reader")
		defer rc.c.Close()
		var got []wire.Msg
		for page := 0; len(got) < s.n; page++ {
			id := fmt.Sprintf("%s-p%d", s.name, page)
			rc.send(fmt.Sprintf(`{"type":"pull","id":%q,"gid":%d,"from_seq":%d,"to_seq":0}`, id, s.gid, int64(len(got))+1))
			var m *wire.Messages
			for m == nil {
				f, n, err := advRead(rc, 15*time.Second)
				if err != nil {
					t.Errorf("ws pull %s from %d: %v (the socket was closed or no answer)", s.name, len(got)+1, err)
					return
				}
				if x, ok := f.(*wire.Messages); ok && x.ID == id {
					if n > hard {
						t.Errorf("ws pull %s from %d: a %d-byte answer, over the connection's hard bound %d", s.name, len(got)+1, n, hard)
					}
					m = x
				}
				if e, ok := f.(*wire.Error); ok && e.ID == id {
					t.Errorf("ws pull %s from %d: %+v", s.name, len(got)+1, e)
					return
				}
			}
			if len(m.Messages) == 0 {
				t.Errorf("ws pull %s from %d: an empty page, last_seq %d", s.name, len(got)+1, m.LastSeq)
				return
			}
			got = append(got, m.Messages...)
		}
		check("ws pull", s, got)
	}
	httpPull := func(s *set) {
		var got []wire.Msg
		tok := ts.token("reader", 0)
		for len(got) < s.n {
			var p wire.MessagesPage
			st, raw := advDo(t, ts.http, "GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=%d", s.gid, len(got)+1), tok, nil, &p)
			if st != http.StatusOK {
				t.Errorf("http pull %s from %d: status %d %.200s", s.name, len(got)+1, st, raw)
				return
			}
			if len(raw) > hard {
				t.Errorf("http pull %s from %d: a %d-byte page, over the byte bound %d", s.name, len(got)+1, len(raw), hard)
			}
			if len(p.Messages) == 0 {
				t.Errorf("http pull %s from %d: an empty page", s.name, len(got)+1)
				return
			}
			got = append(got, p.Messages...)
		}
		check("http pull", s, got)
	}
	for _, s := range sets {
		wsPull(s)
		httpPull(s)
	}

	// The SDK catches both groups up from seq 0.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cur := map[int64]int64{}
	for _, s := range sets {
		cur[s.gid] = 0
	}
	var disconnects atomic.Int64
	cc, err := client.Dial(ctx, client.Config{URL: ts.ws + "/ws", Token: ts.token("reader", 0), HTTPURL: ts.http,
		Cursors: cur, OnEvent: func(ev client.Event) {
			if ev.Kind == client.EventDisconnected {
				disconnects.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	got := map[int64][]wire.Msg{}
	total := 0
	for total < 350 {
		select {
		case m := <-cc.Messages():
			got[m.GID] = append(got[m.GID], wire.Msg{GID: m.GID, Seq: m.Seq, Body: m.Body})
			total++
		case <-ctx.Done():
			st := cc.Stats()
			t.Fatalf("SDK: delivered %d of 350 in 10 s; %d disconnects, %d reconnects, %d pulls", total, disconnects.Load(), st.Reconnects, st.Pulls)
		}
	}
	for _, s := range sets {
		check("SDK", s, got[s.gid])
	}
	if st := cc.Stats(); st.Reconnects != 0 || disconnects.Load() != 0 {
		t.Errorf("SDK: %d reconnects, %d disconnects while catching up, want none", st.Reconnects, disconnects.Load())
	}
}

// advProc is a fanfared child process whose stderr (the JSON log) is kept.
type advProc struct {
	t   *testing.T
	cmd *exec.Cmd
	ts  *testServer // HTTP and WebSocket helpers; srv is nil
	mu  sync.Mutex
	log bytes.Buffer
}

func (p *advProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Write(b)
}

func (p *advProc) logLen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Len()
}

func (p *advProc) logFrom(off int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()[off:]
}

func startAdvProc(t *testing.T, args ...string) *advProc {
	t.Helper()
	httpAddr, wsAddr := freePort(t), freePort(t)
	args = append([]string{"-http-addr", httpAddr, "-ws-addr", wsAddr, "-jwt-secret", testSecret,
		"-admin-token", "test-admin-token", "-log-level", "warn", "-limits-file", unlimited(t)}, args...)
	p := &advProc{t: t, ts: &testServer{t: t, ws: "ws://" + wsAddr, http: "http://" + httpAddr,
		admin: "test-admin-token", signer: newTestSigner(t)}}
	p.cmd = exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	p.cmd.Env = serverEnv()
	p.cmd.Stderr = p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := advHTTP.Get(p.ts.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("fanfared child not ready in 30 s: %v\n%s", err, p.logFrom(0))
		}
	}
}

// advRemovalRedisDown (class 4): two nodes share Postgres and a throwaway
// Redis. With Redis stopped, bob (online on node b) is removed through
// node a; Redis is restarted. Asserted: the removal reaches node b
// eventually (within 15 s of the cross-node pushes working again, a
// message node b pushes to carol is not pushed to bob, and from then on
// bob gets none of the group's messages), and every line the nodes log
// during and after the outage is JSON.
func advRemovalRedisDown(t *testing.T) {
	rd := redistest.Start(t, advRedisPort)
	url := pgtest.URL(t)
	common := []string{"-postgres-url", url, "-postgres-schema", pgtest.Schema(t, url),
		"-redis-addr", rd.Addr(), "-redis-prefix", "adv" + randomHex(4) + ":"}
	pa := startAdvProc(t, append([]string{"-node-id", "node-a"}, common...)...)
	pb := startAdvProc(t, append([]string{"-node-id", "node-b"}, common...)...)
	a, b := pa.ts, pb.ts
	gid := a.createGroup("alice", "bob", "carol")
	alice := a.dialRaw("alice")
	carol := b.dialRaw("carol")
	bobRC := b.dialRaw("bob")
	send := func(id string) int64 {
		t.Helper()
		seq, e := advSendWS(t, alice, gid, id, fmt.Sprintf("%q", id))
		if e != nil {
			t.Fatalf("send %s: %+v", id, e)
		}
		return seq
	}
	cross := func(tag string) int64 {
		t.Helper()
		for i, deadline := 0, time.Now().Add(20*time.Second); ; i++ {
			seq := send(fmt.Sprintf("%s-%d", tag, i))
			if advWaitSeq(carol, gid, seq, 300*time.Millisecond) {
				return seq
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no push crossed from node a to node b in 20 s", tag)
			}
		}
	}
	cross("probe")
	if !advWaitSeq(bobRC, gid, send("for-bob"), 10*time.Second) {
		t.Fatal("bob on node b got no push before the outage")
	}
	removedAfter := send("last-before")
	bob := collect(bobRC, gid)

	logOff := []int{pa.logLen(), pb.logLen()}
	defer func() {
		for i, p := range []*advProc{pa, pb} {
			sc := bufio.NewScanner(strings.NewReader(p.logFrom(logOff[i])))
			sc.Buffer(nil, 1<<20)
			bad, first := 0, ""
			for sc.Scan() {
				if l := strings.TrimSpace(sc.Text()); l != "" && !json.Valid([]byte(l)) {
					if bad++; bad == 1 {
						first = l
					}
				}
			}
			if bad > 0 {
				t.Errorf("node %d logged %d lines that are not JSON during and after the Redis outage, the first: %.300s", i, bad, first)
			}
		}
	}()
	rd.Stop()
	if st, raw := advDo(t, a.http, "DELETE", fmt.Sprintf("/v1/groups/%d/members/bob", gid), a.admin, nil, nil); st != http.StatusNoContent {
		t.Fatalf("remove bob with Redis down: status %d %s (the store is up)", st, raw)
	}
	time.Sleep(time.Second)
	rd.Start()

	first := cross("after")
	leaked := func(from int64) []int64 {
		bob.mu.Lock()
		defer bob.mu.Unlock()
		var out []int64
		for _, s := range bob.seqs {
			if s > from {
				out = append(out, s)
			}
		}
		return out
	}
	// Converged: a message carol was pushed and bob, 300 ms later, not.
	var conv int64
	for deadline := time.Now().Add(15 * time.Second); conv == 0; {
		seq := send(fmt.Sprintf("conv-%d", time.Now().UnixNano()))
		if !advWaitSeq(carol, gid, seq, 5*time.Second) {
			t.Fatalf("carol on node b got no push of seq %d", seq)
		}
		time.Sleep(300 * time.Millisecond)
		if l := leaked(seq - 1); len(l) == 0 {
			conv = seq
		} else if time.Now().After(deadline) {
			t.Fatalf("bob, removed while Redis was down, still gets the group's pushes 15 s after the bus returned: seqs %v", leaked(removedAfter))
		}
	}
	if l := leaked(removedAfter); len(l) > 0 {
		t.Logf("before the removal reached node b, bob got seqs %v (the first message after the outage was %d)", l, first)
	}
	for i := range 3 {
		seq := send(fmt.Sprintf("final-%d", i))
		advWaitSeq(carol, gid, seq, 5*time.Second)
	}
	time.Sleep(300 * time.Millisecond)
	if l := leaked(conv); len(l) > 0 {
		t.Errorf("bob got seqs %v after the removal had reached node b", l)
	}
}

// advNonMemberFlood (class 5): mallory, not a member, sends 300 messages
// at once to a large group under its limit (20 msg/s, buffer 40, large
// from 1 member). Asserted: every answer mallory gets is forbidden (or
// overloaded: the node may shed the flood; see below); the
// group stays at level 0 and not hot; bob, online, gets no degraded
// notice; alice, a member, then sends 20 messages at once and every one
// is acked (the group's budget was not spent by mallory).
func advNonMemberFlood(t *testing.T, mode string) {
	ts := startServer(t, mode, "-large-group-members", "1", "-group-rate", "20", "-group-buffer", "40",
		"-trigger-clear-after", "30s", "-hot-clear-after", "30s")
	gid := ts.createGroup("alice", "bob")
	bob := ts.dialRaw("bob")
	mallory := advReady(ts.dialRaw("mallory"))
	const flood = 300
	var frames bytes.Buffer
	for i := range flood {
		if err := wsutil.WriteClientText(&frames, fmt.Appendf(nil, `{"type":"send","id":"m%d","gid":%d,"body":"spam"}`, i, gid)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := mallory.rw.Write(frames.Bytes()); err != nil {
		t.Fatal(err)
	}
	codes := map[string]int{}
	for n := 0; n < flood; {
		f, err := mallory.tryRead(20 * time.Second)
		if err != nil {
			t.Fatalf("mallory: %d of %d answers, then %v (answers so far: %v)", n, flood, err, codes)
		}
		switch f := f.(type) {
		case *wire.Ack:
			codes["ack"]++
			n++
		case *wire.Error:
			codes[f.Code]++
			n++
		}
	}
	// forbidden, or overloaded when the node sheds the flood itself; never
	// an ack, and never rate_limited: with the per-user limits off, that
	// can only come from the group's own limit, which mallory must not
	// reach.
	if codes[wire.CodeForbidden] == 0 || codes[wire.CodeForbidden]+codes[wire.CodeOverloaded] != flood {
		t.Errorf("mallory's %d sends were answered %v, want forbidden (or overloaded) for every one", flood, codes)
	}
	time.Sleep(1500 * time.Millisecond) // triggers are evaluated every 500 ms
	var deg wire.DegradeStatus
	advDo(t, ts.http, "GET", "/admin/v1/degrade", ts.admin, nil, &deg)
	for _, g := range deg.Groups {
		if g.GID == gid && g.Level != 0 {
			t.Errorf("after a non-member flood the group is at level %d (auto %d), want 0", g.Level, g.Auto)
		}
	}
	var hot wire.HotGroupsResponse
	advDo(t, ts.http, "GET", "/admin/v1/hot-groups", ts.admin, nil, &hot)
	for _, g := range hot.Groups {
		if g.GID == gid {
			t.Errorf("after a non-member flood the group is hot: %+v", g)
		}
	}
	for _, f := range quietFrames(bob, 200*time.Millisecond) {
		if d, ok := f.(*wire.Degraded); ok {
			t.Errorf("bob was told %+v after a non-member flood", d)
		}
	}
	alice := advReady(ts.dialRaw("alice"))
	frames.Reset()
	const own = 20
	for i := range own {
		wsutil.WriteClientText(&frames, fmt.Appendf(nil, `{"type":"send","id":"a%d","gid":%d,"body":"hi"}`, i, gid))
	}
	if _, err := alice.rw.Write(frames.Bytes()); err != nil {
		t.Fatal(err)
	}
	acked, refused := 0, map[string]int{}
	for acked+len(refused) < own {
		f, err := alice.tryRead(15 * time.Second)
		if err != nil {
			t.Fatalf("alice: %d acks, refused %v, then %v", acked, refused, err)
		}
		switch f := f.(type) {
		case *wire.Ack:
			acked++
		case *wire.Error:
			refused[f.Code+":"+f.ID]++
		}
	}
	if acked != own {
		t.Errorf("alice, a member, sent %d messages within the group's rate after the flood: %d acked, refused %v", own, acked, refused)
	}
}

// advReadFlood (class 6): one member's connection floods read frames for
// 3 s. Asserted: the flooder is answered rate_limited at least once;
// meanwhile other users' connects (dial to hello) all succeed and, like
// their sends (send to ack), each complete within 1 s.
func advReadFlood(t *testing.T) {
	// The default frame limits, which unlimited() turns off; the flooder's
	// connects and the other user's sends are not what is limited here.
	ts := startServer(t, "embedded", "-limits-file", writeFile(t, "limits.json",
		`{"rules":{"user_group":{"limit":0},"user_all":{"limit":0},"connect":{"limit":0}}}`))
	gid := ts.createGroup("flooder", "alice")
	fl := advReady(ts.dialRaw("flooder"))
	alice := ts.dialRaw("alice")
	var frames bytes.Buffer
	for i := range 2000 {
		wsutil.WriteClientText(&frames, fmt.Appendf(nil, `{"type":"read","gid":%d,"seq":%d}`, gid, i%3))
	}
	chunk := frames.Bytes()
	floodFor := 3 * time.Second
	stop := time.Now().Add(floodFor)
	var limited, others atomic.Int64
	var wg sync.WaitGroup
	var writes atomic.Int64
	wg.Go(func() {
		for time.Now().Before(stop) {
			fl.c.SetWriteDeadline(stop)
			if _, err := fl.c.Write(chunk); err != nil {
				return
			}
			writes.Add(1)
		}
	})
	wg.Go(func() {
		for {
			fl.c.SetReadDeadline(stop.Add(2 * time.Second))
			b, err := wsutil.ReadServerText(fl.rw)
			if err != nil {
				return
			}
			f, _ := wire.DecodeServer(b)
			if e, ok := f.(*wire.Error); ok && e.Code == wire.CodeRateLimited {
				limited.Add(1)
			} else {
				others.Add(1)
			}
		}
	})
	var worstConn, worstSend time.Duration
	refusedConns := 0
	for i := 0; time.Now().Before(stop); i++ {
		t0 := time.Now()
		if err := advConnect(ts, fmt.Sprintf("visitor%d", i)); err != nil {
			refusedConns++
			t.Logf("visitor%d's connect during the read flood: %v", i, err)
		}
		worstConn = max(worstConn, time.Since(t0))
		t0 = time.Now()
		if _, e := advSendWS(t, alice, gid, fmt.Sprintf("s%d", i), "1"); e != nil {
			t.Errorf("alice's send during the read flood: %+v", e)
		}
		worstSend = max(worstSend, time.Since(t0))
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("read flood: %d x 2000 frames written; flooder got %d rate_limited, %d other frames; worst connect %v, worst send %v",
		writes.Load(), limited.Load(), others.Load(), worstConn, worstSend)
	if limited.Load() == 0 {
		t.Errorf("the read flooder (%d frames) was never answered rate_limited", writes.Load()*2000)
	}
	if refusedConns > 0 {
		t.Errorf("%d other users' connects failed during a read flood", refusedConns)
	}
	if worstConn > time.Second || worstSend > time.Second {
		t.Errorf("during a read flood: worst connect %v, worst send %v, want each under 1 s", worstConn, worstSend)
	}
}

// advReady returns rc once a ping sent after its hello was answered:
// frames sent right after hello may still count as sent before it (see
// advEdgeInput), which the floods here are not about.
func advReady(rc *rawConn) *rawConn {
	rc.t.Helper()
	rc.send(`{"type":"ping","id":"ready"}`)
	readUntil[*wire.Pong](rc, 10*time.Second)
	return rc
}

// advConnect opens a socket as uid, reads its hello and closes it.
func advConnect(ts *testServer, uid string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, br, _, err := ws.Dial(ctx, ts.ws+"/ws?token="+ts.token(uid, 0))
	if err != nil {
		return err
	}
	defer c.Close()
	rc := &rawConn{t: ts.t, c: c, rw: c}
	if br != nil {
		rc.rw = bufferedRW(br, c)
	}
	f, err := rc.tryRead(5 * time.Second)
	if err != nil {
		return err
	}
	if _, ok := f.(*wire.Hello); !ok {
		return fmt.Errorf("first frame %T, want hello", f)
	}
	return nil
}

// advRoomsRestart (class 7): in embedded mode a waiting room survives a
// restart on the same data directory as it does in Redis: its
// configuration, and its queue (the admitted user stays admitted; bob and
// carol, waiting in that order, are away within their grace and get
// positions 1 and 2 back when they reconnect). The Redis backend passes
// the same steps.
func advRoomsRestart(t *testing.T) {
	dir := t.TempDir()
	args := []string{"-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-jwt-secret", testSecret,
		"-admin-token", "test-admin-token", "-log-level", "warn", "-data-dir", dir, "-limits-file", unlimited(t),
		"-room-token-secret", testRoomSecret}
	ts := startArgs(t, args)
	var cfg wire.RoomConfig
	if st, raw := advDo(t, ts.http, "POST", "/admin/v1/rooms", ts.admin, `{"room":"sale","max_active":1,"admit_rate":0.01,"grace_s":300,"max_wait_s":3600}`, &cfg); st != http.StatusOK {
		t.Fatalf("create room: %d %s", st, raw)
	}
	alice := ts.dialRoom("sale", "alice", 0)
	readUntil[*wire.Granted](alice, 10*time.Second)
	bob := ts.dialRoom("sale", "bob", 0)
	if q, _ := readUntil[*wire.Queue](bob, 10*time.Second); q.Position != 1 {
		t.Fatalf("bob's position: %+v", q)
	}
	carol := ts.dialRoom("sale", "carol", 0)
	if q, _ := readUntil[*wire.Queue](carol, 10*time.Second); q.Position != 2 {
		t.Fatalf("carol's position: %+v", q)
	}
	ts.stop()

	ts = startArgs(t, args)
	var after wire.RoomConfig
	st, raw := advDo(t, ts.http, "GET", "/admin/v1/rooms/sale", ts.admin, nil, &after)
	if st != http.StatusOK {
		t.Fatalf("room right after a restart (the node answers /readyz): status %d %s, want the room kept", st, raw)
	}
	if after.MaxActive != 1 || after.AdmitRate != 0.01 {
		t.Errorf("room after a restart: %s, want max_active 1, admit_rate 0.01", raw)
	}
	var full wire.RoomConfig // the config itself, through an idempotent update
	advDo(t, ts.http, "POST", "/admin/v1/rooms", ts.admin, `{"room":"sale"}`, &full)
	if full.GraceS != 300 || full.MaxWaitS != 3600 || full.MaxActive != 1 {
		t.Errorf("room config after a restart: %+v, want grace_s 300, max_wait_s 3600, max_active 1", full)
	}
	// The queue: alice's admission and both waiting users (away, within
	// their grace) are kept; reconnecting in order, each gets their place.
	var rs wire.RoomStatus
	advDo(t, ts.http, "GET", "/admin/v1/rooms/sale", ts.admin, nil, &rs)
	if rs.Active != 1 || rs.Away != 2 {
		t.Errorf("room status after a restart: active %d, away %d; want alice still admitted and bob and carol away within their grace", rs.Active, rs.Away)
	}
	for want, uid := range []string{"bob", "carol"} {
		rc := ts.dialRoom("sale", uid, 0)
		switch f := rc.read(10 * time.Second).(type) {
		case *wire.Queue:
			if f.Position != int64(want+1) {
				t.Errorf("%s after a restart: %+v, want position %d", uid, f, want+1)
			}
		default:
			t.Errorf("%s after a restart: got %T %+v, want a queue frame with position %d", uid, f, f, want+1)
		}
	}
}

// advSecretsHelp (class 8, fanfared's part; cmd/fanfare has its own
// test): help output never shows a secret taken from the environment.
func advSecretsHelp(t *testing.T) {
	env := map[string]string{"FANFARE_JWT_SECRET": "env-jwt-secret-0123456789abcdef-0123456789",
		"FANFARE_ADMIN_TOKEN": "env-admin-token-abcdef", "FANFARE_ROOM_TOKEN_SECRET": "env-room-secret-0123456789abcdef-012345",
		"FANFARE_POSTGRES_URL": "postgres://u:env-pg-password@127.0.0.1:1/x"}
	var out bytes.Buffer
	_, err := loadConfig([]string{"-h"}, func(k string) string { return env[k] }, &out)
	if err == nil {
		t.Error("fanfared -h: got no error")
	}
	for name, v := range env {
		secret := v
		if name == "FANFARE_POSTGRES_URL" {
			secret = "env-pg-password"
		}
		if strings.Contains(out.String(), secret) {
			t.Errorf("fanfared -h prints %s", name)
		}
	}
}

// advConnsPerIP (class 9): with the default configuration, sockets from
// one IP that never finish their handshake are capped: among 5000 opened
// within the handshake timeout, the server closes the ones past the cap
// at once (before a complete request header), a complete handshake from
// that IP is refused while the cap is full, another IP (127.0.0.2) still
// connects, and once the sockets close the first IP connects again.
func advConnsPerIP(t *testing.T) {
	// The default cap, with the default loopback exemption removed: the
	// test's one IP is a loopback address.
	ts := startServer(t, "embedded", "-max-conns-per-ip-exempt", "")
	addr := strings.TrimPrefix(ts.ws, "ws://")
	const most = 5000
	var socks []net.Conn
	defer func() {
		for _, c := range socks {
			if c != nil {
				c.Close()
			}
		}
	}()
	// 16 dialers open them in parallel, so that all are open well within
	// the handshake timeout (5 s); then every socket is checked at once:
	// data (a refusal) or the end of the stream means the server closed
	// it.
	start := time.Now()
	socks = make([]net.Conn, most)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= most {
					return
				}
				c, err := net.DialTimeout("tcp", addr, 2*time.Second)
				if err != nil {
					continue // refused at connect: counted below
				}
				c.Write([]byte("GET /ws HTTP/1.1\r\nHost: " + addr + "\r\n")) // never finished
				socks[i] = c
			}
		})
	}
	wg.Wait()
	opened := time.Since(start)
	// Each socket is read on a goroutine of its own: once a deadline has
	// passed, a Read fails at once even with data waiting, so reading them
	// one after another would stop counting at the first socket kept open.
	deadline := time.Now().Add(time.Second)
	var nclosed atomic.Int64
	var rg sync.WaitGroup
	for _, c := range socks {
		if c == nil {
			nclosed.Add(1)
			continue
		}
		rg.Go(func() {
			c.SetReadDeadline(deadline)
			var b [64]byte
			if _, err := c.Read(b[:]); err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
				nclosed.Add(1)
			}
		})
	}
	rg.Wait()
	closed := int(nclosed.Load())
	capped := -1
	if closed > 0 {
		capped = most - closed
	}
	el := time.Since(start)
	t.Logf("opened %d half-handshakes in %v (checked after %v): %d closed by the server", most, opened, el, closed)
	if capped < 0 {
		t.Fatalf("%d sockets from one IP that never finished their handshake were all kept open: no per-IP cap by default", most)
	}
	if capped != defaultMaxConnsPerIP {
		t.Errorf("%d of %d half-handshakes from one IP were kept open, want the default cap %d", capped, most, defaultMaxConnsPerIP)
	}
	if el > 4*time.Second {
		t.Errorf("opening took %v: the handshake timeout (5 s) may have closed the first ones, so the cap is not what closed them", el)
	}
	if advConnect(ts, "same-ip") == nil {
		t.Errorf("a complete handshake from the capped IP was upgraded")
	}
	other := client.Config{URL: ts.ws + "/ws", Token: ts.token("other-ip", 0), LocalAddr: "127.0.0.2", MaxRetries: -1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cc, err := client.Dial(ctx, other); err != nil {
		t.Errorf("a client from another IP was refused: %v", err)
	} else {
		cc.Close()
	}
	for _, c := range socks {
		if c != nil {
			c.Close()
		}
	}
	socks = nil
	for deadline := time.Now().Add(5 * time.Second); advConnect(ts, "same-ip-later") != nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the IP is still refused 5 s after its sockets closed")
		}
	}
}

// advEdgeInput (class 10): a group created with gid 2^63-1 leaves later
// creates (without a gid) working, the huge gid itself being created or
// refused as a client error, never as a retryable outage; a body holding
// a lone UTF-16 surrogate escape is refused over WebSocket and HTTP with
// the same code; the same bad pull ranges are described identically by
// HTTP and WebSocket; frames pipelined right after hello are answered
// (the hello a client reads is not followed by a window in which its
// frames still count as sent before hello).
func advEdgeInput(t *testing.T, mode string) {
	ts := startServer(t, mode)
	gid := ts.createGroup("alice", "bob") // before the huge gid, which may break creates
	var g wire.Group
	st, raw := advDo(t, ts.http, "POST", "/v1/groups", ts.admin, `{"gid":9223372036854775807,"name":"edge","owner":"alice"}`, &g)
	if st != http.StatusCreated && (st < 400 || st >= 500) {
		t.Errorf("create gid 2^63-1: status %d %s, want 201 or a 4xx client error", st, raw)
	}
	for i := range 3 {
		var next wire.Group
		if st, raw := advDo(t, ts.http, "POST", "/v1/groups", ts.admin, `{"name":"after","owner":"alice"}`, &next); st != http.StatusCreated {
			t.Errorf("create %d after gid 2^63-1: status %d %s, want 201", i, st, raw)
		}
	}

	rc := ts.dialRaw("alice")
	const lone = `"a\ud800b"`
	wsSeq, wsErr := advSendWS(t, rc, gid, "lone", lone)
	var httpErr wire.ErrorResponse
	st, raw = advDo(t, ts.http, "POST", fmt.Sprintf("/v1/groups/%d/messages", gid), ts.token("alice", 0), `{"id":"lone-http","body":`+lone+`}`, &httpErr)
	switch {
	case wsErr == nil:
		t.Errorf("a body with a lone surrogate escape was stored over WebSocket as seq %d", wsSeq)
	case st == http.StatusOK:
		t.Errorf("a body with a lone surrogate escape was stored over HTTP: %s", raw)
	case wsErr.Code != httpErr.Error.Code:
		t.Errorf("a lone surrogate escape: WebSocket says %q, HTTP %q (status %d), want the same code", wsErr.Code, httpErr.Error.Code, st)
	}

	// A client may pipeline as soon as it has hello: 64 pulls (more than
	// the 32 frames allowed before hello, within the frame limits this
	// server runs with) written at once right after it are all answered,
	// on each of 10 fresh sockets.
	var pulls bytes.Buffer
	for i := range 64 {
		wsutil.WriteClientText(&pulls, fmt.Appendf(nil, `{"type":"pull","id":"q%d","gid":%d,"from_seq":1,"to_seq":1}`, i, gid))
	}
	for k := range 10 {
		pc := ts.dialRaw("bob")
		if _, err := pc.rw.Write(pulls.Bytes()); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 64; {
			f, err := pc.tryRead(10 * time.Second)
			if err != nil {
				t.Errorf("socket %d: 64 pulls written right after hello: %d answered, then %v", k, i, err)
				break
			}
			switch f := f.(type) {
			case *wire.Messages:
				i++
			case *wire.Error:
				t.Errorf("socket %d: pull %s answered %+v", k, f.ID, f)
				i++
			}
		}
		pc.c.Close()
	}

	tok := ts.token("alice", 0)
	for i, r := range []struct{ from, to int64 }{{5, 2}, {-1, 0}, {1, -3}} {
		var he wire.ErrorResponse
		st, _ := advDo(t, ts.http, "GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=%d&to_seq=%d", gid, r.from, r.to), tok, nil, &he)
		id := fmt.Sprintf("range-%d", i)
		rc.send(fmt.Sprintf(`{"type":"pull","id":%q,"gid":%d,"from_seq":%d,"to_seq":%d}`, id, gid, r.from, r.to))
		var we *wire.Error
		for we == nil {
			f := rc.read(10 * time.Second)
			if e, ok := f.(*wire.Error); ok && e.ID == id {
				we = e
			}
			if m, ok := f.(*wire.Messages); ok && m.ID == id {
				we = &wire.Error{Code: "(answered with messages)"}
			}
		}
		if st != http.StatusBadRequest || he.Error.Code != we.Code || he.Error.Message != we.Message {
			t.Errorf("pull %d..%d: HTTP %d %q %q, WebSocket %q %q; want the same bad_request and message", r.from, r.to, st, he.Error.Code, he.Error.Message, we.Code, we.Message)
		}
	}
}
