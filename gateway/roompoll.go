package gateway

import (
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/limiter"
)

// The HTTP polling path of the waiting rooms (docs/protocol.md §8.8):
// POST /v1/rooms/{room}/enter, GET /v1/rooms/{room}/status and POST
// /v1/rooms/{room}/leave. A polling visitor is held on this node by a
// poller: one waitroom.Ticket whose deliver callback keeps the latest
// frame, so a status poll answers from memory, without a backend call.
// The visitor counts as connected while polls arrive within
// pollTimeout(poll_after) of the previous answer; past it the sweeper
// closes the ticket (Ticket.Close, the same as a closed socket: a waiting
// user is away and keeps its place for the room's grace; an admitted
// session ends, except in a room with a site target, where it lasts until
// its access token expires: the user is on the site, not on the page).
//
// In cluster mode a visitor whose polls land on another node is joined
// there too (Join is idempotent and keeps the place), and the room's entry
// lists both nodes as holding the user. When the first node's poller
// times out, its Disconnect only takes that node off the list: the user
// stays waiting (or admitted) as long as any node holds it, so a visitor
// moving between nodes, or polling them in turn, is never away nor passed
// over (docs/operations.md, "Several nodes").

// Polling defaults (RoomsConfig).
const (
	DefaultMaxPollers   = 100_000
	DefaultPollMin      = time.Second
	DefaultPollMax      = 20 * time.Second
	DefaultPollGrace    = 10 * time.Second
	DefaultSiteMaxAge   = 5 * time.Second
	maxRoomRequestBytes = 1024
	// headPollers is how many users at the head of a queue poll every PollMin.
	headPollers = 10
	// sweepEvery is how often the sweeper looks for pollers past their
	// timeout (a visitor is away at most this much later than its timeout).
	sweepEvery = time.Second
	// ticketHeader carries a ticket on the polling routes.
	ticketHeader = "X-Fanfare-Ticket"
	// accessHeader carries an access token to /rooms/{room}/verify.
	accessHeader = "X-Fanfare-Access"
	// ticketCookiePrefix + room is the ticket cookie's name.
	ticketCookiePrefix = "fanfare_ticket_"
)

// errPollersFull: the node holds its maximum of polling visitors.
var errPollersFull = RetryLater(&clientError{base: waitroom.ErrRoomFull, msg: "this node holds its maximum of polling visitors"}, 5*time.Second)

type pollKey struct{ room, uid string }

// poller is one polling visitor of one room on this node. joinMu
// serializes its joins (concurrent polls of one visitor share one); mu
// guards the rest and is a leaf taken inside waitroom's member.mu (deliver).
type poller struct {
	key    pollKey
	joinMu sync.Mutex

	mu        sync.Mutex
	t         *waitroom.Ticket
	u         waitroom.Update // latest frame
	gone      bool            // rejected, ended or closed: the next poll joins again
	removed   bool            // dropped from Rooms.polls
	deadline  time.Time       // away past it
	holdUntil time.Time       // an admitted session in a site room: kept until its expiry
}

func (p *poller) deliver(u waitroom.Update) {
	p.mu.Lock()
	switch u.Kind {
	case waitroom.UpdateQueue, waitroom.UpdateGranted:
		p.u = u
	case waitroom.UpdateRejected:
		p.u, p.gone = u, true
	case waitroom.UpdateEnded:
		p.gone, p.holdUntil = true, time.Time{}
	}
	p.mu.Unlock()
}

// held is an admitted socket session of a site room whose socket closed:
// its ticket stays open until the access token expires (see roompoll.go).
type held struct {
	t       *waitroom.Ticket
	expires time.Time
}

// pollAfter is the suggested interval before the next poll for u:
// ETA/20 between PollMin and PollMax while waiting (near the head polls
// come every PollMin, deep in the queue every PollMax), PollMax/2 while
// paused or scheduled, PollMin for the headPollers users at the head
// (whatever the status: a new room is paused until its first admission),
// the retry hint after a refusal; jittered by ±20%
// so that visitors who entered together do not poll together.
func (rs *Rooms) pollAfter(u waitroom.Update) time.Duration {
	d := rs.pollMax / 2
	switch u.Kind {
	case waitroom.UpdateQueue:
		switch {
		case u.Ahead < headPollers: // the grant may come at any admission step
			d = rs.pollMin
		case u.Status == waitroom.StatusWaiting:
			d = u.ETA / 20
		}
	case waitroom.UpdateGranted:
		d = rs.pollMax
	case waitroom.UpdateRejected:
		d = max(u.RetryAfter, rs.pollMin)
	}
	d = min(max(d, rs.pollMin), rs.pollMax)
	j := 0.8 + 0.4*rand.Float64()
	return time.Duration(float64(d) * j).Round(time.Millisecond)
}

