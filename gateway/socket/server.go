package socket

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// Server is a multicore gnet WebSocket server. Create it with New, serve
// with Run, stop with Shutdown.
type Server struct {
	cfg      Config
	lim      limits
	handler  Handler
	start    time.Time
	tick     time.Duration
	tcpLimit int64

	loopsMu sync.Mutex
	loops   atomic.Pointer[[]*loop]

	bootMu   sync.Mutex // orders OnBoot against Run's cancellation
	canceled bool       // guarded by bootMu
	eng      atomic.Pointer[gnet.Engine]
	addr     atomic.Pointer[net.TCPAddr]
	ready    chan struct{}
	readyOne sync.Once
	runDone  chan struct{}
	running  atomic.Bool
	draining atomic.Bool
	stopped  atomic.Bool

	nextID   atomic.Uint64
	tcp      atomic.Int64 // all TCP connections
	active   atomic.Int64 // upgraded (or being upgraded) connections
	upgrades atomic.Uint64
	// queueDropped counts broadcast deliveries refused at LoopQueueBound.
	queueDropped atomic.Uint64
	// queueClosed counts connections closed because their refused
	// deliveries could not be recorded (loop.refuseLocked).
	queueClosed atomic.Uint64
	rejects     [6]atomic.Uint64 // by status: 401, 403, 404, 408/431/400, 429, 503

	ipMu    sync.Mutex
	perIP   map[netip.Addr]int32
	userMu  sync.Mutex
	perUser map[string]int32 // connections per uid, kept only under MaxConnsPerUser > 0
}

// New validates cfg, fills in defaults and returns a server ready to Run.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	fdLimit := 1024
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
		fdLimit = int(min(rl.Cur, 1<<30))
	}
	cfg = cfg.withDefaults(fdLimit)
	s := &Server{
		cfg:     cfg,
		lim:     limits{maxFrame: int64(cfg.MaxFrameBytes), maxMessage: int64(cfg.MaxMessageBytes)},
		handler: cfg.Handler,
		start:   time.Now(),
		ready:   make(chan struct{}),
		runDone: make(chan struct{}),
		perIP:   make(map[netip.Addr]int32),
		perUser: make(map[string]int32),
	}
	if s.handler == nil {
		s.handler = nopHandler{}
	}
	s.tcpLimit = int64(cfg.MaxConns + cfg.MaxConns/16 + 16)
	if budget := int64(fdLimit - 64); s.tcpLimit > budget && budget > 0 {
		s.tcpLimit = budget
		if cfg.MaxConns > fdLimit-fdReserve { // a configured value, not the default
			cfg.Logger.Warn("socket: MaxConns exceeds the open-file limit; TCP connections capped",
				"max_conns", cfg.MaxConns, "fd_limit", fdLimit)
		}
	}
	shortest := min(cfg.HandshakeTimeout, cfg.IdleTimeout, cfg.MessageTimeout, cfg.CloseTimeout)
	s.tick = min(max(shortest/10, 5*time.Millisecond), 250*time.Millisecond)
	if h := cfg.UpgradeHold; h > 0 {
		// A held 101 waits at most UpgradeHold plus one tick.
		s.tick = min(s.tick, max(h, 5*time.Millisecond))
	}
	s.loops.Store(&[]*loop{})
	return s, nil
}

// clock returns the server's monotonic time in nanoseconds.
func (s *Server) clock() int64 { return int64(time.Since(s.start)) }

func (s *Server) wallNow() time.Time { return time.Now() }

// Run listens on Config.Addr and serves until ctx is done (connections are
// then dropped without a close handshake) or Shutdown completes. It returns
// nil after a clean stop.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("socket: Run called twice")
	}
	defer close(s.runDone)
	if s.stopped.Load() {
		s.readyOne.Do(func() { close(s.ready) })
		return ErrServerClosed
	}
	numLoops := s.cfg.NumLoops
	if numLoops == 0 {
		numLoops = runtime.GOMAXPROCS(0)
	}
	stopCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		<-stopCtx.Done()
		s.bootMu.Lock()
		s.canceled = true
		eng := s.eng.Load()
		s.bootMu.Unlock()
		if eng != nil {
			c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = eng.Stop(c)
		}
	}()
	err := gnet.Run(&events{s: s}, "tcp://"+s.cfg.Addr,
		gnet.WithMulticore(true),
		gnet.WithNumEventLoop(numLoops),
		gnet.WithTicker(true),
		gnet.WithReuseAddr(true),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithLogger(gnetLogger{s.cfg.Logger}),
	)
	s.readyOne.Do(func() { close(s.ready) })
	if err != nil && s.addr.Load() == nil {
		return fmt.Errorf("socket: listen %s: %w", s.cfg.Addr, err)
	}
	return err
}

