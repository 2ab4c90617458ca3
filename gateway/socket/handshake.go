package socket

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/gobwas/ws"
	"github.com/panjf2000/gnet/v2"
)

var crlfcrlf = []byte("\r\n\r\n")

// Handshake refusals. Built once: they are immutable.
var (
	errNotFound     = reject(http.StatusNotFound, "no WebSocket endpoint at this path", "")
	errBadURI       = reject(http.StatusBadRequest, "malformed request URI", "")
	errForbidden    = reject(http.StatusForbidden, "origin not allowed", "")
	errUnauthorized = reject(http.StatusUnauthorized, "missing, invalid or expired token", "WWW-Authenticate: Bearer\r\n")
	errNodeFull     = reject(http.StatusTooManyRequests, "node connection limit reached", "Retry-After: 1\r\n")
	errUserFull     = reject(http.StatusTooManyRequests, "too many connections for this user", "Retry-After: 1\r\n")
	errDraining     = reject(http.StatusServiceUnavailable, "server shutting down", "Retry-After: 1\r\n")
)

func reject(status int, reason, header string) error {
	opts := []ws.RejectOption{ws.RejectionStatus(status), ws.RejectionReason(reason)}
	if header != "" {
		opts = append(opts, ws.RejectionHeader(ws.HandshakeHeaderString(header)))
	}
	return ws.RejectConnectionError(opts...)
}

// ipFullResponse refuses a connection at accept, over MaxConnsPerIP.
var ipFullResponse = []byte("HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nRetry-After: 1\r\n" +
	"Content-Type: text/plain\r\nContent-Length: 39\r\n\r\ntoo many connections from this address\n")

// statusResponses are the plain answers sent without gobwas (timeouts,
// oversized headers, Admit refusals).
var statusResponses = map[int][]byte{}

func init() {
	for _, st := range []int{400, 401, 403, 404, 408, 429, 431, 500, 503} {
		extra := ""
		if st == 429 || st == 503 {
			extra = "Retry-After: 1\r\n"
		}
		statusResponses[st] = fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nConnection: close\r\n%sContent-Length: 0\r\n\r\n",
			st, http.StatusText(st), extra)
	}
}

func statusResponse(status int) []byte {
	if b, ok := statusResponses[status]; ok {
		return b
	}
	text := http.StatusText(status)
	if text == "" {
		text = "Error"
	}
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", status, text)
}

// headerEnd finds the end of the request header ("\r\n\r\n") in buf,
// searching from from. It returns the header length or -1.
func headerEnd(buf []byte, from int) int {
	if i := bytes.Index(buf[from:], crlfcrlf); i >= 0 {
		return from + i + 4
	}
	return -1
}

// accumulate adds data to c's handshake bytes. It returns the complete
// header and whatever followed it once "\r\n\r\n" arrived, or tooBig when
// the header cannot fit limit bytes. While neither, it keeps the bytes (in
// a pooled buffer) and remembers how far it searched, so a header sent a
// byte at a time costs linear, not quadratic, work.
func accumulate(c *Conn, data []byte, limit int) (hdr, rest []byte, tooBig bool) {
	if c.hs == nil {
		if n := headerEnd(data, 0); n >= 0 {
			return data[:n], data[n:], n > limit
		}
		if len(data) >= limit {
			return nil, nil, true
		}
		c.hs = getBuf()
		*c.hs = append(*c.hs, data...)
		c.hsScan = int32(max(0, len(data)-3))
		return nil, nil, false
	}
	*c.hs = append(*c.hs, data...)
	buf := *c.hs
	if n := headerEnd(buf, int(c.hsScan)); n >= 0 {
		return buf[:n], buf[n:], n > limit
	}
	if len(buf) >= limit {
		return nil, nil, true
	}
	c.hsScan = int32(max(0, len(buf)-3))
	return nil, nil, false
}

