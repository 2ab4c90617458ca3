// This file holds Events, the Server-Sent Events transport
// (docs/protocol.md §14): GET /v1/events streams a chat connection's
// server frames to clients that cannot open a WebSocket, on the HTTP API
// port. A stream is a fanout.Conn like a socket: the engine pushes to it
// through Chat.Push, which hands it the frames it encoded for the sockets.

package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/presence"
)

// Defaults and bounds of EventsConfig (fanfared's -sse-* flags).
const (
	DefaultSSEHeartbeat     = 15 * time.Second
	DefaultSSEMaxLifetime   = 10 * time.Minute
	DefaultSSEWriteTimeout  = 30 * time.Second
	DefaultSSEMaxStreams    = 10000
	DefaultSSECursorGroups  = 64
	MaxSSECursorGroups      = 1024
	DefaultSSETicketTTL     = 30 * time.Second
	DefaultSSEMaxTickets    = 1 << 16
	DefaultSSERetry         = time.Second
	MaxSSEPadding           = 64 << 10
	sseSweepEvery           = time.Second
	sseMinHeartbeat         = time.Second
	sseMaxKeptBuffer        = 64 << 10
	sseMaxCursorHeaderBytes = 1 + MaxSSECursorGroups*maxCursorEntryLen
)

// EventsConfig configures Events. The zero value of every field but Chat
// works.
type EventsConfig struct {
	// Chat is the chat socket's handler: Events shares its engine, its
	// admission rule, its pushes and its degradation notices. Required.
	Chat *Chat
	// Verifier checks bearer tokens (Authorization: Bearer); nil: only
	// tickets open streams, and POST /v1/events/ticket is the API's.
	Verifier Verifier
	// TicketSecret keys the tickets (docs/protocol.md §14.2); nodes that
	// share it accept each other's tickets. Empty: a random key, tickets
	// of this process only.
	TicketSecret []byte
	// TicketTTL is how long a ticket may be redeemed; 0 = 30 s.
	TicketTTL time.Duration
	// MaxTickets bounds the redeemed tickets remembered (until they
	// expire) to refuse replays; past it redemption answers 503. 0 = 65536.
	MaxTickets int
	// Heartbeat is the interval of the comment lines a stream gets when
	// nothing else was written (proxies close idle responses; clients
	// detect a dead stream by their absence). 0 = 15 s; at least 1 s.
	Heartbeat time.Duration
	// MaxLifetime ends a stream cleanly after this long (minus up to a
	// tenth, at random, so that streams opened together do not all
	// reconnect together); the client reconnects with its cursor. 0 =
	// 10 min; negative = no limit.
	MaxLifetime time.Duration
	// WriteTimeout bounds one write of a stream: a client that does not
	// read for this long is closed as a slow consumer. 0 = 30 s.
	WriteTimeout time.Duration
	// OutboundBound is the number of bytes a stream may have queued and
	// not yet written before its pushes are dropped and replaced, once
	// it drained, by one resync per group, as a socket's
	// (socket.Config.OutboundBound). 0 = socket.DefaultOutboundBound.
	OutboundBound int
	// OutboundHardBound closes a stream whose queued replies (hello,
	// degraded, resync) would pass it. 0 = 4 x OutboundBound.
	OutboundHardBound int
	// MaxStreams caps the open streams of this node (429 beyond). 0 =
	// DefaultSSEMaxStreams.
	MaxStreams int
	// MaxStreamsPerUser caps one uid's streams (429); -1 = no cap; 0 =
	// socket.DefaultMaxConnsPerUser. fanout's presence cap (fanfared's
	// -max-conns-per-user) counts sockets and streams together.
	MaxStreamsPerUser int
	// MaxStreamsPerIP caps the streams of one address (429), counted as
	// socket.IPKey counts it; -1 = no cap; 0 = socket.DefaultMaxConnsPerIP.
	MaxStreamsPerIP int
	// IPv6CapPrefix: see socket.Config.IPv6CapPrefix. 0 = 64.
	IPv6CapPrefix int
	// PerIPExempt lists addresses MaxStreamsPerIP does not apply to.
	PerIPExempt []netip.Prefix
	// CursorGroups bounds the groups of a resume cursor (the id of the
	// events, and Last-Event-ID or ?cursor= on a reconnect); a user in
	// more groups gets a partial cursor and syncs. 0 = 64; at most 1024.
	CursorGroups int
	// Padding is the size of a comment written when a stream opens, for
	// proxies that hold back the first bytes of a response; 0 = none; at
	// most 64 KiB.
	Padding int
	// Retry is the reconnection delay announced to EventSource (the
	// retry field); 0 = 1 s.
	Retry time.Duration
	// Registerer receives the streams' metrics (fanfare_sse_*); nil = not
	// registered.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Validate reports every problem of c.
func (c EventsConfig) Validate() error {
	var errs []error
	if c.Chat == nil {
		errs = append(errs, errors.New("gateway: EventsConfig.Chat is required"))
	}
	for name, d := range map[string]time.Duration{"TicketTTL": c.TicketTTL, "Heartbeat": c.Heartbeat, "WriteTimeout": c.WriteTimeout, "Retry": c.Retry} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("gateway: Events %s must not be negative, got %v", name, d))
		}
	}
	if c.Heartbeat > 0 && c.Heartbeat < sseMinHeartbeat {
		errs = append(errs, fmt.Errorf("gateway: Events Heartbeat must be at least %v, got %v", sseMinHeartbeat, c.Heartbeat))
	}
	for name, v := range map[string]int{"MaxTickets": c.MaxTickets, "OutboundBound": c.OutboundBound, "OutboundHardBound": c.OutboundHardBound,
		"MaxStreams": c.MaxStreams, "CursorGroups": c.CursorGroups, "Padding": c.Padding} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("gateway: Events %s must not be negative, got %d", name, v))
		}
	}
	for name, v := range map[string]int{"MaxStreamsPerUser": c.MaxStreamsPerUser, "MaxStreamsPerIP": c.MaxStreamsPerIP} {
		if v < -1 {
			errs = append(errs, fmt.Errorf("gateway: Events %s must be -1 (no cap) or more, got %d", name, v))
		}
	}
	if c.CursorGroups > MaxSSECursorGroups {
		errs = append(errs, fmt.Errorf("gateway: Events CursorGroups is %d, at most %d", c.CursorGroups, MaxSSECursorGroups))
	}
	if c.Padding > MaxSSEPadding {
		errs = append(errs, fmt.Errorf("gateway: Events Padding is %d, at most %d", c.Padding, MaxSSEPadding))
	}
	if c.IPv6CapPrefix != 0 && (c.IPv6CapPrefix < 16 || c.IPv6CapPrefix > 128) {
		errs = append(errs, fmt.Errorf("gateway: Events IPv6CapPrefix is %d, want 16..128", c.IPv6CapPrefix))
	}
	if c.OutboundBound > 0 && c.OutboundHardBound > 0 && c.OutboundHardBound < c.OutboundBound {
		errs = append(errs, fmt.Errorf("gateway: Events OutboundHardBound %d is below OutboundBound %d", c.OutboundHardBound, c.OutboundBound))
	}
	return errors.Join(errs...)
}

