package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// Ack confirms a stored message: Seq is its place in the group, TS the
// commit time in Unix milliseconds, ID the client_msg_id it was sent with.
type Ack struct {
	ID  string
	GID int64
	Seq int64
	TS  int64
}

// SendOption modifies one Send.
type SendOption func(*sendOptions)

type sendOptions struct {
	id   string
	kind string
}

// WithID sends with client_msg_id id instead of a generated one, so that a
// send retried across restarts of the app is stored once.
func WithID(id string) SendOption { return func(o *sendOptions) { o.id = id } }

// WithKind sets the message kind (wire.KindText, the default, or
// wire.KindAtAll).
func WithKind(kind string) SendOption { return func(o *sendOptions) { o.kind = kind } }

// Send stores body in group gid and returns the ack. body is a
// json.RawMessage or []byte holding JSON, or any value json.Marshal
// accepts. Retryable failures (overloaded, unavailable, rate_limited,
// connection loss, a missing answer) are retried with the same
// client_msg_id up to Config.MaxRetries times, so a retry of a send that
// was stored returns the original seq. Other server errors are returned as
// *Error; ctx bounds the whole call.
func (c *Conn) Send(ctx context.Context, gid int64, body any, opts ...SendOption) (Ack, error) {
	var o sendOptions
	for _, opt := range opts {
		opt(&o)
	}
	if gid <= 0 {
		return Ack{}, &Error{Code: wire.CodeBadRequest, Message: "gid must be positive"}
	}
	raw, err := encodeBody(body)
	if err != nil {
		return Ack{}, err
	}
	if o.id == "" {
		o.id = c.newID()
	} else if len(o.id) > wire.MaxIDBytes {
		return Ack{}, &Error{Code: wire.CodeBadRequest, Message: fmt.Sprintf("id is %d bytes, at most %d", len(o.id), wire.MaxIDBytes)}
	}
	frame := wire.AppendSend(nil, &wire.Send{ID: o.id, GID: gid, Kind: o.kind, Body: raw})
	var lastErr error
	for attempt := 0; ; attempt++ {
		if attempt > c.cfg.MaxRetries {
			return Ack{}, lastErr
		}
		s, err := c.waitSession(ctx)
		if err != nil {
			return Ack{}, err
		}
		if m := s.hello.MaxMessageBytes; m > 0 && int64(len(frame)) > m {
			return Ack{}, &Error{Code: wire.CodeTooLarge, Message: fmt.Sprintf("send frame is %d bytes, the server takes at most %d", len(frame), m)}
		}
		f, err := c.request(ctx, s, o.id, frame)
		switch {
		case errors.Is(err, ErrConnLost), errors.Is(err, ErrTimeout):
			lastErr = err
			continue
		case err != nil:
			return Ack{}, err
		}
		switch f := f.(type) {
		case *wire.Ack:
			return Ack{ID: o.id, GID: f.GID, Seq: f.Seq, TS: f.TS}, nil
		case *wire.Error:
			e := errorFrom(f)
			if !e.Retryable() {
				return Ack{}, e
			}
			lastErr = e
			wait := e.RetryAfter
			if wait <= 0 {
				wait = backoff(c.cfg.BackoffMin, c.cfg.BackoffMax, attempt)
			}
			if wait > c.cfg.MaxRetryAfter || attempt >= c.cfg.MaxRetries {
				return Ack{}, e
			}
			if !sleep(ctx, wait) {
				return Ack{}, ctx.Err()
			}
		default:
			return Ack{}, fmt.Errorf("%w: %q answers a send", ErrProtocol, f.FrameType())
		}
	}
}

// encodeBody returns body as validated raw JSON.
func encodeBody(body any) (json.RawMessage, error) {
	var raw []byte
	switch b := body.(type) {
	case json.RawMessage:
		raw = b
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return nil, &Error{Code: wire.CodeBadRequest, Message: "body: " + err.Error()}
		}
	}
	if !json.Valid(raw) {
		return nil, &Error{Code: wire.CodeBadRequest, Message: "body is not valid JSON"}
	}
	return raw, nil
}

