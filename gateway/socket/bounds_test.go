package socket

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// onLoop runs fn on c's event loop and waits for it: the test's view of
// loop-owned state (outbound buffer, connection state).
func onLoop(t testing.TB, c *Conn, fn func()) {
	t.Helper()
	done := make(chan struct{})
	task := loopFunc(func() { fn(); close(done) })
	if err := c.l.el.Execute(context.Background(), task); err != nil {
		t.Fatalf("execute on loop: %v", err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("loop task did not run in 5s")
	}
}

type loopFunc func()

func (f loopFunc) Run(context.Context) error { f(); return nil }

// outbound returns the bytes gnet holds for c and c's state.
func outbound(t testing.TB, c *Conn) (n int, state uint8) {
	onLoop(t, c, func() {
		state = c.state
		if c.state != stClosed {
			n = c.gc.OutboundBuffered()
		}
	})
	return n, state
}

// TestPingFloodBounded: a client that floods pings and never reads (the
// review's reproduction grew a node from 25 MB to 533 MB in 5 s) holds
// no more than OutboundBound of pongs, is no longer kept alive by its
// pings, and is closed at IdleTimeout with a close frame it can still
// read.
func TestPingFloodBounded(t *testing.T) {
	const bound = 64 << 10
	const idle = time.Second
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, NumLoops: 1, OutboundBound: bound, SocketSendBuffer: 4 << 10,
		IdleTimeout: idle, CloseTimeout: 5 * time.Second, MaxConnsPerUser: -1, PingRate: -1}) // the bounds alone
	c := rawDialRcvBuf(t, s, 4<<10)
	c.write(upgradeRequest("/ws", "flooder"))
	if st, _, err := c.readResponse(); err != nil || st != 101 {
		t.Fatalf("upgrade: %d %v", st, err)
	}
	waitFor(t, 3*time.Second, "opened", func() bool { return h.opened.Load() == 1 })
	conn := h.snapshot()[0]
	heap0, _ := heapInuse()

	// 64 pings of 125 bytes per write, about 16 MB/s: three idle
	// timeouts long, or until the server starts closing.
	batch := bytes.Repeat(ping(strings.Repeat("p", maxControlPayload)).encode(), 64)
	start := time.Now()
	var maxBuf int
	var closedAfter time.Duration
	var sent int
	for time.Since(start) < 3*idle {
		_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := c.nc.Write(batch); err != nil {
			t.Fatalf("flood write after %v: %v", time.Since(start), err)
		}
		sent += len(batch)
		n, st := outbound(t, conn)
		maxBuf = max(maxBuf, n)
		if st != stOpen {
			closedAfter = time.Since(start)
			break
		}
		time.Sleep(500 * time.Microsecond)
	}
	heap1, _ := heapInuse()
	t.Logf("flooded %d KiB of pings for %v: server outbound buffer peaked at %d KiB, heap in use %+d KiB",
		sent>>10, time.Since(start).Round(time.Millisecond), maxBuf>>10, (int64(heap1)-int64(heap0))>>10)
	if maxBuf > bound+closeAllowance {
		t.Errorf("outbound buffer peaked at %d bytes, want at most OutboundBound %d (+%d for the close frame)", maxBuf, bound, closeAllowance)
	}
	if closedAfter == 0 {
		t.Fatalf("still open after %v of pings without reading, want closed at the %v idle timeout", 3*idle, idle)
	}
	if closedAfter > idle+time.Second {
		t.Errorf("closed after %v, want about the %v idle timeout", closedAfter, idle)
	}
	// What it did not read ends with its close frame.
	code, reason, err := c.expectClose(5 * time.Second)
	if err != nil || code != CloseGoingAway || reason != "idle timeout" {
		t.Fatalf("got close %d %q (%v), want 1001 idle timeout", code, reason, err)
	}
}

