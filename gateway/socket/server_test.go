package socket

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none = valid
	}{
		{name: "zero value", cfg: Config{}},
		{name: "full", cfg: Config{Addr: "0.0.0.0:9000", Paths: []string{"/ws"}, AllowedOrigins: []string{"https://a.example", "*"}, MaxConnsPerIP: -1}},
		{name: "bad addr", cfg: Config{Addr: "nope"}, want: []string{"Addr"}},
		{name: "negatives", cfg: Config{IdleTimeout: -1, MaxConns: -5, MaxConnsPerUser: -2}, want: []string{"IdleTimeout", "MaxConns must", "MaxConnsPerUser"}},
		{name: "frame over message", cfg: Config{MaxFrameBytes: 100 << 10, MaxMessageBytes: 64 << 10}, want: []string{"MaxFrameBytes"}},
		{name: "tiny header cap", cfg: Config{MaxHeaderBytes: 100}, want: []string{"MaxHeaderBytes"}},
		{name: "hard bound below bound", cfg: Config{OutboundBound: 1000, OutboundHardBound: 10}, want: []string{"OutboundHardBound"}},
		{name: "bad path and origin", cfg: Config{Paths: []string{"ws"}, AllowedOrigins: []string{"example.com"}}, want: []string{"path", "origin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got nil, want an error mentioning %v", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got %q, want it to mention %q", err, w)
				}
			}
		})
	}
	s, err := New(Config{})
	if err != nil {
		t.Fatalf("New(Config{}): %v", err)
	}
	if s.cfg.Addr != DefaultAddr || s.cfg.MaxMessageBytes != 64<<10 || s.cfg.MaxHeaderBytes != 8<<10 || s.cfg.MaxConns <= 0 {
		t.Fatalf("defaults: got %+v", s.cfg)
	}
}

func TestHandshakeStatuses(t *testing.T) {
	h := &echoHandler{admit: func(r *Request) int {
		switch r.Identity.UID {
		case "l4":
			return http.StatusServiceUnavailable
		case "full":
			return http.StatusTooManyRequests
		}
		return 0
	}}
	s := startServer(t, Config{Handler: h, MaxConnsPerUser: -1})
	past := strconv.FormatInt(time.Now().Add(-time.Minute).UnixMilli(), 10)
	future := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	tests := []struct {
		name   string
		req    []byte
		status int
	}{
		{"ok query token", upgradeRequest("/ws", "alice"), 101},
		{"ok bearer", upgradeRequest("/ws", "", "Authorization: Bearer alice"), 101},
		{"ok bearer lower-case scheme", upgradeRequest("/ws", "", "authorization: bearer alice"), 101},
		{"ok room path", upgradeRequest("/rooms/sale1/ws", "alice"), 101},
		{"ok future expiry", upgradeRequest("/ws", "alice:1:"+future), 101},
		{"ok same-host origin", upgradeRequest("/ws", "alice", "Origin: https://example.com"), 101},
		{"deflate offered and declined", upgradeRequest("/ws", "alice", "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits"), 101},
		{"no token", upgradeRequest("/ws", ""), 401},
		{"bad token", upgradeRequest("/ws", "bad"), 401},
		{"expired token", upgradeRequest("/ws", "alice:0:"+past), 401},
		{"malformed bearer", upgradeRequest("/ws", "", "Authorization: Basic YWxpY2U6cHc="), 401},
		{"unknown path", upgradeRequest("/other", "alice"), 404},
		{"bare room prefix", upgradeRequest("/rooms/", "alice"), 404},
		{"foreign origin", upgradeRequest("/ws", "alice", "Origin: https://evil.example"), 403},
		{"handler says L4", upgradeRequest("/ws", "l4"), 503},
		{"handler says full", upgradeRequest("/ws", "full"), 429},
		{"POST", bytes.Replace(upgradeRequest("/ws", "alice"), []byte("GET"), []byte("POST"), 1), 405},
		{"HTTP/1.0", bytes.Replace(upgradeRequest("/ws", "alice"), []byte("HTTP/1.1"), []byte("HTTP/1.0"), 1), 505},
		{"no key", bytes.Replace(upgradeRequest("/ws", "alice"), []byte("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"), nil, 1), 400},
		{"version 8", bytes.Replace(upgradeRequest("/ws", "alice"), []byte("Version: 13"), []byte("Version: 8"), 1), 426},
		{"no upgrade header", bytes.Replace(upgradeRequest("/ws", "alice"), []byte("Upgrade: websocket\r\n"), nil, 1), 400},
		{"header too large", upgradeRequest("/ws", "alice", "X-Big: "+strings.Repeat("a", 9000)), 431},
		{"garbage", []byte("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"), 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := rawDial(t, s)
			c.write(tt.req)
			st, hdr, err := c.readResponse()
			if err != nil {
				t.Fatalf("reading the response: %v", err)
			}
			if st != tt.status {
				t.Fatalf("got status %d, want %d", st, tt.status)
			}
			if st == 101 {
				if ext := hdr.Get("Sec-WebSocket-Extensions"); ext != "" {
					t.Fatalf("got extensions %q, want none (permessage-deflate declined)", ext)
				}
				c.sendText("hi")
				c.expectText("hi")
				return
			}
			if (st == 429 || st == 503) && hdr.Get("Retry-After") == "" {
				t.Errorf("got no Retry-After on %d", st)
			}
			// Refused: no upgrade, and the server closes the connection.
			_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := c.br.ReadByte(); err == nil {
				t.Fatalf("got byte %#x after a refusal, want EOF", n)
			}
		})
	}
}

