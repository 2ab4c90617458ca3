package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/store/postgres/pgtest"
)

const testSecret = "0123456789abcdef0123456789abcdef-test"

// testServer is a fanfared node started in-process on 127.0.0.1:0.
type testServer struct {
	t      *testing.T
	srv    *server
	ws     string // ws://host:port
	http   string // http://host:port
	admin  string
	signer *auth.Signer
	stop   func()
	logw   *testLogWriter // nil for a child process
}

// modes are the two ways every end-to-end test runs.
var modes = []string{"embedded", "cluster"}

// modeArgs are the flags of a mode: embedded (a data directory) or cluster
// (Postgres schema and Redis key prefix of the test's own).
func modeArgs(t *testing.T, mode string) []string {
	t.Helper()
	switch mode {
	case "embedded":
		return []string{"-data-dir", t.TempDir()}
	case "cluster":
		url := pgtest.URL(t)
		return []string{"-postgres-url", url, "-postgres-schema", pgtest.Schema(t, url),
			"-redis-addr", redisAddr(t), "-redis-prefix", "t" + randomHex(6) + ":"}
	}
	t.Fatalf("unknown mode %q", mode)
	return nil
}

// startServer starts a node in mode with extra flags.
func startServer(t *testing.T, mode string, extra ...string) *testServer {
	t.Helper()
	args := []string{"-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-jwt-secret", testSecret,
		"-admin-token", "test-admin-token", "-log-level", "warn", "-shutdown-timeout", "5s"}
	args = append(args, modeArgs(t, mode)...)
	if !slices.Contains(extra, "-limits-file") {
		args = append(args, "-limits-file", unlimited(t))
	}
	args = append(args, extra...)
	return startArgs(t, args)
}

func redisAddr(t *testing.T) string {
	t.Helper()
	a := os.Getenv("FANFARE_TEST_REDIS_ADDR")
	if a == "" {
		t.Fatal("FANFARE_TEST_REDIS_ADDR is not set (make test sets it)")
	}
	return a
}

// unlimited writes a limits document that disables the per-user limits, for
// tests that send faster than a person would.
func unlimited(t *testing.T) string {
	t.Helper()
	return writeFile(t, "limits.json", `{"rules":{"user_group":{"limit":0},"user_all":{"limit":0},"pull":{"limit":0},"connect":{"limit":0},`+
		`"frame_send":{"limit":0},"frame_pull":{"limit":0},"frame_read":{"limit":0},"frame_user":{"limit":0}}}`)
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func startArgs(t *testing.T, args []string) *testServer {
	t.Helper()
	cfg, err := loadConfig(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logw := &testLogWriter{t: t}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := newServer(ctx, cfg, newLogger(logw, cfg.LogLevel))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("server failed to start: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("server did not start in 20 s")
	}
	signer, err := auth.NewSigner(auth.SignerConfig{Secret: []byte(testSecret)})
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{t: t, srv: s, ws: "ws://" + s.wsAddr(), http: "http://" + s.httpAddr(), admin: "test-admin-token", signer: signer, logw: logw}
	var once sync.Once
	ts.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("server run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("server did not stop in 30 s")
			}
			logw.stop()
		})
	}
	t.Cleanup(ts.stop)
	return ts
}

// testLogWriter sends server logs to the test log until the test ends,
// and keeps the last maxKeptLogLines for tests that look for a record
// (logged).
type testLogWriter struct {
	mu    sync.Mutex
	t     *testing.T
	done  bool
	lines []string
}

const maxKeptLogLines = 4000

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	line := strings.TrimSpace(string(p))
	if !w.done {
		w.t.Log(line)
	}
	if len(w.lines) == maxKeptLogLines {
		w.lines = append(w.lines[:0], w.lines[maxKeptLogLines/2:]...)
	}
	w.lines = append(w.lines, line)
	return len(p), nil
}

// logged returns the kept log lines that contain every one of subs.
func (w *testLogWriter) logged(subs ...string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
next:
	for _, l := range w.lines {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue next
			}
		}
		out = append(out, l)
	}
	return out
}