// Ready is closed once the server listens (or Run failed).
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr returns the listening address once Ready is closed, nil before.
func (s *Server) Addr() net.Addr {
	if a := s.addr.Load(); a != nil {
		return a
	}
	return nil
}

// Shutdown drains the server: new connections are refused, every open
// connection gets a close frame with 1001 (going away), handshakes in
// progress get 503, and Shutdown waits until the clients have closed or
// ctx is done; then the engine stops and Run returns. It returns ctx's
// error if connections had to be dropped.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopped.Store(true)
	if s.draining.Swap(true) {
		return errors.New("socket: Shutdown called twice")
	}
	if !s.running.Load() {
		return nil
	}
	<-s.ready
	for _, l := range *s.loops.Load() {
		_ = l.el.Execute(context.Background(), &drainTask{l: l})
	}
	var err error
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for s.tcp.Load() > 0 && err == nil {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-t.C:
		}
	}
	if eng := s.eng.Load(); eng != nil {
		stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = eng.Stop(stopCtx)
		cancel()
	}
	select {
	case <-s.runDone:
	case <-ctx.Done():
		if err == nil {
			err = ctx.Err()
		}
	}
	s.cfg.Logger.Info("socket: shut down", "forced", err != nil)
	return err
}

// drainTask starts the close handshake of every connection of a loop.
type drainTask struct{ l *loop }

func (t *drainTask) Run(context.Context) error {
	l := t.l
	l.now = l.s.clock()
	for c := l.hsList.head; c != nil; c = l.hsList.head {
		l.reject(c, 503, nil)
	}
	for c := l.idleList.head; c != nil; c = l.idleList.head {
		l.startClose(c, CloseGoingAway, "server shutting down")
	}
	l.flush()
	return nil
}

// Broadcast queues the push f for every connection in conns: one task per
// event loop however many recipients it has, the same frame bytes for all,
// and no allocation per recipient. Per connection, frames keep the order in
// which Broadcast, Push and Write queued them. Connections over their
// outbound bound drop the push and get one resync later. It returns how
// many deliveries were refused because an event loop's queue was full
// (Config.LoopQueueBound): the node is overloaded and the engine should
// degrade. A refused delivery is handled like a push dropped by the
// outbound bound: the connection gets one resync for the group (once its
// outbound buffer is empty, usually in the loop's next flush), so the
// client pulls what it missed. Broadcast never blocks on a connection.
func (s *Server) Broadcast(f *Frame, conns []*Conn) (dropped int) {
	return s.broadcast(f, nil, conns)
}

// WireBytes returns the bytes f takes on the wire to a connection with
// (deflate true) or without permessage-deflate, compressing f now if it is
// due to be compressed: call it before Broadcast to count egress and to
// keep the compression out of the loops' locks.
func (s *Server) WireBytes(f *Frame, deflate bool) int {
	if !deflate || !f.text || len(f.b) < s.cfg.DeflateMinBytes {
		return len(f.b)
	}
	return len(f.deflated(s.cfg.DeflateLevel))
}

// BroadcastBatch is Broadcast for several frames: each connection gets all
// of fs, in order, coalesced into one write.
func (s *Server) BroadcastBatch(fs []*Frame, conns []*Conn) (dropped int) {
	return s.broadcast(nil, fs, conns)
}

func (s *Server) broadcast(f *Frame, fs []*Frame, conns []*Conn) (dropped int) {
	loops := *s.loops.Load()
	// Lock order: loops by index, ascending.
	for _, l := range loops {
		l.mu.Lock()
	}
	bound := s.cfg.LoopQueueBound
	for _, c := range conns {
		if c == nil || c.closed.Load() {
			continue
		}
		l := c.l
		if f != nil {
			if len(l.inbox) >= bound {
				l.refuseLocked(c, f)
				dropped++
				continue
			}
			l.inbox = append(l.inbox, outItem{c: c, f: f, kind: itemPush, next: -1})
		} else {
			for _, g := range fs {
				if len(l.inbox) >= bound {
					l.refuseLocked(c, g)
					dropped++
					continue
				}
				l.inbox = append(l.inbox, outItem{c: c, f: g, kind: itemPush, next: -1})
			}
		}
		l.touched = true
	}
	for _, l := range loops {
		sched := l.touched && !l.scheduled
		if l.touched {
			l.scheduled = true
			l.touched = false
		}
		l.mu.Unlock()
		if sched {
			l.schedule()
		}
	}
	if dropped > 0 {
		s.queueDropped.Add(uint64(dropped))
	}
	return dropped
}

