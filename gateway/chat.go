package gateway

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/presence"
)

// Defaults of ChatConfig's worker pools (fanfared's -frame-workers,
// -frame-queue, -connect-workers, -connect-queue, -request-timeout).
const (
	DefaultWorkers        = 32
	DefaultWorkQueue      = 4096
	DefaultConnectWorkers = 8
	DefaultConnectQueue   = 1024
	DefaultRequestTimeout = 5 * time.Second
)

// ChatConfig configures Chat. The zero value works.
type ChatConfig struct {
	// Node names this node in hello frames.
	Node string
	// Heartbeat is the client heartbeat announced in hello; 0 = 30 s.
	Heartbeat time.Duration
	// MaxMessageBytes is announced in hello; 0 = socket.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Workers run the blocking work of client frames (pull, read, remote
	// send checks) off the event loops; 0 = DefaultWorkers.
	Workers int
	// WorkQueue bounds the frame work waiting for a worker; past it
	// frames are answered overloaded; 0 = DefaultWorkQueue.
	WorkQueue int
	// ConnectWorkers run the registration of new connections, on a pool
	// of their own so that no flood of frames delays other users'
	// connects; 0 = DefaultConnectWorkers.
	ConnectWorkers int
	// ConnectQueue bounds the connects waiting for a connect worker; past
	// it a new connection is closed with 1013; 0 = DefaultConnectQueue.
	ConnectQueue int
	// RequestTimeout bounds one blocking request; 0 =
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// PageBytes bounds the frame of one pull answer (bytes): a page ends
	// before the message that would take it past PageBytes, and says in
	// next_seq where to continue, but always holds one message. Keep it
	// under the socket's outbound bounds; 0 = DefaultPageBytes.
	PageBytes int
	// Limiter decides the per-user send and pull limits; nil = none.
	Limiter limiter.Limiter
	// RemoteLimiter says Limiter may block on the network (Redis): its
	// send checks then run on the worker pool instead of the event loop
	// (one worker per connection, so its sends keep their order).
	RemoteLimiter bool
	// ConnLimiter decides admission of new connections (the tier-weighted
	// connect rule); it runs on the event loop, so it must be in-process.
	// nil = no admission limit.
	ConnLimiter limiter.Limiter
	// FrameLimiter decides the per-connection and per-user frame limits
	// (limiter.FrameSend ... limiter.FrameDenied) before any work is
	// queued for a frame; it runs on the event loop, so it must be
	// in-process. nil = no frame limits.
	FrameLimiter limiter.Limiter
	Logger       *slog.Logger
}

// Chat serves the chat socket (/ws): it decodes client frames, applies
// the frame limits (admitFrame) before any work is queued for them, hands
// sends to the engine, runs pulls and reads on a bounded worker pool and
// connects on a pool of their own, and is the engine's Pusher, encoding
// each push once and broadcasting it.
type Chat struct {
	cfg   ChatConfig
	eng   *fanout.Engine
	srv   *socket.Server
	pool  *pool // frame work
	conns *pool // connects
	// live holds the registered connections, for node-wide notices: a
	// slice under a leaf mutex, each session knowing its index
	// (session.live), 8 to 16 bytes per connection where a map took
	// about 29 and a sync.Map about 280; it is written only at connect
	// and close (a close moves the last connection into the gap).
	liveMu sync.Mutex
	live   []*socket.Conn
	log    *slog.Logger
	// events, when set (NewEvents), has the Server-Sent Events streams:
	// Push and Degraded reach them too.
	events *Events
	// draining refuses new connections (503) once a shutdown started.
	draining atomic.Bool
}

// session is the per-connection state of the chat socket.
type session struct {
	mu        sync.Mutex
	closed    bool
	connected bool // registered with the engine: OnClose must disconnect
	ready     bool // hello sent and early frames answered
	// live is 1 + the connection's index in Chat.live, 0 = not there;
	// guarded by Chat.liveMu.
	live int32
	// early holds frames that arrived before hello was sent; they are
	// handled, in order, right after it (hello is the first frame a
	// client receives, answers included). A pointer, allocated by the
	// first such frame: few clients send any, and it keeps the session,
	// held by every idle connection, in the 24-byte size class
	// (TestSessionSize).
	early *[][]byte
}

