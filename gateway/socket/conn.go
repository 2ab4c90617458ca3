package socket

import (
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// Connection states, owned by the event loop.
const (
	stHandshake uint8 = iota // waiting for the complete request header
	stOpen                   // upgraded
	stClosing                // close frame or HTTP error sent; waiting for the peer to go
	stClosed                 // gone
)

// Conn is one client connection. Its identity (ID, UID, Tier, Path,
// RemoteAddr) is fixed at the upgrade. Write, Push and Close are safe from
// any goroutine; everything else about the connection runs on its event
// loop.
type Conn struct {
	l      *loop
	gc     gnet.Conn
	id     uint64
	uid    string
	path   string
	remote netip.AddrPort
	expAt  int64 // token expiry, Unix nanoseconds; 0 = none
	tier   int32
	// deflate: permessage-deflate was negotiated (deflate.go). Set before
	// OnOpen, never changed after.
	deflate bool
	ctx     atomic.Pointer[any]
	closed  atomic.Bool // Close called, closing or closed: writes are refused
	// refHead is 1 + the index of c's latest entry in l.refused, guarded by
	// l.mu (loop.refuseLocked); 0 = none.
	refHead int32

	// Event-loop owned from here on.
	expires   int64 // token expiry on the server clock; 0 = none
	ph        tnode // handshake, idle or closing list
	mt        tnode // message-timeout list
	heapIdx   int32
	state     uint8
	opened    bool // OnOpen ran, so OnClose must run
	ipCounted bool
	active    bool // counted in Server.active
	userSlot  bool // counted in Server.perUser
	overflow  bool // pushes are being dropped until the outbound drains
	killSlow  bool // over the hard bound (or no Resync): close after this flush
	// pongStalled: the pong (below) waits in loop.pongs for the
	// connection to drain. Beside the other flags, with msgsSeen, so that
	// Conn fits the 384-byte size class (no padding words).
	pongStalled bool
	msgsSeen    uint32
	dec         decoder
	hs          *[]byte // handshake bytes while the header is incomplete
	hsScan      int32
	head        int32 // first of this connection's items in loop.work during a flush, -1 none
	tail        int32
	pendBytes   int32
	// pong is the pong frame answering the latest ping, held (pooled)
	// while it does not fit OutboundBound (loop.pong); nil = none.
	pong    *[]byte
	pingTAT int64 // ping limit (GCRA): theoretical arrival time, server clock
	// written counts every byte handed to gnet for this connection (put,
	// writev); written minus what gnet still buffers is what the socket
	// took. drainedAt is that figure when the idle deadline was last
	// refreshed (loop.afterFrames): a connection with bytes waiting that
	// took none since keeps its deadline whatever it sends, since it is
	// not reading.
	written   int64
	drainedAt int64
	// held is the 101 answer while Config.UpgradeHold keeps it back for
	// the handler's first frame (loop.held says until when); nil =
	// written.
	held *[]byte // pooled (getBuf)
}

// waiting is what c has not handed to the socket yet: what gnet buffers
// and a held 101.
func (c *Conn) waiting() int {
	if c.held != nil {
		return c.gc.OutboundBuffered() + len(*c.held)
	}
	return c.gc.OutboundBuffered()
}

// ID returns a number unique among this server's connections.
func (c *Conn) ID() uint64 { return c.id }

// UID returns the authenticated user id.
func (c *Conn) UID() string { return c.uid }

// Tier returns the user's VIP tier from the token's lvl claim (0 normal, 1-3 VIP).
func (c *Conn) Tier() int { return int(c.tier) }

// Path returns the request path of the upgrade, e.g. "/ws" or
// "/rooms/sale1/ws".
func (c *Conn) Path() string { return c.path }

// RemoteAddr returns the client's address.
func (c *Conn) RemoteAddr() netip.AddrPort { return c.remote }

// Expires returns when the token expires and the session is closed; zero
// means never.
func (c *Conn) Expires() time.Time {
	if c.expAt == 0 {
		return time.Time{}
	}
	return time.Unix(0, c.expAt)
}

// SetContext stores v for the connection's consumer. It is safe for
// concurrent use.
func (c *Conn) SetContext(v any) { c.ctx.Store(&v) }

// Context returns what SetContext stored, or nil.
func (c *Conn) Context() any {
	if p := c.ctx.Load(); p != nil {
		return *p
	}
	return nil
}

// Deflate reports whether c negotiated permessage-deflate: text frames of
// at least Config.DeflateMinBytes reach it compressed.
func (c *Conn) Deflate() bool { return c.deflate }

// Write queues f for this connection: a reply (ack, pong, error, hello,
// messages) that is never dropped for being slow. A connection whose
// waiting bytes pass Config.OutboundHardBound is closed instead. Frames
// queued for a connection are written in order, coalesced with whatever
// else is pending for it into one write per loop iteration. Write never
// blocks; it returns ErrClosed after Close or once the connection is
// closing, and ErrQueueFull when its event loop's queue is at its bound.
func (c *Conn) Write(f *Frame) error {
	if c.closed.Load() {
		return ErrClosed
	}
	return c.l.enqueue(c, f, itemReply)
}

// Push queues f for this connection like Write, but as a push: dropped,
// and replaced by one resync per group later, while the connection's
// outbound bytes exceed Config.OutboundBound. Use Server.Broadcast for
// many recipients.
func (c *Conn) Push(f *Frame) error {
	if c.closed.Load() {
		return ErrClosed
	}
	return c.l.enqueue(c, f, itemPush)
}

// Close sends a close frame with code and reason (cut to 123 bytes) after
// the frames already queued, then closes the connection once the client
// answers or Config.CloseTimeout passes. No messages are delivered to the
// handler after Close returns. It is safe to call more than once and from
// any goroutine.
func (c *Conn) Close(code CloseCode, reason string) {
	if c.closed.Swap(true) {
		return
	}
	// Close items bypass the loop queue bound (at most one per connection).
	_ = c.l.enqueue(c, &Frame{b: appendClose(nil, code, reason)}, itemClose)
}