// Stats is a snapshot of the server's counters.
type Stats struct {
	Conns         int64  // upgraded connections open
	TCPConns      int64  // TCP connections, including handshakes and closings
	Upgrades      uint64 // successful upgrades since start
	Rejected      uint64 // handshakes refused, all statuses
	Unauthorized  uint64 // ... with 401
	Forbidden     uint64 // ... with 403
	TooMany       uint64 // ... with 429
	Unavailable   uint64 // ... with 503
	Deliveries    uint64 // frames written to connections (pushes and replies)
	PushesDropped uint64 // pushes dropped by the outbound bound
	Resyncs       uint64 // resync frames sent
	SlowClosed    uint64 // connections closed over the hard bound
	QueueDropped  uint64 // broadcast deliveries refused at LoopQueueBound (node overloaded); each leads to a resync
	QueueClosed   uint64 // connections closed (1013) because their refused deliveries could not be recorded
}

// Stats returns the current counters.
func (s *Server) Stats() Stats {
	st := Stats{
		Conns:        s.active.Load(),
		TCPConns:     s.tcp.Load(),
		Upgrades:     s.upgrades.Load(),
		Unauthorized: s.rejects[0].Load(),
		Forbidden:    s.rejects[1].Load(),
		TooMany:      s.rejects[4].Load(),
		Unavailable:  s.rejects[5].Load(),
		QueueDropped: s.queueDropped.Load(),
		QueueClosed:  s.queueClosed.Load(),
	}
	for i := range s.rejects {
		st.Rejected += s.rejects[i].Load()
	}
	for _, l := range *s.loops.Load() {
		st.Deliveries += l.deliveries.Load()
		st.PushesDropped += l.pushesDropped.Load()
		st.Resyncs += l.resyncs.Load()
		st.SlowClosed += l.slowClosed.Load()
	}
	return st
}

func (s *Server) countReject(status int) {
	i := 3
	switch status {
	case 401:
		i = 0
	case 403:
		i = 1
	case 404:
		i = 2
	case 429:
		i = 4
	case 503:
		i = 5
	}
	s.rejects[i].Add(1)
}

// loopFor returns the loop state of el, creating it on first use.
func (s *Server) loopFor(el gnet.EventLoop) *loop {
	for _, l := range *s.loops.Load() {
		if l.el == el {
			return l
		}
	}
	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	old := *s.loops.Load()
	for _, l := range old {
		if l.el == el {
			return l
		}
	}
	l := newLoop(s, el, len(old))
	next := append(append(make([]*loop, 0, len(old)+1), old...), l)
	s.loops.Store(&next)
	return l
}

