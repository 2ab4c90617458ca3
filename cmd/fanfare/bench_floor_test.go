package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestBenchFloor runs bench broadcast -floor against a floor server in this
// process: every scheduled message reaches every lean receiver once, in
// order, and the run reports latency and the floor's CPU.
func TestBenchFloor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pr, pw := io.Pipe()
	srvCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		e := &env{getenv: func(string) string { return "" }, stdout: io.Discard, stderr: pw}
		done <- cmdBench(srvCtx, e, []string{"floor-server", "-ws-addr", "127.0.0.1:0", "-control-addr", "127.0.0.1:0"})
		pw.Close()
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("floor-server: %v", err)
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	// "bench floor-server: ws 127.0.0.1:P, control 127.0.0.1:Q"
	f := strings.Fields(strings.NewReplacer(",", "").Replace(line))
	if len(f) != 6 {
		t.Fatalf("floor-server said %q", line)
	}
	wsAddr, ctlAddr := f[3], f[5]
	var out, errOut bytes.Buffer
	e := &env{getenv: func(string) string { return "" }, stdout: &out, stderr: &errOut}
	args := []string{"broadcast", "-floor", "http://" + ctlAddr, "-ws", "ws://" + wsAddr + "/ws",
		"-members", "30", "-rate", "100", "-duration", "1s", "-warmup", "200ms", "-procs", "1", "-bind", "none",
		"-receivers", "lean", "-server-pid", strconv.Itoa(os.Getpid()), "-json"}
	if err := cmdBench(ctx, e, args); err != nil {
		t.Fatalf("bench: %v\n%s", err, errOut.String())
	}
	var r broadcastResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("result %q: %v", out.String(), err)
	}
	if r.Connected != 30 || r.Sent < 100 || r.Acked != r.Sent {
		t.Fatalf("got %d connected, %d sent, %d acked; want 30 and >= 100 all scheduled", r.Connected, r.Sent, r.Acked)
	}
	if r.Lost != 0 || r.Duplicates != 0 || r.OutOfOrder != 0 || r.BadFrames != 0 || r.Disconnects != 0 {
		t.Fatalf("got lost %d dup %d ooo %d bad frames %d disconnects %d, want 0", r.Lost, r.Duplicates, r.OutOfOrder, r.BadFrames, r.Disconnects)
	}
	if r.Deliveries == 0 || r.Deliveries != r.LatencyMS.Count || r.Deliveries%30 != 0 || r.LatencyMS.P50 <= 0 {
		t.Fatalf("got %d deliveries, latency %+v", r.Deliveries, r.LatencyMS)
	}
	if !strings.Contains(errOut.String(), "floor: seqs") {
		t.Fatalf("no floor summary in %q", errOut.String())
	}
}

// TestFloorWriterBacklog fills a socket the floor writes to: what the
// socket does not take waits in its backlog, later passes send it first,
// and the reader gets every frame once, in order, in both modes.
func TestFloorWriterBacklog(t *testing.T) {
	for _, mode := range []string{rawCoalesce, rawFrame} {
		t.Run(mode, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fds[1])
			_ = unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
			if err := unix.SetNonblock(fds[0], true); err != nil {
				t.Fatal(err)
			}
			c := &floorConn{fd: fds[0]}
			w := &floorWriter{mode: mode}
			var want []byte
			frame := func(i int) []byte {
				return appendServerFrame(nil, []byte(strings.Repeat(strconv.Itoa(i%10), 200)))
			}
			// Nobody reads: the socket fills and the rest waits.
			for k := 0; !c.dead && len(c.backlog) < 64<<10 && k < 1e5; k += 2 {
				f := [][]byte{frame(k), frame(k + 1)}
				want = append(append(want, f[0]...), f[1]...)
				w.pass([]*floorConn{c}, f)
			}
			if c.dead || w.backlogged != 1 || w.blocked.Load() == 0 {
				t.Fatalf("dead %v, backlogged %d, blocked %d: want a live socket with a backlog", c.dead, w.backlogged, w.blocked.Load())
			}
			// The reader drains while empty passes retry the backlog.
			got := make(chan []byte)
			go func() {
				var b []byte
				buf := make([]byte, 8192)
				for len(b) < len(want) {
					n, err := unix.Read(fds[1], buf)
					if err != nil || n == 0 {
						break
					}
					b = append(b, buf[:n]...)
				}
				got <- b
			}()
			deadline := time.Now().Add(10 * time.Second)
			for w.backlogged > 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
				w.pass([]*floorConn{c}, nil)
			}
			if w.backlogged != 0 {
				t.Fatalf("backlog of %d bytes left after 10s", len(c.backlog))
			}
			if b := <-got; !bytes.Equal(b, want) {
				t.Fatalf("got %d bytes, want the %d written, in order", len(b), len(want))
			}
		})
	}
}

// TestFloorFrameModeStopsAtFullSocket: in frame mode, once a socket is
// full the rest of the pass goes to its backlog, rather than one more
// failing write(2) per remaining frame.
func TestFloorFrameModeStopsAtFullSocket(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	_ = unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	c := &floorConn{fd: fds[0]}
	w := &floorWriter{mode: rawFrame}
	frames := make([][]byte, 2000) // 400 KB: more than the socket takes
	for i := range frames {
		frames[i] = appendServerFrame(nil, bytes.Repeat([]byte{'x'}, 200))
	}
	w.pass([]*floorConn{c}, frames)
	if len(c.backlog) == 0 || w.blocked.Load() != 1 {
		t.Fatalf("backlog %d bytes, %d blocked writes: want a backlog after one blocked write", len(c.backlog), w.blocked.Load())
	}
	if n := w.writes.Load(); n >= int64(len(frames)) {
		t.Fatalf("%d writes for %d frames: the full socket was written to once per frame", n, len(frames))
	}
}