func TestOriginAllowList(t *testing.T) {
	s := startServer(t, Config{AllowedOrigins: []string{"https://app.example.com"}})
	for _, tt := range []struct {
		origin string
		status int
	}{
		{"https://app.example.com", 101},
		{"HTTPS://APP.EXAMPLE.COM", 101},
		{"https://example.com", 403}, // same host as Host, but not listed
		{"http://app.example.com", 403},
		{"", 101}, // not a browser
	} {
		c := rawDial(t, s)
		var extra []string
		if tt.origin != "" {
			extra = append(extra, "Origin: "+tt.origin)
		}
		c.write(upgradeRequest("/ws", "u-"+tt.origin, extra...))
		if st, _, err := c.readResponse(); err != nil || st != tt.status {
			t.Errorf("origin %q: got %d (%v), want %d", tt.origin, st, err, tt.status)
		}
	}
	any := startServer(t, Config{AllowedOrigins: []string{"*"}})
	c := rawDial(t, any)
	c.write(upgradeRequest("/ws", "u", "Origin: https://anything.example"))
	if st, _, err := c.readResponse(); err != nil || st != 101 {
		t.Errorf("origin * : got %d (%v), want 101", st, err)
	}
}

// TestHandshakeSplit sends the request a byte at a time, with a frame
// pipelined right behind it.
func TestHandshakeSplit(t *testing.T) {
	s := startServer(t, Config{})
	c := rawDial(t, s)
	req := append(upgradeRequest("/ws", "alice"), text("pipelined").encode()...)
	for i := range req {
		c.write(req[i : i+1])
	}
	if st, _, err := c.readResponse(); err != nil || st != 101 {
		t.Fatalf("got %d (%v), want 101", st, err)
	}
	c.expectText("pipelined")
}

// TestSlowlorisHandshake: a client that never finishes its header is
// answered 408 and closed at the handshake deadline, while other clients
// upgrade and talk without delay.
func TestSlowlorisHandshake(t *testing.T) {
	const timeout = 400 * time.Millisecond
	s := startServer(t, Config{HandshakeTimeout: timeout, MaxConnsPerUser: -1})
	slow := rawDial(t, s)
	start := time.Now()
	req := upgradeRequest("/ws", "slow")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < len(req)-1; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := slow.nc.Write(req[i : i+1]); err != nil {
				return
			}
		}
	}()
	// Meanwhile, others are served promptly.
	for i := range 5 {
		t0 := time.Now()
		c := dialWS(t, s, "/ws", fmt.Sprintf("fast%d", i))
		c.sendText("ping")
		c.expectText("ping")
		if d := time.Since(t0); d > 200*time.Millisecond {
			t.Errorf("a normal client took %v during the slowloris", d)
		}
		time.Sleep(40 * time.Millisecond)
	}
	st, _, err := slow.readResponse()
	closedAt := time.Since(start)
	close(stop)
	wg.Wait()
	if err != nil || st != http.StatusRequestTimeout {
		t.Fatalf("slow client: got %d (%v), want 408", st, err)
	}
	if closedAt < timeout-50*time.Millisecond || closedAt > timeout+400*time.Millisecond {
		t.Fatalf("slow client answered after %v, want about %v", closedAt, timeout)
	}
}

// TestSlowlorisMidFrame: a frame that trickles in is cut at the message
// deadline with 1008; other connections are unaffected.
func TestSlowlorisMidFrame(t *testing.T) {
	const timeout = 400 * time.Millisecond
	s := startServer(t, Config{MessageTimeout: timeout, MaxConnsPerUser: -1})
	slow := dialWS(t, s, "/ws", "slow")
	f := text(strings.Repeat("x", 100)).encode()
	start := time.Now()
	slow.write(f[:10])
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 10; i < len(f)-1; i++ {
			time.Sleep(30 * time.Millisecond)
			if _, err := slow.nc.Write(f[i : i+1]); err != nil {
				return
			}
		}
	}()
	other := dialWS(t, s, "/ws", "other")
	for range 5 {
		other.sendText("still here")
		other.expectText("still here")
		time.Sleep(50 * time.Millisecond)
	}
	code, reason, err := slow.expectClose(3 * time.Second)
	d := time.Since(start)
	if err != nil || code != ClosePolicyViolation || reason != "message timeout" {
		t.Fatalf("got close %d %q (%v), want 1008 message timeout", code, reason, err)
	}
	if d < timeout-50*time.Millisecond || d > timeout+400*time.Millisecond {
		t.Fatalf("closed after %v, want about %v", d, timeout)
	}
	<-done
	other.sendText("after")
	other.expectText("after")
}

