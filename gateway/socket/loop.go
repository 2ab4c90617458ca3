package socket

import (
	"context"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// iovMax is the most slices one writev takes (Linux UIO_MAXIOV); gnet
// closes the connection with EINVAL beyond it.
const iovMax = 1024

// closeAllowance is how far a close frame may take a connection's waiting
// bytes past Config.OutboundHardBound: one close frame of the largest
// size (2 header bytes and a 125-byte payload). Nothing else ever passes
// the hard bound, so a connection closed at it still gets its close frame
// queued, and its waiting bytes never exceed OutboundHardBound plus this.
const closeAllowance = 2 + maxControlPayload

// gatherBytes is the size of the per-loop buffer small frames are copied
// into for one write(2); larger batches go out with writev.
const gatherBytes = 32 << 10

// maxStamped bounds the frames with an origin one flush reports to
// Config.OnWritePass (the rest of a larger flush goes unmeasured): it keeps
// the search for a frame already seen short.
const maxStamped = 32

// Kinds of outbound items.
const (
	itemReply uint8 = iota // never dropped for slowness
	itemPush               // subject to the outbound bound
	itemClose              // close frame, then the close handshake
)

// outItem is one frame queued for one connection. During a flush, next
// chains the items of the same connection (indexes into loop.work).
type outItem struct {
	c    *Conn
	f    *Frame
	next int32
	kind uint8
}

// refusal is a push delivery Broadcast refused at Config.LoopQueueBound.
// The loop turns it into a recorded drop and a resync for its group, the
// same outcome as a push dropped by the outbound bound. One entry per
// connection and group: later refusals raise lastSeq.
type refusal struct {
	c       *Conn
	gid     int64
	lastSeq int64
	prev    int32 // c's previous entry in the same list, -1 none
	n       int32 // c's entries in the list up to this one
}

// maxRefusedGroups caps the groups one connection may have refused
// deliveries for between two flushes of its loop, which bounds the
// refusals a loop holds to maxRefusedGroups entries (32 bytes each) per
// connection: a few KiB against the OutboundBound bytes each connection
// may already hold. Past it the connection is closed (refuseLocked).
const maxRefusedGroups = 128

// maxSpareDrops caps the emptied per-connection drops maps a loop keeps
// for reuse, so that connections overflowing over and over (a loop that
// keeps refusing deliveries) do not allocate a map each time; only maps of
// at most spareDropsLen groups are kept, so the spares stay small.
const (
	maxSpareDrops = 4096
	spareDropsLen = 8
)

// overloadedClose closes a connection whose missed deliveries cannot be
// recorded (refuseLocked): it reconnects and syncs instead.
var overloadedClose = &Frame{b: appendClose(nil, CloseTryAgainLater, "overloaded")}

// loop is fanfare's state for one gnet event loop. Fields above the line
// are guarded by mu and touched by any goroutine; the rest is owned by the
// event loop goroutine.
type loop struct {
	s   *Server
	el  gnet.EventLoop
	idx int

	mu        sync.Mutex
	inbox     []outItem
	scheduled bool // a flush is pending: no need to Execute another
	touched   bool // Broadcast scratch: items were added under this lock
	// refused holds Broadcast's refusals until the next flush, at most
	// maxRefusedGroups per connection (refuseLocked).
	refused []refusal

	// Owned by the event loop.
	work       []outItem
	refWork    []refusal
	dirty      []*Conn
	bufs       [][]byte
	iovecs     []unix.Iovec
	hsList     tlist // sel 0: connections in the handshake
	idleList   tlist // sel 0: open connections by last frame received
	closingLst tlist // sel 0: connections in the close handshake
	msgList    tlist // sel 1: connections in the middle of a message
	expiry     expHeap
	overflowed []*Conn
	held       []heldConn // connections whose 101 is held (Conn.held), released or not, oldest first
	pair       [2][]byte
	pongs      []*Conn                   // connections with a stalled pong (Conn.pongStalled), retried by sweep
	drops      map[*Conn]map[int64]int64 // overflowing connection -> gid -> highest dropped seq
	spareDrops []map[int64]int64         // emptied drops maps for reuse, at most maxSpareDrops
	slow       []*Conn
	gids       []int64
	stamped    []*Frame // frames of this flush with an origin (Config.OnWritePass)
	scratch    []byte
	gather     []byte
	now        int64
	sweeper    sweepTask
	hk         handshaker

	// Counters, written by the loop, read by Stats.
	deliveries    atomic.Uint64
	pushesDropped atomic.Uint64
	resyncs       atomic.Uint64
	slowClosed    atomic.Uint64
}

func newLoop(s *Server, el gnet.EventLoop, idx int) *loop {
	l := &loop{
		s:       s,
		el:      el,
		idx:     idx,
		msgList: tlist{sel: 1},
		bufs:    make([][]byte, 0, iovMax),
		iovecs:  make([]unix.Iovec, 0, iovMax),
		scratch: make([]byte, 0, 256),
		gather:  make([]byte, 0, gatherBytes),
	}
	l.sweeper.l = l
	return l
}

// enqueue adds one item and makes sure a flush will run.
func (l *loop) enqueue(c *Conn, f *Frame, kind uint8) error {
	l.mu.Lock()
	if kind != itemClose && len(l.inbox) >= l.s.cfg.LoopQueueBound {
		l.mu.Unlock()
		return ErrQueueFull
	}
	l.inbox = append(l.inbox, outItem{c: c, f: f, kind: kind, next: -1})
	sched := !l.scheduled
	l.scheduled = true
	l.mu.Unlock()
	if sched {
		l.schedule()
	}
	return nil
}

func (l *loop) schedule() {
	if err := l.el.Execute(context.Background(), l); err != nil {
		// The engine is stopping; the connections go with it.
		l.mu.Lock()
		l.scheduled = false
		l.mu.Unlock()
	}
}

// Run is the flush task (gnet.Runnable): it runs on the event loop.
func (l *loop) Run(context.Context) error {
	l.now = l.s.clock()
	l.flush()
	return nil
}

// enter marks the loop busy in a callback: writes queued meanwhile are
// flushed at the end of the callback instead of each scheduling a task.
func (l *loop) enter() {
	l.now = l.s.clock()
	l.mu.Lock()
	l.scheduled = true
	l.mu.Unlock()
}

// flush writes everything queued for this loop: one write (or writev in
// chunks of iovMax) per connection, whatever the number of frames.
func (l *loop) flush() {
	l.mu.Lock()
	l.work, l.inbox = l.inbox, l.work[:0]
	l.refWork, l.refused = l.refused, l.refWork[:0]
	l.scheduled = false
	l.mu.Unlock()
	work := l.work
	if len(work) == 0 && len(l.refWork) == 0 {
		return
	}
	cfg := &l.s.cfg
	var dropped uint64
	var prev *Frame
	// Pass 1, in queue order: apply the bounds, chain each connection's
	// items.
	for i := range work {
		it := &work[i]
		c := it.c
		if it.f != prev {
			prev = it.f
			if it.f.origin != 0 && cfg.OnWritePass != nil && len(l.stamped) < maxStamped && !slices.Contains(l.stamped, it.f) {
				l.stamped = append(l.stamped, it.f)
			}
		}
		if c.state != stOpen || c.killSlow {
			// Closing at the end of this flush: nothing after the frame
			// that did not fit, so the client sees no gap before the close.
			continue
		}
		size := len(it.f.wireFor(c, cfg))
		switch it.kind {
		case itemPush:
			if c.overflow && !(c.pendBytes == 0 && l.tryResync(c)) {
				l.recordDrop(c, it.f.gid, it.f.lastSeq)
				dropped++
				continue
			}
			if c.waiting()+int(c.pendBytes)+size > cfg.OutboundBound {
				l.startOverflow(c)
				l.recordDrop(c, it.f.gid, it.f.lastSeq)
				dropped++
				continue
			}
		case itemReply:
			if c.waiting()+int(c.pendBytes)+size > cfg.OutboundHardBound {
				l.markSlow(c)
				continue
			}
		}
		if c.state != stOpen { // a resync write failed
			continue
		}
		if c.head < 0 {
			c.head = int32(i)
			l.dirty = append(l.dirty, c)
		} else {
			work[c.tail].next = int32(i)
		}
		c.tail = int32(i)
		c.pendBytes += int32(size)
	}
	// Pass 2: one write per connection.
	var first int64
	if len(l.stamped) > 0 {
		first = time.Now().UnixNano()
	}
	var delivered uint64
	yield := int64(l.s.cfg.PassYield)
	yieldAt := l.s.clock() + yield
	for i, c := range l.dirty {
		if c.state == stOpen {
			delivered += l.writeChain(c, work)
		}
		c.head, c.tail, c.pendBytes = -1, -1, 0
		if i&63 == 63 && yield > 0 && l.s.clock() >= yieldAt {
			runtime.Gosched()
			yieldAt = l.s.clock() + yield
		}
	}
	if len(l.stamped) > 0 {
		last := time.Now().UnixNano()
		for _, f := range l.stamped {
			cfg.OnWritePass(f.origin, first, last)
		}
		clear(l.stamped)
		l.stamped = l.stamped[:0]
	}
	clear(l.dirty)
	l.dirty = l.dirty[:0]
	if len(l.refWork) > 0 {
		l.applyRefusals()
	}
	for _, c := range l.slow {
		c.killSlow = false
		if c.state == stOpen {
			l.slowClosed.Add(1)
			l.s.cfg.Logger.Info("socket: closing slow consumer", "conn", c.id, "uid", c.uid)
			l.startClose(c, ClosePolicyViolation, "slow consumer")
		}
	}
	clear(l.slow)
	l.slow = l.slow[:0]
	clear(work) // drop references to frames and connections
	if delivered > 0 {
		l.deliveries.Add(delivered)
	}
	if dropped > 0 {
		l.pushesDropped.Add(dropped)
	}
}

// fits reports whether n more bytes for c keep its waiting bytes (those
// gnet holds because the socket did not take them) within limit.
func fits(c *Conn, n, limit int) bool {
	return c.waiting()+n <= limit
}

// put writes b to c at once, behind whatever gnet still holds for it, if
// that keeps c's waiting bytes within limit, and reports whether it did.
// Every write outside a flush goes through it: pongs and resyncs
// (OutboundBound), handshake answers (OutboundHardBound) and close frames
// (OutboundHardBound + closeAllowance). The frames of a flush are checked
// against the same bounds in flush's first pass, so no byte reaches a
// socket without counting against its connection's bounds.
func (l *loop) put(c *Conn, b []byte, limit int) bool {
	if !fits(c, len(b), limit) {
		return false
	}
	if c.held != nil {
		// The 101 and this frame in one write.
		held := c.held
		c.held = nil
		l.pair[0], l.pair[1] = *held, b
		l.writev(c, l.pair[:]) // gnet copies what the socket does not take
		l.pair = [2][]byte{}
		putBuf(held)
		return true
	}
	c.written += int64(len(b))
	_, _ = c.gc.Write(b)
	return true
}

// releaseHeld writes c's held 101 alone.
func (l *loop) releaseHeld(c *Conn) {
	if b := c.held; b != nil {
		c.held = nil
		c.written += int64(len(*b))
		_, _ = c.gc.Write(*b)
		putBuf(b)
	}
}

// heldConn is a connection whose 101 is held, and when the sweep writes
// it alone (server clock). Kept in the loop, not in Conn, so that Conn
// stays in its size class.
type heldConn struct {
	c     *Conn
	until int64
}

// sweepHeld writes the 101s whose hold ended without a frame from the
// handler and forgets the connections whose 101 went out.
func (l *loop) sweepHeld(now int64) {
	kept := l.held[:0]
	for _, h := range l.held {
		switch c := h.c; {
		case c.held == nil || c.state != stOpen:
		case h.until <= now:
			l.releaseHeld(c)
		default:
			kept = append(kept, h)
		}
	}
	clear(l.held[len(kept):])
	l.held = kept
}

// pingAllowed applies Config.PingRate and PingBurst to one ping of c: a
// GCRA bucket on the loop's clock, 8 bytes per connection.
func (l *loop) pingAllowed(c *Conn) bool {
	cfg := &l.s.cfg
	if cfg.PingRate < 0 {
		return true
	}
	interval := int64(time.Second) / int64(cfg.PingRate)
	tat := max(c.pingTAT, l.now)
	if tat-l.now > int64(cfg.PingBurst-1)*interval {
		return false
	}
	c.pingTAT = tat + interval
	return true
}

// pong answers a ping with payload. It is written at once when it fits
// OutboundBound. Otherwise it stalls: it is kept (one per connection: a
// later ping replaces it, as RFC 6455 §5.5.3 allows only the most recent
// ping to be answered) in l.pongs until the connection drains (sweep
// retries it), and until it is sent frames from the client do not
// refresh its idle deadline. So a client that pings and never reads holds
// one pending pong, not one per ping, and is closed at IdleTimeout.
func (l *loop) pong(c *Conn, payload []byte) {
	if c.state != stOpen {
		return
	}
	if c.pong == nil {
		if l.put(c, appendControl(l.scratch[:0], opPong, payload), l.s.cfg.OutboundBound) {
			return
		}
		c.pong = getBuf()
	}
	*c.pong = appendControl((*c.pong)[:0], opPong, payload)
	l.sendPong(c)
}

// sendPong writes c's stalled pong if it fits OutboundBound now, else
// keeps it in l.pongs.
func (l *loop) sendPong(c *Conn) {
	if c.pong == nil || c.state != stOpen {
		return
	}
	if !l.put(c, *c.pong, l.s.cfg.OutboundBound) {
		if !c.pongStalled {
			c.pongStalled = true
			l.pongs = append(l.pongs, c)
		}
		return
	}
	l.releasePong(c)
}

// releasePong forgets c's stalled pong; its entry in l.pongs is dropped by
// the next sweep.
func (l *loop) releasePong(c *Conn) {
	if c.pong != nil {
		putBuf(c.pong)
		c.pong = nil
	}
	c.pongStalled = false
}

// retryPongs writes the stalled pongs of connections that drained.
func (l *loop) retryPongs() {
	kept := l.pongs[:0]
	for _, c := range l.pongs {
		if c.state == stOpen && c.pongStalled {
			l.sendPong(c)
			if c.pongStalled {
				kept = append(kept, c)
			}
		}
	}
	clear(l.pongs[len(kept):])
	l.pongs = kept
}

// writeChain writes c's chained items and returns how many frames went out.
func (l *loop) writeChain(c *Conn, work []outItem) uint64 {
	bufs := l.bufs[:0]
	var closeFrame *Frame
	var n uint64
	held := c.held
	if held != nil {
		// The held 101 goes first, in the same write.
		bufs = append(bufs, *held)
		c.held = nil
		defer putBuf(held)
	}
	for i := c.head; i >= 0; i = work[i].next {
		it := &work[i]
		if it.kind == itemClose {
			closeFrame = it.f
			break
		}
		bufs = append(bufs, it.f.wireFor(c, &l.s.cfg))
		n++
		if len(bufs) == iovMax {
			l.writev(c, bufs)
			bufs = bufs[:0]
			if c.state != stOpen {
				return n
			}
		}
	}
	if len(bufs) > 0 {
		l.writev(c, bufs)
	}
	clear(bufs)
	if closeFrame != nil && c.state == stOpen {
		l.closeWith(c, closeFrame.b)
	}
	return n
}

// writev writes bufs to c in one system call when nothing is pending in
// gnet's outbound buffer, without gnet's per-call iovec allocation; what
// the socket does not take goes to gnet's buffer, in order.
func (l *loop) writev(c *Conn, bufs [][]byte) {
	gc := c.gc
	for _, b := range bufs {
		c.written += int64(len(b))
	}
	if len(bufs) == 1 {
		_, _ = gc.Write(bufs[0])
		return
	}
	if gc.OutboundBuffered() > 0 {
		_, _ = gc.Writev(bufs)
		return
	}
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if total <= cap(l.gather) {
		// Small frames: one copy into the loop's scratch and a plain
		// write(2) is cheaper than the kernel walking many tiny iovecs
		// (measured: 32 coalesced 102-byte frames). gnet copies whatever
		// the socket does not take, so the scratch is free again at once.
		g := l.gather[:0]
		for _, b := range bufs {
			g = append(g, b...)
		}
		_, _ = gc.Write(g)
		return
	}
	iov := l.iovecs[:0]
	for _, b := range bufs {
		var v unix.Iovec
		v.Base = &b[0]
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	r, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(gc.Fd()), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	clear(iov)
	n := int(r)
	if errno == 0 && n == total {
		return
	}
	if errno != 0 {
		// EAGAIN: gnet buffers it all. Anything else: gnet's own write
		// sees the same error and closes the connection properly.
		n = 0
	}
	rest := bufs
	for n > 0 {
		if n >= len(rest[0]) {
			n -= len(rest[0])
			rest = rest[1:]
			continue
		}
		rest[0] = rest[0][n:]
		n = 0
	}
	_, _ = gc.Writev(rest)
}

// refuseLocked records that Broadcast refused the push f for c at
// LoopQueueBound; l.mu is held. A connection's entries are chained from
// c.refHead, so it costs one entry per group however many deliveries it
// misses before the next flush. A connection that needs an entry for more
// than maxRefusedGroups groups is closed (1013) instead: it reconnects and
// syncs, so nothing is lost silently either way. A push without a group
// (gid 0) has nothing to resync, as with the outbound bound.
func (l *loop) refuseLocked(c *Conn, f *Frame) {
	if f.gid == 0 {
		return
	}
	// c.refHead is stale unless it names an entry of c in this list: entries
	// are only added here, and each one updates its connection's refHead.
	head, n := int32(-1), int32(0)
	if i := c.refHead - 1; i >= 0 && int(i) < len(l.refused) && l.refused[i].c == c {
		head, n = i, l.refused[i].n
	}
	for i := head; i >= 0; i = l.refused[i].prev {
		if r := &l.refused[i]; r.gid == f.gid {
			r.lastSeq = max(r.lastSeq, f.lastSeq)
			return
		}
	}
	if n >= maxRefusedGroups {
		if !c.closed.Swap(true) {
			// As Conn.Close: close items bypass the bound, one per connection.
			l.inbox = append(l.inbox, outItem{c: c, f: overloadedClose, kind: itemClose, next: -1})
			l.s.queueClosed.Add(1)
		}
		return
	}
	l.refused = append(l.refused, refusal{c: c, gid: f.gid, lastSeq: f.lastSeq, prev: head, n: n + 1})
	c.refHead = int32(len(l.refused))
}

// applyRefusals turns the refusals taken by this flush into the outbound
// bound's state: each connection records the drop for the group and
// overflows, exactly as if its own bound had dropped the push, and is
// resynced at once when nothing is waiting in its outbound buffer (else
// when it drains, like any overflowing connection). It runs after the
// flush's writes: every push of the same flush was queued before the
// refusals, so the resync follows them.
func (l *loop) applyRefusals() {
	n := len(l.overflowed)
	for i := range l.refWork {
		r := &l.refWork[i]
		c := r.c
		if c.state != stOpen {
			continue
		}
		if !c.overflow {
			l.startOverflow(c)
		}
		l.recordDrop(c, r.gid, r.lastSeq)
	}
	clear(l.refWork) // drop references to connections
	l.refWork = l.refWork[:0]
	kept := l.overflowed[:n]
	for _, c := range l.overflowed[n:] {
		if !l.tryResync(c) {
			kept = append(kept, c)
		}
	}
	clear(l.overflowed[len(kept):])
	l.overflowed = kept
}

// recordDrop remembers the highest seq dropped per group for c's resync.
// The map lives in the loop, keyed by connection, so only overflowing
// connections pay for it.
func (l *loop) recordDrop(c *Conn, gid, lastSeq int64) {
	if gid == 0 {
		return
	}
	m := l.drops[c]
	if m == nil {
		if l.drops == nil {
			l.drops = make(map[*Conn]map[int64]int64)
		}
		if n := len(l.spareDrops); n > 0 {
			m = l.spareDrops[n-1]
			l.spareDrops[n-1] = nil
			l.spareDrops = l.spareDrops[:n-1]
		} else {
			m = make(map[int64]int64, 1)
		}
		l.drops[c] = m
	}
	if seq, ok := m[gid]; !ok || lastSeq > seq {
		m[gid] = lastSeq
	}
}

// releaseDrops forgets c's drops, keeping the emptied map for reuse.
func (l *loop) releaseDrops(c *Conn) {
	m, ok := l.drops[c]
	if !ok {
		return
	}
	delete(l.drops, c)
	if len(m) <= spareDropsLen && len(l.spareDrops) < maxSpareDrops {
		clear(m)
		l.spareDrops = append(l.spareDrops, m)
	}
}

// markSlow schedules c to be closed at the end of the flush.
func (l *loop) markSlow(c *Conn) {
	if !c.killSlow {
		c.killSlow = true
		l.slow = append(l.slow, c)
	}
}

func (l *loop) startOverflow(c *Conn) {
	if l.s.cfg.Resync == nil {
		l.markSlow(c)
		return
	}
	c.overflow = true
	l.overflowed = append(l.overflowed, c)
	if lg := l.s.cfg.Logger; lg.Enabled(context.Background(), slog.LevelDebug) { // the arguments would allocate
		lg.Debug("socket: pushes dropped until the outbound buffer drains",
			"conn", c.id, "uid", c.uid, "outbound", c.gc.OutboundBuffered())
	}
}

// tryResync ends c's overflow once its outbound buffer has drained: it
// writes one resync frame per group whose pushes were dropped, in gid
// order, and reports whether c takes pushes again.
func (l *loop) tryResync(c *Conn) bool {
	if !c.overflow {
		return true
	}
	if c.state != stOpen || c.gc.OutboundBuffered() > 0 {
		return false
	}
	drops := l.drops[c]
	l.gids = l.gids[:0]
	for gid := range drops {
		l.gids = append(l.gids, gid)
	}
	slices.Sort(l.gids)
	bound := l.s.cfg.OutboundBound
	for _, gid := range l.gids {
		if f := l.s.cfg.Resync(gid, drops[gid]); f != nil {
			if !fits(c, len(f.b), bound) {
				// A connection in many groups: the rest of its resyncs
				// wait for the next drain, as pushes would.
				return false
			}
			l.resyncs.Add(1) // before the write: a client that read it sees it counted
			l.put(c, f.b, bound)
		}
		delete(drops, gid)
		if c.state != stOpen {
			return false
		}
	}
	c.overflow = false
	l.releaseDrops(c)
	return true
}

// sweepTask runs the per-tick timeout sweep on its loop.
type sweepTask struct{ l *loop }

func (t *sweepTask) Run(context.Context) error {
	t.l.sweep()
	return nil
}

// sweep enforces every deadline that has passed and resumes drained
// connections.
func (l *loop) sweep() {
	l.now = l.s.clock()
	now := l.now
	l.flush() // queued frames go before any close frame below
	for c := l.hsList.expired(now); c != nil; c = l.hsList.expired(now) {
		l.reject(c, 408, nil)
	}
	for c := l.msgList.expired(now); c != nil; c = l.msgList.expired(now) {
		l.startClose(c, ClosePolicyViolation, "message timeout")
	}
	for c := l.idleList.expired(now); c != nil; c = l.idleList.expired(now) {
		l.startClose(c, CloseGoingAway, "idle timeout")
	}
	for c := l.closingLst.expired(now); c != nil; c = l.closingLst.expired(now) {
		l.kill(c)
	}
	for c := l.expiry.top(); c != nil && c.expires <= now; c = l.expiry.top() {
		l.expiry.remove(c)
		l.startClose(c, ClosePolicyViolation, "token expired")
	}
	kept := l.overflowed[:0]
	for _, c := range l.overflowed {
		if c.state == stOpen && !l.tryResync(c) {
			kept = append(kept, c)
		}
	}
	clear(l.overflowed[len(kept):])
	l.overflowed = kept
	if len(l.pongs) > 0 {
		l.retryPongs()
	}
	if len(l.held) > 0 {
		l.sweepHeld(now)
	}
	l.flush()
}

// startClose sends a close frame and starts the close handshake.
func (l *loop) startClose(c *Conn, code CloseCode, reason string) {
	if c.state != stOpen {
		return
	}
	l.closeWith(c, appendClose(l.scratch[:0], code, reason))
}

// closeWith writes the close frame b and moves c to the closing state:
// nothing more is read or written; the connection goes when the client
// closes its side or at CloseTimeout. The write side is shut down when
// nothing is pending, so the client sees the close frame and then EOF.
// The close frame may take c up to closeAllowance past the hard bound:
// a connection closed for being over it still gets its close frame
// behind what it has not read.
func (l *loop) closeWith(c *Conn, b []byte) {
	l.put(c, b, l.s.cfg.OutboundHardBound+closeAllowance)
	l.enterClosing(c)
}

func (l *loop) enterClosing(c *Conn) {
	if c.state == stClosed {
		return // the write failed and gnet closed it
	}
	c.state = stClosing
	c.closed.Store(true)
	l.msgList.remove(c)
	l.expiry.remove(c)
	l.closingLst.pushBack(c, l.now+int64(l.s.cfg.CloseTimeout))
	c.dec.release()
	l.releasePong(c)
	if c.gc.OutboundBuffered() == 0 {
		_ = unix.Shutdown(c.gc.Fd(), unix.SHUT_WR)
	}
}

// kill closes c now, without a handshake.
func (l *loop) kill(c *Conn) {
	if c.state == stClosed {
		return
	}
	_ = l.el.Close(c.gc)
}

// reject answers a handshake with an HTTP error status and starts closing.
func (l *loop) reject(c *Conn, status int, resp []byte) {
	if c.state != stHandshake {
		return
	}
	if resp == nil {
		resp = statusResponse(status)
	}
	l.s.countReject(status)
	l.put(c, resp, l.s.cfg.OutboundHardBound+closeAllowance)
	l.releaseHandshake(c)
	l.enterClosing(c)
}

// releaseHandshake frees what the handshake held.
func (l *loop) releaseHandshake(c *Conn) {
	if c.hs != nil {
		putBuf(c.hs)
		c.hs = nil
	}
}
