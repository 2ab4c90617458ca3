package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestMaxConnsPerIPDefault: a public port caps connections per address by
// default, loopback excepted (a proxy on the host, load generators).
func TestMaxConnsPerIPDefault(t *testing.T) {
	cfg, err := loadConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConnsPerIP != defaultMaxConnsPerIP || defaultMaxConnsPerIP <= 0 {
		t.Fatalf("got -max-conns-per-ip %d by default, want %d (> 0)", cfg.MaxConnsPerIP, defaultMaxConnsPerIP)
	}
	ex, err := cfg.ipCapExempt()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"127.0.0.1", "::1"} {
		if !slices.ContainsFunc(ex, func(p netip.Prefix) bool { return p.Contains(netip.MustParseAddr(a)) }) {
			t.Errorf("%s is not exempt by default (got %v)", a, ex)
		}
	}
	if slices.ContainsFunc(ex, func(p netip.Prefix) bool { return p.Contains(netip.MustParseAddr("203.0.113.7")) }) {
		t.Errorf("a public address is exempt by default (got %v)", ex)
	}
	if _, err := loadConfig([]string{"-max-conns-per-ip-exempt", "10.0.0.0/33"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Error("a malformed exemption was accepted")
	}
}

// TestMaxConnsPerIPAtAccept: past -max-conns-per-ip, a connection is
// answered 429 at accept, before it sends its request.
func TestMaxConnsPerIPAtAccept(t *testing.T) {
	// The cap does not depend on the store: embedded mode only.
	ts := startServer(t, "embedded", "-max-conns-per-ip", "2", "-max-conns-per-ip-exempt", "")
	addr := strings.TrimPrefix(ts.ws, "ws://")
	for range 2 { // handshakes in progress count
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
	}
	for deadline := time.Now().Add(5 * time.Second); ts.srv.ws.Stats().TCPConns < 2; { // both accepted
		if time.Now().After(deadline) {
			t.Fatalf("fanfared holds %d TCP connections, want 2", ts.srv.ws.Stats().TCPConns)
		}
		time.Sleep(time.Millisecond)
	}
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("3rd connection from one address, nothing sent: got %v (%v), want 429 at once; stats %+v", resp, err, ts.srv.ws.Stats())
	}
}