// TestFragmentDribble: sending one fragment at a time does not extend the
// message deadline.
func TestFragmentDribble(t *testing.T) {
	const timeout = 400 * time.Millisecond
	s := startServer(t, Config{MessageTimeout: timeout})
	c := dialWS(t, s, "/ws", "dribble")
	start := time.Now()
	c.write(frag(opText, "a").encode())
	go func() {
		for range 20 {
			time.Sleep(50 * time.Millisecond)
			if _, err := c.nc.Write(cont("b", false).encode()); err != nil {
				return
			}
		}
	}()
	code, _, err := c.expectClose(3 * time.Second)
	if d := time.Since(start); err != nil || code != ClosePolicyViolation || d > timeout+400*time.Millisecond {
		t.Fatalf("got close %d after %v (%v), want 1008 after about %v", code, d, err, timeout)
	}
}

func TestIdleTimeout(t *testing.T) {
	const timeout = 400 * time.Millisecond
	s := startServer(t, Config{IdleTimeout: timeout, MaxConnsPerUser: -1})
	idle := dialWS(t, s, "/ws", "idle")
	busy := dialWS(t, s, "/ws", "busy")
	start := time.Now()
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				busy.writeTolerant(ping("hb").encode())
			}
		}
	}()
	code, reason, err := idle.expectClose(3 * time.Second)
	d := time.Since(start)
	if err != nil || code != CloseGoingAway || reason != "idle timeout" {
		t.Fatalf("got %d %q (%v), want 1001 idle timeout", code, reason, err)
	}
	if d < timeout-50*time.Millisecond || d > timeout+400*time.Millisecond {
		t.Fatalf("idle connection closed after %v, want about %v", d, timeout)
	}
	time.Sleep(timeout)
	close(stop)
	busy.sendText("alive")
	for {
		op, p, err := busy.readFrame(3 * time.Second)
		if err != nil {
			t.Fatalf("busy connection: %v", err)
		}
		if op == opText {
			if string(p) != "alive" {
				t.Fatalf("got %q, want alive", p)
			}
			break
		}
		if op != opPong {
			t.Fatalf("got opcode %d on the busy connection, want pongs then text", op)
		}
	}
}

func TestTokenExpiry(t *testing.T) {
	s := startServer(t, Config{})
	exp := time.Now().Add(400 * time.Millisecond)
	c := dialWS(t, s, "/ws", "alice:0:"+strconv.FormatInt(exp.UnixMilli(), 10))
	c.sendText("x")
	c.expectText("x")
	code, reason, err := c.expectClose(3 * time.Second)
	late := time.Since(exp)
	if err != nil || code != ClosePolicyViolation || reason != "token expired" {
		t.Fatalf("got %d %q (%v), want 1008 token expired", code, reason, err)
	}
	if late < -20*time.Millisecond || late > 400*time.Millisecond {
		t.Fatalf("closed %v after expiry, want about 0", late)
	}
}

func TestConnCaps(t *testing.T) {
	t.Run("node", func(t *testing.T) {
		h := &echoHandler{}
		s := startServer(t, Config{MaxConns: 3, Handler: h, MaxConnsPerUser: -1})
		var cs []*wsClient
		for i := range 3 {
			cs = append(cs, dialWS(t, s, "/ws", fmt.Sprint("u", i)))
		}
		c := rawDial(t, s)
		c.write(upgradeRequest("/ws", "u9"))
		if st, _, _ := c.readResponse(); st != 429 {
			t.Fatalf("4th connection: got %d, want 429", st)
		}
		cs[0].nc.Close()
		waitFor(t, 3*time.Second, "the slot to free", func() bool { return h.closed.Load() == 1 })
		dialWS(t, s, "/ws", "u9")
		if got := s.Stats().TooMany; got != 1 {
			t.Fatalf("got %d 429s in stats, want 1", got)
		}
	})
	t.Run("ip", func(t *testing.T) {
		s := startServer(t, Config{MaxConnsPerIP: 2, MaxConnsPerUser: -1})
		a := dialWS(t, s, "/ws", "a")
		dialWS(t, s, "/ws", "b")
		c := rawDial(t, s)
		c.write(upgradeRequest("/ws", "c"))
		if st, _, _ := c.readResponse(); st != 429 {
			t.Fatalf("3rd connection from one IP: got %d, want 429", st)
		}
		a.nc.Close()
		c.nc.Close()
		waitFor(t, 3*time.Second, "the slots to free", func() bool { return s.Stats().TCPConns == 1 })
		dialWS(t, s, "/ws", "d")
	})
	t.Run("user", func(t *testing.T) {
		s := startServer(t, Config{MaxConnsPerUser: 2})
		a := dialWS(t, s, "/ws", "alice")
		dialWS(t, s, "/ws", "alice")
		dialWS(t, s, "/ws", "bob")
		c := rawDial(t, s)
		c.write(upgradeRequest("/ws", "alice"))
		if st, _, _ := c.readResponse(); st != 429 {
			t.Fatalf("3rd connection of alice: got %d, want 429", st)
		}
		a.nc.Close()
		waitFor(t, 3*time.Second, "alice's slot to free", func() bool { return s.Stats().Conns == 2 })
		dialWS(t, s, "/ws", "alice")
	})
	t.Run("user, no cap", func(t *testing.T) {
		// Without a cap nothing is counted per user: no map entry per
		// connected uid.
		s := startServer(t, Config{MaxConnsPerUser: -1})
		for range 3 {
			dialWS(t, s, "/ws", "alice")
		}
		dialWS(t, s, "/ws", "bob")
		waitFor(t, 3*time.Second, "4 connections", func() bool { return s.Stats().Conns == 4 })
		s.userMu.Lock()
		n := len(s.perUser)
		s.userMu.Unlock()
		if n != 0 {
			t.Fatalf("got %d uids counted without a cap, want 0", n)
		}
	})
}

