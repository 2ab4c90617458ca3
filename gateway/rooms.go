package gateway

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/limiter"
)

// RoomsConfig configures Rooms. The zero value of every field but Manager
// works.
type RoomsConfig struct {
	Manager *waitroom.Manager
	// Workers run joins (backend calls) off the event loops; 0 = 16.
	Workers int
	// WorkQueue bounds the joins waiting for a worker; past it the socket
	// is closed with 1013; 0 = 4096.
	WorkQueue int
	// JoinTimeout bounds one join; 0 = 5 s.
	JoinTimeout time.Duration
	// Limiter is the node's in-process limiter: it checks
	// limiter.RoomEnter (per user) at the handshake, before any backend
	// call or worker (a denied open answers 429), and the frame limits of
	// room sockets, as ChatConfig.FrameLimiter. nil = none.
	Limiter limiter.Limiter
	Logger  *slog.Logger

	// Tickets signs and verifies room tickets (the HTTP polling path and
	// the room socket's ?ticket=). nil = a random key: tickets then hold on
	// this process only.
	Tickets *RoomTickets
	// Users verifies the user tokens of POST /v1/rooms/{room}/enter; nil
	// = only tickets and anonymous visitors.
	Users Verifier
	// MaxPollers bounds the polling visitors held on this node (past it
	// enter and status answer 503 room_full); 0 = DefaultMaxPollers.
	MaxPollers int
	// PollMin and PollMax bound the suggested poll interval
	// (poll_after_ms); 0 = 1 s and 20 s.
	PollMin, PollMax time.Duration
	// PollGrace is added to twice the suggested interval to give the time
	// without a poll after which a polling visitor is away; 0 = 10 s.
	PollGrace time.Duration
	// SiteMaxAge is the Cache-Control max-age of GET /v1/rooms/{room}/site;
	// 0 = 5 s.
	SiteMaxAge time.Duration
	// ClientIPHeader names the header a trusted reverse proxy sets to the
	// client address (X-Forwarded-For: its last entry is used; X-Real-IP),
	// for the per-address enter limit; "" = the connection's address.
	ClientIPHeader string
	// AccessCookieDomain is the Domain of the access-token cookie set for
	// sites whose token_in is "cookie" ("" = the API's host only).
	AccessCookieDomain string
}

// Rooms serves the waiting-room sockets (/rooms/{room}/ws): it joins the
// user to the room and turns the room's updates into queue, granted and
// rejected frames. Closing the socket of an admitted user ends its session
// and admits the next one.
type Rooms struct {
	m    *waitroom.Manager
	pool *pool
	lim  limiter.Limiter
	log  *slog.Logger

	tickets                     *RoomTickets
	users                       Verifier
	joinTimeout                 time.Duration
	maxPollers                  int
	pollMin, pollMax, pollGrace time.Duration
	siteMaxAge                  time.Duration
	ipHeader, accessDomain      string

	// pmu guards polls and holds (a leaf: nothing is called under it).
	pmu   sync.Mutex
	polls map[pollKey]*poller
	holds map[pollKey]held
}

type roomSession struct {
	mu      sync.Mutex
	closed  bool
	ticket  *waitroom.Ticket
	granted time.Time        // the expiry of the admitted session the socket was told of; zero = none
	checks  [2]limiter.Check // frame limits' scratch (OnMessage runs on the loop, one frame at a time)
}

