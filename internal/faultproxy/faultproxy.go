package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Direction is one way of a proxied connection.
type Direction int

const (
	// Upstream is from the client (who dialed the proxy) to the target:
	// requests.
	Upstream Direction = iota
	// Downstream is from the target to the client: replies.
	Downstream
)

func (d Direction) String() string {
	if d == Upstream {
		return "upstream"
	}
	return "downstream"
}

// Faults are the faults of one direction; the zero value forwards bytes
// as they come.
type Faults struct {
	// Latency delays every chunk by this much; Jitter adds a uniformly
	// random part of [0, Jitter) to each chunk, order kept.
	Latency, Jitter time.Duration
	// BytesPerSecond caps the direction's throughput on each connection;
	// 0 = no cap.
	BytesPerSecond int64
	// Blackhole holds every byte of the direction while the connection
	// stays up (see the package doc: held, not discarded).
	Blackhole bool
	// ResetAfter resets a connection (RST both ways) once this many bytes
	// went through the direction since these faults were set; 0 = never.
	ResetAfter int64
}

// Stats counts what the proxy did.
type Stats struct {
	Accepted int64 // connections accepted
	Open     int64 // connections open now
	Resets   int64 // connections reset by ResetAfter or ResetAll
	// Bytes delivered, by direction.
	Upstream, Downstream int64
}

// chunkSize is the most one read takes from a socket; queueChunks the
// chunks a direction holds before its reader stops reading (then the
// kernel's buffers fill and the sender blocks).
const (
	chunkSize   = 32 << 10
	queueChunks = 16
	dialTimeout = 5 * time.Second
)

// dirState is one direction's faults and the generation they were set in:
// ResetAfter counts bytes from the generation a writer first sees.
type dirState struct {
	f   Faults
	gen uint64
}

// Proxy forwards TCP connections from its address to a target under the
// faults in force. It is safe for concurrent use.
type Proxy struct {
	target string
	addr   string

	dirs      [2]atomic.Pointer[dirState]
	partition atomic.Bool
	gen       atomic.Uint64
	sockBuf   atomic.Int64 // SetSocketBuffers; 0 = the kernel's

	mu     sync.Mutex
	ln     net.Listener // nil while refusing
	conns  map[*pconn]struct{}
	wake   chan struct{} // closed and replaced on every change of faults
	closed bool
	wg     sync.WaitGroup

	accepted, resets atomic.Int64
	bytes            [2]atomic.Int64
}

// New listens on 127.0.0.1 (a free port) and proxies to target
// (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), ln: ln, conns: map[*pconn]struct{}{}, wake: make(chan struct{})}
	for d := range p.dirs {
		p.dirs[d].Store(&dirState{})
	}
	p.wg.Add(1)
	go p.accept(ln)
	return p, nil
}

// Start is New for a test: a failure fails t, and t.Cleanup closes the
// proxy.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's address (host:port); it stays the same across
// Refuse.
func (p *Proxy) Addr() string { return p.addr }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Set puts f in force for direction d on every connection, open or new,
// replacing what was set before.
func (p *Proxy) Set(d Direction, f Faults) {
	p.dirs[d].Store(&dirState{f: f, gen: p.gen.Add(1)})
	p.changed()
}

// SetSocketBuffers makes the connections accepted from now on use socket
// buffers of n bytes (SO_RCVBUF and SO_SNDBUF on both sides, and reads of
// at most n), so that a slow or held direction pushes back on the sender
// after little data, as a thin link does, instead of after the megabytes
// loopback buffers take. 0 restores the kernel's sizes.
func (p *Proxy) SetSocketBuffers(n int) { p.sockBuf.Store(int64(n)) }

// Get returns the faults in force for d.
func (p *Proxy) Get(d Direction) Faults { return p.dirs[d].Load().f }

// Partition holds both directions of every connection while on, whatever
// the directions' own faults; new connections are accepted and hear
// nothing.
func (p *Proxy) Partition(on bool) {
	p.partition.Store(on)
	p.changed()
}