func TestNilAuthenticatorRefuses(t *testing.T) {
	s, err := New(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	<-s.Ready()
	c := rawDial(t, s)
	c.write(upgradeRequest("/ws", "alice"))
	if st, _, _ := c.readResponse(); st != 401 {
		t.Fatalf("got %d, want 401 without an Authenticator", st)
	}
}

func TestHandlerClose(t *testing.T) {
	h := &echoHandler{onOpen: func(c *Conn) {
		if c.UID() == "kick" {
			_ = c.Write(NewTextFrame([]byte("bye")))
			c.Close(4001, "kicked")
			if err := c.Write(NewTextFrame([]byte("late"))); !errors.Is(err, ErrClosed) {
				panic(fmt.Sprintf("Write after Close: got %v, want ErrClosed", err))
			}
		}
	}}
	s := startServer(t, Config{Handler: h})
	c := dialWS(t, s, "/ws", "kick")
	c.expectText("bye")
	code, reason, err := c.expectClose(3 * time.Second)
	if err != nil || code != 4001 || reason != "kicked" {
		t.Fatalf("got %d %q (%v), want 4001 kicked", code, reason, err)
	}
	c.nc.Close() // completes the close handshake
	waitFor(t, 3*time.Second, "OnClose", func() bool { return h.closed.Load() == 1 })
}

func TestConnIdentity(t *testing.T) {
	var got *Conn
	var mu sync.Mutex
	h := &echoHandler{onOpen: func(c *Conn) {
		mu.Lock()
		got = c
		mu.Unlock()
		c.SetContext("engine-state")
	}}
	s := startServer(t, Config{Handler: h})
	exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	dialWS(t, s, "/rooms/sale1/ws", "carol:2:"+strconv.FormatInt(exp.UnixMilli(), 10))
	mu.Lock()
	defer mu.Unlock()
	if got == nil {
		t.Fatal("OnOpen not called")
	}
	if got.UID() != "carol" || got.Tier() != 2 || got.Path() != "/rooms/sale1/ws" || !got.Expires().Equal(exp) {
		t.Fatalf("got uid %q level %d path %q expires %v", got.UID(), got.Tier(), got.Path(), got.Expires())
	}
	if !got.RemoteAddr().Addr().IsLoopback() || got.ID() == 0 || got.Context() != "engine-state" {
		t.Fatalf("got remote %v id %d context %v", got.RemoteAddr(), got.ID(), got.Context())
	}
}

func TestShutdown(t *testing.T) {
	h := &echoHandler{}
	s, err := New(Config{Addr: "127.0.0.1:0", NumLoops: 2, Authenticator: &fakeAuth{}, Handler: h, MaxConnsPerUser: -1})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	<-s.Ready()
	var cs []*wsClient
	for i := range 10 {
		cs = append(cs, dialWS(t, s, "/ws", fmt.Sprint("u", i)))
	}
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, err := c.expectClose(5 * time.Second)
			if err != nil || code != CloseGoingAway {
				t.Errorf("got close %d (%v), want 1001", code, err)
			}
			c.nc.Close()
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	wg.Wait()
	if err := <-done; err != nil {
		t.Fatalf("Run after Shutdown: %v", err)
	}
	if h.closed.Load() != 10 {
		t.Fatalf("got %d OnClose calls, want 10", h.closed.Load())
	}
	if _, err := net.DialTimeout("tcp", s.Addr().String(), time.Second); err == nil {
		t.Fatalf("dial after Shutdown succeeded, want refused")
	}
}

// readSeqs reads text frames "gid:seq" and resync frames until n frames or
// the timeout.
func readFrames(t *testing.T, c *wsClient, n int, timeout time.Duration) []string {
	var res []string
	for len(res) < n {
		op, p, err := c.readFrame(timeout)
		if err != nil {
			break
		}
		if op != opText {
			t.Fatalf("got opcode %d, want text", op)
		}
		res = append(res, string(p))
	}
	return res
}

func TestBroadcastOrderAndCoalescing(t *testing.T) {
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, MaxConnsPerUser: -1})
	const nConns, nFrames = 40, 300
	var cs []*wsClient
	for i := range nConns {
		cs = append(cs, dialWS(t, s, "/ws", fmt.Sprint("u", i)))
	}
	waitFor(t, 3*time.Second, "all opened", func() bool { return h.opened.Load() == nConns })
	conns := h.snapshot()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range nFrames {
			if i%3 == 0 {
				s.BroadcastBatch([]*Frame{NewPushFrame(1, int64(i), []byte(fmt.Sprintf("m%d", i))), NewPushFrame(1, int64(i), []byte(fmt.Sprintf("n%d", i)))}, conns)
				continue
			}
			if d := s.Broadcast(NewPushFrame(1, int64(i), []byte(fmt.Sprintf("m%d", i))), conns); d != 0 {
				t.Errorf("got %d dropped deliveries, want 0", d)
			}
		}
	}()
	var want []string
	for i := range nFrames {
		want = append(want, fmt.Sprintf("m%d", i))
		if i%3 == 0 {
			want = append(want, fmt.Sprintf("n%d", i))
		}
	}
	for i, c := range cs {
		got := readFrames(t, c, len(want), 5*time.Second)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("connection %d: got %d frames %v..., want %d in order", i, len(got), got[:min(5, len(got))], len(want))
		}
	}
	wg.Wait()
	if st := s.Stats(); st.Deliveries < uint64(nConns*len(want)) || st.PushesDropped != 0 {
		t.Fatalf("stats: got %d deliveries and %d drops, want >= %d and 0", st.Deliveries, st.PushesDropped, nConns*len(want))
	}
}