// earlyLen is how many frames wait in s.early; s.mu is held.
func (s *session) earlyLen() int {
	if s.early == nil {
		return 0
	}
	return len(*s.early)
}

// checksPool holds the frame limits' scratch (admitFrame), taken per
// frame: a session does not carry 144 bytes of it while idle.
var checksPool = sync.Pool{New: func() any { return new([2]limiter.Check) }}

// maxEarlyFrames bounds the frames a client may send before hello.
const maxEarlyFrames = 32

// NewChat returns a Chat. Chat is the engine's Pusher and the socket
// server's Handler, so it is built first and bound to both with Attach
// before either runs; Run starts its workers.
func NewChat(cfg ChatConfig) *Chat {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 30 * time.Second
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = socket.DefaultMaxMessageBytes
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.WorkQueue <= 0 {
		cfg.WorkQueue = DefaultWorkQueue
	}
	if cfg.ConnectWorkers <= 0 {
		cfg.ConnectWorkers = DefaultConnectWorkers
	}
	if cfg.ConnectQueue <= 0 {
		cfg.ConnectQueue = DefaultConnectQueue
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.PageBytes <= 0 {
		cfg.PageBytes = DefaultPageBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Chat{cfg: cfg, pool: newPool(cfg.Workers, cfg.WorkQueue, cfg.RequestTimeout),
		conns: newPool(cfg.ConnectWorkers, cfg.ConnectQueue, cfg.RequestTimeout), log: cfg.Logger,
	}
}

// admitFrame applies the frame limits to one frame of c (admitFrame) with a
// pooled scratch.
func (ch *Chat) admitFrame(c *socket.Conn, f *wire.ClientFrame, err error) bool {
	if ch.cfg.FrameLimiter == nil {
		return true
	}
	checks := checksPool.Get().(*[2]limiter.Check)
	ok := admitFrame(ch.cfg.FrameLimiter, ch.log, c, checks, f, err)
	*checks = [2]limiter.Check{} // no uid kept in the pool
	checksPool.Put(checks)
	return ok
}

// Attach binds Chat to its engine and to the socket server whose
// connections it pushes to. Call it once, before either runs.
func (ch *Chat) Attach(eng *fanout.Engine, srv *socket.Server) { ch.eng, ch.srv = eng, srv }

// Run runs the worker pools until ctx is done.
func (ch *Chat) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { _ = ch.conns.run(ctx) })
	_ = ch.pool.run(ctx)
	wg.Wait()
	return nil
}

// submit queues blocking work; false when the queue is full.
func (ch *Chat) submit(fn func(context.Context)) bool { return ch.pool.submit(fn) }

// Drain makes Admit refuse new connections with 503: the first step of a
// graceful shutdown.
func (ch *Chat) Drain() { ch.draining.Store(true) }

// Admit refuses new connections while draining and at L4 (503), while the node is at L3
// because of egress or store alarms (429), and past the tier-weighted
// connect quota (429: VIPs keep their reserve).
func (ch *Chat) Admit(r *socket.Request) int { return ch.admit(r.Identity.UID, r.Identity.Tier) }

// admit is Admit for uid of tier, whatever its transport.
func (ch *Chat) admit(uid string, tier int) int {
	if ch.draining.Load() {
		return 503
	}
	switch lv := ch.eng.Levels().Node(); {
	case lv >= fanout.L4Reject:
		return 503
	case lv >= fanout.L3WriteOnly:
		return 429
	}
	if err := allow(context.Background(), ch.cfg.ConnLimiter, limiter.Check{
		Rule: limiter.Connect, Key: ch.cfg.Node, User: uid, Tier: tier,
	}); err != nil {
		return 429
	}
	return 0
}

// OnOpen registers the connection with the engine off the loop. hello is
// written just before the connection's presence bits are set: pushes
// follow hello, and a client that syncs after hello misses nothing.
func (ch *Chat) OnOpen(c *socket.Conn) {
	s := &session{}
	c.SetContext(s)
	if !ch.conns.submit(func(ctx context.Context) { ch.connect(ctx, c, s) }) {
		c.Close(socket.CloseTryAgainLater, "server busy")
	}
}

