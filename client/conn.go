package client

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// Message is one group message delivered by a Conn, in seq order per group
// and exactly once per (GID, Seq).
type Message struct {
	GID  int64
	Seq  int64
	From string
	// TS is the commit time, Unix milliseconds.
	TS   int64
	Kind string
	// Body is the message's raw JSON. With Config.OnMessage it is valid
	// only during the call; on the Messages channel it is owned by the
	// receiver.
	Body json.RawMessage
	// Pulled says the message came by pull (gap fill or catch-up), not by
	// push.
	Pulled bool
}

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds.
const (
	// EventConnected: a connection is up; Hello is its hello frame.
	EventConnected EventKind = iota + 1
	// EventDisconnected: the connection dropped (Err says why); the Conn
	// redials with backoff.
	EventDisconnected
	// EventDegraded: the effective degradation level seen by this client
	// changed; GID 0 means node-wide. At level 3 (wire.LevelWriteOnly) the server pushes nothing
	// and the Conn polls with pulls every Config.PollInterval.
	EventDegraded
	// EventResync: the server dropped pushes for this connection up to
	// LastSeq of GID; the Conn pulls what it missed.
	EventResync
	// EventSkipped: messages From..To of GID will not be delivered
	// (Config.MaxCatchUp, or the server's last_seq is below a pushed seq).
	// Pull them explicitly if needed.
	EventSkipped
	// EventGroupLost: a pull of GID was answered forbidden or not_found
	// (Err): the user is no longer a member; the group is not tracked
	// anymore.
	EventGroupLost
	// EventError: the server sent an error frame without an id (e.g. for a
	// read frame), or a background request failed (Err).
	EventError
)

var eventNames = [...]string{"", "connected", "disconnected", "degraded", "resync", "skipped", "group_lost", "error"}

// String returns the kind's name, e.g. "degraded".
func (k EventKind) String() string {
	if int(k) < len(eventNames) && k > 0 {
		return eventNames[k]
	}
	return "event(" + strconv.Itoa(int(k)) + ")"
}

// Event is a connection-level happening apps may show (see EventKind for
// which fields each kind sets).
type Event struct {
	Kind    EventKind
	GID     int64
	Level   int
	LastSeq int64
	From    int64
	To      int64
	Hello   wire.Hello
	Err     error
}

// Stats are a Conn's counters since Dial.
type Stats struct {
	// Delivered messages, of which Pulled came by pull.
	Delivered uint64
	Pulled    uint64
	// Duplicates are pushes or pulled messages dropped because their
	// (gid, seq) was delivered or pending already.
	Duplicates uint64
	// Gaps revealed by pushes; Pulls are pull requests sent.
	Gaps  uint64
	Pulls uint64
	// Overflow counts pushes dropped because a group's pending buffer was
	// full (they are pulled later).
	Overflow uint64
	// Reconnects counts successful redials.
	Reconnects uint64
	// EventsDropped counts events that did not fit the Events channel.
	EventsDropped uint64
}

type counters struct {
	delivered, pulled, duplicates, gaps, pulls, overflow, reconnects, eventsDropped atomic.Uint64
}

// Conn is a client connection to a fanfare node that survives reconnects:
// it sends with retries, delivers every group's messages exactly once and
// in order, and catches up after gaps and reconnects. Safe for concurrent
// use.
type Conn struct {
	cfg      Config
	log      *slog.Logger
	cancel   context.CancelFunc // ends run
	done     chan struct{}      // closed when run has returned
	termErr  error              // why run gave up; set before done is closed
	wake     chan struct{}      // cap 1: queued work for run
	idPrefix string
	ids      atomic.Uint64
	st       counters

	smu   sync.Mutex
	cur   *session      // the connected session, nil while redialing
	up    chan struct{} // closed when cur is set
	hello wire.Hello    // of the latest session

	cmu   sync.Mutex
	calls map[string]*call // requests waiting for their answer, by id

	mu     sync.Mutex // delivery state below
	groups map[int64]*group
	queue  []*group // groups with work for run
	level  int      // node-wide degradation level
	// levels holds the groups' announced levels above L0, tracked or not
	// (a group's level can arrive before the app tracks it).
	levels map[int64]int
	pollAt time.Time
	reads  map[int64]int64 // read marks to write after reconnect
	// syncing is set from connect until the sync that follows it is
	// applied (HTTPURL set, SkipUnread not): a group first seen by a push
	// meanwhile is provisional, so that the sync, not the push, says where
	// its delivery starts.
	syncing bool
	msgs    chan Message
	events  chan Event

	// online holds the latest presence frame of each group (gid ->
	// Presence), see presence.go.
	online sync.Map
}

