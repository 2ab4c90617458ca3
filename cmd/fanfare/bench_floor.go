package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gobwas/ws"
	"golang.org/x/sys/unix"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// The raw coalescing floor (bench floor-server, bench broadcast -floor) is
// the fan-out a server could not beat on the same core: no store, no
// engine, no event loop framework. It accepts any WebSocket upgrade,
// answers a hello, and from then on only writes: a schedule of messages
// (what bench broadcast's senders would send) is turned into push frames
// like fanfared's, and one goroutine writes every frame that is due to
// every connection in one write(2) per connection per pass, the next pass
// taking whatever came due meanwhile. The send->receive latency the same
// lean receivers measure against it is the floor fanfared's is compared
// with, measured in the same run: the time one core takes to walk every
// socket, plus the wait for the pass before.

// floorServer is the state of bench floor-server.
type floorServer struct {
	mu      sync.Mutex
	conns   []floorConn
	pending []byte // frames due, not yet written
	seq     int64  // last seq scheduled
	wake    chan struct{}
	idle    chan struct{} // written after a pass that found nothing pending
	// Counters of the writer, read under mu.
	passes, writes, blocked, failed int64
}

type floorConn struct {
	nc net.Conn
	fd int
}

func benchFloorServer(ctx context.Context, e *env, args []string) error {
	fs := newFlags("bench floor-server", "[-ws-addr A] [-control-addr A]", `
The raw coalescing floor for bench broadcast -floor: a WebSocket server that
answers every upgrade with a hello and then only writes the messages
bench broadcast schedules through -control-addr, every frame due in one
write(2) per connection per pass. Run it pinned like the server it is
compared with (taskset -c 0).`)
	wsAddr := fs.String("ws-addr", "127.0.0.1:18091", "WebSocket listen address (any path, any token)")
	ctlAddr := fs.String("control-addr", "127.0.0.1:18092", "HTTP control address (POST /floor/run, GET /floor/seq)")
	if err := fs.parse(e, args); err != nil {
		return err
	}
	s := &floorServer{wake: make(chan struct{}, 1), idle: make(chan struct{}, 1)}
	ln, err := net.Listen("tcp", *wsAddr)
	if err != nil {
		return err
	}
	defer ln.Close()
	cln, err := net.Listen("tcp", *ctlAddr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /floor/seq", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		seq, n := s.seq, len(s.conns)
		s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]int64{"seq": seq, "conns": int64(n)})
	})
	mux.HandleFunc("POST /floor/run", s.handleRun)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(cln) }()
	defer hs.Close()
	go s.writer()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	fmt.Fprintf(e.stderr, "bench floor-server: ws %s, control %s\n", ln.Addr(), cln.Addr())
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go s.serve(nc)
	}
}

// serve upgrades nc, sends the hello, registers its descriptor with the
// writer and discards whatever the client sends (pings) until it closes.
func (s *floorServer) serve(nc net.Conn) {
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := (ws.Upgrader{}).Upgrade(nc); err != nil {
		nc.Close()
		return
	}
	hello := appendServerFrame(nil, wire.AppendHello(nil, &wire.Hello{UID: "floor", Node: "floor", HeartbeatS: 30, MaxMessageBytes: 1 << 16}))
	if _, err := nc.Write(hello); err != nil {
		nc.Close()
		return
	}
	_ = nc.SetDeadline(time.Time{})
	rc, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		nc.Close()
		return
	}
	fd := -1
	_ = rc.Control(func(f uintptr) { fd = int(f) })
	s.mu.Lock()
	s.conns = append(s.conns, floorConn{nc: nc, fd: fd})
	s.mu.Unlock()
	_, _ = io.Copy(io.Discard, nc)
	// The descriptor stays registered until the process ends: the writer
	// holds it by number, so nc is not closed under it.
}