// TestStalledPongSentOnDrain: pings from a connection over OutboundBound
// are answered once it drains, with one pong for the latest ping.
func TestStalledPongSentOnDrain(t *testing.T) {
	const bound = 16 << 10
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, NumLoops: 1, OutboundBound: bound, SocketSendBuffer: 4 << 10, MaxConnsPerUser: -1})
	c := rawDialRcvBuf(t, s, 4<<10)
	c.write(upgradeRequest("/ws", "slow"))
	if st, _, err := c.readResponse(); err != nil || st != 101 {
		t.Fatalf("upgrade: %d %v", st, err)
	}
	waitFor(t, 3*time.Second, "opened", func() bool { return h.opened.Load() == 1 })
	conn := h.snapshot()[0]
	const replies = 40
	for i := range replies {
		if err := conn.Write(NewTextFrame([]byte(fmt.Sprintf("%d:%s", i, strings.Repeat("r", 1000))))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 3*time.Second, "the outbound buffer past the bound", func() bool {
		n, _ := outbound(t, conn)
		return n > bound
	})
	const pings = 50
	for i := range pings {
		c.write(ping(fmt.Sprintf("ping-%d", i)).encode())
	}
	s.sync()
	var pongs []string
	texts := 0
	for texts < replies || len(pongs) == 0 {
		op, p, err := c.readFrame(5 * time.Second)
		if err != nil {
			t.Fatalf("after %d replies and pongs %q: %v", texts, pongs, err)
		}
		switch op {
		case opText:
			texts++
		case opPong:
			pongs = append(pongs, string(p))
		default:
			t.Fatalf("got opcode %d", op)
		}
	}
	// Nothing more: one pong for the fifty pings.
	if op, p, err := c.readFrame(300 * time.Millisecond); err == nil {
		t.Fatalf("got op %d %q after the pong, want nothing", op, p)
	}
	if want := fmt.Sprintf("ping-%d", pings-1); len(pongs) != 1 || pongs[0] != want {
		t.Fatalf("got pongs %q, want one answering the latest ping %q", pongs, want)
	}
}

// TestHardBoundCloseFrame: a connection that does not read while replies
// pass OutboundHardBound is closed with 1008, and its close frame follows
// the replies that fitted, within the close allowance.
func TestHardBoundCloseFrame(t *testing.T) {
	const bound, hard = 16 << 10, 64 << 10
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, NumLoops: 1, OutboundBound: bound, OutboundHardBound: hard,
		SocketSendBuffer: 4 << 10, MaxConnsPerUser: -1})
	c := rawDialRcvBuf(t, s, 4<<10)
	c.write(upgradeRequest("/ws", "slow"))
	if st, _, err := c.readResponse(); err != nil || st != 101 {
		t.Fatalf("upgrade: %d %v", st, err)
	}
	waitFor(t, 3*time.Second, "opened", func() bool { return h.opened.Load() == 1 })
	conn := h.snapshot()[0]
	reply := NewTextFrame(bytes.Repeat([]byte("r"), 1000))
	var peak int
	for range 200 {
		if conn.Write(reply) != nil {
			break
		}
		s.sync()
		n, _ := outbound(t, conn)
		peak = max(peak, n)
	}
	waitFor(t, 3*time.Second, "the slow close", func() bool { return s.Stats().SlowClosed == 1 })
	if peak > hard+closeAllowance {
		t.Errorf("outbound peaked at %d bytes, want at most %d + %d", peak, hard, closeAllowance)
	}
	texts := 0
	for {
		op, p, err := c.readFrame(5 * time.Second)
		if err != nil {
			t.Fatalf("after %d replies: %v, want a close frame", texts, err)
		}
		if op == opText {
			texts++
			continue
		}
		if op != opClose || len(p) < 2 || CloseCode(uint16(p[0])<<8|uint16(p[1])) != ClosePolicyViolation || string(p[2:]) != "slow consumer" {
			t.Fatalf("got op %d %q, want close 1008 slow consumer", op, p)
		}
		break
	}
	if texts == 0 || texts*reply.Len() > hard+16<<10 {
		t.Fatalf("got %d replies before the close frame", texts)
	}
}