// request writes frame with id over s and waits for its answer: ErrConnLost
// when s ends first, ErrTimeout after SendTimeout.
func (c *Conn) request(ctx context.Context, s *session, id string, frame []byte) (wire.ServerFrame, error) {
	cl := &call{ch: make(chan wire.ServerFrame, 1)}
	c.cmu.Lock()
	if _, busy := c.calls[id]; busy {
		c.cmu.Unlock()
		return nil, ErrIDInFlight
	}
	c.calls[id] = cl
	c.cmu.Unlock()
	defer func() {
		c.cmu.Lock()
		delete(c.calls, id)
		c.cmu.Unlock()
	}()
	if err := s.writeText(frame); err != nil {
		// The write closed the socket; wait for the reader to retire the
		// session so a retry does not pick it again.
		select {
		case <-s.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %v", ErrConnLost, err)
	}
	t := time.NewTimer(c.cfg.SendTimeout)
	defer t.Stop()
	select {
	case f := <-cl.ch:
		return f, nil
	case <-s.done:
		select {
		case f := <-cl.ch: // answered just before the end
			return f, nil
		default:
		}
		return nil, fmt.Errorf("%w: %v", ErrConnLost, s.err)
	case <-t.C:
		return nil, ErrTimeout
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.done:
		return nil, c.closedErr()
	}
}

// pullWS sends one pull frame over s and returns the answer: one page from
// from, at most 200 messages and the server's page byte budget (next_seq
// says where the next page starts when it stopped short of the range). A
// server error is returned as *Error.
func (c *Conn) pullWS(ctx context.Context, s *session, gid, from, to int64) (*wire.Messages, error) {
	id := c.newID()
	f, err := c.request(ctx, s, id, wire.AppendPull(nil, &wire.Pull{ID: id, GID: gid, FromSeq: from, ToSeq: to}))
	if err != nil {
		return nil, err
	}
	switch f := f.(type) {
	case *wire.Messages:
		return f, nil
	case *wire.Error:
		return nil, errorFrom(f)
	}
	return nil, fmt.Errorf("%w: %q answers a pull", ErrProtocol, f.FrameType())
}

// Page is the answer of Pull: the messages in seq order and the group's
// last_seq when the last page was read.
type Page struct {
	Messages []Message
	LastSeq  int64
}

// Pull returns gid's stored messages in [from, to] (to 0: up to last_seq)
// that the user may see (the server clamps the range to the member's
// join_seq), at most Config.MaxPullRange of them: when the returned
// messages end below to (or LastSeq), pull again from after the last one.
// It reads over the socket, or over HTTP when the socket is down and
// HTTPURL is set. Retryable failures are retried like Send's. Pull does not
// feed Messages and does not move the cursors.
func (c *Conn) Pull(ctx context.Context, gid, from, to int64) (Page, error) {
	if gid <= 0 || from < 0 || to < 0 || (to != 0 && to < from) {
		return Page{}, &Error{Code: wire.CodeBadRequest, Message: fmt.Sprintf("bad range: gid %d [%d, %d]", gid, from, to)}
	}
	from = max(from, 1)
	var out Page
	for len(out.Messages) < c.cfg.MaxPullRange {
		page, err := c.pullPage(ctx, gid, from, to)
		if err != nil {
			return out, err
		}
		out.LastSeq = page.LastSeq
		for i := range page.Messages {
			m := &page.Messages[i]
			m.GID = gid
			if m.Seq < from || len(out.Messages) == c.cfg.MaxPullRange {
				continue
			}
			out.Messages = append(out.Messages, message(m, true))
		}
		if len(page.Messages) == 0 {
			break // nothing visible in [from, to]
		}
		from = page.Messages[len(page.Messages)-1].Seq + 1
		if page.NextSeq > 0 {
			// The page stopped at its count or byte bound before the
			// end of the range (servers that do not say so are paged by
			// the range check below).
			from = max(from, page.NextSeq)
			continue
		}
		end := page.LastSeq
		if to != 0 && to < end {
			end = to
		}
		if from > end {
			break
		}
	}
	return out, nil
}

// pullPage reads one page with retries.
func (c *Conn) pullPage(ctx context.Context, gid, from, to int64) (*wire.Messages, error) {
	var lastErr error
	for attempt := 0; attempt <= c.cfg.MaxRetries; attempt++ {
		var (
			page *wire.Messages
			err  error
		)
		if s := c.current(); s == nil && c.cfg.HTTPURL != "" {
			page, err = c.pullHTTP(ctx, gid, from, to)
		} else if s, err = c.waitSession(ctx); err == nil {
			page, err = c.pullWS(ctx, s, gid, from, to)
		}
		if err == nil {
			return page, nil
		}
		if err := c.again(ctx, attempt, err); err != nil {
			return nil, err
		}
		lastErr = err
	}
	return nil, lastErr
}

// again decides whether a failed request (attempt counts from 0) is tried
// again: nil after waiting when it is (a retryable server answer, within
// MaxRetryAfter, or a lost connection or answer), else the error to
// return.
func (c *Conn) again(ctx context.Context, attempt int, err error) error {
	var se *Error
	switch {
	case errors.As(err, &se) && se.Retryable():
		wait := se.RetryAfter
		if wait <= 0 {
			wait = backoff(c.cfg.BackoffMin, c.cfg.BackoffMax, attempt)
		}
		if wait > c.cfg.MaxRetryAfter {
			return err
		}
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
		return nil
	case errors.Is(err, ErrConnLost), errors.Is(err, ErrTimeout):
		// The first retry at once (a socket request waits for the next
		// session anyway), later ones after a backoff.
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt > 0 && !sleep(ctx, backoff(c.cfg.BackoffMin, c.cfg.BackoffMax, attempt-1)) {
			return ctx.Err()
		}
		return nil
	default:
		return err
	}
}

// pullHTTP reads one page with GET /v1/groups/{gid}/messages.
func (c *Conn) pullHTTP(ctx context.Context, gid, from, to int64) (*wire.Messages, error) {
	q := url.Values{"from_seq": {strconv.FormatInt(from, 10)}}
	if to != 0 {
		q.Set("to_seq", strconv.FormatInt(to, 10))
	}
	var page wire.MessagesPage
	if err := c.httpGet(ctx, "/v1/groups/"+strconv.FormatInt(gid, 10)+"/messages?"+q.Encode(), &page); err != nil {
		return nil, err
	}
	return &wire.Messages{GID: page.GID, Messages: page.Messages, LastSeq: page.LastSeq, NextSeq: page.NextSeq}, nil
}

// Sync asks the server (GET /v1/sync, every page: it follows next_after)
// for every group of the user with last_seq, last_read_seq and unread, in
// gid order, and schedules the catch-up of tracked
// groups behind their last_seq and of untracked ones (from last_read_seq,
// or nothing with SkipUnread). A Conn syncs by itself after every
// (re)connect when HTTPURL is set.
func (c *Conn) Sync(ctx context.Context) ([]wire.SyncGroup, error) {
	groups, err := c.syncHTTP(ctx)
	if err != nil {
		return nil, err
	}
	c.applySync(groups)
	return groups, nil
}

func (c *Conn) syncHTTP(ctx context.Context) ([]wire.SyncGroup, error) {
	if c.cfg.HTTPURL == "" {
		return nil, ErrNoHTTP
	}
	var groups []wire.SyncGroup
	var after int64
	for {
		path := "/v1/sync"
		if after > 0 {
			path += "?after_gid=" + strconv.FormatInt(after, 10)
		}
		var resp wire.SyncResponse
		if err := c.getRetrying(ctx, path, &resp); err != nil {
			return nil, err
		}
		groups = append(groups, resp.Groups...)
		if resp.NextAfter == 0 {
			return groups, nil
		}
		// The cursor must move forward past a non-empty page, or a faulty
		// server would keep this loop going forever.
		if resp.NextAfter <= after || len(resp.Groups) == 0 {
			return nil, fmt.Errorf("%w: GET %s: next_after %d does not move past after_gid %d", ErrProtocol, path, resp.NextAfter, after)
		}
		after = resp.NextAfter
	}
}

// syncEntry returns gid's sync entry (GET /v1/sync from gid: one page,
// whose first entry is gid's when the user is a member), nil when the user
// is not a member.
func (c *Conn) syncEntry(ctx context.Context, gid int64) (*wire.SyncGroup, error) {
	path := "/v1/sync"
	if gid > 1 {
		path += "?after_gid=" + strconv.FormatInt(gid-1, 10)
	}
	var resp wire.SyncResponse
	if err := c.getRetrying(ctx, path, &resp); err != nil {
		return nil, err
	}
	for i := range resp.Groups {
		if resp.Groups[i].GID == gid {
			return &resp.Groups[i], nil
		}
	}
	return nil, nil
}

// getRetrying is httpGet tried again as a pull is (again): a GET is
// idempotent, so a keep-alive connection the server closed under the
// request, or a 503 with Retry-After, costs a retry, not an error.
func (c *Conn) getRetrying(ctx context.Context, path string, out any) error {
	var err error
	for attempt := 0; attempt <= c.cfg.MaxRetries; attempt++ {
		if err = c.httpGet(ctx, path, out); err == nil {
			return nil
		}
		if err := c.again(ctx, attempt, err); err != nil {
			return err
		}
	}
	return err
}

// httpGet does an authenticated GET of path and decodes the JSON answer
// into out; an HTTP error becomes *Error.
func (c *Conn) httpGet(ctx context.Context, path string, out any) error {
	token, err := c.cfg.token(ctx)
	if err != nil {
		return fmt.Errorf("client: token: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.cfg.HTTPURL, "/")+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: GET %s: %w", ErrConnLost, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxFrameBytes))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: GET %s: %w", ErrConnLost, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return httpError(resp, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%w: GET %s: %v", ErrProtocol, path, err)
	}
	return nil
}