// TestOutboundBoundResync: a client that stops reading gets its pushes
// dropped past the bound, then exactly one resync per group carrying the
// highest dropped seq once it drains, then pushes again.
func TestOutboundBoundResync(t *testing.T) {
	resync := func(gid, lastSeq int64) *Frame {
		return NewTextFrame([]byte(fmt.Sprintf("resync:%d:%d", gid, lastSeq)))
	}
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, OutboundBound: 32 << 10, SocketSendBuffer: 8 << 10, Resync: resync, MaxConnsPerUser: -1})
	slow := rawDialRcvBuf(t, s, 8<<10)
	slow.write(upgradeRequest("/ws", "slow"))
	if st, _, err := slow.readResponse(); err != nil || st != 101 {
		t.Fatalf("upgrade: %d %v", st, err)
	}
	fast := dialWS(t, s, "/ws", "fast")
	waitFor(t, 3*time.Second, "both opened", func() bool { return h.opened.Load() == 2 })
	conns := h.snapshot()
	payload := strings.Repeat("p", 1000)
	const n = 3000
	var fastGot atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the fast client keeps reading; it must get everything
		defer wg.Done()
		for fastGot.Load() < 2*n+1 {
			op, _, err := fast.readFrame(10 * time.Second)
			if err != nil || op != opText {
				t.Errorf("fast client after %d frames: op %d, %v", fastGot.Load(), op, err)
				return
			}
			fastGot.Add(1)
		}
	}()
	sent := int64(0)
	for i := 1; i <= n; i++ {
		for _, gid := range []int64{7, 9} {
			s.Broadcast(NewPushFrame(gid, int64(i), []byte(fmt.Sprintf("%d:%d:%s", gid, i, payload))), conns)
			sent++
		}
		if i%10 == 0 { // pace the pushes to what the fast reader takes
			waitFor(t, 10*time.Second, "the fast reader", func() bool { return fastGot.Load() >= sent })
		}
	}
	waitFor(t, 5*time.Second, "pushes to be dropped", func() bool { return s.Stats().PushesDropped > 0 })
	// Now the slow client reads everything; the server must resync it.
	next := map[int64]int{7: 1, 9: 1}
	resyncs := map[int64]int{}
	var resyncSeq = map[int64]int{}
	deadline := time.Now().Add(10 * time.Second)
	for len(resyncs) < 2 && time.Now().Before(deadline) {
		op, p, err := slow.readFrame(5 * time.Second)
		if err != nil {
			t.Fatalf("slow client read: %v", err)
		}
		if op != opText {
			t.Fatalf("got opcode %d", op)
		}
		parts := strings.SplitN(string(p), ":", 3)
		if parts[0] == "resync" {
			gid, _ := strconv.ParseInt(parts[1], 10, 64)
			seq, _ := strconv.Atoi(parts[2])
			resyncs[gid]++
			resyncSeq[gid] = seq
			continue
		}
		gid, _ := strconv.ParseInt(parts[0], 10, 64)
		seq, _ := strconv.Atoi(parts[1])
		if resyncs[gid] > 0 {
			t.Fatalf("got push %d:%d after its resync before new pushes", gid, seq)
		}
		if seq != next[gid] {
			t.Fatalf("gid %d: got seq %d, want %d (pushes before the overflow arrive in order, without gaps)", gid, seq, next[gid])
		}
		next[gid]++
	}
	for _, gid := range []int64{7, 9} {
		if resyncs[gid] != 1 || resyncSeq[gid] != n {
			t.Fatalf("gid %d: got %d resyncs with last_seq %d, want 1 with %d", gid, resyncs[gid], resyncSeq[gid], n)
		}
	}
	// Pushes resume after the resync, and no second resync comes.
	s.Broadcast(NewPushFrame(7, n+1, []byte(fmt.Sprintf("7:%d:x", n+1))), conns)
	op, p, err := slow.readFrame(5 * time.Second)
	if err != nil || op != opText || string(p) != fmt.Sprintf("7:%d:x", n+1) {
		t.Fatalf("after resync: got %d %q %v, want the next push", op, p, err)
	}
	wg.Wait()
	if st := s.Stats(); st.Resyncs != 2 {
		t.Fatalf("got %d resyncs in stats, want 2", st.Resyncs)
	}
}