func (ch *Chat) connect(ctx context.Context, c *socket.Conn, s *session) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return
	}
	hello := func() {
		f := socket.NewTextFrame(wire.AppendHello(nil, &wire.Hello{
			UID:             c.UID(),
			Node:            ch.cfg.Node,
			HeartbeatS:      int64(ch.cfg.Heartbeat / time.Second),
			MaxMessageBytes: int64(ch.cfg.MaxMessageBytes),
		}))
		// A client that waited for hello has its frames handled from now
		// on, behind hello, while the registration finishes: the early cap
		// is for frames sent before hello, not for a burst right after it
		// (closed as "too many frames before hello" in cluster mode, where
		// registering takes store round trips). hello is queued under the
		// session lock, so OnMessage sees ready only once it is.
		s.mu.Lock()
		_ = c.Write(f)
		if s.earlyLen() == 0 {
			s.ready = true
		}
		s.mu.Unlock()
	}
	ms, err := ch.eng.ConnectReady(ctx, c, hello)
	if err != nil {
		ch.log.Warn("connect failed", "uid", c.UID(), "err", err)
		if errors.Is(err, presence.ErrTooManyConns) {
			c.Close(socket.ClosePolicyViolation, "too many connections for this user")
		} else {
			c.Close(socket.CloseTryAgainLater, "try again later")
		}
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ch.eng.Disconnect(c)
		return
	}
	s.connected = true
	ch.liveMu.Lock()
	ch.live = append(ch.live, c)
	s.live = int32(len(ch.live))
	ch.liveMu.Unlock()
	s.mu.Unlock()
	// Frames that came before hello are answered now, in order and outside
	// the lock; frames arriving meanwhile queue behind them.
	for {
		s.mu.Lock()
		early := s.early
		s.early = nil
		if early == nil || len(*early) == 0 {
			s.ready = true
			s.mu.Unlock()
			break
		}
		s.mu.Unlock()
		for _, msg := range *early {
			ch.handle(c, msg)
		}
	}
	// Tell the client about levels already in force.
	lv := ch.eng.Levels()
	node := lv.Node()
	if node > fanout.L0Normal {
		_ = c.Write(degradedFrame(0, node))
	}
	for _, m := range ms {
		if g := lv.Effective(m.GID); g > node {
			_ = c.Write(degradedFrame(m.GID, g))
		}
	}
}

// OnClose unregisters the connection.
func (ch *Chat) OnClose(c *socket.Conn) {
	s, _ := c.Context().(*session)
	if s == nil {
		return
	}
	s.mu.Lock()
	s.closed = true
	ch.liveMu.Lock()
	if i := s.live - 1; i >= 0 {
		last := len(ch.live) - 1
		if int(i) != last {
			moved := ch.live[last]
			ch.live[i] = moved
			moved.Context().(*session).live = i + 1
		}
		ch.live[last] = nil
		ch.live = ch.live[:last]
		s.live = 0
	}
	ch.liveMu.Unlock()
	connected := s.connected
	s.mu.Unlock()
	if connected {
		ch.eng.Disconnect(c)
	}
}