// session is one connection's life: the socket, its hello, and the reader
// goroutine's exit.
type session struct {
	*wsConn
	hello wire.Hello
	start time.Time
	done  chan struct{} // closed when the reader has returned
	err   error         // why the reader returned; set before done
	every time.Duration // heartbeat interval
	hb    atomic.Pointer[time.Timer]
	seen  uint64 // recv at the previous heartbeat; heartbeat goroutine only
	dead  atomic.Bool
}

// call is one request waiting for its answer.
type call struct {
	ch chan wire.ServerFrame // cap 1: *wire.Ack, *wire.Messages or *wire.Error
}

// stableAfter is how long a connection must have lived for the reconnect
// backoff to start again from BackoffMin.
const stableAfter = 10 * time.Second

// Dial connects to cfg.URL, waits for the hello frame and returns the Conn,
// which from then on keeps itself connected until Close. A failure of this
// first connection is returned (a *HandshakeError for a refused upgrade).
func Dial(ctx context.Context, cfg Config) (*Conn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var p [8]byte
	_, _ = crand.Read(p[:])
	c := &Conn{
		cfg:      cfg,
		log:      cfg.Logger,
		done:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
		idPrefix: hex.EncodeToString(p[:]) + "-",
		up:       make(chan struct{}),
		calls:    make(map[string]*call),
		groups:   make(map[int64]*group),
		levels:   make(map[int64]int),
	}
	if cfg.OnMessage == nil {
		c.msgs = make(chan Message, cfg.MessageBuffer)
	}
	if cfg.OnEvent == nil {
		c.events = make(chan Event, cfg.EventBuffer)
	}
	for gid, seq := range cfg.Cursors {
		g := c.newGroupLocked(gid, seq)
		g.probe = true
		c.enqueueLocked(g)
	}
	s, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	c.publish(s)
	rctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(rctx, s)
	return c, nil
}

// Messages returns the channel of delivered messages (nil with
// Config.OnMessage). It is closed after Close, or when the Conn gives up
// (see Err).
func (c *Conn) Messages() <-chan Message { return c.msgs }

// Events returns the channel of events (nil with Config.OnEvent). It is
// closed with Messages.
func (c *Conn) Events() <-chan Event { return c.events }