func (c *EventsConfig) fill() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.TicketTTL, DefaultSSETicketTTL)
	def(&c.Heartbeat, DefaultSSEHeartbeat)
	def(&c.MaxLifetime, DefaultSSEMaxLifetime)
	def(&c.WriteTimeout, DefaultSSEWriteTimeout)
	def(&c.Retry, DefaultSSERetry)
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defInt(&c.MaxTickets, DefaultSSEMaxTickets)
	defInt(&c.OutboundBound, socket.DefaultOutboundBound)
	defInt(&c.OutboundHardBound, 4*c.OutboundBound)
	defInt(&c.MaxStreams, DefaultSSEMaxStreams)
	defInt(&c.MaxStreamsPerUser, socket.DefaultMaxConnsPerUser)
	defInt(&c.MaxStreamsPerIP, socket.DefaultMaxConnsPerIP)
	defInt(&c.IPv6CapPrefix, socket.DefaultIPv6CapPrefix)
	defInt(&c.CursorGroups, DefaultSSECursorGroups)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Events serves the event streams: GET /v1/events, POST /v1/events/ticket
// and POST /v1/groups/{gid}/read (Register). Run sweeps the streams'
// deadlines (heartbeat, lifetime, token expiry); each stream is written
// by its own request's goroutine (net/http's), and Chat.Push only queues
// on it.
type Events struct {
	cfg EventsConfig
	ch  *Chat
	tk  *tickets
	log *slog.Logger

	mu      sync.Mutex
	streams map[uint64]*stream
	perUser map[string]int
	perIP   map[netip.Addr]int
	gone    chan struct{} // closed and replaced when the last stream leaves while shutting down

	nextID   atomic.Uint64
	shutdown atomic.Bool

	// Counters, read by the collector.
	opened, deliveries, dropped, resyncs, slowClosed atomic.Uint64
}

