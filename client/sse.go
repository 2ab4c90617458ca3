package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// transport is what a session needs from its connection: the WebSocket
// (wsConn) or the Server-Sent Events fallback (sseConn), which turns the
// client frames it is handed into HTTP requests and their answers into
// the server frames a socket would have carried (docs/protocol.md §14).
type transport interface {
	// read returns the next server frame (valid until the next call).
	read() ([]byte, error)
	// writeText hands over one client frame.
	writeText(p []byte) error
	// closeWith closes with a close code (best effort) and close closes.
	closeWith(code ws.StatusCode)
	close()
	// received counts what arrived (frames, heartbeats), for the
	// dead-connection check.
	received() uint64
	// setReadDeadline bounds the reads until changed (zero: none).
	setReadDeadline(t time.Time)
	// kind names the transport in events and logs.
	kind() string
}

func (c *wsConn) received() uint64            { return c.recv.Load() }
func (c *wsConn) setReadDeadline(t time.Time) { _ = c.nc.SetReadDeadline(t) }
func (c *wsConn) kind() string                { return TransportWebSocket }
func (c *sseConn) setReadDeadline(t time.Time) {
	if t.IsZero() {
		c.deadline.Store(0)
		return
	}
	c.deadline.Store(t.UnixNano())
}
func (c *sseConn) kind() string                 { return TransportSSE }
func (c *sseConn) received() uint64             { return c.recv.Load() }
func (c *sseConn) closeWith(code ws.StatusCode) { c.close() }

// Transports (Config.Transport).
const (
	// TransportAuto opens a WebSocket and falls back to Server-Sent
	// Events when the upgrade cannot be made (no answer, or an answer
	// that is not the server's own refusal: 401, 429 and 503 are).
	TransportAuto = ""
	// TransportWebSocket never falls back.
	TransportWebSocket = "websocket"
	// TransportSSE receives over GET /v1/events and sends, pulls and
	// marks reads over the HTTP API; it needs HTTPURL.
	TransportSSE = "sse"
)

// sseStickFor is how long a Conn that fell back keeps using SSE before it
// tries a WebSocket again: a blocked port costs a dial timeout per try.
const sseStickFor = 5 * time.Minute

// maxSSERequests bounds the HTTP requests of one SSE connection in flight
// (sends, pulls, reads); writeText waits for a slot.
const maxSSERequests = 32

// shouldFallBack reports whether a failed WebSocket dial may be a network
// that blocks WebSocket: anything but the server's own refusals.
func shouldFallBack(err error) bool {
	var he *HandshakeError
	if errors.As(err, &he) {
		switch he.Status {
		case http.StatusUnauthorized, http.StatusTooManyRequests, http.StatusServiceUnavailable:
			return false
		}
	}
	return !errors.Is(err, context.Canceled)
}

// sseConn is one event stream plus the HTTP requests standing for the
// client frames.
type sseConn struct {
	cfg  *Config
	base string
	hc   *http.Client
	body io.ReadCloser
	br   *bufio.Reader
	ctx  context.Context
	stop context.CancelFunc
	// in carries the frames read() returns: events of the stream (from
	// pump) and the answers to requests.
	in       chan []byte
	errc     chan error // pump's end, once
	sem      chan struct{}
	recv     atomic.Uint64
	deadline atomic.Int64 // Unix ns, 0 = none
	once     sync.Once
	wg       sync.WaitGroup
	mu       sync.Mutex // closing and the wg.Add of requests
	closing  bool
}