// Refuse closes the listening socket while on, so that new connections
// are refused; off listens again on the same address. Open connections
// are not touched; one the kernel completed but the proxy had not yet
// accepted is reset with the listener, as a real server's backlog is.
func (p *Proxy) Refuse(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("faultproxy: closed")
	}
	switch {
	case on && p.ln != nil:
		err := p.ln.Close()
		p.ln = nil
		return err
	case !on && p.ln == nil:
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("faultproxy: listen again on %s: %w", p.addr, err)
		}
		p.ln = ln
		p.wg.Add(1)
		go p.accept(ln)
	}
	return nil
}

// Clear removes every fault: both directions forward as they come, no
// partition, new connections accepted.
func (p *Proxy) Clear() error {
	p.Set(Upstream, Faults{})
	p.Set(Downstream, Faults{})
	p.Partition(false)
	return p.Refuse(false)
}

// ResetAll resets every open connection (RST on both sides).
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	cs := make([]*pconn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.reset()
	}
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := len(p.conns)
	p.mu.Unlock()
	return Stats{Accepted: p.accepted.Load(), Open: int64(open), Resets: p.resets.Load(),
		Upstream: p.bytes[Upstream].Load(), Downstream: p.bytes[Downstream].Load()}
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	cs := make([]*pconn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.abort()
	}
	p.wg.Wait()
}

// changed wakes the writers waiting on a blackhole.
func (p *Proxy) changed() {
	p.mu.Lock()
	close(p.wake)
	p.wake = make(chan struct{})
	p.mu.Unlock()
}

func (p *Proxy) wakeCh() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.wake
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed: Refuse or Close
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(c.(*net.TCPConn))
	}
}