// Done is closed when the Conn has stopped: after Close, or when it gave up
// redialing (Err says why).
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the Conn stopped by itself (e.g. a *HandshakeError with
// status 401 on redial without TokenFunc); nil while running or after Close.
func (c *Conn) Err() error {
	select {
	case <-c.done:
		return c.termErr
	default:
		return nil
	}
}

// Hello returns the hello frame of the latest connection.
func (c *Conn) Hello() wire.Hello {
	c.smu.Lock()
	defer c.smu.Unlock()
	return c.hello
}

// UID returns the user id the server authenticated.
func (c *Conn) UID() string { return c.Hello().UID }

// Connected reports whether a connection is up now.
func (c *Conn) Connected() bool { return c.current() != nil }

// Stats returns the counters.
func (c *Conn) Stats() Stats {
	return Stats{
		Delivered:     c.st.delivered.Load(),
		Pulled:        c.st.pulled.Load(),
		Duplicates:    c.st.duplicates.Load(),
		Gaps:          c.st.gaps.Load(),
		Pulls:         c.st.pulls.Load(),
		Overflow:      c.st.overflow.Load(),
		Reconnects:    c.st.reconnects.Load(),
		EventsDropped: c.st.eventsDropped.Load(),
	}
}

// Close closes the connection (close code 1000), stops redialing, waits
// for the Conn's goroutines to end and closes Messages and Events. Pending
// Sends return ErrClosed.
func (c *Conn) Close() error {
	c.cancel()
	<-c.done
	return nil
}

// newID returns a request id unique to this Conn and, through its random
// prefix, across processes.
func (c *Conn) newID() string {
	return c.idPrefix + strconv.FormatUint(c.ids.Add(1), 36)
}

// connect dials, reads the hello frame and returns the session (its reader
// not started).
func (c *Conn) connect(ctx context.Context) (*session, error) {
	token, err := c.cfg.token(ctx)
	if err != nil {
		return nil, fmt.Errorf("client: token: %w", err)
	}
	wc, err := dialWS(ctx, &c.cfg, c.cfg.URL, token)
	if err != nil {
		return nil, err
	}
	hello, err := readHello(wc, c.cfg.HandshakeTimeout)
	if err != nil {
		wc.close()
		return nil, err
	}
	s := &session{wsConn: wc, hello: *hello, start: time.Now(), done: make(chan struct{})}
	s.every = c.cfg.Heartbeat
	if s.every == 0 {
		s.every = time.Duration(hello.HeartbeatS) * time.Second
	}
	if s.every <= 0 {
		s.every = DefaultHeartbeat
	}
	return s, nil
}

// readHello reads the first frame, which must be hello.
func readHello(wc *wsConn, timeout time.Duration) (*wire.Hello, error) {
	_ = wc.nc.SetReadDeadline(time.Now().Add(timeout))
	data, err := wc.read()
	if err != nil {
		return nil, fmt.Errorf("client: reading hello: %w", err)
	}
	_ = wc.nc.SetReadDeadline(time.Time{})
	f, err := wire.DecodeServer(data)
	if err != nil {
		return nil, fmt.Errorf("%w: first frame: %v", ErrProtocol, err)
	}
	h, ok := f.(*wire.Hello)
	if !ok {
		return nil, fmt.Errorf("%w: first frame is %q, want hello", ErrProtocol, f.FrameType())
	}
	return h, nil
}

// run owns the connection: it serves a session until it ends, then redials
// with jittered exponential backoff, until ctx is canceled or redialing
// cannot succeed.
func (c *Conn) run(ctx context.Context, s *session) {
	defer c.finish()
	attempt := 0
	for {
		c.serve(ctx, s)
		if ctx.Err() != nil {
			return
		}
		if time.Since(s.start) >= stableAfter {
			attempt = 0
		}
		for {
			if !sleep(ctx, backoff(c.cfg.BackoffMin, c.cfg.BackoffMax, attempt)) {
				return
			}
			attempt++
			ns, err := c.connect(ctx)
			if err == nil {
				s = ns
				c.st.reconnects.Add(1)
				break
			}
			if ctx.Err() != nil {
				return
			}
			c.log.Warn("client: redial failed", "attempt", attempt, "err", err)
			var he *HandshakeError
			if errors.As(err, &he) && he.permanent() && c.cfg.TokenFunc == nil {
				c.termErr = fmt.Errorf("%w: %w", ErrClosed, err)
				return
			}
		}
	}
}

// finish runs when run returns: no reader is alive anymore, so the
// channels can be closed.
func (c *Conn) finish() {
	if c.msgs != nil {
		close(c.msgs)
	}
	if c.events != nil {
		close(c.events)
	}
	close(c.done)
}

// serve runs one session: it starts the reader and the heartbeat, resumes
// (sync + pulls), then does the queued delivery work until the session
// ends.
func (c *Conn) serve(ctx context.Context, s *session) {
	c.attach(s)
	c.resetLevels()
	c.mu.Lock()
	c.syncing = c.cfg.HTTPURL != "" && !c.cfg.SkipUnread
	c.mu.Unlock()
	go c.readLoop(s)
	defer c.detach(ctx, s)
	c.resume(ctx, s)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next, ok := c.work(ctx, s)
		if !ok {
			// The session failed under a pull, or ctx ended.
			select {
			case <-s.done:
			case <-ctx.Done():
			}
		}
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), time.Millisecond))
		}
		select {
		case <-s.done:
			return
		case <-ctx.Done():
			s.closeWith(ws.StatusNormalClosure)
			<-s.done
			return
		case <-c.wake:
		case <-timer.C:
		}
	}
}

// publish makes s the current session, used by requests.
func (c *Conn) publish(s *session) {
	c.smu.Lock()
	defer c.smu.Unlock()
	if c.cur != s {
		c.cur = s
		c.hello = s.hello
		close(c.up)
	}
}

// attach publishes s (Dial did for the first one) and starts its
// heartbeat.
func (c *Conn) attach(s *session) {
	c.publish(s)
	s.hb.Store(time.AfterFunc(s.every, func() { c.heartbeat(s) }))
	c.log.Debug("client: connected", "uid", s.hello.UID, "node", s.hello.Node)
	c.emit(Event{Kind: EventConnected, Hello: s.hello})
}

// unpublish makes s no longer the current session; the reader calls it
// before closing s.done, so that a session whose done is closed is never
// handed out.
func (c *Conn) unpublish(s *session) {
	c.smu.Lock()
	if c.cur == s {
		c.cur = nil
		c.up = make(chan struct{})
	}
	c.smu.Unlock()
}

// resetLevels forgets the degradation levels of the previous connection
// before the reader starts: the server announces the levels in force right
// after connecting.
func (c *Conn) resetLevels() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.level, c.pollAt = 0, time.Time{}
	clear(c.levels)
}

// detach ends s's heartbeat after its reader has returned.
func (c *Conn) detach(ctx context.Context, s *session) {
	s.hb.Load().Stop()
	if ctx.Err() == nil {
		c.log.Info("client: disconnected", "err", s.err)
		c.emit(Event{Kind: EventDisconnected, Err: s.err})
	}
}

// current returns the connected session or nil.
func (c *Conn) current() *session {
	c.smu.Lock()
	defer c.smu.Unlock()
	return c.cur
}

