package socket

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"
)

// Sentinel errors.
var (
	// ErrClosed is returned when writing to a connection that is closed or
	// closing.
	ErrClosed = errors.New("socket: connection closed")
	// ErrQueueFull is returned when an event loop's outbound queue is at
	// Config.LoopQueueBound: the node is overloaded.
	ErrQueueFull = errors.New("socket: event loop queue full")
	// ErrServerClosed is returned by Run after Shutdown.
	ErrServerClosed = errors.New("socket: server closed")
	// ErrUnauthorized is what an Authenticator returns for a missing,
	// malformed, expired or otherwise unacceptable token.
	ErrUnauthorized = errors.New("socket: unauthorized")
)

// Defaults applied by New to zero Config fields.
const (
	DefaultAddr             = "127.0.0.1:8081"
	DefaultMaxHeaderBytes   = 8 << 10
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultIdleTimeout      = 90 * time.Second // three missed 30 s heartbeats
	DefaultMessageTimeout   = 10 * time.Second
	DefaultCloseTimeout     = 3 * time.Second
	DefaultMaxMessageBytes  = 64 << 10
	DefaultOutboundBound    = 256 << 10
	DefaultMaxConnsPerIP    = 4096
	// DefaultIPv6CapPrefix: IPv6 clients are counted per /64, the
	// smallest block one subscriber is usually given.
	DefaultIPv6CapPrefix   = 64
	DefaultMaxConnsPerUser = 16
	DefaultLoopQueueBound  = 1 << 20
	DefaultPassYield       = time.Millisecond
	DefaultPingRate        = 10
	DefaultPingBurst       = 50
	// DefaultDeflateMinBytes: below a few hundred bytes the deflate
	// header and block overhead eat most of the gain.
	DefaultDeflateMinBytes = 256
	DefaultDeflateLevel    = 1 // flate.BestSpeed
	// fdReserve is how many file descriptors the default MaxConns leaves
	// for everything else in the process (listeners, store, Redis, logs).
	fdReserve = 256
)

// DefaultPaths are the request paths accepted when Config.Paths is empty:
// the chat socket and the waiting-room sockets (docs/protocol.md §1.1).
var DefaultPaths = []string{"/ws", "/rooms/"}

