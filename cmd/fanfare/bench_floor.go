package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"
	"golang.org/x/sys/unix"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// The raw floor (bench floor-server) is the fan-out a server could not
// beat on the same cores: no store, no engine, no event-loop library. It
// is the one raw server of the benchmarks: bench broadcast -floor and
// bench peer (its raw-coalesced and raw-frame columns) both run it.
//
// It accepts any WebSocket upgrade, answers a hello, takes the socket's
// descriptor out of the Go runtime and from then on only writes (what
// clients send, their pings, stays unread in the kernel). Messages come
// from POST /publish (bench peer: one HTTP request per message, as for
// the servers it is compared with) or from a schedule, POST /floor/run
// (bench broadcast -floor: the floor sends what bench broadcast's senders
// would send, each body's "t" its scheduled time). Either way each message
// becomes a push frame like fanfared's ({"type":"msg",...}, the same
// bytes for the same body), built once and shared by every socket.
//
// Its writers, one per Go processor (one when pinned to a core), each own
// a share of the sockets and write in passes: -mode coalesce writes every
// frame due for a socket in one write(2) per pass, the next pass taking
// whatever came due meanwhile; -mode frame writes each frame on its own. A
// socket whose buffer is full keeps the rest in a backlog that the next
// pass (at most 5 ms later) sends first, so nothing is dropped or
// reordered and no socket holds up the others.

// Raw floor modes (-mode).
const (
	rawFrame    = "frame"
	rawCoalesce = "coalesce"
)

// floorServerEnv marks a child process started as the floor server (the
// test binary's TestMain reads it; the fanfare binary gets "bench
// floor-server").
const floorServerEnv = "FANFARE_BENCH_FLOOR_SERVER"

// floorRetry is how soon a writer retries the sockets left with a backlog.
const floorRetry = 5 * time.Millisecond

// floorServer is the state of bench floor-server.
type floorServer struct {
	writers []*floorWriter
	hello   []byte // the hello frame every upgrade gets

	// mu orders messages: a seq and its place in every writer's queue
	// are taken together, so every socket gets the seqs in order.
	mu      sync.Mutex
	seq     int64 // last seq queued
	payload []byte
	next    int // round-robin over writers for new connections

	conns       atomic.Int64
	lastUpgrade atomic.Int64 // Unix ns
}

// floorWriter owns a share of the sockets and the frames queued for them.
type floorWriter struct {
	mode string
	wake chan struct{}

	mu        sync.Mutex
	conns     []*floorConn
	queue     [][]byte
	queuedSeq int64 // seq of the last frame queued

	// Owned by the writer goroutine.
	all        []byte // a pass's frames back to back (coalesce)
	backlogged int    // sockets left with a backlog by the last pass

	// doneSeq is the last seq a pass has handed to every socket (written,
	// or in a socket's backlog).
	doneSeq                         atomic.Int64
	passes, writes, blocked, failed atomic.Int64
}

// floorConn is one subscriber socket, owned by its writer.
type floorConn struct {
	fd      int
	backlog []byte
	dead    bool
}

func benchFloorServer(ctx context.Context, e *env, args []string) error {
	fs := newFlags("bench floor-server", "[-ws-addr A] [-control-addr A] [-mode coalesce|frame]", `
The raw floor of bench broadcast -floor and bench peer: a WebSocket server
that answers every upgrade with a hello and then only writes, each message
(POST /publish on -control-addr, or the schedule bench broadcast gives it)
as a push frame like fanfared's, every frame due in one write(2) per
connection per pass (-mode coalesce) or one write per frame (-mode frame).
Run it pinned like the server it is compared with (taskset -c 0).`)
	wsAddr := fs.String("ws-addr", "127.0.0.1:18091", "WebSocket listen address (any path, any token)")
	ctlAddr := fs.String("control-addr", "127.0.0.1:18092", "HTTP control address (POST /publish, POST /floor/run, GET /floor/seq)")
	mode := fs.String("mode", rawCoalesce, "coalesce (every due frame in one write per connection per pass) or frame (one write per frame per connection)")
	if err := fs.parse(e, args); err != nil {
		return err
	}
	if *mode != rawFrame && *mode != rawCoalesce {
		return fs.usageErr("-mode %q: want coalesce or frame", *mode)
	}
	s := &floorServer{hello: appendServerFrame(nil, wire.AppendHello(nil, &wire.Hello{UID: "floor", Node: "floor", HeartbeatS: 30, MaxMessageBytes: 1 << 16}))}
	ln, err := net.Listen("tcp", *wsAddr)
	if err != nil {
		return err
	}
	defer ln.Close()
	cln, err := net.Listen("tcp", *ctlAddr)
	if err != nil {
		return err
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for range runtime.GOMAXPROCS(0) {
		w := &floorWriter{mode: *mode, wake: make(chan struct{}, 1)}
		s.writers = append(s.writers, w)
		wg.Go(func() { w.run(wctx) })
	}
	wg.Go(func() { s.returnMemory(wctx) })
	mux := http.NewServeMux()
	mux.HandleFunc("GET /floor/seq", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		seq := s.seq
		s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]int64{"seq": seq, "conns": s.conns.Load()})
	})
	mux.HandleFunc("POST /floor/run", s.handleRun)
	mux.HandleFunc("POST /publish", s.handlePublish)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(cln) }()
	defer hs.Close()
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