// waitSession waits for a connected session.
func (c *Conn) waitSession(ctx context.Context) (*session, error) {
	for {
		c.smu.Lock()
		s, up := c.cur, c.up
		c.smu.Unlock()
		if s != nil {
			return s, nil
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.done:
			return nil, c.closedErr()
		}
	}
}

func (c *Conn) closedErr() error {
	if c.termErr != nil {
		return c.termErr
	}
	return ErrClosed
}

// heartbeat runs every s.every on a timer goroutine: it closes a
// connection from which nothing arrived since the previous ping, and pings.
func (c *Conn) heartbeat(s *session) {
	select {
	case <-s.done:
		return
	default:
	}
	n := s.recv.Load()
	if n == s.seen {
		s.dead.Store(true)
		c.log.Warn("client: no frames for two heartbeats, closing", "heartbeat", s.every)
		s.close()
		return
	}
	s.seen = n
	if err := s.writeText(pingFrame); err != nil {
		return
	}
	s.hb.Load().Reset(s.every)
}

var pingFrame = wire.AppendPing(nil, &wire.Ping{})

// readLoop reads and dispatches frames until the connection fails.
func (c *Conn) readLoop(s *session) {
	defer close(s.done)
	defer c.unpublish(s)
	for {
		data, err := s.read()
		if err != nil {
			if s.dead.Load() {
				err = fmt.Errorf("%w: no frames for two heartbeats", ErrConnLost)
			}
			s.err = err
			if code := closeCode(err); code != 0 {
				s.closeWith(code) // fail the connection as RFC 6455 asks
			}
			s.close()
			return
		}
		f, err := wire.DecodeServer(data)
		if err != nil {
			if !errors.Is(err, wire.ErrUnknownType) {
				c.log.Warn("client: bad frame skipped", "err", err)
			}
			continue
		}
		c.dispatch(f)
	}
}

// closeCode is the RFC 6455 close code for a read error that is the
// server's fault; 0 for the others (the connection is gone or silent, and
// a close frame could only block).
func closeCode(err error) ws.StatusCode {
	var pe ws.ProtocolError
	switch {
	case errors.Is(err, wsutil.ErrInvalidUTF8):
		return ws.StatusInvalidFramePayloadData
	case errors.Is(err, wsutil.ErrMessageTooLarge), errors.Is(err, wsutil.ErrFrameTooLarge):
		return ws.StatusMessageTooBig
	case errors.As(err, &pe):
		return ws.StatusProtocolError
	}
	return 0
}

// dispatch routes one decoded frame. Bodies alias the read buffer: what
// leaves this goroutine is copied.
func (c *Conn) dispatch(f wire.ServerFrame) {
	switch f := f.(type) {
	case *wire.Ack:
		c.answer(f.ID, f)
	case *wire.Messages:
		ownBodies(f.Messages)
		c.answer(f.ID, f)
	case *wire.Error:
		if f.ID == "" || !c.answer(f.ID, f) {
			c.emit(Event{Kind: EventError, Err: errorFrom(f)})
		}
	case *wire.Msg:
		c.push(f)
	case *wire.Batch:
		c.pushBatch(f)
	case *wire.Summary:
		c.summary(f)
	case *wire.Resync:
		c.resync(f)
	case *wire.Degraded:
		c.degraded(f)
	case *wire.Presence:
		c.presence(f)
	}
}

// ownBodies copies the bodies of msgs into one fresh allocation.
func ownBodies(msgs []wire.Msg) {
	n := 0
	for i := range msgs {
		n += len(msgs[i].Body)
	}
	buf := make([]byte, 0, n)
	for i := range msgs {
		start := len(buf)
		buf = append(buf, msgs[i].Body...)
		msgs[i].Body = buf[start:len(buf):len(buf)]
	}
}

// answer hands f to the request waiting for id; false when none waits.
func (c *Conn) answer(id string, f wire.ServerFrame) bool {
	c.cmu.Lock()
	cl := c.calls[id]
	c.cmu.Unlock()
	if cl == nil {
		return false
	}
	select {
	case cl.ch <- f:
	default: // a second answer (a repeated request): the first counts
	}
	return true
}

// emit reports ev without blocking. Called only from the reader and run
// goroutines, never after finish.
func (c *Conn) emit(ev Event) {
	if c.cfg.OnEvent != nil {
		c.cfg.OnEvent(ev)
		return
	}
	select {
	case c.events <- ev:
	default:
		c.st.eventsDropped.Add(1)
	}
}

// backoff returns the jittered wait before attempt n (0-based): a uniform
// draw in [d/2, d] with d = min(max, min*2^n).
func backoff(minD, maxD time.Duration, n int) time.Duration {
	d := minD
	for i := 0; i < n && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	half := d / 2
	return half + rand.N(half+1)
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