// TestIPCapAtAccept: a connection over MaxConnsPerIP is refused at
// accept, before its request is read or its token checked; exempt
// addresses are not capped.
func TestIPCapAtAccept(t *testing.T) {
	auth := &fakeAuth{}
	s := startServer(t, Config{Authenticator: auth, MaxConnsPerIP: 2, MaxConnsPerUser: -1,
		MaxConnsPerIPExempt: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}})
	dialWS(t, s, "/ws", "a")
	rawDial(t, s) // a handshake in progress counts too
	// Its accept may still be on its way to another event loop: wait
	// until the server holds both, or the third could be counted second.
	for deadline := time.Now().Add(5 * time.Second); s.Stats().TCPConns < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("the server holds %d TCP connections, want 2", s.Stats().TCPConns)
		}
		time.Sleep(time.Millisecond)
	}
	calls := auth.calls.Load()
	start := time.Now()
	c := rawDial(t, s) // sends nothing: the answer cannot wait for the request
	st, h, err := c.readResponse()
	if err != nil || st != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("3rd connection from one address: got %d %v (%v), want 429 with Retry-After", st, h, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("answered after %v, want at accept", d)
	}
	if got := auth.calls.Load(); got != calls {
		t.Errorf("the refused connection cost %d token checks, want 0", got-calls)
	}
	// An exempt address is not capped.
	for i := range 3 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
		nc, err := d.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatalf("dial from 127.0.0.2: %v", err)
		}
		t.Cleanup(func() { nc.Close() })
		ec := &wsClient{t: t, nc: nc, br: bufio.NewReader(nc)}
		ec.write(upgradeRequest("/ws", fmt.Sprint("x", i)))
		if st, _, err := ec.readResponse(); err != nil || st != http.StatusSwitchingProtocols {
			t.Fatalf("exempt connection %d: got %d (%v), want 101", i, st, err)
		}
	}
}

// TestPingAllocs: answering pings, the write path every pong takes
// through the bounds, allocates nothing per ping.
func TestPingAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation measurement")
	}
	s := startServer(t, Config{MaxConnsPerUser: -1, PingRate: -1})
	c := dialWS(t, s, "/ws", "pinger")
	const n = 2000
	payload := strings.Repeat("x", 16)
	batch := bytes.Repeat(ping(payload).encode(), n)
	want := make([]byte, 2+len(payload))
	buf := make([]byte, n*len(want))
	round := func() {
		c.write(batch)
		_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c.br, buf); err != nil {
			t.Fatalf("reading %d pongs: %v", n, err)
		}
	}
	round() // warm up: buffers and pools
	before := mallocs()
	round()
	per := float64(mallocs()-before) / n
	t.Logf("%.4f allocations per ping", per)
	if per > 0.05 {
		t.Fatalf("got %.4f allocations per ping, want ~0", per)
	}
	if buf[0] != 0x80|opPong || string(buf[2:len(want)]) != payload {
		t.Fatalf("got % x, want pongs", buf[:len(want)])
	}
}

// TestResyncsWithinBound: a connection that missed pushes of many groups
// gets its resyncs as it drains, never more than OutboundBound waiting at
// once, each group's exactly once.
func TestResyncsWithinBound(t *testing.T) {
	const bound = 4 << 10
	const groups = 100
	resync := func(gid, lastSeq int64) *Frame {
		return NewTextFrame([]byte(fmt.Sprintf("resync:%d:%d:%s", gid, lastSeq, strings.Repeat("r", 200))))
	}
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, NumLoops: 1, OutboundBound: bound, SocketSendBuffer: 4 << 10,
		Resync: resync, MaxConnsPerUser: -1})
	c := rawDialRcvBuf(t, s, 4<<10)
	c.write(upgradeRequest("/ws", "member"))
	if st, _, err := c.readResponse(); err != nil || st != 101 {
		t.Fatalf("upgrade: %d %v", st, err)
	}
	waitFor(t, 3*time.Second, "opened", func() bool { return h.opened.Load() == 1 })
	conns := h.snapshot()
	for gid := int64(1); gid <= groups; gid++ {
		s.Broadcast(NewPushFrame(gid, 1, []byte(fmt.Sprintf("push:%d:%s", gid, strings.Repeat("p", 1000)))), conns)
	}
	waitFor(t, 3*time.Second, "pushes dropped", func() bool { return s.Stats().PushesDropped > groups/2 })
	pushed := map[int64]bool{}
	resynced := map[int64]int{}
	peak := 0
	for len(pushed)+len(resynced) < groups {
		op, p, err := c.readFrame(5 * time.Second)
		if err != nil || op != opText {
			t.Fatalf("after %d pushes and %d resyncs: op %d, %v", len(pushed), len(resynced), op, err)
		}
		parts := strings.SplitN(string(p), ":", 3)
		gid, _ := strconv.ParseInt(parts[1], 10, 64)
		if parts[0] == "push" {
			pushed[gid] = true
		} else {
			resynced[gid]++
		}
		n, _ := outbound(t, conns[0])
		peak = max(peak, n)
		time.Sleep(time.Millisecond) // a slow reader: the resyncs come as it drains
	}
	if peak > bound {
		t.Errorf("outbound buffer peaked at %d bytes while resyncing, want at most OutboundBound %d", peak, bound)
	}
	for gid := int64(1); gid <= groups; gid++ {
		if pushed[gid] == (resynced[gid] == 1) || resynced[gid] > 1 {
			t.Errorf("gid %d: pushed %v, %d resyncs; want the push or one resync", gid, pushed[gid], resynced[gid])
		}
	}
	if op, p, err := c.readFrame(300 * time.Millisecond); err == nil {
		t.Fatalf("got op %d %q after every group was accounted for, want nothing", op, p)
	}
}