// Config configures a Server. The zero value works: New fills in the
// defaults documented on each field.
type Config struct {
	// Addr is the TCP listen address. Default 127.0.0.1:8081; port 0 picks
	// a free port (see Server.Addr).
	Addr string
	// NumLoops is the number of event loops. 0 = one per CPU
	// (GOMAXPROCS).
	NumLoops int
	// Paths lists the request paths accepted for upgrade; an entry ending
	// in "/" accepts every path under it ("/rooms/" accepts
	// "/rooms/sale1/ws"). Other paths are answered 404. Default
	// DefaultPaths.
	Paths []string
	// MaxHeaderBytes caps the request line and headers. A larger request
	// is answered 431. Default 8 KiB.
	MaxHeaderBytes int
	// HandshakeTimeout is the time from accept to a complete request
	// header; then the connection is answered 408 and closed. Default 5 s.
	HandshakeTimeout time.Duration
	// IdleTimeout closes (1001) a connection from which no complete frame,
	// ping included, arrived for this long. Frames do not count while the
	// answer to a ping waits because the connection's outbound bytes are
	// over OutboundBound (the client does not read). Default 90 s.
	IdleTimeout time.Duration
	// MessageTimeout closes (1008) a connection that started a frame or a
	// fragmented message and did not finish it within this time: the
	// slowloris guard after the upgrade. Default 10 s.
	MessageTimeout time.Duration
	// CloseTimeout is how long a connection the server is closing may take
	// to answer the close handshake before it is dropped. Default 3 s.
	CloseTimeout time.Duration
	// PingRate is how many WebSocket pings per second a connection may
	// send on average, PingBurst how many at once; a connection over them
	// is closed (1008 "too many pings"): every ping costs a write. Clients
	// ping every few seconds at most. Defaults 10/s and 50; PingRate -1 =
	// no limit.
	PingRate  int
	PingBurst int
	// MaxFrameBytes caps one data frame's payload, checked from the
	// declared length before anything is stored (1009). Default
	// MaxMessageBytes.
	MaxFrameBytes int
	// MaxMessageBytes caps one message, all fragments together (1009).
	// Default 64 KiB.
	MaxMessageBytes int
	// OutboundBound is the number of bytes a connection may have waiting
	// to be sent before pushes to it are dropped and replaced by one
	// resync per group (docs/architecture.md §5.4). Default 256 KiB.
	OutboundBound int
	// OutboundHardBound closes (1008) a connection whose waiting bytes,
	// replies included, would exceed it; the write that would is not made.
	// Only the close frame may go past it, by at most 127 bytes. Default
	// 4 x OutboundBound.
	OutboundHardBound int
	// UpgradeHold keeps the 101 answer of an upgrade back until the
	// handler's first frame for the connection (a hello written off the
	// loop once the connection is registered), for at most this long, and
	// writes both in one system call: a write and the peer's wakeup fewer
	// per upgrade. A client waits for that frame anyway; one that gets no
	// frame gets its 101 alone once the hold ends (the sweep, which then
	// runs at least every UpgradeHold, checks: at most twice UpgradeHold
	// late). 0 (default) writes the 101 at once.
	UpgradeHold time.Duration
	// PassYield is how long an event loop's write pass runs before it
	// lets the process's other goroutines run (runtime.Gosched, checked
	// every 64 connections written). A pass over many thousands of
	// sockets takes tens or hundreds of milliseconds; on a node with one
	// Go processor the HTTP handlers, the shard workers and the store's
	// commit completions would otherwise wait for the runtime to preempt
	// the loop (every 10 ms) at each hand-off on a message's way to the
	// next pass. 0 = DefaultPassYield; negative = never yield.
	PassYield time.Duration
	// SocketSendBuffer sets SO_SNDBUF on accepted sockets, in bytes; 0
	// keeps the kernel default. Smaller values make the outbound bound
	// bite sooner and cap kernel memory per connection.
	SocketSendBuffer int
	// MaxConns caps upgraded connections on this node (429 beyond it).
	// Default: the process's open-file limit minus a reserve of 256. Raw
	// TCP connections beyond MaxConns plus MaxConns/16 are closed at
	// accept without an answer, to keep file descriptors free.
	MaxConns int
	// MaxConnsPerIP caps connections (including those still in the
	// handshake) from one IP address. It is checked at accept, before the
	// request is read: a connection over it is answered 429 at once.
	// Default 4096; -1 = no cap.
	MaxConnsPerIP int
	// MaxConnsPerIPExempt lists the client addresses MaxConnsPerIP does
	// not apply to: a reverse proxy on the same host (every client then
	// has its address), load generators. nil = none.
	MaxConnsPerIPExempt []netip.Prefix
	// IPv6CapPrefix is the prefix length under which IPv6 addresses count
	// as one for MaxConnsPerIP (one host holds a whole /64: counting per
	// address would cap nothing). 16..128; 0 = DefaultIPv6CapPrefix;
	// 128 = per address. IPv4 is counted per address.
	IPv6CapPrefix int
	// MaxConnsPerUser caps upgraded connections of one uid (429). Default
	// 16; -1 = no cap.
	MaxConnsPerUser int
	// LoopQueueBound caps the frames queued for one event loop and not yet
	// taken by it. Beyond it Write returns ErrQueueFull and Broadcast
	// refuses (and counts) the deliveries; each connection that missed one
	// gets a resync for the group, as past OutboundBound. The refusals
	// waiting for the loop are recorded once per connection and group; a
	// connection that missed deliveries of more than 128 groups before its
	// loop caught up is closed (1013) instead, so that it reconnects and
	// syncs. Default 1<<20.
	LoopQueueBound int
	// AllowedOrigins lists the browser origins ("https://app.example.com")
	// that may open a socket. Empty: requests without Origin, or whose
	// Origin host equals the Host header. "*" allows any origin. Requests
	// without Origin (non-browser clients) are always allowed. Others get
	// 403.
	AllowedOrigins []string
	// SiblingPorts, with AllowedOrigins empty, also allows an Origin whose
	// host name is the Host header's on one of these ports: the node's
	// own pages (the demo on the HTTP port) open sockets on this port,
	// from the same host. nil: none.
	SiblingPorts []string
	// Authenticator verifies the token of every handshake. nil refuses
	// every handshake with 401: there is no anonymous access.
	Authenticator Authenticator
	// Tickets, when set, verifies a handshake's `ticket` query parameter,
	// taken when the request carries no token: the waiting room's own
	// credential for its socket (docs/protocol.md §6.1). nil = tickets
	// are not taken.
	Tickets TicketAuthenticator
	// Handler receives admission decisions and connection events. nil
	// accepts every authenticated connection and ignores its messages.
	Handler Handler
	// Resync builds the frame that tells a connection whose pushes were
	// dropped to pull group gid from its last seen seq up to lastSeq. It
	// runs on an event loop and must not block. nil closes (1008) a
	// connection when it exceeds OutboundBound, or misses a Broadcast
	// delivery at LoopQueueBound, instead.
	Resync func(gid, lastSeq int64) *Frame
	// Deflate negotiates permessage-deflate (RFC 7692) with clients that
	// offer it: each push is compressed once for all its recipients (no
	// context takeover on the server side), and compressed client messages
	// are inflated within MaxMessageBytes. false (default) declines the
	// extension. See deflate.go.
	Deflate bool
	// DeflateMinBytes is the smallest payload compressed; smaller frames go
	// out uncompressed also on deflate connections. 0 = DefaultDeflateMinBytes.
	DeflateMinBytes int
	// DeflateLevel is the compress/flate level, 1 (fastest) to 9; 0 =
	// DefaultDeflateLevel.
	DeflateLevel int
	// OnWritePass, when set, is told of each write pass of an event loop
	// that carried a frame with an origin (Frame.SetOrigin): once per such
	// frame and loop, with the origin and the times the pass began and
	// ended (Unix nanoseconds). It runs on the event loop and must be
	// cheap and must not block (the engine's stage histogram).
	OnWritePass func(origin, first, last int64)
	// Logger receives connection-level logs; nil discards them.
	Logger *slog.Logger
}