// NewRooms returns a Rooms; Run starts its workers.
func NewRooms(cfg RoomsConfig) (*Rooms, error) {
	if cfg.Manager == nil {
		return nil, errors.New("gateway: RoomsConfig.Manager is required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 16
	}
	if cfg.WorkQueue <= 0 {
		cfg.WorkQueue = 4096
	}
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Tickets == nil {
		var err error
		if cfg.Tickets, err = NewRoomTickets([]byte(newAnonymousUID()+newAnonymousUID()), 0); err != nil {
			return nil, err
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.PollMin, DefaultPollMin)
	def(&cfg.PollMax, DefaultPollMax)
	def(&cfg.PollGrace, DefaultPollGrace)
	def(&cfg.SiteMaxAge, DefaultSiteMaxAge)
	if cfg.PollMax < cfg.PollMin {
		return nil, errors.New("gateway: RoomsConfig.PollMax is below PollMin")
	}
	if cfg.MaxPollers <= 0 {
		cfg.MaxPollers = DefaultMaxPollers
	}
	return &Rooms{m: cfg.Manager, pool: newPool(cfg.Workers, cfg.WorkQueue, cfg.JoinTimeout), lim: cfg.Limiter, log: cfg.Logger,
		tickets: cfg.Tickets, users: cfg.Users, joinTimeout: cfg.JoinTimeout, maxPollers: cfg.MaxPollers,
		pollMin: cfg.PollMin, pollMax: cfg.PollMax, pollGrace: cfg.PollGrace, siteMaxAge: cfg.SiteMaxAge,
		ipHeader: cfg.ClientIPHeader, accessDomain: cfg.AccessCookieDomain,
		polls: make(map[pollKey]*poller), holds: make(map[pollKey]held)}, nil
}

// Run runs the join workers and the pollers' sweeper until ctx is done.
func (rs *Rooms) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		rs.sweep(ctx)
	}()
	err := rs.pool.run(ctx)
	<-done
	return err
}

// roomOf returns the room name of a /rooms/{room}/ws path.
func roomOf(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/rooms/")
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, "/ws")
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", false
	}
	return name, true
}

// Admit answers 404 for a path that names no room and 429 past the
// user's room_enter limit.
func (rs *Rooms) Admit(r *socket.Request) int {
	name, ok := roomOf(r.Path)
	if !ok {
		return http.StatusNotFound
	}
	if _, ok := rs.m.Config(name); !ok {
		return http.StatusNotFound
	}
	if err := allow(context.Background(), rs.lim, limiter.Check{
		Rule: limiter.RoomEnter, Key: r.Identity.UID, Tier: r.Identity.Tier,
	}); err != nil {
		return http.StatusTooManyRequests
	}
	return 0
}

// OnOpen joins the user to the room off the loop.
func (rs *Rooms) OnOpen(c *socket.Conn) {
	s := &roomSession{}
	c.SetContext(s)
	name, _ := roomOf(c.Path())
	if !rs.pool.submit(func(ctx context.Context) { rs.join(ctx, c, s, name) }) {
		c.Close(socket.CloseTryAgainLater, "server busy")
	}
}

func (rs *Rooms) join(ctx context.Context, c *socket.Conn, s *roomSession, name string) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return
	}
	t, err := rs.m.Join(ctx, name, c.UID(), c.Tier(), func(u waitroom.Update) { rs.deliver(c, s, u) })
	if err != nil {
		rs.log.Warn("room join failed", "room", name, "uid", c.UID(), "err", err)
		_ = c.Write(socket.NewTextFrame(AppendErrorFrame(nil, "", err)))
		c.Close(socket.CloseTryAgainLater, "waiting room unavailable")
		return
	}
	if t == nil { // rejected: the rejected frame went out through deliver
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		t.Close()
		return
	}
	s.ticket = t
	s.mu.Unlock()
}

// deliver encodes one room update for c. Updates of one user are
// serialized by the room.
func (rs *Rooms) deliver(c *socket.Conn, s *roomSession, u waitroom.Update) {
	switch u.Kind {
	case waitroom.UpdateGranted:
		s.mu.Lock()
		s.granted = u.ExpiresAt
		s.mu.Unlock()
	case waitroom.UpdateRejected:
		_ = c.Write(socket.NewTextFrame(rs.frame(nil, u)))
		c.Close(socket.CloseNormal, "rejected")
		return
	case waitroom.UpdateEnded:
		s.mu.Lock()
		s.granted = time.Time{}
		s.mu.Unlock()
		c.Close(socket.CloseNormal, "session ended: "+string(u.Reason))
		return
	}
	if b := rs.frame(nil, u); b != nil {
		_ = c.Write(socket.NewTextFrame(b))
	}
}

// OnMessage answers pings; the room socket takes no other frames.
func (rs *Rooms) OnMessage(c *socket.Conn, msg []byte) {
	f, err := wire.DecodeClient(msg)
	if s, _ := c.Context().(*roomSession); s != nil && !admitFrame(rs.lim, rs.log, c, &s.checks, &f, err) {
		return
	}
	if err != nil {
		_ = c.Write(socket.NewTextFrame(AppendErrorFrame(nil, "", err)))
		return
	}
	if f.Type == wire.TypePing {
		_ = c.Write(socket.NewTextFrame(wire.AppendPong(nil, &wire.Pong{ID: f.ID})))
		return
	}
	_ = c.Write(socket.NewTextFrame(AppendErrorFrame(nil, f.ID, BadRequest("%s frames are not taken on a room socket", f.Type))))
}