// pollTimeout is how long after an answer a visitor stays connected
// without polling: twice the suggested interval plus PollGrace.
func (rs *Rooms) pollTimeout(after time.Duration) time.Duration { return 2*after + rs.pollGrace }

// frame encodes u as the room socket's frame; granted frames of a room
// with a site carry redirect_url. Ended has no frame (nil).
func (rs *Rooms) frame(dst []byte, u waitroom.Update) []byte {
	switch u.Kind {
	case waitroom.UpdateQueue:
		q := queueFrame(u, time.Now()) // scheduled frames carry starts_at, starts_in_s
		return wire.AppendQueue(dst, &q)
	case waitroom.UpdateGranted:
		g := wire.Granted{Room: u.Room, AccessToken: u.AccessToken, ExpiresAt: u.ExpiresAt.UnixMilli()}
		if cfg, ok := rs.m.Config(u.Room); ok && cfg.Site != nil && cfg.Site.TargetURL != "" {
			g.RedirectURL = redirectURL(cfg.Site, u.AccessToken)
		}
		return wire.AppendGranted(dst, &g)
	case waitroom.UpdateRejected:
		return appendRejected(dst, u.Room, u.Reject.Err(u.RetryAfter))
	}
	return nil
}

// redirectURL is the site's target with the access token in the query
// (token_in "query") or as it is (token_in "cookie": the token travels in
// the cookie the polling answer sets).
func redirectURL(s *waitroom.Site, token string) string {
	if s.CookieToken() || token == "" {
		return s.TargetURL
	}
	u, err := url.Parse(s.TargetURL)
	if err != nil { // validated when stored; keep the target rather than fail the grant
		return s.TargetURL
	}
	q := u.Query()
	q.Set(s.Name(), token)
	u.RawQuery = q.Encode()
	return u.String()
}