// handshake consumes bytes of a connection whose request header is not
// complete yet. It never waits: bytes are kept until "\r\n\r\n" arrives,
// the header cap is hit (431) or the handshake deadline passes (408).
func (l *loop) handshake(c *Conn, data []byte) gnet.Action {
	hdr, rest, tooBig := accumulate(c, data, l.s.cfg.MaxHeaderBytes)
	switch {
	case tooBig:
		l.reject(c, http.StatusRequestHeaderFieldsTooLarge, nil)
		return gnet.None
	case hdr == nil:
		return gnet.None
	}
	if !l.upgrade(c, hdr) {
		l.releaseHandshake(c)
		return gnet.None
	}
	act := gnet.None
	if len(rest) > 0 {
		// Frames sent right behind the request.
		act = l.frames(c, rest)
	}
	l.releaseHandshake(c)
	return act
}

// hsIO lets gobwas read the buffered header and write its answer to memory:
// the upgrade never touches the socket, so it never blocks the loop.
type hsIO struct {
	io.Reader
	io.Writer
}

// handshaker is a loop's reusable upgrade state: the upgrader with its
// hooks bound once, the reader of the header and the buffer of the
// answer. An upgrade then allocates nothing of its own here.
type handshaker struct {
	h    hsCheck
	u    ws.Upgrader
	r    bytes.Reader
	w    bytes.Buffer
	rw   io.ReadWriter
	host []byte
}

func (hk *handshaker) init(s *Server) {
	h := &hk.h
	hk.u = ws.Upgrader{
		ReadBufferSize:  s.cfg.MaxHeaderBytes,
		OnRequest:       h.onRequest,
		OnHost:          h.onHost,
		OnHeader:        h.onHeader,
		OnBeforeUpgrade: h.onBeforeUpgrade,
		Negotiate:       h.negotiateDeflate,
	}
	hk.rw = hsIO{Reader: &hk.r, Writer: &hk.w}
}

// hsCheck collects what the checks need while gobwas parses the request.
type hsCheck struct {
	s      *Server
	c      *Conn
	path   string
	query  string
	host   []byte // in handshaker.host: a string is made only for an Origin check
	origin string
	bearer string
	id     Identity
	// deflate: permessage-deflate accepted (negotiateDeflate); deflateNoCtx:
	// with client_no_context_takeover.
	deflate, deflateNoCtx bool
}

func (h *hsCheck) onRequest(uri []byte) error {
	if p, q, ok := parseTarget(uri); ok {
		path, ok := h.s.matchPath(p)
		if !ok {
			return errNotFound
		}
		h.path = path
		if len(q) > 0 {
			h.query = string(q)
		}
		return nil
	}
	u, err := url.ParseRequestURI(string(uri))
	if err != nil {
		return errBadURI
	}
	p, ok := h.s.matchPath([]byte(u.Path))
	if !ok {
		return errNotFound
	}
	h.path, h.query = p, u.RawQuery
	return nil
}

// parseTarget splits a request target that url.ParseRequestURI would
// take as it is (an absolute path without escapes or control bytes) into
// path and query; ok false sends anything else to url.ParseRequestURI.
// TestParseTarget and FuzzParseTarget hold the two to the same answer.
func parseTarget(uri []byte) (path, query []byte, ok bool) {
	if len(uri) == 0 || uri[0] != '/' {
		return nil, nil, false
	}
	for _, b := range uri {
		if b == '%' || b < 0x20 || b == 0x7f {
			return nil, nil, false
		}
	}
	path, query, _ = bytes.Cut(uri, []byte("?"))
	return path, query, true
}

// queryCredentials returns the first token and ticket parameters of a
// query without escapes ('%', '+') or ';', exactly as url.ParseQuery
// would; ok false sends anything else to url.ParseQuery.
func queryCredentials(q string) (token, ticket string, ok bool) {
	if strings.ContainsAny(q, "%+;") {
		return "", "", false
	}
	var gotToken, gotTicket bool
	for q != "" {
		var kv string
		kv, q, _ = strings.Cut(q, "&")
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "token" && !gotToken:
			token, gotToken = v, true
		case k == "ticket" && !gotTicket:
			ticket, gotTicket = v, true
		}
	}
	return token, ticket, true
}