// OnClose ends the user's ticket: an admitted session ends and the next
// user is admitted; a waiting user keeps its place for the grace period.
// In a room with a site target an admitted session outlives its socket
// until its access token expires (the user went on to the site).
func (rs *Rooms) OnClose(c *socket.Conn) {
	s, _ := c.Context().(*roomSession)
	if s == nil {
		return
	}
	s.mu.Lock()
	s.closed = true
	t, granted := s.ticket, s.granted
	s.mu.Unlock()
	if t == nil {
		return
	}
	if name, ok := roomOf(c.Path()); ok && granted.After(time.Now()) {
		if cfg, ok := rs.m.Config(name); ok && cfg.Site != nil && cfg.Site.TargetURL != "" {
			rs.hold(name, c.UID(), t, granted)
			return
		}
	}
	t.Close()
}

// Sockets routes each WebSocket connection to the chat handler (/ws) or the
// waiting-room handler (/rooms/{room}/ws) by its path.
type Sockets struct {
	Chat  *Chat
	Rooms *Rooms // nil: room paths answer 404
}

func (s *Sockets) handler(path string) socket.Handler {
	if strings.HasPrefix(path, "/rooms/") {
		if s.Rooms == nil {
			return nil
		}
		return s.Rooms
	}
	return s.Chat
}

// Admit implements socket.Handler.
func (s *Sockets) Admit(r *socket.Request) int {
	h := s.handler(r.Path)
	if h == nil {
		return http.StatusNotFound
	}
	return h.Admit(r)
}

// OnOpen implements socket.Handler.
func (s *Sockets) OnOpen(c *socket.Conn) { s.handler(c.Path()).OnOpen(c) }

// OnMessage implements socket.Handler.
func (s *Sockets) OnMessage(c *socket.Conn, msg []byte) { s.handler(c.Path()).OnMessage(c, msg) }

// OnClose implements socket.Handler.
func (s *Sockets) OnClose(c *socket.Conn) { s.handler(c.Path()).OnClose(c) }

var _ socket.Handler = (*Sockets)(nil)
var _ socket.Handler = (*Rooms)(nil)

// RoomRoutes registers the waiting-room admin endpoints on a, and the
// public key set access tokens verify with (GET /v1/rooms/jwks, an
// addition, docs/protocol.md §8.5: protected services fetch it by URL).
func RoomRoutes(a *API, rs *Rooms) {
	a.HandleAdmin("POST /admin/v1/rooms", rs.upsert)
	a.HandleAdmin("GET /admin/v1/rooms/{room}", rs.status)
	a.HandleAdmin("GET /admin/v1/rooms", rs.list)
	a.HandlePublic("GET /v1/rooms/jwks", http.HandlerFunc(rs.jwks))
	public := func(pattern string, h HandlerFunc) { a.HandlePublic(pattern, a.limitBody(a.withErrors(h))) }
	public("GET /v1/rooms/{room}/site", rs.site)
	public("POST /v1/rooms/{room}/enter", rs.enter)
	public("GET /v1/rooms/{room}/status", rs.pollStatus)
	public("POST /v1/rooms/{room}/leave", rs.leave)
	public("GET /rooms/{room}/verify", rs.verify)
}

