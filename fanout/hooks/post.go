package hooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Poster sends signed JSON POSTs to one URL: the transport shared by the
// before-send hook, the event stream and the waiting room's session-end
// webhook. It keeps its connections alive (one receiver, many requests).
type Poster struct {
	url    string
	secret []byte
	kind   string
	header http.Header
	hc     *http.Client
	now    func() time.Time
}

// PosterConfig configures a Poster.
type PosterConfig struct {
	// URL receives the POSTs; required (http or https).
	URL string
	// Secret signs every request (HMAC-SHA256, Sign); empty = unsigned.
	Secret []byte
	// Kind is sent in HeaderKind.
	Kind string
	// Header is added to every request (e.g. an authorization header).
	Header http.Header
	// Client is the HTTP client; nil = one of its own with keep-alive
	// connections (per-request deadlines come from the context).
	Client *http.Client
	// Now is the clock of the timestamp header; nil = time.Now.
	Now func() time.Time
}

// NewPoster returns a Poster for cfg.
func NewPoster(cfg PosterConfig) *Poster {
	hc := cfg.Client
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		hc = &http.Client{Transport: tr}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Poster{url: cfg.URL, secret: cfg.Secret, kind: cfg.Kind, header: cfg.Header, hc: hc, now: cfg.Now}
}

// StatusError is a non-2xx answer of the receiver.
type StatusError struct{ Status int }

func (e *StatusError) Error() string { return fmt.Sprintf("hooks: receiver answered %d", e.Status) }

// Post sends body and returns the receiver's answer, read up to maxResp
// bytes (a longer answer is an error: a receiver cannot make the server
// buffer without bound). A non-2xx status is a *StatusError.
func (p *Poster) Post(ctx context.Context, body []byte, maxResp int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range p.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	setSigned(req, p.secret, p.kind, p.now(), body)
	resp, err := p.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResp+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, &StatusError{Status: resp.StatusCode}
	}
	if int64(len(data)) > maxResp {
		return nil, fmt.Errorf("hooks: answer longer than %d bytes", maxResp)
	}
	return data, nil
}

// Retry calls p.Post until it succeeds, attempts run out (0 = no limit)
// or ctx ends, waiting backoff before the first retry and doubling it up
// to maxBackoff; each attempt gets timeout. retried is called before each
// retry (for metrics). It returns the last error.
func (p *Poster) Retry(ctx context.Context, body []byte, timeout, backoff, maxBackoff time.Duration, attempts int, retried func(error)) error {
	var last error
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, timeout)
		_, last = p.Post(actx, body, 4<<10)
		cancel()
		if last == nil {
			return nil
		}
		if ctx.Err() != nil {
			return errors.Join(last, ctx.Err())
		}
		if attempts > 0 && n >= attempts {
			return last
		}
		if retried != nil {
			retried(last)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(last, ctx.Err())
		case <-t.C:
		}
		backoff = min(backoff*2, maxBackoff)
	}
}