func (h *hsCheck) onHost(host []byte) error {
	if h.c.l == nil {
		h.host = bytes.Clone(host)
		return nil
	}
	hk := &h.c.l.hk
	hk.host = append(hk.host[:0], host...)
	h.host = hk.host
	return nil
}

func (h *hsCheck) onHeader(k, v []byte) error {
	switch {
	case bytes.EqualFold(k, []byte("Origin")):
		h.origin = string(v)
	case bytes.EqualFold(k, []byte("Authorization")):
		if len(v) > 7 && bytes.EqualFold(v[:7], []byte("Bearer ")) {
			h.bearer = string(bytes.TrimSpace(v[7:]))
		}
	}
	return nil
}

// onBeforeUpgrade runs the admission checks in order of cost: origin,
// node and address caps, the token, the user cap, then the handler.
func (h *hsCheck) onBeforeUpgrade() (ws.HandshakeHeader, error) {
	s, c := h.s, h.c
	if s.draining.Load() {
		return nil, errDraining
	}
	if h.origin != "" && !s.originAllowed(h.origin, string(h.host)) {
		return nil, errForbidden
	}
	if !s.reserveActive() {
		return nil, errNodeFull
	}
	c.active = true
	// MaxConnsPerIP was checked at accept (events.OnOpen).
	token, ticket := h.bearer, ""
	if token == "" && h.query != "" {
		var ok bool
		if token, ticket, ok = queryCredentials(h.query); !ok {
			if q, err := url.ParseQuery(h.query); err == nil {
				token, ticket = q.Get("token"), q.Get("ticket")
			}
		}
	}
	var id Identity
	var err error
	switch {
	case token != "" && s.cfg.Authenticator != nil:
		id, err = s.cfg.Authenticator.Authenticate(token)
	case token == "" && ticket != "" && s.cfg.Tickets != nil:
		id, err = s.cfg.Tickets.AuthenticateTicket(h.path, ticket)
	default:
		return nil, errUnauthorized
	}
	if err != nil || (!id.Expires.IsZero() && !id.Expires.After(s.wallNow())) {
		return nil, errUnauthorized
	}
	c.uid = id.UID
	if s.cfg.MaxConnsPerUser > 0 {
		// Counted only under a cap: with none (-1) the count would serve
		// nothing and cost a map entry per user.
		if !s.reserveUser(id.UID) {
			return nil, errUserFull
		}
		c.userSlot = true
	}
	if st := s.handler.Admit(&Request{Path: h.path, RemoteAddr: c.remote, Identity: id}); st != 0 {
		if st < 400 || st > 599 {
			st = http.StatusServiceUnavailable
		}
		return nil, reject(st, "refused", retryAfter(st))
	}
	h.id = id
	return nil, nil
}

func retryAfter(status int) string {
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		return "Retry-After: 1\r\n"
	}
	return ""
}

// decide runs gobwas's upgrade over the complete buffered header, with the
// admission checks as its hooks, and returns the answer to write: a 101
// (status 0) or an HTTP error. It reserves c's node and user slots on
// success and releases them on refusal. permessage-deflate is accepted when
// Config.Deflate is set (negotiateDeflate); every other extension is
// declined.
//
// resp and h belong to the loop's handshaker (or, without a loop, to this
// call) until the next decide on the loop: use them before.
func (s *Server) decide(c *Conn, hdr []byte) (resp []byte, status int, h *hsCheck) {
	var hk *handshaker
	if c.l != nil {
		hk = &c.l.hk
	} else {
		hk = &handshaker{}
	}
	if hk.rw == nil {
		hk.init(s)
	}
	hk.h = hsCheck{s: s, c: c}
	h = &hk.h
	hk.r.Reset(hdr)
	hk.w.Reset()
	_, err := hk.u.Upgrade(hk.rw)
	w := &hk.w
	if err == nil {
		return w.Bytes(), 0, h
	}
	s.releaseSlots(c)
	status = http.StatusBadRequest
	if rej, ok := err.(*ws.ConnectionRejectedError); ok && rej.StatusCode() != 0 {
		status = rej.StatusCode()
	}
	resp = w.Bytes()
	if len(resp) == 0 {
		resp = statusResponse(status)
	}
	s.cfg.Logger.Debug("socket: handshake refused", "conn", c.id, "remote", c.remote.String(),
		"status", status, "reason", err.Error())
	return resp, status, h
}