// dialSSE opens GET /v1/events with the Bearer token.
func dialSSE(ctx context.Context, cfg *Config, token string) (*sseConn, error) {
	if cfg.HTTPURL == "" {
		return nil, errors.New("client: the SSE transport needs HTTPURL")
	}
	base := strings.TrimRight(cfg.HTTPURL, "/")
	// The stream outlives any request timeout: its own client, on the
	// same transport.
	hc := &http.Client{Transport: cfg.HTTPClient.Transport, CheckRedirect: cfg.HTTPClient.CheckRedirect}
	sctx, stop := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, base+"/v1/events", nil)
	if err != nil {
		stop()
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Cache-Control", "no-cache")
	// The handshake (answer headers) is bounded like the upgrade's.
	t := time.AfterFunc(cfg.DialTimeout+cfg.HandshakeTimeout, stop)
	cancelDial := context.AfterFunc(ctx, stop)
	resp, err := hc.Do(req)
	t.Stop()
	cancelDial()
	if err != nil {
		stop()
		return nil, fmt.Errorf("client: GET %s/v1/events: %w", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		stop()
		return nil, &HandshakeError{Status: resp.StatusCode}
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		stop()
		return nil, fmt.Errorf("%w: GET /v1/events answered %q, want text/event-stream", ErrProtocol, ct)
	}
	c := &sseConn{cfg: cfg, base: base, hc: cfg.HTTPClient, body: resp.Body,
		br: bufio.NewReaderSize(resp.Body, cfg.ReadBufferSize), ctx: sctx, stop: stop,
		in: make(chan []byte, 64), errc: make(chan error, 1), sem: make(chan struct{}, maxSSERequests)}
	c.wg.Go(c.pump)
	return c, nil
}

// pump reads the stream's events into in until it fails or ends.
func (c *sseConn) pump() {
	var data []byte
	var event string
	for {
		line, err := c.readLine()
		if err != nil {
			if err == io.EOF {
				err = fmt.Errorf("%w: event stream ended", ErrConnLost)
			}
			c.errc <- err
			return
		}
		switch {
		case len(line) == 0: // dispatch
			if event == "close" {
				c.errc <- closeEventError(data)
				return
			}
			if len(data) > 0 && event == "" {
				select {
				case c.in <- data:
				case <-c.ctx.Done():
					c.errc <- ErrConnLost
					return
				}
			}
			data, event = nil, ""
		case line[0] == ':': // a comment: the heartbeat
			c.recv.Add(1)
		default:
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(field) {
			case "data":
				if data != nil {
					data = append(data, '\n')
				}
				if int64(len(data)+len(value)) > c.cfg.MaxFrameBytes {
					c.errc <- fmt.Errorf("%w: event over %d bytes", ErrProtocol, c.cfg.MaxFrameBytes)
					return
				}
				data = append(data, value...)
			case "event":
				event = string(value)
			}
			// id and retry: this client resumes by sync and pulls.
		}
	}
}

// readLine returns one line without its end (LF, CRLF or CR), bounded by
// MaxFrameBytes.
func (c *sseConn) readLine() ([]byte, error) {
	var line []byte
	for {
		b, err := c.br.ReadSlice('\n')
		line = append(line, b...)
		if err == bufio.ErrBufferFull {
			if int64(len(line)) > c.cfg.MaxFrameBytes+16 {
				return nil, fmt.Errorf("%w: event line over %d bytes", ErrProtocol, c.cfg.MaxFrameBytes)
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		line = bytes.TrimSuffix(line[:len(line)-1], []byte("\r"))
		return line, nil
	}
}

// closeEventError is the error of the stream's close event.
func closeEventError(data []byte) error {
	var ce struct {
		Code   int    `json:"code"`
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(data, &ce)
	return fmt.Errorf("%w: event stream closed by the server: %d %s", ErrConnLost, ce.Code, ce.Reason)
}

func (c *sseConn) read() ([]byte, error) {
	var timeout <-chan time.Time
	if d := c.deadline.Load(); d != 0 {
		t := time.NewTimer(time.Until(time.Unix(0, d)))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case b := <-c.in:
		c.recv.Add(1)
		return b, nil
	case err := <-c.errc:
		c.errc <- err // later reads fail the same way
		return nil, err
	case <-timeout:
		return nil, fmt.Errorf("%w: no hello in time", ErrConnLost)
	}
}

// close ends the stream and the requests in flight and waits for their
// goroutines (no goroutine outlives Conn.Close); the reader's next read
// fails.
func (c *sseConn) close() {
	c.mu.Lock()
	c.closing = true // no request starts from now on: Wait may run
	c.mu.Unlock()
	c.abort()
	c.wg.Wait()
}

// abort is close without the wait, for the request goroutines themselves.
func (c *sseConn) abort() {
	c.once.Do(func() {
		c.stop()
		c.body.Close()
	})
}

// writeText turns one client frame into its HTTP request, run off the
// caller's goroutine; the answer comes back through read as the frame a
// socket would have carried. A ping needs nothing: the stream's
// heartbeats show it is alive.
func (c *sseConn) writeText(p []byte) error {
	f, err := wire.DecodeClient(p)
	if err != nil {
		return err
	}
	if f.Type == wire.TypePing {
		return nil
	}
	select {
	case c.sem <- struct{}{}:
	case <-c.ctx.Done():
		return ErrConnLost
	}
	body := bytes.Clone(f.Body)
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		<-c.sem
		return ErrConnLost
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		defer func() { <-c.sem }()
		var out []byte
		var err error
		switch f.Type {
		case wire.TypeSend:
			out, err = c.send(f.ID, f.GID, f.Kind, body)
		case wire.TypePull:
			out, err = c.pull(f.ID, f.GID, f.FromSeq, f.ToSeq)
		case wire.TypeRead:
			out, err = c.markRead(f.GID, f.Seq)
		default:
			return
		}
		if err != nil {
			// As a lost socket: the session ends and what waited is
			// retried on the next one.
			c.cfg.Logger.Debug("client: sse request failed", "type", f.Type, "err", err)
			c.abort()
			return
		}
		if out != nil {
			select {
			case c.in <- out:
			case <-c.ctx.Done():
			}
		}
	}()
	return nil
}

// do makes one request and returns the answer's status and body; an
// answer that is not 2xx becomes an error frame for id.
func (c *sseConn) do(method, path string, body []byte, id string) (int, []byte, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(c.ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	token, err := c.cfg.token(c.ctx)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("client: token: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxFrameBytes))
	if err != nil {
		return 0, nil, nil, err
	}
	if resp.StatusCode/100 != 2 {
		var e *Error
		errors.As(httpError(resp, b), &e)
		return resp.StatusCode, nil, wire.AppendError(nil, &wire.Error{ID: id, Code: e.Code, Message: e.Message, RetryAfterMS: e.RetryAfter.Milliseconds()}), nil
	}
	return resp.StatusCode, b, nil, nil
}

func (c *sseConn) send(id string, gid int64, kind string, body []byte) ([]byte, error) {
	type sendBody struct {
		ID   string          `json:"id"`
		Kind string          `json:"kind,omitempty"`
		Body json.RawMessage `json:"body"`
	}
	req, err := json.Marshal(sendBody{ID: id, Kind: kind, Body: body})
	if err != nil {
		return nil, err
	}
	_, b, ef, err := c.do(http.MethodPost, "/v1/groups/"+strconv.FormatInt(gid, 10)+"/messages", req, id)
	if err != nil || ef != nil {
		return ef, err
	}
	var r wire.SendResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: send answer: %v", ErrProtocol, err)
	}
	return wire.AppendAck(nil, &wire.Ack{ID: id, GID: r.GID, Seq: r.Seq, TS: r.TS}), nil
}

func (c *sseConn) pull(id string, gid, from, to int64) ([]byte, error) {
	path := "/v1/groups/" + strconv.FormatInt(gid, 10) + "/messages?from_seq=" + strconv.FormatInt(from, 10)
	if to > 0 {
		path += "&to_seq=" + strconv.FormatInt(to, 10)
	}
	_, b, ef, err := c.do(http.MethodGet, path, nil, id)
	if err != nil || ef != nil {
		return ef, err
	}
	var p wire.MessagesPage
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%w: pull answer: %v", ErrProtocol, err)
	}
	return wire.AppendMessages(nil, &wire.Messages{ID: id, GID: p.GID, Messages: p.Messages, LastSeq: p.LastSeq, NextSeq: p.NextSeq}), nil
}

func (c *sseConn) markRead(gid, seq int64) ([]byte, error) {
	body := strconv.AppendInt([]byte(`{"seq":`), seq, 10)
	body = append(body, '}')
	_, _, ef, err := c.do(http.MethodPost, "/v1/groups/"+strconv.FormatInt(gid, 10)+"/read", body, "")
	return ef, err
}

// dial opens the session's transport as Config.Transport says: a
// WebSocket, falling back to SSE (TransportAuto with HTTPURL) when the
// upgrade fails as a blocking network makes it fail: before any WebSocket
// of this Conn worked, any failure but the server's own refusals; after,
// only an HTTP answer that is not fanfare's (a proxy's). After a
// fallback, redials use SSE for sseStickFor before trying a WebSocket
// again.
func (c *Conn) dial(ctx context.Context, token string) (transport, error) {
	switch {
	case c.cfg.Transport == TransportSSE:
		return dialSSE(ctx, &c.cfg, token)
	case c.cfg.Transport == TransportAuto && c.cfg.HTTPURL != "" && time.Now().UnixNano() < c.sseUntil.Load():
		return dialSSE(ctx, &c.cfg, token)
	}
	wc, err := dialWS(ctx, &c.cfg, c.cfg.URL, token)
	if err == nil {
		c.wsOK.Store(true) // the upgrade went through: the hello is read next
		return wc, nil
	}
	var he *HandshakeError
	answered := errors.As(err, &he)
	if c.cfg.Transport != TransportAuto || c.cfg.HTTPURL == "" || !shouldFallBack(err) || ctx.Err() != nil ||
		(c.wsOK.Load() && !answered) {
		// A Conn whose WebSocket worked before takes a failure without an
		// answer for an outage (the stream would fail as well); an answer
		// that is not fanfare's own refusal (a proxy's) still falls back.
		return nil, err
	}
	sc, serr := dialSSE(ctx, &c.cfg, token)
	if serr != nil {
		return nil, fmt.Errorf("%w (SSE fallback: %w)", err, serr)
	}
	c.log.Info("client: WebSocket unavailable, using Server-Sent Events", "err", err)
	c.sseUntil.Store(time.Now().Add(sseStickFor).UnixNano())
	return sc, nil
}

// Transport returns the transport of the current connection
// (TransportWebSocket or TransportSSE), "" while disconnected.
func (c *Conn) Transport() string {
	if s := c.current(); s != nil {
		return s.kind()
	}
	return ""
}
