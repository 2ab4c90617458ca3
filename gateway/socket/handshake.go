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

// hsCheck collects what the checks need while gobwas parses the request.
type hsCheck struct {
	s      *Server
	c      *Conn
	path   string
	query  string
	host   string
	origin string
	bearer string
	id     Identity
	// deflate: permessage-deflate accepted (negotiateDeflate); deflateNoCtx:
	// with client_no_context_takeover.
	deflate, deflateNoCtx bool
}

func (h *hsCheck) onRequest(uri []byte) error {
	u, err := url.ParseRequestURI(string(uri))
	if err != nil {
		return errBadURI
	}
	p, ok := h.s.matchPath(u.Path)
	if !ok {
		return errNotFound
	}
	h.path, h.query = p, u.RawQuery
	return nil
}

func (h *hsCheck) onHost(host []byte) error {
	h.host = string(host)
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
	if !s.originAllowed(h.origin, h.host) {
		return nil, errForbidden
	}
	if !s.reserveActive() {
		return nil, errNodeFull
	}
	c.active = true
	// MaxConnsPerIP was checked at accept (events.OnOpen).
	token := h.bearer
	if token == "" && h.query != "" {
		if q, err := url.ParseQuery(h.query); err == nil {
			token = q.Get("token")
		}
	}
	if token == "" || s.cfg.Authenticator == nil {
		return nil, errUnauthorized
	}
	id, err := s.cfg.Authenticator.Authenticate(token)
	if err != nil || (!id.Expires.IsZero() && !id.Expires.After(s.wallNow())) {
		return nil, errUnauthorized
	}
	if !s.reserveUser(id.UID) {
		return nil, errUserFull
	}
	c.uid, c.userSlot = id.UID, true
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
func (s *Server) decide(c *Conn, hdr []byte) (resp []byte, status int, h *hsCheck) {
	h = &hsCheck{s: s, c: c}
	u := ws.Upgrader{
		ReadBufferSize:  s.cfg.MaxHeaderBytes,
		OnRequest:       h.onRequest,
		OnHost:          h.onHost,
		OnHeader:        h.onHeader,
		OnBeforeUpgrade: h.onBeforeUpgrade,
		Negotiate:       h.negotiateDeflate,
	}
	var w bytes.Buffer
	_, err := u.Upgrade(hsIO{Reader: bytes.NewReader(hdr), Writer: &w})
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
func (s *Server) matchPath(p string) (string, bool) {
	for _, a := range s.cfg.Paths {
		if strings.HasSuffix(a, "/") {
			if strings.HasPrefix(p, a) && len(p) > len(a) {
				return p, true
			}
		} else if p == a {
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