// NewEvents returns Events bound to cfg.Chat: from now on Chat.Push and
// Chat.Degraded reach its streams too.
func NewEvents(cfg EventsConfig) (*Events, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fill()
	ev := &Events{cfg: cfg, ch: cfg.Chat, log: cfg.Logger,
		tk:      newTickets(cfg.TicketSecret, cfg.TicketTTL, cfg.MaxTickets),
		streams: make(map[uint64]*stream), perUser: make(map[string]int), perIP: make(map[netip.Addr]int),
		gone: make(chan struct{})}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(ev.collector()); err != nil {
			return nil, fmt.Errorf("gateway: register sse metrics: %w", err)
		}
	}
	cfg.Chat.events = ev
	return ev, nil
}

// Register adds the stream routes to a.
func (ev *Events) Register(a *API) {
	a.HandlePublic("GET /v1/events", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ev.serve(a, w, r) }))
	a.HandleUser("POST /v1/events/ticket", ev.ticket)
	a.HandleUser("POST /v1/groups/{gid}/read", ev.read)
}

// Run sweeps the streams' deadlines until ctx ends.
func (ev *Events) Run(ctx context.Context) error {
	t := time.NewTicker(sseSweepEvery)
	defer t.Stop()
	var tick int
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			ev.sweep(now)
			if tick++; time.Duration(tick)*sseSweepEvery >= ev.cfg.TicketTTL {
				tick = 0
				ev.tk.sweep()
			}
		}
	}
}

// sweep asks idle streams for a heartbeat and ends those past their
// lifetime or token expiry.
func (ev *Events) sweep(now time.Time) {
	n := now.UnixNano()
	hb := int64(ev.cfg.Heartbeat)
	ev.mu.Lock()
	defer ev.mu.Unlock()
	for _, s := range ev.streams {
		switch {
		case s.expires != 0 && n >= s.expires:
			s.finish(socket.ClosePolicyViolation, "token expired")
		case s.deadline != 0 && n >= s.deadline:
			s.finish(socket.CloseNormal, "max lifetime; reconnect")
		case n-s.lastWrite.Load() >= hb:
			s.beat()
		}
	}
}

// Shutdown ends every stream (a close event, 1001) and waits until their
// handlers returned or ctx ends; new streams are refused from now on.
func (ev *Events) Shutdown(ctx context.Context) error {
	ev.shutdown.Store(true)
	for {
		ev.mu.Lock()
		for _, s := range ev.streams {
			s.finish(socket.CloseGoingAway, "server shutting down")
		}
		n, gone := len(ev.streams), ev.gone
		ev.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-gone:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Streams returns the number of open streams.
func (ev *Events) Streams() int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return len(ev.streams)
}

// errStreamCap is the refusal of a stream past a connection cap.
func errStreamCap(what string) error {
	return RetryLater(&clientError{base: ErrRateLimited, msg: what}, DefaultRetryAfter)
}

// admit reserves a stream's place under the node, user and address caps.
func (ev *Events) admit(s *stream) error {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.shutdown.Load() {
		return RetryLater(&clientError{base: ErrNotReady, msg: "server shutting down"}, DefaultRetryAfter)
	}
	if len(ev.streams) >= ev.cfg.MaxStreams {
		return errStreamCap("too many event streams on this node")
	}
	if max := ev.cfg.MaxStreamsPerUser; max > 0 && ev.perUser[s.uid] >= max {
		return errStreamCap("too many event streams for this user")
	}
	if s.ipCounted {
		if ev.perIP[s.ip] >= ev.cfg.MaxStreamsPerIP {
			return errStreamCap("too many event streams from this address")
		}
		ev.perIP[s.ip]++
	}
	ev.perUser[s.uid]++
	ev.streams[s.id] = s
	return nil
}

// release gives back what admit reserved.
func (ev *Events) release(s *stream) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	delete(ev.streams, s.id)
	if n := ev.perUser[s.uid] - 1; n > 0 {
		ev.perUser[s.uid] = n
	} else {
		delete(ev.perUser, s.uid)
	}
	if s.ipCounted {
		if n := ev.perIP[s.ip] - 1; n > 0 {
			ev.perIP[s.ip] = n
		} else {
			delete(ev.perIP, s.ip)
		}
	}
	if len(ev.streams) == 0 && ev.shutdown.Load() {
		close(ev.gone)
		ev.gone = make(chan struct{})
	}
}