// OnMessage handles one client frame.
func (ch *Chat) OnMessage(c *socket.Conn, msg []byte) {
	if s, _ := c.Context().(*session); s != nil {
		s.mu.Lock()
		if !s.ready {
			if s.earlyLen() >= maxEarlyFrames {
				s.mu.Unlock()
				c.Close(socket.ClosePolicyViolation, "too many frames before hello")
				return
			}
			if s.early == nil {
				s.early = new([][]byte)
			}
			*s.early = append(*s.early, bytes.Clone(msg)) // msg is only valid during the call
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
	ch.handle(c, msg)
}

// handle answers one client frame; it never blocks.
func (ch *Chat) handle(c *socket.Conn, msg []byte) {
	f, err := wire.DecodeClient(msg)
	s, _ := c.Context().(*session)
	if s != nil && !ch.admitFrame(c, &f, err) {
		return
	}
	if err != nil {
		ch.replyError(c, "", err)
		return
	}
	switch f.Type {
	case wire.TypeSend:
		ch.send(c, &f)
	case wire.TypePull:
		id, gid, from, to := f.ID, f.GID, f.FromSeq, f.ToSeq
		if !ch.submit(func(ctx context.Context) {
			if err := allow(ctx, ch.cfg.Limiter, limiter.Check{Rule: limiter.Pull, User: c.UID(), Tier: c.Tier()}); err != nil {
				ch.replyError(c, id, err)
				return
			}
			ch.pull(ctx, c, id, gid, from, to)
		}) {
			ch.replyError(c, id, &fanout.RetryError{Err: fanout.ErrOverloaded, After: time.Second})
		}
	case wire.TypeRead:
		gid, seq := f.GID, f.Seq
		if !ch.submit(func(ctx context.Context) {
			if err := ch.eng.MarkRead(ctx, gid, c.UID(), seq); err != nil {
				ch.replyError(c, "", err)
			}
		}) {
			ch.replyError(c, "", &fanout.RetryError{Err: fanout.ErrOverloaded, After: time.Second})
		}
	case wire.TypePing:
		_ = c.Write(socket.NewTextFrame(wire.AppendPong(nil, &wire.Pong{ID: f.ID})))
	}
}

func (ch *Chat) send(c *socket.Conn, f *wire.ClientFrame) {
	id, gid := f.ID, f.GID
	req := fanout.SendRequest{
		GID:         gid,
		UID:         c.UID(),
		ClientMsgID: id,
		Kind:        f.Kind,
		Body:        bytes.Clone(f.Body), // the loop's buffer is reused
		Done: func(r fanout.SendResult) {
			if r.Err != nil {
				ch.replyError(c, id, r.Err)
				return
			}
			_ = c.Write(socket.NewTextFrame(wire.AppendAck(nil, &wire.Ack{ID: id, GID: gid, Seq: r.Seq, TS: r.CreatedAt.UnixMilli()})))
		},
	}
	lim := ch.cfg.Limiter
	if lim == nil {
		ch.eng.Send(req)
		return
	}
	// A check that may block runs on the connection's own worker, so that
	// its sends reach the engine in the order the client sent them.
	check := func(ctx context.Context) {
		var buf [2]limiter.Check
		if err := allow(ctx, lim, sendChecks(buf[:0], req.UID, c.Tier(), gid)...); err != nil {
			ch.replyError(c, id, err)
			return
		}
		ch.eng.Send(req)
	}
	if !ch.cfg.RemoteLimiter {
		check(context.Background())
		return
	}
	if !ch.pool.submitKey(c.ID(), check) {
		ch.replyError(c, id, &fanout.RetryError{Err: fanout.ErrOverloaded, After: time.Second})
	}
}

// pull answers one pull with a page of at most PageBytes (pagedMessages).
func (ch *Chat) pull(ctx context.Context, c *socket.Conn, id string, gid, from, to int64) {
	msgs, last, next, err := pagedMessages(ctx, ch.eng, gid, c.UID(), from, to, ch.cfg.PageBytes)
	if err != nil {
		ch.replyError(c, id, err)
		return
	}
	out := wire.Messages{ID: id, GID: gid, Messages: wireMsgs(nil, msgs), LastSeq: last, NextSeq: next}
	b, _ := wire.AppendMessagesWithin(nil, &out, ch.cfg.PageBytes)
	_ = c.Write(socket.NewTextFrame(b))
}

func (ch *Chat) replyError(c *socket.Conn, id string, err error) {
	if r := MapError(err, ScopeMember); r.Status >= 500 && !r.Retryable() {
		ch.log.Error("request failed", "uid", c.UID(), "id", id, "err", err)
	}
	_ = c.Write(socket.NewTextFrame(AppendErrorFrame(nil, id, err)))
}

func degradedFrame(gid int64, lv fanout.Level) *socket.Frame {
	return socket.NewTextFrame(wire.AppendDegraded(nil, &wire.Degraded{GID: gid, Level: wireLevel(lv)}))
}

// ResyncFrame builds the resync frame the socket layer sends to a
// connection whose pushes were dropped (socket.Config.Resync).
func ResyncFrame(gid, lastSeq int64) *socket.Frame {
	return socket.NewTextFrame(wire.AppendResync(nil, &wire.Resync{GID: gid, LastSeq: lastSeq}))
}

// SocketAuth adapts a token Verifier to the socket layer's Authenticator.
func SocketAuth(v Verifier) socket.Authenticator { return socketAuth{v} }

type socketAuth struct{ v Verifier }

func (a socketAuth) Authenticate(token string) (socket.Identity, error) {
	c, err := a.v.Verify(token)
	if err != nil {
		return socket.Identity{}, err
	}
	return socket.Identity{UID: c.UID, Tier: c.Tier, Expires: c.Expires}, nil
}