// TestSlowConsumerClosedWithoutResync: with no Resync configured, a
// connection over the bound is closed with 1008.
func TestSlowConsumerClosedWithoutResync(t *testing.T) {
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, OutboundBound: 16 << 10, SocketSendBuffer: 8 << 10})
	c := rawDialRcvBuf(t, s, 8<<10)
	c.write(upgradeRequest("/ws", "slow"))
	if st, _, err := c.readResponse(); err != nil || st != 101 {
		t.Fatalf("upgrade: %d %v", st, err)
	}
	waitFor(t, 3*time.Second, "opened", func() bool { return h.opened.Load() == 1 })
	conns := h.snapshot()
	for i := range 2000 {
		s.Broadcast(NewPushFrame(1, int64(i), bytes.Repeat([]byte("z"), 1000)), conns)
	}
	waitFor(t, 5*time.Second, "the slow consumer to be closed", func() bool { return s.Stats().SlowClosed == 1 })
	code, reason, err := c.expectClose(10 * time.Second)
	if err != nil || code != ClosePolicyViolation || reason != "slow consumer" {
		t.Fatalf("got %d %q (%v), want 1008 slow consumer", code, reason, err)
	}
}

func TestWritevChunking(t *testing.T) {
	// More than iovMax frames pending for one connection: written in
	// chunks, all arrive in order (gnet's Writev fails beyond 1024).
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, NumLoops: 1})
	c := dialWS(t, s, "/ws", "many")
	waitFor(t, 3*time.Second, "opened", func() bool { return h.opened.Load() == 1 })
	conns := h.snapshot()
	var fs []*Frame
	for i := range 2500 {
		fs = append(fs, NewPushFrame(1, int64(i), []byte(strconv.Itoa(i))))
	}
	s.BroadcastBatch(fs, conns)
	got := readFrames(t, c, len(fs), 5*time.Second)
	for i, g := range got {
		if g != strconv.Itoa(i) {
			t.Fatalf("frame %d: got %q", i, g)
		}
	}
	if len(got) != len(fs) {
		t.Fatalf("got %d frames, want %d", len(got), len(fs))
	}
}

// warmBroadcast connects n clients that drain what they get (until the
// test ends), and warms the loops' queues with 50 broadcasts of the frame
// it returns.
func warmBroadcast(t *testing.T, s *Server, h *echoHandler, n int) ([]*Conn, *Frame) {
	t.Helper()
	var cs []*wsClient
	for i := range n {
		cs = append(cs, dialWS(t, s, "/ws", fmt.Sprint("u", i)))
	}
	waitFor(t, 3*time.Second, "opened", func() bool { return h.opened.Load() == int64(n) })
	conns := h.snapshot()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	for _, c := range cs {
		wg.Go(func() {
			buf := make([]byte, 4096)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = c.nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				_, _ = c.nc.Read(buf)
			}
		})
	}
	f := NewPushFrame(1, 1, bytes.Repeat([]byte("a"), 100))
	for range 50 {
		s.Broadcast(f, conns)
		s.sync()
	}
	return conns, f
}

// TestBroadcastAllocs measures allocations of Broadcast to 200 connections
// in steady state: a few per event loop for the task, none per recipient.
func TestBroadcastAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation measurement")
	}
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, MaxConnsPerUser: -1})
	const n = 200
	conns, f := warmBroadcast(t, s, h, n)
	allocs := testing.AllocsPerRun(100, func() {
		s.Broadcast(f, conns)
		s.sync()
	})
	// s.sync itself allocates (a channel and a task per loop).
	perDelivery := allocs / n
	t.Logf("allocations per broadcast to %d connections: %.1f (%.3f per delivery)", n, allocs, perDelivery)
	if perDelivery > 0.1 {
		t.Fatalf("got %.3f allocations per delivery, want ~0", perDelivery)
	}
}

func TestStatsCountsRejections(t *testing.T) {
	s := startServer(t, Config{})
	for _, tok := range []string{"", "bad"} {
		c := rawDial(t, s)
		c.write(upgradeRequest("/ws", tok))
		_, _, _ = c.readResponse()
	}
	waitFor(t, time.Second, "stats", func() bool { return s.Stats().Unauthorized == 2 })
	if st := s.Stats(); st.Rejected != 2 {
		t.Fatalf("got %d rejections, want 2", st.Rejected)
	}
}

func TestRunCanceledContext(t *testing.T) {
	s, err := New(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run with a canceled context: got %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return for a canceled context")
	}
}

// TestBroadcastLoopQueueBound: past LoopQueueBound a broadcast refuses the
// deliveries, reports them and counts them in Stats.
func TestBroadcastLoopQueueBound(t *testing.T) {
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, MaxConnsPerUser: -1, NumLoops: 1, LoopQueueBound: 4})
	const nConns = 10
	for i := range nConns {
		dialWS(t, s, "/ws", fmt.Sprint("u", i))
	}
	waitFor(t, 3*time.Second, "all opened", func() bool { return h.opened.Load() == nConns })
	conns := h.snapshot()
	f := NewPushFrame(1, 1, []byte("x"))
	dropped := 0
	for range 5 {
		dropped += s.Broadcast(f, conns)
	}
	if dropped == 0 {
		t.Fatalf("got no dropped deliveries for 50 frames into a loop queue of 4")
	}
	if got := s.Stats().QueueDropped; got != uint64(dropped) {
		t.Errorf("Stats().QueueDropped = %d, want %d", got, dropped)
	}
}