// ipCapped reports whether MaxStreamsPerIP applies to a.
func (ev *Events) ipCapped(a netip.Addr) bool {
	if ev.cfg.MaxStreamsPerIP <= 0 || !a.IsValid() {
		return false
	}
	for _, p := range ev.cfg.PerIPExempt {
		if p.Contains(a.Unmap()) {
			return false
		}
	}
	return true
}

// authenticate takes the bearer token of the Authorization header, or
// else the ticket of ?ticket=. A token in the query is refused: URLs end
// up in access logs and proxy caches (docs/protocol.md §14.2).
func (ev *Events) authenticate(r *http.Request) (auth.Claims, error) {
	if tok, ok := bearerToken(r); ok {
		if ev.cfg.Verifier == nil {
			return auth.Claims{}, &clientError{base: ErrUnauthorized, msg: "user authentication is not configured"}
		}
		c, err := ev.cfg.Verifier.Verify(tok)
		if err != nil {
			if !errors.Is(err, auth.ErrInvalidToken) {
				err = fmt.Errorf("%w: %w", auth.ErrInvalidToken, err)
			}
			return auth.Claims{}, err
		}
		return c, nil
	}
	q := r.URL.Query()
	if t := q.Get("ticket"); t != "" {
		return ev.tk.redeem(t)
	}
	if q.Has("token") {
		return auth.Claims{}, &clientError{base: ErrUnauthorized, msg: "a token in the URL is not accepted here; send Authorization: Bearer, or a ticket from POST /v1/events/ticket"}
	}
	return auth.Claims{}, &clientError{base: ErrUnauthorized, msg: "bearer token or ticket required"}
}

// resumeCursor reads the cursor a client resumes from: Last-Event-ID
// (what EventSource sends when it reconnects by itself) over ?cursor=.
func (ev *Events) resumeCursor(r *http.Request) (cursor, bool, error) {
	s := r.Header.Get("Last-Event-ID")
	if s == "" {
		s = r.URL.Query().Get("cursor")
	}
	if s == "" {
		return cursor{max: ev.cfg.CursorGroups, e: make([]cursorEntry, 0, ev.cfg.CursorGroups)}, false, nil
	}
	c, err := parseCursor(s, ev.cfg.CursorGroups)
	return c, err == nil, err
}

