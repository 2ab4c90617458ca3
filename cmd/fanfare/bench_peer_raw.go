package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"
	"golang.org/x/sys/unix"
)

// The raw server is bench peer's floor: the least a server can do to fan
// one published body out to every WebSocket subscriber. It upgrades
// GET /ws, takes each socket's descriptor out of the Go runtime, and on
// POST /publish queues the body as one unmasked text frame; its writers
// (one per core it may run on, each owning a share of the sockets) then
// write(2) the queued frames to every socket: in mode "frame" one write
// per frame per socket, in mode "coalesce" every frame due for a socket in
// one write. A socket whose buffer is full keeps the rest in a backlog
// that later writes send first, so nothing is dropped. It keeps no
// history, checks no token and reads nothing from the subscribers.

// Raw server modes.
const (
	rawFrame    = "frame"
	rawCoalesce = "coalesce"
)

// peerRawEnv marks a child process started as the raw server (the test
// binary's TestMain reads it; the fanfare binary gets "bench peer-raw").
const peerRawEnv = "FANFARE_BENCH_PEER_RAW"

// rawConn is one subscriber socket of the raw server, owned by its writer.
type rawConn struct {
	fd      int
	backlog []byte
	dead    bool
}

// rawWriter owns a share of the sockets and the frames queued for them.
type rawWriter struct {
	mode  string
	mu    sync.Mutex
	conns []*rawConn
	queue [][]byte
	wake  chan struct{}
	all   []byte // the round's frames back to back (coalesce)
}

// rawServer is the raw server's state.
type rawServer struct {
	writers []*rawWriter
	mu      sync.Mutex
	n       int

	lastUpgrade atomic.Int64 // Unix ns
}

// runPeerRaw is the raw server's main: it serves on -addr until ctx ends
// and prints "raw: listening on ADDR" to out once it accepts.
func runPeerRaw(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench peer-raw", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	mode := fs.String("mode", rawCoalesce, "frame (one write per frame per socket) or coalesce (one write per socket per round)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *mode != rawFrame && *mode != rawCoalesce {
		return fmt.Errorf("bench peer-raw: -mode %q: want frame or coalesce", *mode)
	}
	srv := &rawServer{}
	for range runtime.GOMAXPROCS(0) {
		w := &rawWriter{mode: *mode, wake: make(chan struct{}, 1)}
		srv.writers = append(srv.writers, w)
		go w.run(ctx)
	}
	go srv.returnMemory(ctx)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ws", srv.upgrade)
	mux.HandleFunc("POST /publish", srv.publish)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = hs.Close()
	}()
	fmt.Fprintf(out, "raw: listening on %s\n", ln.Addr())
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (s *rawServer) upgrade(w http.ResponseWriter, r *http.Request) {
	nc, _, _, err := ws.UpgradeHTTP(r, w)
	if err != nil {
		return
	}
	defer nc.Close() // the writer keeps a duplicate of the descriptor
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	fd := -1
	_ = raw.Control(func(s uintptr) { fd, _ = unix.Dup(int(s)) })
	if fd < 0 || unix.SetNonblock(fd, true) != nil {
		return
	}
	s.mu.Lock()
	wr := s.writers[s.n%len(s.writers)]
	s.n++
	s.mu.Unlock()
	wr.mu.Lock()
	wr.conns = append(wr.conns, &rawConn{fd: fd})
	wr.mu.Unlock()
	s.lastUpgrade.Store(time.Now().UnixNano())
}

// returnMemory gives the handshakes' garbage back to the kernel a second
// after the last upgrade, so that the idle RSS per connection is what the
// server keeps (a descriptor, its socket buffers and a rawConn), not
// what the Go heap has not yet scavenged.
func (s *rawServer) returnMemory(ctx context.Context) {
	var done int64
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		last := s.lastUpgrade.Load()
		if last != done && time.Since(time.Unix(0, last)) > time.Second {
			debug.FreeOSMemory()
			done = last
		}
	}
}

func (s *rawServer) publish(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	frame := appendServerFrame(make([]byte, 0, len(body)+10), body)
	for _, wr := range s.writers {
		wr.mu.Lock()
		wr.queue = append(wr.queue, frame)
		wr.mu.Unlock()
		select {
		case wr.wake <- struct{}{}:
		default:
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte("{}"))
}

// run writes each round's frames to every socket of w.
func (w *rawWriter) run(ctx context.Context) {
	retry := time.NewTicker(5 * time.Millisecond)
	defer retry.Stop()
	var frames [][]byte
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-retry.C:
		}
		w.mu.Lock()
		frames, w.queue = w.queue, frames[:0]
		conns := w.conns
		w.mu.Unlock()
		if w.mode == rawCoalesce {
			w.all = w.all[:0]
			for _, f := range frames {
				w.all = append(w.all, f...)
			}
		}
		for _, c := range conns {
			if c.dead {
				continue
			}
			switch {
			case len(c.backlog) > 0:
				for _, f := range frames {
					c.backlog = append(c.backlog, f...)
				}
				c.write(nil)
			case w.mode == rawCoalesce:
				if len(w.all) > 0 {
					c.write(w.all)
				}
			default:
				for _, f := range frames {
					c.write(f)
				}
			}
		}
	}
}

// write sends p (or, with p nil, the backlog) in one write(2), keeping
// what the socket did not take.
func (c *rawConn) write(p []byte) {
	if len(c.backlog) > 0 {
		if p != nil {
			c.backlog = append(c.backlog, p...)
		}
		p = c.backlog
	}
	n, err := unix.Write(c.fd, p)
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		n = 0
	case err != nil:
		c.dead = true
		unix.Close(c.fd)
		c.backlog = nil
		return
	}
	if n == len(p) {
		c.backlog = c.backlog[:0]
		return
	}
	rest := p[n:]
	if len(c.backlog) > 0 {
		c.backlog = c.backlog[:copy(c.backlog, rest)]
	} else {
		c.backlog = append(c.backlog, rest...)
	}
}

// appendServerFrame appends p as one unmasked final text frame (the raw
// servers of bench peer-raw and bench floor-server).
func appendServerFrame(dst, p []byte) []byte {
	n := len(p)
	switch {
	case n < 126:
		dst = append(dst, 0x81, byte(n))
	case n < 1<<16:
		dst = append(dst, 0x81, 126, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0x81, 127, 0, 0, 0, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(dst, p...)
}