func (w *testLogWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

func (ts *testServer) token(uid string, lvl int) string {
	tok, err := ts.signer.Sign(uid, lvl, time.Hour)
	if err != nil {
		ts.t.Fatal(err)
	}
	return tok
}

// do sends one HTTP request with bearer tok and decodes the JSON answer
// into out (when non-nil); it returns the status.
func (ts *testServer) do(method, path, tok string, body any, out any) int {
	ts.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			ts.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, ts.http+path, rd)
	if err != nil {
		ts.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		ts.t.Fatal(err)
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			ts.t.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return resp.StatusCode
}

// createGroup creates a group owned by members[0] with all members.
func (ts *testServer) createGroup(members ...string) int64 {
	ts.t.Helper()
	var g wire.Group
	if st := ts.do("POST", "/v1/groups", ts.admin, wire.CreateGroupRequest{Name: "g", Owner: members[0]}, &g); st != http.StatusCreated {
		ts.t.Fatalf("create group: status %d", st)
	}
	ts.addMembers(g.GID, members...)
	return g.GID
}

func (ts *testServer) addMembers(gid int64, uids ...string) []wire.Member {
	ts.t.Helper()
	var out wire.MembersResponse
	for len(uids) > 0 {
		n := min(len(uids), 5000)
		var part wire.MembersResponse
		if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/members", gid), ts.admin, wire.AddMembersRequest{UIDs: uids[:n]}, &part); st != http.StatusOK {
			ts.t.Fatalf("add members: status %d", st)
		}
		out.Members = append(out.Members, part.Members...)
		uids = uids[n:]
	}
	return out.Members
}

// rawConn is a WebSocket client speaking docs/protocol.md frames directly.
type rawConn struct {
	t     *testing.T
	c     net.Conn
	rw    io.ReadWriter // reads through the handshake's buffered reader
	hello wire.Hello
}

// dialRaw connects as uid and reads hello.
func (ts *testServer) dialRaw(uid string) *rawConn {
	ts.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, br, _, err := ws.Dial(ctx, ts.ws+"/ws?token="+ts.token(uid, 0))
	if err != nil {
		ts.t.Fatalf("dial %s: %v", uid, err)
	}
	rc := &rawConn{t: ts.t, c: c, rw: c}
	if br != nil {
		rc.rw = bufferedRW(br, c)
	}
	ts.t.Cleanup(func() { c.Close() })
	f := rc.read(5 * time.Second)
	h, ok := f.(*wire.Hello)
	if !ok {
		ts.t.Fatalf("first frame: got %T, want hello", f)
	}
	rc.hello = *h
	return rc
}

// bufferedRW reads through br first: frames that arrived with the 101
// response are in it.
func bufferedRW(br io.Reader, c net.Conn) io.ReadWriter {
	return struct {
		io.Reader
		io.Writer
	}{br, c}
}

func (rc *rawConn) send(v string) {
	rc.t.Helper()
	if err := wsutil.WriteClientText(rc.rw, []byte(v)); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// read returns the next server frame, or fails the test after d.
func (rc *rawConn) read(d time.Duration) wire.ServerFrame {
	rc.t.Helper()
	f, err := rc.tryRead(d)
	if err != nil {
		rc.t.Fatalf("read: %v", err)
	}
	return f
}

// tryRead is tryReadAny without presence frames: the online counts
// (docs/protocol.md §4.16) come whenever a group's count changes, between
// the frames the other tests wait for.
func (rc *rawConn) tryRead(d time.Duration) (wire.ServerFrame, error) {
	deadline := time.Now().Add(d)
	for {
		f, err := rc.tryReadAny(time.Until(deadline))
		if _, p := f.(*wire.Presence); err != nil || !p {
			return f, err
		}
	}
}

// tryReadAny returns the next server frame, whatever it is.
func (rc *rawConn) tryReadAny(d time.Duration) (wire.ServerFrame, error) {
	rc.c.SetReadDeadline(time.Now().Add(d))
	b, err := wsutil.ReadServerText(rc.rw)
	if err != nil {
		return nil, err
	}
	return wire.DecodeServer(b)
}

// until reads frames until one of type T arrives (others are returned too).
func readUntil[T wire.ServerFrame](rc *rawConn, d time.Duration) (T, []wire.ServerFrame) {
	rc.t.Helper()
	deadline := time.Now().Add(d)
	var skipped []wire.ServerFrame
	for {
		f, err := rc.tryRead(time.Until(deadline))
		if err != nil {
			var want T
			// The frames that came instead say why (an error frame, a
			// resync...).
			last := skipped[max(0, len(skipped)-5):]
			desc := make([]string, len(last))
			for i, x := range last {
				desc[i] = fmt.Sprintf("%T%+v", x, x)
			}
			rc.t.Fatalf("read %T: %v (skipped %d frames, the last: %s)", want, err, len(skipped), strings.Join(desc, " "))
		}
		if v, ok := f.(T); ok {
			return v, skipped
		}
		skipped = append(skipped, f)
	}
}

func newTestSigner(t *testing.T) *auth.Signer {
	t.Helper()
	s, err := auth.NewSigner(auth.SignerConfig{Secret: []byte(testSecret)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