// serve is GET /v1/events.
func (ev *Events) serve(a *API, w http.ResponseWriter, r *http.Request) {
	fail := func(err error) { a.writeError(w, r, err, ScopeMember) }
	claims, err := ev.authenticate(r)
	if err != nil {
		fail(err)
		return
	}
	cur, resumed, err := ev.resumeCursor(r)
	if err != nil {
		fail(err)
		return
	}
	switch ev.ch.admit(claims.UID, claims.Tier) {
	case 503:
		fail(RetryLater(&clientError{base: ErrNotReady, msg: "not accepting connections"}, DefaultRetryAfter))
		return
	case 429:
		fail(errStreamCap("connections refused for now"))
		return
	}
	s := ev.newStream(claims, r.RemoteAddr, cur)
	if err := ev.admit(s); err != nil {
		fail(err)
		return
	}
	defer ev.release(s)
	ctx := r.Context()
	eng := ev.ch.eng
	// Without a complete cursor the stream starts from the user's groups
	// as they are before it registers: a later resume then asks for what
	// was committed after this read (at worst again: clients skip seqs
	// they have).
	if !resumed || cur.partial {
		if err := ev.seed(ctx, s); err != nil {
			fail(err)
			return
		}
	}
	hello := socket.NewTextFrame(wire.AppendHello(nil, &wire.Hello{
		UID: s.uid, Node: ev.ch.cfg.Node,
		HeartbeatS:      int64(ev.cfg.Heartbeat / time.Second),
		MaxMessageBytes: int64(ev.ch.cfg.MaxMessageBytes),
	}))
	ms, err := eng.ConnectReady(ctx, s, func() { s.reply(hello) })
	if err != nil {
		if errors.Is(err, presence.ErrTooManyConns) {
			fail(errStreamCap("too many connections for this user"))
		} else {
			ev.log.Warn("sse connect failed", "uid", s.uid, "err", err)
			fail(RetryLater(&clientError{base: ErrNotReady, msg: "try again later"}, DefaultRetryAfter))
		}
		return
	}
	defer eng.Disconnect(s)
	ev.opened.Add(1)

	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{}) // the server's ReadTimeout would end the stream
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache, no-store, no-transform")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer this response
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	head := make([]byte, 0, 32+ev.cfg.Padding)
	if ev.cfg.Padding > 0 {
		head = append(head, ':')
		for range ev.cfg.Padding - 2 {
			head = append(head, ' ')
		}
		head = append(head, '\n')
	}
	head = append(head, "retry: "...)
	head = strconv.AppendInt(head, ev.cfg.Retry.Milliseconds(), 10)
	head = append(head, "\n\n"...)
	if !s.write(rc, w, head, time.Now()) {
		return
	}

	if resumed {
		ev.resume(ctx, s)
	}
	lv := eng.Levels()
	node := lv.Node()
	if node > fanout.L0Normal {
		s.reply(degradedFrame(0, node))
	}
	for _, m := range ms {
		if g := lv.Effective(m.GID); g > node {
			s.reply(degradedFrame(m.GID, g))
		}
	}
	why := s.run(ctx, rc, w)
	if why == "slow consumer" {
		ev.slowClosed.Add(1)
	}
	ev.log.Debug("sse stream ended", "uid", s.uid, "stream", s.id, "cause", why)
}

// seed puts the user's groups and their last seqs into s's cursor, as
// many as it holds (partial beyond).
func (ev *Events) seed(ctx context.Context, s *stream) error {
	limit := ev.cfg.CursorGroups + 1
	entries, err := ev.ch.eng.Sync(ctx, s.uid, 0, limit)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if _, found := s.cur.find(e.GID); !found {
			s.cur.set(e.GID, e.LastSeq)
		}
	}
	return nil
}

// resume queues a resync for every group of s's cursor that moved past
// it: read after s registered, so everything committed before that is
// covered, and everything after it is pushed.
func (ev *Events) resume(ctx context.Context, s *stream) {
	want := slices.Clone(s.cur.e) // the cursor is the request goroutine's; the writer has not started
	if len(want) == 0 {
		return
	}
	after := want[0].gid - 1
	last := want[len(want)-1].gid
	i := 0
	for after < last && i < len(want) {
		entries, err := ev.ch.eng.Sync(ctx, s.uid, after, DefaultSyncPage)
		if err != nil {
			// The client learns nothing is certain: it syncs, as after
			// any reconnect without a cursor.
			ev.log.Warn("sse resume: sync failed", "uid", s.uid, "err", err)
			s.finish(socket.CloseTryAgainLater, "resume failed; reconnect")
			return
		}
		for _, e := range entries {
			for i < len(want) && want[i].gid < e.GID {
				i++
			}
			if i < len(want) && want[i].gid == e.GID && e.LastSeq > want[i].seq {
				s.reply(sseResyncFrame(e.GID, e.LastSeq))
			}
		}
		if len(entries) < DefaultSyncPage {
			break
		}
		after = entries[len(entries)-1].GID
	}
}

// sseResyncFrame is ResyncFrame carrying its group, so that a stream's
// cursor follows it.
func sseResyncFrame(gid, lastSeq int64) *socket.Frame {
	return socket.NewPushFrame(gid, lastSeq, wire.AppendResync(nil, &wire.Resync{GID: gid, LastSeq: lastSeq}))
}