// serve upgrades nc, sends the hello and hands a duplicate of its
// descriptor to a writer; nc itself is closed, so that the Go runtime
// keeps nothing for the connection.
func (s *floorServer) serve(nc net.Conn) {
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := (ws.Upgrader{}).Upgrade(nc); err != nil {
		return
	}
	if _, err := nc.Write(s.hello); err != nil {
		return
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	fd := -1
	_ = rc.Control(func(f uintptr) { fd, _ = unix.Dup(int(f)) })
	if fd < 0 {
		return
	}
	if unix.SetNonblock(fd, true) != nil {
		unix.Close(fd)
		return
	}
	s.mu.Lock()
	w := s.writers[s.next%len(s.writers)]
	s.next++
	s.mu.Unlock()
	w.mu.Lock()
	w.conns = append(w.conns, &floorConn{fd: fd})
	w.mu.Unlock()
	s.conns.Add(1)
	s.lastUpgrade.Store(time.Now().UnixNano())
}

// returnMemory gives the handshakes' garbage back to the kernel a second
// after the last upgrade, so that the idle RSS per connection is what the
// server keeps (a descriptor, its socket and a floorConn), not what the
// Go heap has not yet scavenged.
func (s *floorServer) returnMemory(ctx context.Context) {
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

// enqueue makes body message seq+1 of group gid, sent at ts, and queues
// its frame for every socket; it returns the seq.
func (s *floorServer) enqueue(gid int64, ts time.Time, body []byte) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.payload = wire.AppendMsg(s.payload[:0], &wire.Msg{GID: gid, Seq: s.seq, From: "floor", TS: ts.UnixMilli(), Kind: "text", Body: body})
	frame := appendServerFrame(make([]byte, 0, len(s.payload)+10), s.payload)
	for _, w := range s.writers {
		w.mu.Lock()
		w.queue = append(w.queue, frame)
		w.queuedSeq = s.seq
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return s.seq
}

// handlePublish queues the request's body (JSON, at most 1 MiB) as one
// message of group 1 and answers {"seq":N}.
func (s *floorServer) handlePublish(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	body = bytes.TrimSpace(body)
	if !json.Valid(body) {
		http.Error(w, "body is not JSON", http.StatusBadRequest)
		return
	}
	seq := s.enqueue(1, time.Now(), body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(strconv.AppendInt([]byte(`{"seq":`), seq, 10))
	_, _ = w.Write([]byte("}"))
}

// run writes the queued frames to w's sockets, one pass per wake-up, and
// retries the sockets left with a backlog every floorRetry.
func (w *floorWriter) run(ctx context.Context) {
	retry := time.NewTimer(floorRetry)
	retry.Stop()
	var frames [][]byte
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-retry.C:
		}
		clear(frames)
		w.mu.Lock()
		frames, w.queue = w.queue, frames[:0]
		conns, last := w.conns, w.queuedSeq
		w.mu.Unlock()
		if len(frames) > 0 || w.backlogged > 0 {
			w.pass(conns, frames)
		}
		w.doneSeq.Store(last)
		if w.backlogged > 0 {
			retry.Reset(floorRetry)
		}
	}
}

// pass hands frames to every socket of conns (and sends what earlier
// passes left in their backlogs).
func (w *floorWriter) pass(conns []*floorConn, frames [][]byte) {
	if w.mode == rawCoalesce {
		w.all = w.all[:0]
		for _, f := range frames {
			w.all = append(w.all, f...)
		}
	}
	var writes, blocked, failed int64
	backlogged := 0
	count := func(r floorWrite) {
		writes++
		switch r {
		case floorBlocked:
			blocked++
		case floorFailed:
			failed++
		}
	}
	for _, c := range conns {
		switch {
		case c.dead:
			continue
		case len(c.backlog) > 0:
			for _, f := range frames {
				c.backlog = append(c.backlog, f...)
			}
			count(c.write(nil))
		case len(frames) == 0:
			continue
		case w.mode == rawCoalesce:
			count(c.write(w.all))
		default:
			for _, f := range frames {
				if len(c.backlog) > 0 {
					// Full: the rest waits for the next pass, rather
					// than one failing write(2) per frame.
					c.backlog = append(c.backlog, f...)
					continue
				}
				count(c.write(f))
			}
		}
		if len(c.backlog) > 0 {
			backlogged++
		}
	}
	w.backlogged = backlogged
	w.passes.Add(1)
	w.writes.Add(writes)
	w.blocked.Add(blocked)
	w.failed.Add(failed)
}

// floorWrite is the outcome of one write(2).
type floorWrite uint8

const (
	floorWritten floorWrite = iota // all of it
	floorBlocked                   // the socket was full: the rest is in the backlog
	floorFailed                    // the connection is gone
)

// write sends p (or, with p nil, the backlog) in one write(2), keeping
// what the socket did not take.
func (c *floorConn) write(p []byte) floorWrite {
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
		return floorFailed
	}
	if n == len(p) {
		c.backlog = c.backlog[:0]
		return floorWritten
	}
	rest := p[n:]
	if len(c.backlog) > 0 {
		c.backlog = c.backlog[:copy(c.backlog, rest)]
	} else {
		c.backlog = append(c.backlog, rest...)
	}
	return floorBlocked
}