// testResync is a Config.Resync whose frames read "resync:gid:lastSeq".
func testResync(gid, lastSeq int64) *Frame {
	return NewTextFrame([]byte(fmt.Sprintf("resync:%d:%d", gid, lastSeq)))
}

// dialUsers opens one connection per uid on s and returns the clients and
// the server connections, both by uid.
func dialUsers(t *testing.T, s *Server, h *echoHandler, uids ...string) (map[string]*wsClient, map[string]*Conn) {
	t.Helper()
	cs := map[string]*wsClient{}
	for _, u := range uids {
		cs[u] = dialWS(t, s, "/ws", u)
	}
	waitFor(t, 3*time.Second, "all opened", func() bool { return h.opened.Load() == int64(len(uids)) })
	conns := map[string]*Conn{}
	for _, c := range h.snapshot() {
		conns[c.UID()] = c
	}
	return cs, conns
}

// TestLoopQueueBoundResync: deliveries Broadcast refuses at LoopQueueBound
// are not lost silently: every connection that missed one gets exactly one
// resync per group carrying the highest seq it missed, after the pushes
// that were accepted, and takes pushes again right after.
func TestLoopQueueBoundResync(t *testing.T) {
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, NumLoops: 1, LoopQueueBound: 8, Resync: testResync, MaxConnsPerUser: -1})
	cs, conns := dialUsers(t, s, h, "a", "b")
	// Groups 5 and 6 alternate, seq 1..20 each: 40 frames for a and 40 for
	// b into a queue of 8, under one lock hold. a gets the first 8; the
	// rest of a's and all of b's are refused.
	var fs []*Frame
	for seq := int64(1); seq <= 20; seq++ {
		for _, gid := range []int64{5, 6} {
			fs = append(fs, NewPushFrame(gid, seq, []byte(fmt.Sprintf("%d:%d", gid, seq))))
		}
	}
	if d := s.BroadcastBatch(fs, []*Conn{conns["a"], conns["b"]}); d != 72 {
		t.Fatalf("got %d refused deliveries, want 72 (80 into a queue of 8)", d)
	}
	want := map[string][]string{
		"a": {"5:1", "6:1", "5:2", "6:2", "5:3", "6:3", "5:4", "6:4", "resync:5:20", "resync:6:20"},
		"b": {"resync:5:20", "resync:6:20"},
	}
	for _, u := range []string{"a", "b"} {
		if got := readFrames(t, cs[u], len(want[u]), 5*time.Second); strings.Join(got, ",") != strings.Join(want[u], ",") {
			t.Fatalf("client %s: got %v, want %v", u, got, want[u])
		}
	}
	// Caught up: the next push is delivered, with no second resync.
	if d := s.Broadcast(NewPushFrame(5, 21, []byte("5:21")), []*Conn{conns["a"], conns["b"]}); d != 0 {
		t.Fatalf("got %d refused deliveries into an empty queue, want 0", d)
	}
	for _, u := range []string{"a", "b"} {
		if got := readFrames(t, cs[u], 1, 5*time.Second); len(got) != 1 || got[0] != "5:21" {
			t.Fatalf("client %s after its resync: got %v, want [5:21]", u, got)
		}
	}
	st := s.Stats()
	if st.QueueDropped != 72 || st.Resyncs != 4 || st.QueueClosed != 0 || st.PushesDropped != 0 {
		t.Fatalf("stats: got %d refused, %d resyncs, %d closed, %d pushes dropped; want 72, 4, 0, 0",
			st.QueueDropped, st.Resyncs, st.QueueClosed, st.PushesDropped)
	}
}

// TestLoopQueueBoundRefusalsBound: a connection may have deliveries of at
// most maxRefusedGroups groups refused before its loop catches up; one that
// misses a delivery of one more group is closed with 1013 (it reconnects
// and syncs) instead of losing the push.
func TestLoopQueueBoundRefusalsBound(t *testing.T) {
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, NumLoops: 1, LoopQueueBound: 1, Resync: testResync, MaxConnsPerUser: -1})
	cs, conns := dialUsers(t, s, h, "a", "b")
	// One frame for each of maxRefusedGroups+1 groups, under one lock
	// hold: a gets the first and has maxRefusedGroups refused, the bound;
	// b has all of them refused, one group too many.
	var fs []*Frame
	for gid := int64(1); gid <= maxRefusedGroups+1; gid++ {
		fs = append(fs, NewPushFrame(gid, 10, []byte(fmt.Sprintf("%d:10", gid))))
	}
	if d := s.BroadcastBatch(fs, []*Conn{conns["a"], conns["b"]}); d != 2*len(fs)-1 {
		t.Fatalf("got %d refused deliveries, want %d", d, 2*len(fs)-1)
	}
	want := []string{"1:10"}
	for gid := 2; gid <= maxRefusedGroups+1; gid++ {
		want = append(want, fmt.Sprintf("resync:%d:10", gid))
	}
	if got := readFrames(t, cs["a"], len(want), 5*time.Second); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("client a: got %v, want %v", got, want)
	}
	outs, err := cs["b"].readOuts(5 * time.Second)
	if err != nil || len(outs) != 1 || outs[0] != closeOut(CloseTryAgainLater) {
		t.Fatalf("client b: got %v (%v), want only a close frame with 1013", outs, err)
	}
	if st := s.Stats(); st.QueueClosed != 1 || st.Resyncs != maxRefusedGroups {
		t.Fatalf("stats: got %d closed and %d resyncs, want 1 and %d", st.QueueClosed, st.Resyncs, maxRefusedGroups)
	}
}