// ticket is POST /v1/events/ticket.
func (ev *Events) ticket(w http.ResponseWriter, r *http.Request) error {
	caller, _ := CallerFrom(r.Context())
	t, notAfter := ev.tk.mint(caller.Claims)
	WriteJSON(w, http.StatusOK, wire.EventTicket{Ticket: t, ExpiresAt: notAfter.UnixMilli()})
	return nil
}

// read is POST /v1/groups/{gid}/read: the read frame over HTTP.
func (ev *Events) read(w http.ResponseWriter, r *http.Request) error {
	gid, err := PathInt64(r, "gid")
	if err != nil {
		return err
	}
	var req wire.ReadRequest
	if err := DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.Seq < 1 {
		return BadRequest("seq must be at least 1")
	}
	caller, _ := CallerFrom(r.Context())
	if err := ev.ch.eng.MarkRead(r.Context(), gid, caller.Claims.UID, req.Seq); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (ev *Events) newStream(c auth.Claims, remote string, cur cursor) *stream {
	s := &stream{ev: ev, id: ev.nextID.Add(1), uid: c.UID, tier: c.Tier, cur: cur, wake: make(chan struct{}, 1)}
	if ap, err := netip.ParseAddrPort(remote); err == nil && ev.ipCapped(ap.Addr()) {
		s.ip, s.ipCounted = socket.IPKey(ap.Addr(), ev.cfg.IPv6CapPrefix), true
	}
	now := time.Now()
	s.lastWrite.Store(now.UnixNano())
	if !c.Expires.IsZero() {
		s.expires = c.Expires.UnixNano()
	}
	if lt := ev.cfg.MaxLifetime; lt > 0 {
		s.deadline = now.Add(lt - rand.N(lt/10+1)).UnixNano()
	}
	return s
}

// deliver queues frames (one push, in seq order) on every stream of ss.
// It runs on a shard worker and never blocks.
func (ev *Events) deliver(frames []*socket.Frame, ss []*stream) {
	var n, dropped uint64
	for _, s := range ss {
		q, d := s.push(frames)
		n += q
		dropped += d
	}
	ev.deliveries.Add(n)
	if dropped > 0 {
		ev.dropped.Add(dropped)
	}
}

// degraded queues f on every stream (gid 0) or on ss.
func (ev *Events) degraded(f *socket.Frame, all bool, ss []fanout.Conn) {
	if all {
		ev.mu.Lock()
		for _, s := range ev.streams {
			s.reply(f)
		}
		ev.mu.Unlock()
		return
	}
	for _, c := range ss {
		if s, ok := c.(*stream); ok {
			s.reply(f)
		}
	}
}

func (ev *Events) collector() prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("fanfare_sse_"+name, help, nil, nil)
	}
	descs := []*prometheus.Desc{
		d("streams", "Server-Sent Events streams open."),
		d("streams_opened_total", "Event streams opened (registered with the engine)."),
		d("frames_written_total", "Push frames queued on event streams."),
		d("pushes_dropped_total", "Pushes dropped by an event stream's outbound bound."),
		d("resyncs_total", "Resync events sent to streams whose pushes were dropped."),
		d("slow_closed_total", "Event streams closed as slow consumers (hard bound or write timeout)."),
	}
	return &statsCollector{descs: descs, collect: func(ch chan<- prometheus.Metric, ds []*prometheus.Desc) {
		g, c := prometheus.GaugeValue, prometheus.CounterValue
		ch <- prometheus.MustNewConstMetric(ds[0], g, float64(ev.Streams()))
		ch <- prometheus.MustNewConstMetric(ds[1], c, float64(ev.opened.Load()))
		ch <- prometheus.MustNewConstMetric(ds[2], c, float64(ev.deliveries.Load()))
		ch <- prometheus.MustNewConstMetric(ds[3], c, float64(ev.dropped.Load()))
		ch <- prometheus.MustNewConstMetric(ds[4], c, float64(ev.resyncs.Load()))
		ch <- prometheus.MustNewConstMetric(ds[5], c, float64(ev.slowClosed.Load()))
	}}
}