// Validate reports every problem with c, joined.
func (c Config) Validate() error {
	var errs []error
	if c.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			errs = append(errs, fmt.Errorf("socket: Addr %q: %w", c.Addr, err))
		}
	}
	nonNeg := func(name string, v int64) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("socket: %s must not be negative, got %d", name, v))
		}
	}
	nonNeg("NumLoops", int64(c.NumLoops))
	nonNeg("MaxHeaderBytes", int64(c.MaxHeaderBytes))
	nonNeg("HandshakeTimeout", int64(c.HandshakeTimeout))
	nonNeg("UpgradeHold", int64(c.UpgradeHold))
	nonNeg("IdleTimeout", int64(c.IdleTimeout))
	nonNeg("MessageTimeout", int64(c.MessageTimeout))
	nonNeg("CloseTimeout", int64(c.CloseTimeout))
	nonNeg("MaxFrameBytes", int64(c.MaxFrameBytes))
	nonNeg("MaxMessageBytes", int64(c.MaxMessageBytes))
	nonNeg("OutboundBound", int64(c.OutboundBound))
	nonNeg("OutboundHardBound", int64(c.OutboundHardBound))
	nonNeg("SocketSendBuffer", int64(c.SocketSendBuffer))
	nonNeg("MaxConns", int64(c.MaxConns))
	nonNeg("LoopQueueBound", int64(c.LoopQueueBound))
	nonNeg("PingBurst", int64(c.PingBurst))
	nonNeg("DeflateMinBytes", int64(c.DeflateMinBytes))
	if c.DeflateLevel < 0 || c.DeflateLevel > 9 {
		errs = append(errs, fmt.Errorf("socket: DeflateLevel must be in 1..9 (0 = default), got %d", c.DeflateLevel))
	}
	if c.PingRate < -1 {
		errs = append(errs, fmt.Errorf("socket: PingRate must be -1 (no limit) or more, got %d", c.PingRate))
	}
	if c.IPv6CapPrefix != 0 && (c.IPv6CapPrefix < 16 || c.IPv6CapPrefix > 128) {
		errs = append(errs, fmt.Errorf("socket: IPv6CapPrefix must be in 16..128, got %d", c.IPv6CapPrefix))
	}
	if c.MaxConnsPerIP < -1 {
		errs = append(errs, fmt.Errorf("socket: MaxConnsPerIP must be -1 (no cap) or more, got %d", c.MaxConnsPerIP))
	}
	if c.MaxConnsPerUser < -1 {
		errs = append(errs, fmt.Errorf("socket: MaxConnsPerUser must be -1 (no cap) or more, got %d", c.MaxConnsPerUser))
	}
	if c.MaxHeaderBytes > 0 && c.MaxHeaderBytes < 256 {
		errs = append(errs, fmt.Errorf("socket: MaxHeaderBytes %d is too small for a WebSocket handshake (min 256)", c.MaxHeaderBytes))
	}
	if c.MaxFrameBytes > 0 && c.MaxMessageBytes > 0 && c.MaxFrameBytes > c.MaxMessageBytes {
		errs = append(errs, fmt.Errorf("socket: MaxFrameBytes %d exceeds MaxMessageBytes %d", c.MaxFrameBytes, c.MaxMessageBytes))
	}
	if c.OutboundHardBound > 0 && c.OutboundBound > 0 && c.OutboundHardBound < c.OutboundBound {
		errs = append(errs, fmt.Errorf("socket: OutboundHardBound %d is below OutboundBound %d", c.OutboundHardBound, c.OutboundBound))
	}
	for _, p := range c.Paths {
		if !strings.HasPrefix(p, "/") {
			errs = append(errs, fmt.Errorf("socket: path %q must start with /", p))
		}
	}
	for _, o := range c.AllowedOrigins {
		if o == "*" {
			continue
		}
		if _, ok := originHost(o); !ok {
			errs = append(errs, fmt.Errorf("socket: allowed origin %q is not scheme://host[:port]", o))
		}
	}
	return errors.Join(errs...)
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults(fdLimit int) Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if len(c.Paths) == 0 {
		c.Paths = DefaultPaths
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MessageTimeout == 0 {
		c.MessageTimeout = DefaultMessageTimeout
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.DeflateMinBytes == 0 {
		c.DeflateMinBytes = DefaultDeflateMinBytes
	}
	if c.DeflateLevel == 0 {
		c.DeflateLevel = DefaultDeflateLevel
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxFrameBytes == 0 {
		c.MaxFrameBytes = c.MaxMessageBytes
	}
	if c.OutboundBound == 0 {
		c.OutboundBound = DefaultOutboundBound
	}
	if c.OutboundHardBound == 0 {
		c.OutboundHardBound = 4 * c.OutboundBound
	}
	if c.MaxConns == 0 {
		c.MaxConns = max(1, fdLimit-fdReserve)
	}
	if c.MaxConnsPerIP == 0 {
		c.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
	if c.IPv6CapPrefix == 0 {
		c.IPv6CapPrefix = DefaultIPv6CapPrefix
	}
	if c.MaxConnsPerUser == 0 {
		c.MaxConnsPerUser = DefaultMaxConnsPerUser
	}
	if c.PassYield == 0 {
		c.PassYield = DefaultPassYield
	}
	if c.LoopQueueBound == 0 {
		c.LoopQueueBound = DefaultLoopQueueBound
	}
	if c.PingRate == 0 {
		c.PingRate = DefaultPingRate
	}
	if c.PingBurst == 0 {
		c.PingBurst = DefaultPingBurst
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// originHost returns the host[:port] of an origin "scheme://host[:port]".
func originHost(origin string) (string, bool) {
	scheme, rest, ok := strings.Cut(origin, "://")
	if !ok || scheme == "" || rest == "" || strings.ContainsAny(rest, "/?#@ ") {
		return "", false
	}
	return rest, true
}

// Authenticator verifies the token presented at the handshake (the `token`
// query parameter, or `Authorization: Bearer`). It runs on an event loop,
// so it must be fast and must not block (no network calls): a JWT
// signature check is the intended use. Any error answers 401.
type Authenticator interface {
	Authenticate(token string) (Identity, error)
}

// TicketAuthenticator verifies a ticket presented at the handshake for
// path (the `ticket` query parameter). It runs on an event loop, like
// Authenticator: fast, no network calls. Any error answers 401.
type TicketAuthenticator interface {
	AuthenticateTicket(path, ticket string) (Identity, error)
}

// Identity is who a token names.
type Identity struct {
	UID     string    // user id (JWT sub)
	Tier    int       // 0 normal, 1-3 VIP (JWT lvl)
	Expires time.Time // the session is closed (1008) at this time; zero = never
}

// Request is what Handler.Admit sees of a handshake that passed the
// protocol, origin, authentication and connection-cap checks.
type Request struct {
	Path       string         // request path, e.g. "/rooms/sale1/ws"
	RemoteAddr netip.AddrPort // client address
	Identity   Identity
}

// Handler is the consumer of the connection layer (the fanout engine).
// Calls for one connection are serialized on its event loop, in the order
// Admit, OnOpen, OnMessage..., OnClose; different connections run
// concurrently on different loops. Handlers must not block: they run on an
// event loop that serves thousands of other connections. Hand slow work to
// another goroutine and answer with Conn.Write.
type Handler interface {
	// Admit decides whether an authenticated handshake may upgrade. It
	// returns 0 to accept, or an HTTP status to refuse with (429 when the
	// node refuses new connections, 503 at degradation level L4).
	Admit(r *Request) (status int)
	// OnOpen runs once the 101 response is written; the first frame the
	// handler writes (hello) is the first the client receives.
	OnOpen(c *Conn)
	// OnMessage receives one complete text message, UTF-8 validated. msg
	// is valid only during the call: copy what must outlive it.
	OnMessage(c *Conn, msg []byte)
	// OnClose runs once when an opened connection is gone. Writes to c
	// after it are dropped.
	OnClose(c *Conn)
}

// nopHandler accepts everything and ignores messages.
type nopHandler struct{}

func (nopHandler) Admit(*Request) int      { return 0 }
func (nopHandler) OnOpen(*Conn)            {}
func (nopHandler) OnMessage(*Conn, []byte) {}
func (nopHandler) OnClose(*Conn)           {}