// serve dials the target for one accepted connection and pumps both
// directions.
func (p *Proxy) serve(client *net.TCPConn) {
	defer p.wg.Done()
	buf := int(p.sockBuf.Load())
	d := net.Dialer{Timeout: dialTimeout}
	if buf > 0 {
		// Before connect, so that the window scale is chosen for it.
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, buf)
				syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, buf)
			})
		}
		client.SetReadBuffer(buf)
		client.SetWriteBuffer(buf)
	}
	sc, err := d.Dial("tcp", p.target)
	if err != nil {
		client.SetLinger(0)
		client.Close()
		return
	}
	c := &pconn{p: p, client: client, server: sc.(*net.TCPConn), done: make(chan struct{}), chunk: chunkSize}
	if buf > 0 {
		c.chunk = min(chunkSize, buf)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.abort()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, d := range []Direction{Upstream, Downstream} {
		src, dst := c.client, c.server
		if d == Downstream {
			src, dst = c.server, c.client
		}
		ch := make(chan chunk, queueChunks)
		wg.Go(func() { c.read(src, ch) })
		wg.Go(func() { c.write(d, dst, ch) })
	}
	wg.Wait()
	if c.eofs.Load() == 2 {
		c.shut() // both sides closed theirs: a clean close
	} else {
		c.abort() // one failed or was reset: close what is left
	}
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pconn is one proxied connection.
type pconn struct {
	p              *Proxy
	client, server *net.TCPConn
	done           chan struct{} // closed by abort
	chunk          int           // the most one read takes
	once           sync.Once
	eofs           atomic.Int32 // directions whose FIN was passed on
}

// chunk is what one read returned, and when.
type chunk struct {
	b   []byte
	at  time.Time
	err error // the read's error (io.EOF: the sender closed its side)
}

// reset is abort counted as a reset (the count is taken before the
// sockets close, so that a peer that saw the RST sees it counted).
func (c *pconn) reset() {
	c.once.Do(func() {
		c.p.resets.Add(1)
		c.shutSockets(true)
	})
}

// abort closes both sockets with RST.
func (c *pconn) abort() {
	c.once.Do(func() { c.shutSockets(true) })
}

// shutSockets closes both sockets, with RST when rst; it runs once, under c.once.
func (c *pconn) shutSockets(rst bool) {
	close(c.done)
	if rst {
		c.client.SetLinger(0)
		c.server.SetLinger(0)
	}
	c.client.Close()
	c.server.Close()
}

// shut closes both sockets without RST, after both sides closed theirs.
func (c *pconn) shut() {
	c.once.Do(func() { c.shutSockets(false) })
}

// read takes chunks from src until it fails or the connection is aborted.
func (c *pconn) read(src *net.TCPConn, ch chan<- chunk) {
	buf := make([]byte, c.chunk)
	for {
		n, err := src.Read(buf)
		var k chunk
		if n > 0 {
			k = chunk{b: append([]byte(nil), buf[:n]...), at: time.Now()}
		} else if err != nil {
			k = chunk{err: err, at: time.Now()}
		} else {
			continue
		}
		select {
		case ch <- k:
		case <-c.done:
			return
		}
		if n > 0 && err != nil {
			select {
			case ch <- chunk{err: err, at: time.Now()}:
			case <-c.done:
			}
			return
		}
		if err != nil {
			return
		}
	}
}

// write delivers d's chunks to dst under the faults in force.
func (c *pconn) write(d Direction, dst *net.TCPConn, ch <-chan chunk) {
	var (
		gen    uint64 // the faults' generation that sent counts from
		sent   int64  // bytes delivered since gen
		prev   time.Time
		tokens float64   // bytes the bandwidth cap allows now
		filled time.Time // when tokens was last topped up
	)
	for {
		var k chunk
		select {
		case k = <-ch:
		case <-c.done:
			return
		}
		if !c.hold(d) {
			return
		}
		if k.err != nil {
			if errors.Is(k.err, io.EOF) {
				// The sender closed its side: pass the FIN on; serve closes
				// the connection when both sides did.
				dst.CloseWrite()
				c.eofs.Add(1)
				return
			}
			c.abort()
			return
		}
		st := c.p.dirs[d].Load()
		f := st.f
		if f.Latency > 0 || f.Jitter > 0 {
			due := k.at.Add(f.Latency)
			if f.Jitter > 0 {
				due = due.Add(rand.N(f.Jitter))
			}
			if due.Before(prev) {
				due = prev // one stream: no chunk overtakes the one before
			}
			prev = due
			if !c.sleep(time.Until(due)) {
				return
			}
		}
		if st.gen != gen {
			gen, sent = st.gen, 0
		}
		b := k.b
		reset := false
		if f.ResetAfter > 0 && sent+int64(len(b)) >= f.ResetAfter {
			b, reset = b[:max(0, f.ResetAfter-sent)], true
		}
		for len(b) > 0 {
			n := len(b)
			if rate := float64(f.BytesPerSecond); rate > 0 {
				// A token bucket holding a twentieth of a second's worth:
				// slices that small keep the pace smooth, and an idle
				// spell buys no burst beyond it.
				burst := max(1, rate/20)
				n = min(n, int(burst))
				now := time.Now()
				tokens = min(burst, tokens+now.Sub(filled).Seconds()*rate)
				filled = now
				if lack := float64(n) - tokens; lack > 0 {
					if !c.sleep(time.Duration(lack / rate * float64(time.Second))) {
						return
					}
					tokens, filled = float64(n), time.Now()
				}
				tokens -= float64(n)
			}
			w, err := dst.Write(b[:n])
			c.p.bytes[d].Add(int64(w))
			sent += int64(w)
			if err != nil {
				c.abort()
				return
			}
			b = b[n:]
		}
		if reset {
			c.reset()
			return
		}
	}
}

// hold waits while d is blackholed or the proxy partitioned; false when
// the connection was aborted meanwhile.
func (c *pconn) hold(d Direction) bool {
	for {
		wake := c.p.wakeCh()
		if !c.p.partition.Load() && !c.p.dirs[d].Load().f.Blackhole {
			return true
		}
		select {
		case <-wake:
		case <-c.done:
			return false
		}
	}
}

// sleep waits d (the fault's delay, not a synchronisation); false when the
// connection was aborted meanwhile.
func (c *pconn) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.done:
		return false
	}
}