// writer writes the due frames to every connection, one pass at a time.
func (s *floorServer) writer() {
	var buf []byte
	for range s.wake {
		for {
			s.mu.Lock()
			if len(s.pending) == 0 {
				s.mu.Unlock()
				break
			}
			buf, s.pending = s.pending, buf[:0]
			conns := s.conns
			s.mu.Unlock()
			var writes, blocked, failed int64
			for _, c := range conns {
				n, err := unix.Write(c.fd, buf)
				writes++
				if err == nil && n == len(buf) {
					continue
				}
				if n < 0 {
					n = 0
				}
				if err != nil && !errors.Is(err, syscall.EAGAIN) {
					failed++
					continue
				}
				// The socket is full: the rest goes out blocking (the
				// net poller waits), in order, before the next pass.
				blocked++
				if _, err := c.nc.Write(buf[n:]); err != nil {
					failed++
				}
			}
			s.mu.Lock()
			s.passes++
			s.writes += writes
			s.blocked += blocked
			s.failed += failed
			s.mu.Unlock()
		}
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

// floorRun is the schedule of POST /floor/run.
type floorRun struct {
	Rate      float64 `json:"rate"`
	Start     int64   `json:"start"` // Unix ns of the first message
	Until     int64   `json:"until"` // Unix ns: no message at or after it
	BodyBytes int     `json:"body_bytes"`
	GID       int64   `json:"gid"`
}

// floorResult is POST /floor/run's answer.
type floorResult struct {
	First, Last                     int64 // seqs scheduled
	Passes, Writes, Blocked, Failed int64
}

// handleRun schedules the messages of a floorRun (each body's "t" its
// scheduled time, as bench broadcast's senders do) and answers once they
// are all written.
func (s *floorServer) handleRun(w http.ResponseWriter, r *http.Request) {
	var run floorRun
	if err := json.NewDecoder(r.Body).Decode(&run); err != nil || run.Rate <= 0 {
		http.Error(w, "bad run", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	first := s.seq + 1
	p0, w0, b0, f0 := s.passes, s.writes, s.blocked, s.failed
	s.mu.Unlock()
	interval := time.Duration(float64(time.Second) / run.Rate)
	var body, payload []byte
	for next := time.Unix(0, run.Start); next.UnixNano() < run.Until; next = next.Add(interval) {
		if !sleepUntil(r.Context(), next) {
			return
		}
		body = benchBody(body, next.UnixNano(), run.BodyBytes)
		s.mu.Lock()
		s.seq++
		payload = wire.AppendMsg(payload[:0], &wire.Msg{GID: run.GID, Seq: s.seq, From: "floor", TS: next.UnixMilli(), Kind: "text", Body: body})
		s.pending = appendServerFrame(s.pending, payload)
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	// Wait for the writer to empty the queue.
	for {
		s.mu.Lock()
		done := len(s.pending) == 0
		s.mu.Unlock()
		if done {
			select {
			case <-s.idle:
			case <-time.After(100 * time.Millisecond):
			}
			s.mu.Lock()
			done = len(s.pending) == 0
			s.mu.Unlock()
			if done {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.mu.Lock()
	res := floorResult{First: first, Last: s.seq, Passes: s.passes - p0, Writes: s.writes - w0, Blocked: s.blocked - b0, Failed: s.failed - f0}
	s.mu.Unlock()
	_ = json.NewEncoder(w).Encode(res)
}

// floorClient is bench broadcast's side of -floor.
type floorClient struct{ base string }

func (c floorClient) seq(ctx context.Context) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/floor/seq", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var v map[string]int64
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return 0, fmt.Errorf("floor: %w", err)
	}
	return v["seq"], nil
}

// run has the floor server send the schedule and returns what it wrote.
func (c floorClient) run(ctx context.Context, run floorRun) (floorResult, error) {
	b, _ := json.Marshal(run)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/floor/run", bytes.NewReader(b))
	if err != nil {
		return floorResult{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return floorResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return floorResult{}, fmt.Errorf("floor: POST /floor/run: %s", resp.Status)
	}
	var res floorResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return floorResult{}, fmt.Errorf("floor: %w", err)
	}
	return res, nil
}

func floorSummary(r floorResult) string {
	return "floor: seqs " + strconv.FormatInt(r.First, 10) + ".." + strconv.FormatInt(r.Last, 10) +
		fmt.Sprintf(", %d passes, %d writes (%d blocked, %d failed)", r.Passes, r.Writes, r.Blocked, r.Failed)
}