// clientIP is the limiter key of a request's address: the address, IPv6
// by /64 (one host holds a /64). Behind a reverse proxy it is the
// proxy's unless ClientIPHeader names the header the proxy sets.
func (rs *Rooms) clientIP(r *http.Request) string {
	raw := r.RemoteAddr
	if rs.ipHeader != "" {
		if v := r.Header.Get(rs.ipHeader); v != "" {
			// X-Forwarded-For: the last hop is the one our proxy added.
			if i := strings.LastIndexByte(v, ','); i >= 0 {
				v = v[i+1:]
			}
			raw = strings.TrimSpace(v)
		}
	}
	a, err := netip.ParseAddr(raw)
	if err != nil {
		host, _, serr := net.SplitHostPort(raw)
		if serr != nil {
			return raw
		}
		if a, err = netip.ParseAddr(host); err != nil {
			return host
		}
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// ticketFrom reads a ticket: the X-Fanfare-Ticket header, else the cookie.
func ticketFrom(r *http.Request, room string) string {
	if t := r.Header.Get(ticketHeader); t != "" {
		return t
	}
	if c, err := r.Cookie(ticketCookiePrefix + room); err == nil {
		return c.Value
	}
	return ""
}

func secureRequest(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (rs *Rooms) setTicketCookie(w http.ResponseWriter, r *http.Request, room, tok string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: ticketCookiePrefix + room, Value: tok, Path: "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: secureRequest(r)})
}

// roomSiteOf returns a room's configuration: ErrUnknownRoom when none.
func (rs *Rooms) roomSiteOf(name string) (waitroom.RoomConfig, error) {
	cfg, ok := rs.m.Config(name)
	if !ok {
		return waitroom.RoomConfig{}, waitroom.ErrUnknownRoom
	}
	return cfg, nil
}

// enter is POST /v1/rooms/{room}/enter.
func (rs *Rooms) enter(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("room")
	if r.ContentLength > maxRoomRequestBytes {
		return &http.MaxBytesError{Limit: maxRoomRequestBytes}
	}
	cfg, err := rs.roomSiteOf(name)
	if err != nil {
		return err
	}
	if err := allow(r.Context(), rs.lim, limiter.Check{Rule: limiter.RoomEnterIP, Key: rs.clientIP(r)}); err != nil {
		return err
	}
	now := time.Now()
	var id RoomTicket
	switch tok, hasBearer := bearerToken(r); {
	case hasBearer:
		if rs.users == nil {
			return &clientError{base: ErrUnauthorized, msg: "user authentication is not configured"}
		}
		c, err := rs.users.Verify(tok)
		if err != nil {
			return &clientError{base: ErrUnauthorized, msg: "invalid or expired user token"}
		}
		id = RoomTicket{Room: name, UID: c.UID, Tier: c.Tier}
	default:
		if t := ticketFrom(r, name); t != "" {
			if id, err = rs.tickets.Verify(t, name, now); err == nil && (!id.Anonymous || cfg.Site.AllowsAnonymous()) {
				break
			}
		}
		if !cfg.Site.AllowsAnonymous() {
			return &clientError{base: ErrUnauthorized, msg: "a user token (Authorization: Bearer) or a ticket is required: the room takes no anonymous visitors"}
		}
		id = RoomTicket{Room: name, UID: newAnonymousUID(), Anonymous: true}
	}
	if err := allow(r.Context(), rs.lim, limiter.Check{Rule: limiter.RoomEnter, Key: id.UID, Tier: id.Tier}); err != nil {
		return err
	}
	return rs.answerPoll(w, r, id, rs.tickets.Sign(id, now))
}

// status is GET /v1/rooms/{room}/status.
func (rs *Rooms) pollStatus(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("room")
	cfg, err := rs.roomSiteOf(name)
	if err != nil {
		return err
	}
	now := time.Now()
	id, err := rs.tickets.Verify(ticketFrom(r, name), name, now)
	if err != nil || (id.Anonymous && !cfg.Site.AllowsAnonymous()) {
		return ErrBadTicket
	}
	if err := allow(r.Context(), rs.lim, limiter.Check{Rule: limiter.RoomPoll, Key: id.UID, Tier: id.Tier}); err != nil {
		return err
	}
	renew := ""
	if id.Expires.Sub(now) < rs.tickets.TTL()/2 {
		renew = rs.tickets.Sign(id, now)
	}
	return rs.answerPoll(w, r, id, renew)
}

// answerPoll joins (or finds) the visitor's poller and answers its latest
// frame. tok, when set, is a new ticket to hand out.
func (rs *Rooms) answerPoll(w http.ResponseWriter, r *http.Request, id RoomTicket, tok string) error {
	ctx, cancel := context.WithTimeout(r.Context(), rs.joinTimeout)
	defer cancel()
	p, err := rs.pollerFor(ctx, id)
	if err != nil {
		return err
	}
	now := time.Now()
	p.mu.Lock()
	u := p.u
	after := rs.pollAfter(u)
	if !p.gone {
		p.deadline = now.Add(rs.pollTimeout(after))
		if u.Kind == waitroom.UpdateGranted {
			if cfg, ok := rs.m.Config(id.Room); ok && cfg.Site != nil && cfg.Site.TargetURL != "" {
				p.holdUntil = u.ExpiresAt
			}
		}
	}
	p.mu.Unlock()
	if u.Kind == waitroom.UpdateGranted && u.AccessToken != "" {
		if cfg, ok := rs.m.Config(id.Room); ok && cfg.Site.CookieToken() {
			http.SetCookie(w, &http.Cookie{Name: cfg.Site.Name(), Value: u.AccessToken, Path: "/", Domain: rs.accessDomain,
				Expires: u.ExpiresAt, HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: secureRequest(r)})
		}
	}
	if tok != "" {
		rs.setTicketCookie(w, r, id.Room, tok, int(rs.tickets.TTL()/time.Second))
	}
	w.Header().Set("Cache-Control", "no-store")
	body := make([]byte, 0, 512)
	body = append(body, '{')
	if tok != "" {
		body = append(body, `"ticket":`...)
		body = strconv.AppendQuote(body, tok)
		body = append(body, ',')
	}
	body = append(body, `"poll_after_ms":`...)
	body = strconv.AppendInt(body, after.Milliseconds(), 10)
	body = append(body, `,"frame":`...)
	body = rs.frame(body, u)
	body = append(body, '}')
	WriteRawJSON(w, http.StatusOK, body)
	return nil
}

// pollerFor returns id's live poller on this node, joining the room when
// there is none (or its last ticket is gone): the first frame is in it.
func (rs *Rooms) pollerFor(ctx context.Context, id RoomTicket) (*poller, error) {
	key := pollKey{id.Room, id.UID}
	for {
		rs.pmu.Lock()
		p := rs.polls[key]
		if p == nil {
			if len(rs.polls) >= rs.maxPollers {
				rs.pmu.Unlock()
				rs.log.Warn("room poll refused: node at its polling visitors' bound", "room", id.Room, "max_pollers", rs.maxPollers)
				return nil, errPollersFull
			}
			p = &poller{key: key, deadline: time.Now().Add(rs.pollTimeout(rs.pollMax))}
			rs.polls[key] = p
		}
		rs.pmu.Unlock()
		p.joinMu.Lock()
		p.mu.Lock()
		removed, live := p.removed, p.t != nil && !p.gone
		p.mu.Unlock()
		if removed { // swept while we waited: start over
			p.joinMu.Unlock()
			continue
		}
		if live {
			p.joinMu.Unlock()
			return p, nil
		}
		t, err := rs.m.Join(ctx, id.Room, id.UID, id.Tier, p.deliver)
		p.mu.Lock()
		if err == nil {
			if old := p.t; old != nil && old != t {
				defer old.Close()
			}
			p.t = t
			if t != nil {
				p.gone = false
			}
		}
		p.mu.Unlock()
		p.joinMu.Unlock()
		if err != nil {
			rs.dropPoller(p)
			return nil, err
		}
		return p, nil
	}
}

// dropPoller removes p from the node and closes its ticket.
func (rs *Rooms) dropPoller(p *poller) {
	rs.pmu.Lock()
	if rs.polls[p.key] == p {
		delete(rs.polls, p.key)
	}
	rs.pmu.Unlock()
	p.mu.Lock()
	p.removed = true
	t := p.t
	p.t = nil
	p.mu.Unlock()
	if t != nil {
		t.Close()
	}
}

// leave is POST /v1/rooms/{room}/leave: the visitor leaves the queue (or
// ends its admitted session) now; the ticket cookie is cleared.
func (rs *Rooms) leave(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("room")
	if r.ContentLength > maxRoomRequestBytes {
		return &http.MaxBytesError{Limit: maxRoomRequestBytes}
	}
	if _, err := rs.roomSiteOf(name); err != nil {
		return err
	}
	id, err := rs.tickets.Verify(ticketFrom(r, name), name, time.Now())
	if err != nil {
		return ErrBadTicket
	}
	if err := allow(r.Context(), rs.lim, limiter.Check{Rule: limiter.RoomPoll, Key: id.UID, Tier: id.Tier}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), rs.joinTimeout)
	defer cancel()
	key := pollKey{id.Room, id.UID}
	rs.pmu.Lock()
	p := rs.polls[key]
	rs.pmu.Unlock()
	var t *waitroom.Ticket
	if p != nil {
		p.joinMu.Lock()
		p.mu.Lock()
		t, p.t, p.gone = p.t, nil, true
		p.mu.Unlock()
		p.joinMu.Unlock()
		rs.dropPoller(p)
	}
	if t == nil { // not polling here: join to get a handle on the entry, then leave
		if t, err = rs.m.Join(ctx, id.Room, id.UID, id.Tier, func(waitroom.Update) {}); err != nil {
			return err
		}
	}
	if t != nil {
		if err := t.Leave(ctx); err != nil {
			return err
		}
	}
	rs.setTicketCookie(w, r, name, "", -1)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// site is GET /v1/rooms/{room}/site: what the queue page renders.
func (rs *Rooms) site(w http.ResponseWriter, r *http.Request) error {
	cfg, err := rs.roomSiteOf(r.PathValue("room"))
	if err != nil {
		return err
	}
	out := wire.RoomSite{Room: cfg.Name, State: string(cfg.State), Phase: cfg.PhaseAt(time.Now().Unix()),
		StartsAt: unixMilli(cfg.StartsAt), EndsAt: unixMilli(cfg.EndsAt)}
	if cfg.State == waitroom.StateClosed {
		out.Phase = waitroom.PhaseEnded
	}
	if cfg.Site != nil {
		out.Site = siteBody(cfg.Site)
	}
	w.Header().Set("Cache-Control", "public, max-age="+strconv.Itoa(int(rs.siteMaxAge/time.Second)))
	WriteJSON(w, http.StatusOK, out)
	return nil
}

// verify is GET /rooms/{room}/verify, for reverse proxies (nginx
// auth_request): 204 with X-Fanfare-User when the request carries a valid
// access token for the room, 401 otherwise. The token is read from
// Authorization: Bearer, X-Fanfare-Access, the site's cookie, or the
// site's query parameter of X-Original-URI (the URI nginx passes).
func (rs *Rooms) verify(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("room")
	cfg, err := rs.roomSiteOf(name)
	if err != nil {
		return err
	}
	tokName := cfg.Site.Name()
	tok, _ := bearerToken(r)
	if tok == "" {
		tok = r.Header.Get(accessHeader)
	}
	if tok == "" {
		if c, err := r.Cookie(tokName); err == nil {
			tok = c.Value
		}
	}
	if tok == "" {
		if orig := r.Header.Get("X-Original-URI"); orig != "" {
			if u, err := url.ParseRequestURI(orig); err == nil {
				tok = u.Query().Get(tokName)
			}
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	if tok == "" || len(tok) > 4096 {
		return &clientError{base: ErrUnauthorized, msg: "no access token"}
	}
	c, err := rs.m.VerifyAccess(tok, name)
	if err != nil {
		return &clientError{base: ErrUnauthorized, msg: "invalid, expired or other room's access token"}
	}
	w.Header().Set("X-Fanfare-User", c.UID())
	w.Header().Set("X-Fanfare-Expires", strconv.FormatInt(c.ExpiresAt.Unix(), 10))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// AuthenticateTicket implements socket.TicketAuthenticator: the room
// socket's ?ticket= credential, the identity of the polling path.
func (rs *Rooms) AuthenticateTicket(path, ticket string) (socket.Identity, error) {
	name, ok := roomOf(path)
	if !ok || rs.tickets == nil {
		return socket.Identity{}, socket.ErrUnauthorized
	}
	id, err := rs.tickets.Verify(ticket, name, time.Now())
	if err != nil {
		return socket.Identity{}, socket.ErrUnauthorized
	}
	if id.Anonymous {
		if cfg, ok := rs.m.Config(name); !ok || !cfg.Site.AllowsAnonymous() {
			return socket.Identity{}, socket.ErrUnauthorized
		}
	}
	return socket.Identity{UID: id.UID, Tier: id.Tier}, nil
}

// sweep closes the pollers whose visitors stopped polling and the held
// sessions past their expiry, once per sweepEvery until ctx ends.
func (rs *Rooms) sweep(ctx context.Context) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	var stale []*poller
	var expired []pollKey
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		stale, expired = stale[:0], expired[:0]
		rs.pmu.Lock()
		for _, p := range rs.polls {
			p.mu.Lock()
			if p.gone || (now.After(p.deadline) && !now.Before(p.holdUntil)) {
				stale = append(stale, p)
			}
			p.mu.Unlock()
		}
		for k, h := range rs.holds {
			if !now.Before(h.expires) {
				expired = append(expired, k)
			}
		}
		var closing []*waitroom.Ticket
		for _, k := range expired {
			closing = append(closing, rs.holds[k].t)
			delete(rs.holds, k)
		}
		rs.pmu.Unlock()
		for _, t := range closing {
			t.Close()
		}
		for _, p := range stale {
			if !p.joinMu.TryLock() { // a poll is joining it right now
				continue
			}
			p.mu.Lock()
			still := p.gone || (now.After(p.deadline) && !now.Before(p.holdUntil))
			p.mu.Unlock()
			if still {
				rs.dropPoller(p)
			}
			p.joinMu.Unlock()
		}
	}
}

// hold keeps an admitted session's ticket open after its socket closed
// (a site room: the user went on to the site) until expires.
func (rs *Rooms) hold(room, uid string, t *waitroom.Ticket, expires time.Time) {
	k := pollKey{room, uid}
	rs.pmu.Lock()
	old, had := rs.holds[k]
	rs.holds[k] = held{t: t, expires: expires}
	rs.pmu.Unlock()
	if had && old.t != t {
		old.t.Close()
	}
}

// PollStats are the node's polling visitors and held sessions.
type PollStats struct{ Pollers, Held int }

// PollStats returns the node's polling visitors and held sessions.
func (rs *Rooms) PollStats() PollStats {
	rs.pmu.Lock()
	defer rs.pmu.Unlock()
	return PollStats{Pollers: len(rs.polls), Held: len(rs.holds)}
}

func siteBody(s *waitroom.Site) wire.Site {
	out := wire.Site{TargetURL: s.TargetURL, TokenIn: s.TokenIn, TokenName: s.TokenName, Anonymous: s.Anonymous,
		Title: s.Title, Text: s.Text, LogoURL: s.LogoURL, Strings: s.Strings, DefaultLang: s.DefaultLang}
	if s.Colors != (waitroom.SiteColors{}) {
		c := wire.SiteColors(s.Colors)
		out.Colors = &c
	}
	return out
}

func siteFromBody(b *wire.Site) *waitroom.Site {
	s := &waitroom.Site{TargetURL: b.TargetURL, TokenIn: b.TokenIn, TokenName: b.TokenName, Anonymous: b.Anonymous,
		Title: b.Title, Text: b.Text, LogoURL: b.LogoURL, Strings: b.Strings, DefaultLang: b.DefaultLang}
	if b.Colors != nil {
		s.Colors = waitroom.SiteColors(*b.Colors)
	}
	if s.Empty() {
		return nil
	}
	return s
}
