package socket

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fakeAuth accepts tokens "uid[:level[:expiresUnixMilli]]" and refuses
// "bad" and the empty uid.
type fakeAuth struct{ calls atomic.Int64 }

func (a *fakeAuth) Authenticate(token string) (Identity, error) {
	a.calls.Add(1)
	parts := strings.Split(token, ":")
	if parts[0] == "" || parts[0] == "bad" {
		return Identity{}, ErrUnauthorized
	}
	id := Identity{UID: parts[0]}
	if len(parts) > 1 {
		id.Tier, _ = strconv.Atoi(parts[1])
	}
	if len(parts) > 2 {
		ms, err := strconv.ParseInt(parts[2], 10, 64)
		if err != nil {
			return Identity{}, ErrUnauthorized
		}
		id.Expires = time.UnixMilli(ms)
	}
	return id, nil
}

// echoHandler echoes every text message and records lifecycle events.
type echoHandler struct {
	admit  func(*Request) int
	onOpen func(*Conn)
	mu     sync.Mutex
	conns  []*Conn
	opened atomic.Int64
	closed atomic.Int64
}

func (h *echoHandler) Admit(r *Request) int {
	if h.admit != nil {
		return h.admit(r)
	}
	return 0
}

func (h *echoHandler) OnOpen(c *Conn) {
	h.opened.Add(1)
	h.mu.Lock()
	h.conns = append(h.conns, c)
	h.mu.Unlock()
	if h.onOpen != nil {
		h.onOpen(c)
	}
}

func (h *echoHandler) OnMessage(c *Conn, msg []byte) {
	_ = c.Write(NewTextFrame(msg))
}

func (h *echoHandler) OnClose(c *Conn) { h.closed.Add(1) }

func (h *echoHandler) snapshot() []*Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*Conn(nil), h.conns...)
}

// startServer runs a server on 127.0.0.1:0 with two loops and stops it at
// the end of the test.
func startServer(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.NumLoops == 0 {
		cfg.NumLoops = 2
	}
	if cfg.Authenticator == nil {
		cfg.Authenticator = &fakeAuth{}
	}
	if cfg.Handler == nil {
		cfg.Handler = &echoHandler{}
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("server not ready after 10s")
	}
	if s.Addr() == nil {
		t.Fatalf("server did not start: %v", <-done)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return 10s after cancel")
		}
	})
	return s
}

// wsClient is a raw test client: it writes exactly the bytes it is told and
// checks every server frame strictly.
type wsClient struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
}

func rawDial(t testing.TB, s *Server) *wsClient {
	t.Helper()
	return rawDialRcvBuf(t, s, 0)
}

// rawDialRcvBuf dials with SO_RCVBUF set before connect (so the kernel
// does not autotune it): a client that does not read then stalls the
// server after a bounded number of bytes.
func rawDialRcvBuf(t testing.TB, s *Server, rcvbuf int) *wsClient {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			})
			return errors.Join(err, serr)
		}
	}
	nc, err := d.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	return &wsClient{t: t, nc: nc, br: bufio.NewReaderSize(nc, 64<<10)}
}

func upgradeRequest(path, token string, extra ...string) []byte {
	var b bytes.Buffer
	target := path
	if token != "" {
		target += "?token=" + token
	}
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n", target)
	for _, h := range extra {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

// readResponse reads an HTTP response head and returns its status and
// headers.
func (c *wsClient) readResponse() (int, http.Header, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp.StatusCode, resp.Header, nil
}

// dialWS dials and upgrades; it fails the test unless the answer is 101.
func dialWS(t testing.TB, s *Server, path, token string, extra ...string) *wsClient {
	t.Helper()
	c := rawDial(t, s)
	c.write(upgradeRequest(path, token, extra...))
	st, h, err := c.readResponse()
	if err != nil || st != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade %s: status %d, err %v", path, st, err)
	}
	if got, want := h.Get("Sec-WebSocket-Accept"), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="; got != want {
		t.Fatalf("Sec-WebSocket-Accept: got %q, want %q", got, want)
	}
	return c
}

func (c *wsClient) write(b []byte) {
	c.t.Helper()
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// writeTolerant writes and ignores errors: the server may have closed the
// connection already, which is what some cases expect.
func (c *wsClient) writeTolerant(b []byte) {
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, _ = c.nc.Write(b)
}

// readFrame reads one server frame, checking that it is unmasked, has no
// RSV bits and is final.
func (c *wsClient) readFrame(timeout time.Duration) (op byte, payload []byte, err error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
	var h [2]byte
	if _, err = io.ReadFull(c.br, h[:]); err != nil {
		return 0, nil, err
	}
	if h[0]&0x70 != 0 || h[0]&0x80 == 0 || h[1]&0x80 != 0 {
		return 0, nil, fmt.Errorf("bad server frame header % x", h)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var e [2]byte
		if _, err = io.ReadFull(c.br, e[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(e[:]))
	case 127:
		var e [8]byte
		if _, err = io.ReadFull(c.br, e[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(e[:])
	}
	payload = make([]byte, n)
	if _, err = io.ReadFull(c.br, payload); err != nil {
		return 0, nil, err
	}
	return h[0] & 0x0f, payload, nil
}

// readOuts reads frames until a close frame (then expects EOF) or an
// error, and returns them as outs.
func (c *wsClient) readOuts(timeout time.Duration) ([]out, error) {
	var res []out
	for {
		op, p, err := c.readFrame(timeout)
		if err != nil {
			return res, err
		}
		switch op {
		case opText:
			res = append(res, echo(string(p)))
		case opPong:
			res = append(res, pongOut(string(p)))
		case opClose:
			var code CloseCode
			if len(p) >= 2 {
				code = CloseCode(binary.BigEndian.Uint16(p))
			}
			res = append(res, closeOut(code))
			// The server closes TCP (or shuts its write side) after a
			// close frame: nothing else may follow.
			_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
			if extra, err := c.br.ReadByte(); !errors.Is(err, io.EOF) {
				return res, fmt.Errorf("after the close frame: got byte %#x, err %v, want EOF", extra, err)
			}
			return res, nil
		default:
			return res, fmt.Errorf("unexpected server opcode %d", op)
		}
	}
}

// expectClose reads until a close frame and returns its code and reason.
func (c *wsClient) expectClose(timeout time.Duration) (CloseCode, string, error) {
	for {
		op, p, err := c.readFrame(timeout)
		if err != nil {
			return 0, "", err
		}
		if op == opClose {
			if len(p) < 2 {
				return 0, "", nil
			}
			return CloseCode(binary.BigEndian.Uint16(p)), string(p[2:]), nil
		}
	}
}

// sendText sends one masked text frame.
func (c *wsClient) sendText(s string) { c.write(text(s).encode()) }

func (c *wsClient) expectText(want string) {
	c.t.Helper()
	op, p, err := c.readFrame(5 * time.Second)
	if err != nil || op != opText || string(p) != want {
		c.t.Fatalf("got op %d %q err %v, want text %q", op, p, err, want)
	}
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// syncTask signals when its loop runs it: every task queued before it on
// that loop (flushes) has run.
type syncTask struct{ done chan struct{} }

func (t syncTask) Run(context.Context) error {
	close(t.done)
	return nil
}

// sync waits until every event loop has run the tasks queued so far.
func (s *Server) sync() {
	for _, l := range *s.loops.Load() {
		t := syncTask{done: make(chan struct{})}
		if l.el.Execute(context.Background(), t) == nil {
			<-t.done
		}
	}
}