// httpError turns an HTTP error answer into *Error.
func httpError(resp *http.Response, body []byte) error {
	var er wire.ErrorResponse
	e := &Error{Status: resp.StatusCode}
	if json.Unmarshal(body, &er) == nil && er.Error.Code != "" {
		e.Code, e.Message = er.Error.Code, er.Error.Message
		e.RetryAfter = time.Duration(er.Error.RetryAfterMS) * time.Millisecond
	} else {
		e.Code, e.Message = codeForStatus(resp.StatusCode), strings.TrimSpace(string(body))
	}
	if e.RetryAfter == 0 {
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
	}
	return e
}

func codeForStatus(status int) string {
	switch status {
	case 400:
		return wire.CodeBadRequest
	case 401:
		return wire.CodeUnauthorized
	case 403:
		return wire.CodeForbidden
	case 404:
		return wire.CodeNotFound
	case 413:
		return wire.CodeTooLarge
	case 422:
		return wire.CodeRejected
	case 429:
		return wire.CodeRateLimited
	case 503:
		return wire.CodeUnavailable
	}
	return wire.CodeInternal
}

// Read marks gid read up to seq (the read frame; the server never moves
// last_read_seq backwards). While disconnected the mark is kept and
// written after the reconnect.
func (c *Conn) Read(gid, seq int64) error {
	if gid <= 0 || seq < 0 {
		return &Error{Code: wire.CodeBadRequest, Message: fmt.Sprintf("bad read mark: gid %d seq %d", gid, seq)}
	}
	if s := c.current(); s != nil && s.writeText(wire.AppendRead(nil, &wire.Read{GID: gid, Seq: seq})) == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reads == nil {
		c.reads = make(map[int64]int64)
	}
	if seq > c.reads[gid] {
		c.reads[gid] = seq
	}
	return nil
}

// resume runs after every connect: it writes the read marks kept while
// disconnected, then syncs over HTTP (or, without HTTPURL or when sync
// fails, probes every tracked group with a pull) so that what was missed
// is pulled.
func (c *Conn) resume(ctx context.Context, s *session) {
	c.mu.Lock()
	reads := c.reads
	c.reads = nil
	c.mu.Unlock()
	for gid, seq := range reads {
		if s.writeText(wire.AppendRead(nil, &wire.Read{GID: gid, Seq: seq})) != nil {
			_ = c.Read(gid, seq) // keep it for the next connection
		}
	}
	if c.cfg.HTTPURL != "" {
		groups, err := c.syncHTTP(ctx)
		if err == nil {
			c.applySync(groups)
			c.mu.Lock()
			c.syncedLocked()
			c.mu.Unlock()
			return
		}
		c.log.Warn("client: sync failed, probing tracked groups by pull", "err", err)
		c.emit(Event{Kind: EventError, Err: err})
	}
	c.mu.Lock()
	c.syncedLocked()
	c.probeAllLocked()
	c.mu.Unlock()
}