// appendServerFrame appends p as one unmasked final text frame.
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

// counters sums the writers' counters.
func (s *floorServer) counters() (r floorResult) {
	for _, w := range s.writers {
		r.Passes += w.passes.Load()
		r.Writes += w.writes.Load()
		r.Blocked += w.blocked.Load()
		r.Failed += w.failed.Load()
	}
	return r
}

// handleRun queues the messages of a floorRun at their scheduled times
// (each body's "t" its scheduled time, as bench broadcast's senders do)
// and answers once every writer has handed them to its sockets.
func (s *floorServer) handleRun(w http.ResponseWriter, r *http.Request) {
	var run floorRun
	if err := json.NewDecoder(r.Body).Decode(&run); err != nil || run.Rate <= 0 || run.BodyBytes < 32 || run.BodyBytes > 60<<10 {
		http.Error(w, "bad run: want rate > 0 and body_bytes within 32..61440", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	first := s.seq + 1
	s.mu.Unlock()
	c0 := s.counters()
	interval := time.Duration(float64(time.Second) / run.Rate)
	var body []byte
	last := first - 1
	for next := time.Unix(0, run.Start); next.UnixNano() < run.Until; next = next.Add(interval) {
		if !sleepUntil(r.Context(), next) {
			return
		}
		body = benchBody(body, next.UnixNano(), run.BodyBytes)
		last = s.enqueue(run.GID, next, body)
	}
	for _, wr := range s.writers {
		for wr.doneSeq.Load() < last {
			if !sleepUntil(r.Context(), time.Now().Add(time.Millisecond)) {
				return
			}
		}
	}
	c1 := s.counters()
	res := floorResult{First: first, Last: last, Passes: c1.Passes - c0.Passes, Writes: c1.Writes - c0.Writes,
		Blocked: c1.Blocked - c0.Blocked, Failed: c1.Failed - c0.Failed}
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
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return floorResult{}, fmt.Errorf("floor: POST /floor/run: %s: %s", resp.Status, bytes.TrimSpace(msg))
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