// jwks answers the JSON Web Key Set of the EdDSA key signing access
// tokens; 404 when they are signed with a shared secret (HS256), which is
// never published.
func (rs *Rooms) jwks(w http.ResponseWriter, r *http.Request) {
	keys := rs.m.TokenKeys()
	if keys == nil {
		WriteError(w, &clientError{base: ErrNotFound, msg: "access tokens are signed with a shared secret (-room-token-secret): no public key; set -room-token-key for EdDSA"}, ScopeAdmin)
		return
	}
	w.Header().Set("Content-Type", "application/jwk-set+json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(keys)
}

func secs(s int64) time.Duration { return time.Duration(s) * time.Second }

// upsert creates or updates a room; zero fields keep the room's current
// value (the default on create).
func (rs *Rooms) upsert(w http.ResponseWriter, r *http.Request) error {
	var req wire.RoomConfig
	if err := DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.Room == "" {
		return BadRequest("room: required")
	}
	rc, ok := rs.m.Config(req.Room)
	if !ok {
		rc = waitroom.RoomConfig{Name: req.Room}
	}
	if req.MaxActive < 0 || req.AdmitRate < 0 || req.MaxWaitS < 0 || req.GraceS < 0 || req.TargetWaitS < 0 ||
		req.VIPShareCap < 0 || req.AccessTokenTTLS < 0 || req.HardTimeoutS < 0 {
		return BadRequest("room settings must not be negative")
	}
	if req.MaxActive > 0 {
		rc.MaxActive = int(req.MaxActive)
	}
	if req.AdmitRate > 0 {
		rc.AdmitRate = req.AdmitRate
	}
	if req.MaxWaitS > 0 {
		rc.MaxWait = secs(req.MaxWaitS)
	}
	if req.GraceS > 0 {
		rc.Grace = secs(req.GraceS)
	}
	if req.TargetWaitS > 0 {
		rc.TargetWait = secs(req.TargetWaitS)
	}
	if req.VIPShareCap > 0 {
		rc.VIPShareCap = req.VIPShareCap
	}
	if req.AccessTokenTTLS > 0 {
		rc.AccessTokenTTL = secs(req.AccessTokenTTLS)
	}
	if req.HardTimeoutS > 0 {
		rc.HardTimeout = secs(req.HardTimeoutS)
	}
	if req.VIPAdmitShare != nil {
		rc.VIPAdmitShare = *req.VIPAdmitShare
	}
	if req.SmoothingS != 0 {
		rc.Smoothing = time.Duration(req.SmoothingS * float64(time.Second))
	}
	if req.VIPBiasS != nil {
		rc.VIPBias = make(map[int]time.Duration, len(req.VIPBiasS))
		for tier, s := range req.VIPBiasS {
			if tier < 1 || tier > waitroom.MaxTier || s < 0 {
				return BadRequest("vip_bias_s: VIP tiers (the token's lvl) 1-%d, seconds >= 0", waitroom.MaxTier)
			}
			rc.VIPBias[tier] = time.Duration(s * float64(time.Second))
		}
	}
	if req.Site != nil {
		rc.Site = siteFromBody(req.Site)
	}
	for _, f := range []struct {
		name string
		in   *string
		out  *time.Time
	}{{"starts_at", req.StartsAt, &rc.StartsAt}, {"ends_at", req.EndsAt, &rc.EndsAt}} {
		switch {
		case f.in == nil:
		case *f.in == "":
			*f.out = time.Time{}
		case len(*f.in) > 64:
			return BadRequest("%s: RFC 3339 time, at most 64 bytes", f.name)
		default:
			t, err := time.Parse(time.RFC3339, *f.in)
			if err != nil {
				return BadRequest("%s: RFC 3339 time (e.g. 2026-12-24T18:00:00Z)", f.name)
			}
			*f.out = t.Truncate(time.Second)
		}
	}
	switch req.State {
	case "":
	case wire.RoomOpen, wire.RoomClosed:
		rc.State = waitroom.RoomState(req.State)
	default:
		return BadRequest("state: must be open or closed")
	}
	out, err := rs.m.Upsert(r.Context(), rc)
	if err != nil {
		if errors.Is(err, waitroom.ErrUnavailable) || errors.Is(err, waitroom.ErrClosed) {
			return err
		}
		return BadRequest("%v", err)
	}
	WriteJSON(w, http.StatusOK, roomConfigBody(out))
	return nil
}

func roomConfigBody(c waitroom.RoomConfig) wire.RoomConfig {
	bias := make(map[int]float64, len(c.VIPBias))
	for lvl, d := range c.VIPBias {
		bias[lvl] = d.Seconds()
	}
	return wire.RoomConfig{
		Room: c.Name, MaxActive: int64(c.MaxActive), AdmitRate: c.AdmitRate, MaxWaitS: int64(c.MaxWait / time.Second),
		GraceS: int64(c.Grace / time.Second), VIPBiasS: bias, VIPShareCap: c.VIPShareCap,
		TargetWaitS: int64(c.TargetWait / time.Second), State: string(c.State), SmoothingS: c.Smoothing.Seconds(),
		AccessTokenTTLS: int64(c.AccessTokenTTL / time.Second), HardTimeoutS: int64(c.HardTimeout / time.Second),
		VIPAdmitShare: &c.VIPAdmitShare, Site: siteOut(c.Site), StartsAt: rfc3339(c.StartsAt), EndsAt: rfc3339(c.EndsAt),
	}
}

func siteOut(s *waitroom.Site) *wire.Site {
	if s == nil {
		return nil
	}
	b := siteBody(s)
	return &b
}

// rfc3339 is t for a room config answer; nil (absent) when zero.
func rfc3339(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339)
	return &s
}