func (s *Server) reserveActive() bool {
	for {
		n := s.active.Load()
		if n >= int64(s.cfg.MaxConns) {
			return false
		}
		if s.active.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// ipKey is what a counts under for MaxConnsPerIP: an IPv4 address
// (IPv4-mapped IPv6 unmapped) itself, an IPv6 address its IPv6CapPrefix
// block.
func ipKey(a netip.Addr, v6bits int) netip.Addr {
	a = a.Unmap()
	if a.Is4() || v6bits >= 128 {
		return a
	}
	p, err := a.WithZone("").Prefix(v6bits)
	if err != nil {
		return a
	}
	return p.Addr()
}

// ipAdd adds d to the connections counted under a's key (ipKey) and
// returns the new count.
func (s *Server) ipAdd(a netip.Addr, d int32) int {
	a = ipKey(a, s.cfg.IPv6CapPrefix)
	s.ipMu.Lock()
	n := s.perIP[a] + d
	if n > 0 {
		s.perIP[a] = n
	} else {
		delete(s.perIP, a)
	}
	s.ipMu.Unlock()
	return int(n)
}

// ipCapped reports whether MaxConnsPerIP applies to a.
func (s *Server) ipCapped(a netip.Addr) bool {
	if s.cfg.MaxConnsPerIP <= 0 {
		return false
	}
	for _, p := range s.cfg.MaxConnsPerIPExempt {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

func (s *Server) reserveUser(uid string) bool {
	s.userMu.Lock()
	defer s.userMu.Unlock()
	n := s.perUser[uid]
	if int(n) >= s.cfg.MaxConnsPerUser {
		return false
	}
	s.perUser[uid] = n + 1
	return true
}

func (s *Server) releaseUser(uid string) {
	s.userMu.Lock()
	if n := s.perUser[uid] - 1; n > 0 {
		s.perUser[uid] = n
	} else {
		delete(s.perUser, uid)
	}
	s.userMu.Unlock()
}

// releaseSlots gives back the node and user slots c reserved.
func (s *Server) releaseSlots(c *Conn) {
	if c.active {
		c.active = false
		s.active.Add(-1)
	}
	if c.userSlot {
		c.userSlot = false
		s.releaseUser(c.uid)
	}
}

// events is the gnet event handler.
type events struct {
	gnet.BuiltinEventEngine
	s *Server
}

func (e *events) OnBoot(eng gnet.Engine) gnet.Action {
	s := e.s
	s.bootMu.Lock()
	canceled := s.canceled
	s.eng.Store(&eng)
	s.bootMu.Unlock()
	if canceled { // Run's context ended before the engine booted
		return gnet.Shutdown
	}
	if fd, err := eng.Dup(); err == nil {
		if sa, err := unix.Getsockname(fd); err == nil {
			switch a := sa.(type) {
			case *unix.SockaddrInet4:
				s.addr.Store(&net.TCPAddr{IP: net.IP(a.Addr[:]).To16(), Port: a.Port})
			case *unix.SockaddrInet6:
				s.addr.Store(&net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port})
			}
		}
		_ = unix.Close(fd)
	}
	s.readyOne.Do(func() { close(s.ready) })
	s.cfg.Logger.Info("socket: listening", "addr", s.Addr())
	return gnet.None
}

func (e *events) OnOpen(gc gnet.Conn) ([]byte, gnet.Action) {
	s := e.s
	if s.draining.Load() {
		return nil, gnet.Close
	}
	var remote netip.AddrPort
	if ta, ok := gc.RemoteAddr().(*net.TCPAddr); ok {
		remote = ta.AddrPort()
		remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	}
	// The address is counted before the connection (TCPConns): whoever
	// sees a connection counted sees its address counted too.
	n := s.ipAdd(remote.Addr(), 1)
	if s.tcp.Add(1) > s.tcpLimit {
		s.tcp.Add(-1)
		s.ipAdd(remote.Addr(), -1)
		return nil, gnet.Close
	}
	l := s.loopFor(gc.EventLoop())
	c := &Conn{l: l, gc: gc, id: s.nextID.Add(1), remote: remote, head: -1, tail: -1, heapIdx: -1}
	c.ipCounted = true
	if n := s.cfg.SocketSendBuffer; n > 0 {
		_ = gc.SetWriteBuffer(n)
	}
	l.now = s.clock()
	l.hsList.pushBack(c, l.now+int64(s.cfg.HandshakeTimeout))
	gc.SetContext(c)
	if n > s.cfg.MaxConnsPerIP && s.ipCapped(remote.Addr()) {
		// At accept, before a byte of the request is read or parsed: an
		// address over its cap costs no header buffer, no token check.
		// The 429 goes out at once and the connection closes like any
		// refused handshake (its input is dropped until the client goes,
		// at most CloseTimeout), counted against the address meanwhile.
		l.reject(c, http.StatusTooManyRequests, ipFullResponse)
	}
	return nil, gnet.None
}

func (e *events) OnClose(gc gnet.Conn, _ error) gnet.Action {
	c, _ := gc.Context().(*Conn)
	if c == nil {
		return gnet.None
	}
	s, l := e.s, c.l
	gc.SetContext(nil)
	c.state = stClosed
	c.closed.Store(true)
	if c.ph.list != nil {
		c.ph.list.remove(c)
	}
	l.msgList.remove(c)
	l.expiry.remove(c)
	if c.hs != nil {
		putBuf(c.hs)
		c.hs = nil
	}
	if c.held != nil {
		putBuf(c.held)
		c.held = nil
	}
	c.dec.release()
	l.releasePong(c)
	l.releaseDrops(c)
	s.tcp.Add(-1)
	if c.ipCounted {
		c.ipCounted = false
		s.ipAdd(c.remote.Addr(), -1)
	}
	s.releaseSlots(c)
	if c.opened {
		c.opened = false
		s.handler.OnClose(c)
	}
	return gnet.None
}

func (e *events) OnTraffic(gc gnet.Conn) gnet.Action {
	c, _ := gc.Context().(*Conn)
	if c == nil {
		return gnet.Close
	}
	l := c.l
	buf, _ := gc.Next(-1)
	l.enter()
	act := gnet.None
	switch c.state {
	case stHandshake:
		act = l.handshake(c, buf)
	case stOpen:
		act = l.frames(c, buf)
	}
	// stClosing: input is read and dropped until the peer closes.
	l.flush()
	return act
}

func (e *events) OnTick() (time.Duration, gnet.Action) {
	s := e.s
	for _, l := range *s.loops.Load() {
		_ = l.el.Execute(context.Background(), &l.sweeper)
	}
	return s.tick, gnet.None
}

// frames decodes the bytes of an open connection and dispatches what they
// contain.
func (l *loop) frames(c *Conn, buf []byte) gnet.Action {
	s := l.s
	before := c.dec.frames
	msgsBefore := c.msgsSeen
	for len(buf) > 0 && c.state == stOpen && !c.closed.Load() {
		n, ev := c.dec.next(buf, &s.lim)
		buf = buf[n:]
		switch ev.kind {
		case evText:
			c.msgsSeen++
			s.handler.OnMessage(c, ev.payload)
			if c.closed.Load() {
				// Closed by the handler: deliver nothing more. The close
				// item is queued and is flushed after this callback.
				l.afterFrames(c, before, msgsBefore)
				return gnet.None
			}
		case evPing:
			if !l.pingAllowed(c) {
				l.flush()
				l.startClose(c, ClosePolicyViolation, "too many pings")
				return gnet.None
			}
			l.flush() // replies queued before the ping go first
			l.pong(c, ev.payload)
		case evPong:
		case evClose:
			// Echo the code. The write side is shut right after it, so the
			// client sees the close frame and EOF at once; the socket goes
			// when the client closes its side.
			l.flush()
			if c.state == stOpen {
				l.closeWith(c, appendClose(l.scratch[:0], ev.code, ""))
				if c.state == stClosing && c.gc.OutboundBuffered() > 0 {
					return gnet.Close // cannot shut down before the buffer drains
				}
			}
			return gnet.None
		case evError:
			s.cfg.Logger.Debug("socket: protocol violation", "conn", c.id, "uid", c.uid,
				"code", int(ev.code), "reason", ev.reason)
			l.flush() // replies to earlier messages go before the close frame
			l.startClose(c, ev.code, ev.reason)
			return gnet.None
		}
	}
	l.afterFrames(c, before, msgsBefore)
	return gnet.None
}

// afterFrames refreshes the idle deadline when frames arrived and keeps the
// message-timeout list in step with the decoder.
func (l *loop) afterFrames(c *Conn, framesBefore, msgsBefore uint32) {
	if c.state != stOpen {
		return
	}
	s := l.s
	if c.dec.frames != framesBefore && !c.pongStalled {
		// A client that does not read keeps its old deadline, whatever it
		// sends: one whose pong is stalled, and one with bytes waiting of
		// which the socket took none since the last refresh (its
		// protocol-level pings are answered by replies, which wait
		// without stalling a pong).
		buffered := c.gc.OutboundBuffered()
		if drained := c.written - int64(buffered); buffered == 0 || drained > c.drainedAt {
			c.drainedAt = drained
			l.idleList.pushBack(c, l.now+int64(s.cfg.IdleTimeout))
		}
	}
	switch {
	case !c.dec.midMessage():
		l.msgList.remove(c)
	case c.mt.list == nil || c.msgsSeen != msgsBefore:
		// A new message started: its own deadline.
		l.msgList.pushBack(c, l.now+int64(s.cfg.MessageTimeout))
	}
}

// gnetLogger routes gnet's logs to slog.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(format string, args ...any) {
	g.l.Debug("gnet: " + fmt.Sprintf(format, args...))
}
func (g gnetLogger) Infof(format string, args ...any) {
	g.l.Debug("gnet: " + fmt.Sprintf(format, args...))
}
func (g gnetLogger) Warnf(format string, args ...any) {
	g.l.Warn("gnet: " + fmt.Sprintf(format, args...))
}
func (g gnetLogger) Errorf(format string, args ...any) {
	g.l.Error("gnet: " + fmt.Sprintf(format, args...))
}
func (g gnetLogger) Fatalf(format string, args ...any) {
	g.l.Error("gnet: fatal: " + fmt.Sprintf(format, args...))
}