// TestLoopQueueBoundWithoutResync: with no Resync configured, a
// connection that missed a delivery at LoopQueueBound is closed (1008), as
// over OutboundBound, rather than left with a silent gap.
func TestLoopQueueBoundWithoutResync(t *testing.T) {
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, NumLoops: 1, LoopQueueBound: 1, MaxConnsPerUser: -1})
	cs, conns := dialUsers(t, s, h, "a")
	fs := []*Frame{NewPushFrame(1, 1, []byte("1:1")), NewPushFrame(1, 2, []byte("1:2"))}
	if d := s.BroadcastBatch(fs, []*Conn{conns["a"]}); d != 1 {
		t.Fatalf("got %d refused deliveries, want 1", d)
	}
	if got := readFrames(t, cs["a"], 1, 5*time.Second); len(got) != 1 || got[0] != "1:1" {
		t.Fatalf("got %v, want [1:1]", got)
	}
	code, reason, err := cs["a"].expectClose(5 * time.Second)
	if err != nil || code != ClosePolicyViolation || reason != "slow consumer" {
		t.Fatalf("got %d %q (%v), want 1008 slow consumer", code, reason, err)
	}
}

// TestBroadcastRefusedAllocs measures allocations of Broadcast to 200
// connections when most deliveries are refused at LoopQueueBound and turned
// into resyncs, in steady state: none per refused delivery.
func TestBroadcastRefusedAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation measurement")
	}
	h := &echoHandler{}
	rf := NewTextFrame([]byte("resync"))
	s := startServer(t, Config{Handler: h, MaxConnsPerUser: -1, LoopQueueBound: 20,
		Resync: func(int64, int64) *Frame { return rf }})
	const n = 200
	conns, f := warmBroadcast(t, s, h, n)
	// The least of three measurements: a loaded machine only adds
	// allocations (the loops' wake-ups while the test waits for them),
	// never removes any the refusal path makes.
	before := s.Stats()
	allocs := math.Inf(1)
	for range 3 {
		allocs = min(allocs, testing.AllocsPerRun(100, func() {
			s.Broadcast(f, conns)
			s.sync()
		}))
	}
	st := s.Stats()
	refused := float64(st.QueueDropped-before.QueueDropped) / 303 // AllocsPerRun runs once more to warm up
	if refused < n/2 {
		t.Fatalf("got %.0f refused deliveries per broadcast, want most of %d", refused, n)
	}
	if st.Resyncs == before.Resyncs {
		t.Fatalf("got no resyncs for the refused deliveries")
	}
	perRefused := allocs / refused
	t.Logf("allocations per broadcast to %d connections, %.0f refused: %.1f (%.3f per refused delivery)", n, refused, allocs, perRefused)
	if perRefused > 0.1 {
		t.Fatalf("got %.3f allocations per refused delivery, want ~0", perRefused)
	}
}

// TestOriginSiblingPorts: with SiblingPorts, a page of the same host on a
// listed port may open a socket (the demo on the HTTP port); other ports
// and other hosts may not, and without SiblingPorts only the same
// host:port may.
func TestOriginSiblingPorts(t *testing.T) {
	req := func(i int, origin string) []byte {
		b := upgradeRequest("/ws", fmt.Sprintf("u%d", i), "Origin: "+origin)
		return bytes.Replace(b, []byte("Host: example.com\r\n"), []byte("Host: example.com:8081\r\n"), 1)
	}
	for i, tt := range []struct {
		ports  []string
		origin string
		status int
	}{
		{[]string{"8080"}, "http://example.com:8080", 101},
		{[]string{"8080"}, "http://EXAMPLE.com:8080", 101},
		{[]string{"8080"}, "http://example.com:8081", 101}, // the same host:port, as before
		{[]string{"8080"}, "http://example.com:9090", 403},
		{[]string{"8080"}, "http://example.com", 403},
		{[]string{"8080"}, "http://evil.example:8080", 403},
		{nil, "http://example.com:8080", 403},
	} {
		s := startServer(t, Config{SiblingPorts: tt.ports})
		c := rawDial(t, s)
		c.write(req(i, tt.origin))
		if st, _, err := c.readResponse(); err != nil || st != tt.status {
			t.Errorf("ports %v, origin %q: got %d (%v), want %d", tt.ports, tt.origin, st, err, tt.status)
		}
	}
}