// TestFrameFlood: one connection floods one kind of frame, as fast as its
// socket takes them, while another user connects and sends. The flooder
// gets rate_limited (with retry_after_ms) and, as it keeps on, is closed
// with 1008; the other user's connect and its acks stay prompt. One
// flood per frame type, including frames that do not decode.
func TestFrameFlood(t *testing.T) {
	floods := []struct{ kind, frame string }{
		{"read", `{"type":"read","gid":%d,"seq":1}`},
		{"ping", `{"type":"ping","id":"p"}`},
		{"pull", `{"type":"pull","id":"q","gid":%d,"from_seq":1}`},
		{"send", `{"type":"send","id":"s","gid":%d,"body":1}`},
		{"garbage", `{"type":"nonsense"}`},
		{"room-ping", `{"type":"ping","id":"r"}`}, // on a waiting-room socket
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-limits-file", writeFile(t, "limits.json", `{"rules":{}}`), // the defaults
				"-room-token-secret", testRoomSecret)
			if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"flood","max_active":10,"admit_rate":20}`, nil); st != http.StatusOK {
				t.Fatalf("create room: %d", st)
			}
			for i, fl := range floods {
				t.Run(fl.kind, func(t *testing.T) {
					flooder, victim := fmt.Sprint("flooder", i), fmt.Sprint("victim", i)
					gid := ts.createGroup(flooder, victim)
					frame := fl.frame
					if strings.Contains(frame, "%d") {
						frame = fmt.Sprintf(frame, gid)
					}
					var fc *rawConn
					if fl.kind == "room-ping" {
						fc = ts.dialRoom("flood", flooder, 0)
					} else {
						fc = ts.dialRaw(flooder)
					}
					testFrameFlood(t, ts, fc, victim, gid, frame)
				})
			}
		})
	}
}

func testFrameFlood(t *testing.T, ts *testServer, fc *rawConn, victim string, gid int64, frame string) {
	// The flood starts right after hello (dialRaw read it): in cluster
	// mode the node is still registering the connection then.
	var batch bytes.Buffer
	for range 512 {
		if err := wsutil.WriteClientText(&batch, []byte(frame)); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var sent atomic.Int64
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = fc.c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := fc.c.Write(batch.Bytes()); err != nil {
				return // closed by the server
			}
			sent.Add(512)
		}
	}()
	type verdict struct {
		limited *wire.Error
		closed  wsutil.ClosedError
		err     error
	}
	got := make(chan verdict, 1)
	go func() {
		var v verdict
		deadline := time.Now().Add(20 * time.Second)
		for {
			f, err := fc.tryRead(time.Until(deadline))
			if err != nil {
				if !errors.As(err, &v.closed) {
					v.err = err
				}
				got <- v
				return
			}
			if e, ok := f.(*wire.Error); ok && e.Code == wire.CodeRateLimited && v.limited == nil {
				v.limited = e
			}
		}
	}()
	defer func() { close(stop); <-writerDone }()

	// Meanwhile another user connects and sends.
	for range 3 {
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		vc := ts.dialRaw(victim)
		connected := time.Since(start)
		start = time.Now()
		vc.send(fmt.Sprintf(`{"type":"send","id":"v","gid":%d,"body":2}`, gid))
		readUntil[*wire.Ack](vc, 10*time.Second)
		acked := time.Since(start)
		t.Logf("%d frames written by the flooder so far (the server drops what follows its close); the other user connected in %v, acked in %v", sent.Load(), connected, acked)
		if connected > 2*time.Second || acked > 2*time.Second {
			t.Errorf("during the flood: connect took %v, ack %v; want both under 2s", connected, acked)
		}
		vc.c.Close()
	}
	v := <-got
	if v.limited == nil || v.limited.RetryAfterMS <= 0 {
		t.Errorf("the flooder got no rate_limited error with retry_after_ms (got %+v)", v.limited)
	}
	if v.err != nil || v.closed.Code != 1008 || v.closed.Reason != "rate limited" {
		t.Errorf("the flooder was not closed with 1008 rate limited: %+v, %v", v.closed, v.err)
	}
	t.Logf("flooder: %d frames sent, closed %+v", sent.Load(), v.closed)
}

// TestPingFloodMemory: a client with a small receive window that floods
// WebSocket pings and never reads (the review grew a node from 25 MB to
// 533 MB in 5 s this way) leaves the node's heap about where it was and
// is closed at the idle timeout: its socket goes at most CloseTimeout
// (3 s) later, its input dropped meanwhile.
func TestPingFloodMemory(t *testing.T) {
	// The socket layer does not depend on the store: embedded mode only.
	// Without the ping rate limit (which would close the flooder at once):
	// the outbound bounds alone must hold.
	ts := startServer(t, "embedded", "-heartbeat", "1s", "-idle-timeout", "2s", "-ws-ping-rate", "0")
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		})
		return errors.Join(err, serr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, _, _, err := ws.Dialer{NetDial: d.DialContext}.Dial(ctx, ts.ws+"/ws?token="+ts.token("pinger", 0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	heap0 := heapInuse()
	var batch bytes.Buffer
	for range 256 {
		f := ws.NewPingFrame(bytes.Repeat([]byte("p"), 125))
		if err := ws.WriteFrame(&batch, ws.MaskFrameInPlace(f)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	var sent int64
	peak := int64(0)
	for time.Since(start) < 10*time.Second {
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := nc.Write(batch.Bytes()); err != nil {
			break // the server closed the connection
		}
		sent += int64(batch.Len())
		if sent%(8<<20) < int64(batch.Len()) {
			peak = max(peak, int64(heapInuse())-int64(heap0))
			if peak > 256<<20 {
				break // enough to fail; spare the machine
			}
		}
	}
	flooded := time.Since(start)
	peak = max(peak, int64(heapInuse())-int64(heap0))
	t.Logf("flooded %d MiB of pings in %v; server heap in use grew by at most %d KiB", sent>>20, flooded.Round(time.Millisecond), peak>>10)
	if peak > 32<<20 {
		t.Errorf("heap grew by %d MiB during the ping flood, want under 32 MiB (the outbound bounds are 1 MiB and 4 MiB)", peak>>20)
	}
	if flooded > 7*time.Second {
		t.Errorf("took pings for %v without a read, want closed at the 2s idle timeout (and gone 3s later)", flooded)
	}
}

// heapInuse is the process's heap in use after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}