// upgrade writes the answer to the handshake and opens or closes c.
func (l *loop) upgrade(c *Conn, hdr []byte) bool {
	resp, status, h := l.s.decide(c, hdr)
	if status != 0 {
		l.reject(c, status, resp)
		return false
	}
	// OnOpen runs before the 101 is written, so a client that has its 101
	// is known to the handler. Frames the handler queues in OnOpen are
	// flushed after this callback, behind the 101.
	l.open(c, h)
	if hold := l.s.cfg.UpgradeHold; hold > 0 && c.state == stOpen {
		// Written with the handler's first frame (put, writeChain), or
		// alone by the sweep once the hold ends.
		b := getBuf()
		*b = append(*b, resp...) // resp is the handshaker's, reused
		c.held = b
		l.held = append(l.held, heldConn{c: c, until: l.now + int64(hold)})
		return !c.closed.Load()
	}
	if !l.put(c, resp, l.s.cfg.OutboundHardBound) {
		return false // cannot happen: nothing was written to c before
	}
	return c.state == stOpen && !c.closed.Load()
}

// open turns an upgraded connection over to the handler.
func (l *loop) open(c *Conn, h *hsCheck) {
	s := l.s
	c.tier = int32(h.id.Tier)
	c.deflate = h.deflate
	c.dec.deflate, c.dec.noCtx = h.deflate, h.deflateNoCtx
	c.path = h.path
	c.state = stOpen
	l.hsList.remove(c)
	l.idleList.pushBack(c, l.now+int64(s.cfg.IdleTimeout))
	if exp := h.id.Expires; !exp.IsZero() {
		c.expAt = exp.UnixNano()
		c.expires = l.now + int64(exp.Sub(s.wallNow()))
		l.expiry.push(c)
	}
	s.upgrades.Add(1)
	c.opened = true
	s.handler.OnOpen(c)
}

// matchPath reports whether p is an accepted path and returns the
// configured string for exact matches, so connections share it.
func (s *Server) matchPath(p []byte) (string, bool) {
	for _, a := range s.cfg.Paths {
		if strings.HasSuffix(a, "/") {
			if len(p) > len(a) && string(p[:len(a)]) == a {
				return string(p), true
			}
		} else if string(p) == a {
			return a, true
		}
	}
	return "", false
}

// originAllowed applies Config.AllowedOrigins.
func (s *Server) originAllowed(origin, host string) bool {
	if origin == "" {
		return true // not a browser
	}
	if len(s.cfg.AllowedOrigins) == 0 {
		oh, ok := originHost(origin)
		if !ok {
			return false
		}
		if strings.EqualFold(oh, host) {
			return true
		}
		if len(s.cfg.SiblingPorts) == 0 {
			return false
		}
		on, op, err1 := net.SplitHostPort(oh)
		hn, _, err2 := net.SplitHostPort(host)
		return err1 == nil && err2 == nil && strings.EqualFold(on, hn) && slices.Contains(s.cfg.SiblingPorts, op)
	}
	for _, a := range s.cfg.AllowedOrigins {
		if a == "*" || strings.EqualFold(strings.TrimSuffix(a, "/"), origin) {
			return true
		}
	}
	return false
}