// unixMilli is t in Unix ms, 0 (absent) when zero.
func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func roomStatusBody(st waitroom.RoomStatus) wire.RoomStatus {
	return wire.RoomStatus{
		Room: st.Config.Name, State: string(st.Config.State), Depth: st.Waiting, Active: st.Active,
		MaxActive: int64(st.Config.MaxActive), AdmitRate: st.Config.AdmitRate, AdmissionRate: st.Rate,
		LMax: st.LMax, Level: int(st.Degradation), Away: st.Away, VIPWaiting: st.VIPWaiting, Overdue: st.Overdue,
		Local: st.Local, Alert: st.Alert, WaitingByTier: append([]int64(nil), st.WaitingByTier[:]...),
		Phase: st.Config.PhaseAt(st.At.Unix()), StartsAt: unixMilli(st.Config.StartsAt), EndsAt: unixMilli(st.Config.EndsAt),
		PreQueue: st.PreQueue, MaxWaitViolations: st.MaxWaitViolations, Owed: st.Owed, Capacity: st.Capacity,
		MinSlack: minSlack(st.MinSlack), AdmittedByTier: append([]int64(nil), st.AdmittedByTier[:]...),
		WaitByTier: waitSummaries(st.WaitByTier[:]),
	}
}

func waitSummaries(ws []waitroom.WaitStats) []wire.WaitSummary {
	out := make([]wire.WaitSummary, len(ws))
	for i, w := range ws {
		out[i] = wire.WaitSummary{N: w.Count, P50S: w.P50.Seconds(), P90S: w.P90.Seconds(), P99S: w.P99.Seconds(), MaxS: w.Max.Seconds()}
	}
	return out
}

func minSlack(v int64) *int64 {
	if v == math.MaxInt64 {
		return nil
	}
	return &v
}

func (rs *Rooms) status(w http.ResponseWriter, r *http.Request) error {
	st, err := rs.m.Status(r.Context(), r.PathValue("room"))
	if err != nil {
		return err
	}
	WriteJSON(w, http.StatusOK, roomStatusBody(st))
	return nil
}

// MaxRoomList bounds GET /admin/v1/rooms: the rooms past it (by name)
// are left out and the answer says so (truncated).
const MaxRoomList = 100

// roomList is GET /admin/v1/rooms (an addition, docs/protocol.md §9.15).
type roomList struct {
	Rooms     []wire.RoomStatus `json:"rooms"`
	Truncated bool              `json:"truncated,omitempty"`
}

// list answers every room's status (as GET /admin/v1/rooms/{room}), by
// name, at most MaxRoomList of them: one backend read per room.
func (rs *Rooms) list(w http.ResponseWriter, r *http.Request) error {
	cfgs := rs.m.Rooms()
	slices.SortFunc(cfgs, func(a, b waitroom.RoomConfig) int { return strings.Compare(a.Name, b.Name) })
	out := roomList{Rooms: make([]wire.RoomStatus, 0, min(len(cfgs), MaxRoomList))}
	if len(cfgs) > MaxRoomList {
		cfgs, out.Truncated = cfgs[:MaxRoomList], true
	}
	for _, c := range cfgs {
		st, err := rs.m.Status(r.Context(), c.Name)
		if errors.Is(err, waitroom.ErrUnknownRoom) {
			continue // deleted since the list was read
		}
		if err != nil {
			return err
		}
		out.Rooms = append(out.Rooms, roomStatusBody(st))
	}
	WriteJSON(w, http.StatusOK, out)
	return nil
}