// TestNothingAfterRefusedReply: once a reply does not fit the hard bound,
// nothing queued after it reaches the client, only the close frame: no
// reply goes missing in the middle of what the client reads.
func TestNothingAfterRefusedReply(t *testing.T) {
	const hard = 64 << 10
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, NumLoops: 1, OutboundBound: 16 << 10, OutboundHardBound: hard,
		SocketSendBuffer: 4 << 10, MaxConnsPerUser: -1})
	c := rawDialRcvBuf(t, s, 4<<10)
	c.write(upgradeRequest("/ws", "slow"))
	if st, _, err := c.readResponse(); err != nil || st != 101 {
		t.Fatalf("upgrade: %d %v", st, err)
	}
	waitFor(t, 3*time.Second, "opened", func() bool { return h.opened.Load() == 1 })
	conn := h.snapshot()[0]
	// Queued in one task, so that one flush takes all three.
	onLoop(t, conn, func() {
		_ = conn.Write(NewTextFrame(append([]byte("a"), bytes.Repeat([]byte("."), 60<<10)...)))
		_ = conn.Write(NewTextFrame(append([]byte("b"), bytes.Repeat([]byte("."), 10<<10)...)))
		_ = conn.Write(NewTextFrame([]byte("c")))
	})
	var got []string
	for {
		op, p, err := c.readFrame(5 * time.Second)
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		if op == opClose {
			break
		}
		got = append(got, string(p[:1]))
	}
	if len(got) != 1 || got[0] != "a" {
		t.Fatalf("got replies %q before the close frame, want only \"a\" (b did not fit, c came after it)", got)
	}
}

// TestPingRate: a connection that pings past PingRate and PingBurst is
// closed with 1008; one within them is answered every time.
func TestPingRate(t *testing.T) {
	s := startServer(t, Config{MaxConnsPerUser: -1, PingRate: 2, PingBurst: 5})
	ok := dialWS(t, s, "/ws", "steady")
	for i := range 5 {
		ok.write(ping(fmt.Sprint(i)).encode())
	}
	for i := range 5 {
		if op, p, err := ok.readFrame(5 * time.Second); err != nil || op != opPong || string(p) != fmt.Sprint(i) {
			t.Fatalf("pong %d: got op %d %q (%v)", i, op, p, err)
		}
	}
	flood := dialWS(t, s, "/ws", "flooder")
	flood.write(bytes.Repeat(ping("x").encode(), 6))
	got, err := flood.readOuts(5 * time.Second)
	want := []out{pongOut("x"), pongOut("x"), pongOut("x"), pongOut("x"), pongOut("x"), closeOut(ClosePolicyViolation)}
	if err != nil || !sameOuts(got, want) {
		t.Fatalf("six pings at once with a burst of 5: got %v (%v), want %v", got, err, want)
	}
}
