package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Item is one send as the before-send hook sees it.
type Item struct {
	UID         string
	ClientMsgID string
	Kind        string // "" = text
	Body        []byte // raw JSON
}

// Action is the hook's answer for one send.
type Action uint8

// Actions.
const (
	Allow       Action = iota // store as sent
	Reject                    // refuse with Verdict.Code
	Rewrite                   // store Verdict.Body instead
	Unavailable               // the hook failed and fails closed: refuse, retryable
)

// Verdict is the outcome of one Item.
type Verdict struct {
	Action Action
	Code   string // Reject: the receiver's code (MaxCodeBytes of [a-z0-9_.-])
	Body   []byte // Rewrite: the new body, valid JSON within the body limit
}

// MaxCodeBytes bounds a rejection code.
const MaxCodeBytes = 64

// RejectedError is a send the before-send hook refused; Code is the
// receiver's code, shown to the sender as the error's message.
type RejectedError struct{ Code string }

func (e *RejectedError) Error() string { return "hooks: rejected by the before-send hook: " + e.Code }

// Is makes errors.Is(err, ErrRejected) hold.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }

// ErrRejected is matched by every *RejectedError (gateway/errors.go maps
// it to the code "rejected").
var ErrRejected = errors.New("hooks: rejected by the before-send hook")

// ErrHookUnavailable is the error of a send refused because the
// before-send hook failed (timeout, error status, bad answer) and it fails
// closed. Retryable.
var ErrHookUnavailable = errors.New("hooks: before-send hook unavailable")

// BeforeSendConfig configures the before-send hook.
type BeforeSendConfig struct {
	// URL receives one POST per group per commit batch; required.
	URL string
	// Secret signs the requests; at least MinSecretBytes.
	Secret []byte
	// Timeout bounds one POST (the sends of the batch wait for it); 0 =
	// 200 ms.
	Timeout time.Duration
	// FailOpen stores the sends as sent when the hook fails; false (the
	// default) refuses them with ErrHookUnavailable.
	FailOpen bool
	// Groups names the groups the hook applies to (ParseGIDSet); nil =
	// every group.
	Groups *GIDSet
	// MaxBody bounds a rewritten body (the store's body limit); 0 = 32 KiB.
	MaxBody int
	// Client is the HTTP client; nil = a keep-alive client of its own.
	Client  *http.Client
	Metrics *Metrics
	Logger  *slog.Logger
}

// Validate reports every problem of c.
func (c BeforeSendConfig) Validate() error {
	var errs []error
	if !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://") {
		errs = append(errs, fmt.Errorf("hooks: before-send URL %q is not http(s)", c.URL))
	}
	if len(c.Secret) < MinSecretBytes {
		errs = append(errs, fmt.Errorf("hooks: before-send secret shorter than %d bytes", MinSecretBytes))
	}
	if c.Timeout < 0 || c.MaxBody < 0 {
		errs = append(errs, errors.New("hooks: before-send Timeout and MaxBody must not be negative"))
	}
	return errors.Join(errs...)
}

// BeforeSend calls the before-send hook. Its methods may be called from
// any goroutine.
type BeforeSend struct {
	cfg  BeforeSendConfig
	post *Poster
	met  *Metrics
	log  *slog.Logger
}

// NewBeforeSend returns the hook client for cfg (Validate first).
func NewBeforeSend(cfg BeforeSendConfig) *BeforeSend {
	if cfg.Timeout == 0 {
		cfg.Timeout = 200 * time.Millisecond
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = 32 << 10
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &BeforeSend{cfg: cfg, met: cfg.Metrics, log: cfg.Logger,
		post: NewPoster(PosterConfig{URL: cfg.URL, Secret: cfg.Secret, Kind: "before_send", Client: cfg.Client})}
}

// Applies reports whether gid's sends go through the hook.
func (b *BeforeSend) Applies(gid int64) bool { return b.cfg.Groups.Contains(gid) }

type bsRequest struct {
	Type     string      `json:"type"`
	GID      int64       `json:"gid"`
	Messages []bsMessage `json:"messages"`
}

type bsMessage struct {
	UID         string          `json:"uid"`
	ClientMsgID string          `json:"client_msg_id"`
	Kind        string          `json:"kind"`
	Body        json.RawMessage `json:"body"`
}

type bsAnswer struct {
	Results []struct {
		Action string          `json:"action"`
		Code   string          `json:"code"`
		Body   json.RawMessage `json:"body"`
	} `json:"results"`
}

// Check asks the hook about one group's sends (one POST) and writes one
// verdict per item to out (len(out) == len(items)). A failed call (error,
// timeout, non-2xx, malformed answer, a rewrite past the body limit) gives
// every item Allow when the hook fails open, Unavailable otherwise.
func (b *BeforeSend) Check(ctx context.Context, gid int64, items []Item, out []Verdict) {
	start := time.Now()
	err := b.call(ctx, gid, items, out)
	b.met.beforeSendSeconds(time.Since(start), err == nil)
	if err != nil {
		act, label := Unavailable, "failed_closed"
		if b.cfg.FailOpen {
			act, label = Allow, "failed_open"
		}
		for i := range out {
			out[i] = Verdict{Action: act}
		}
		b.met.beforeSendOutcome(label, len(items))
		b.log.Warn("before-send hook failed", "gid", gid, "messages", len(items), "fail_open", b.cfg.FailOpen, "err", err)
		return
	}
	for i := range out {
		b.met.beforeSendOutcome(actionLabel(out[i].Action), 1)
	}
}

func actionLabel(a Action) string {
	switch a {
	case Reject:
		return "reject"
	case Rewrite:
		return "rewrite"
	case Unavailable:
		return "failed_closed"
	}
	return "allow"
}

func (b *BeforeSend) call(ctx context.Context, gid int64, items []Item, out []Verdict) error {
	req := bsRequest{Type: "before_send", GID: gid, Messages: make([]bsMessage, len(items))}
	for i, it := range items {
		kind := it.Kind
		if kind == "" {
			kind = "text"
		}
		req.Messages[i] = bsMessage{UID: it.UID, ClientMsgID: it.ClientMsgID, Kind: kind, Body: it.Body}
	}
	body, err := json.Marshal(&req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	maxResp := int64(len(items))*int64(b.cfg.MaxBody+256) + 1024
	data, err := b.post.Post(ctx, body, maxResp)
	if err != nil {
		return err
	}
	var ans bsAnswer
	if err := json.Unmarshal(data, &ans); err != nil {
		return fmt.Errorf("hooks: malformed answer: %w", err)
	}
	if len(ans.Results) != len(items) {
		return fmt.Errorf("hooks: %d results for %d messages", len(ans.Results), len(items))
	}
	for i, r := range ans.Results {
		switch r.Action {
		case "allow", "":
			out[i] = Verdict{Action: Allow}
		case "reject":
			code := r.Code
			if code == "" {
				code = "rejected"
			}
			if !validCode(code) {
				return fmt.Errorf("hooks: result %d: code %q is not 1-%d bytes of [a-z0-9_.-]", i, code, MaxCodeBytes)
			}
			out[i] = Verdict{Action: Reject, Code: code}
		case "rewrite":
			if len(r.Body) == 0 || len(r.Body) > b.cfg.MaxBody || !json.Valid(r.Body) {
				return fmt.Errorf("hooks: result %d: rewritten body is not JSON of at most %d bytes", i, b.cfg.MaxBody)
			}
			out[i] = Verdict{Action: Rewrite, Body: []byte(r.Body)}
		default:
			return fmt.Errorf("hooks: result %d: unknown action %q", i, r.Action)
		}
	}
	return nil
}

func validCode(c string) bool {
	if len(c) == 0 || len(c) > MaxCodeBytes {
		return false
	}
	for i := 0; i < len(c); i++ {
		ch := c[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '.' || ch == '-') {
			return false
		}
	}
	return true
}

// GIDSet is a set of gids: every gid, or a list of ranges.
type GIDSet struct {
	all    bool
	ranges [][2]int64
}

// MaxGIDRanges bounds the ranges of a GIDSet.
const MaxGIDRanges = 1024

// ParseGIDSet parses "all" (every group) or a comma-separated list of
// gids and inclusive ranges ("7,100-199").
func ParseGIDSet(s string) (*GIDSet, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "all" {
		return &GIDSet{all: true}, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxGIDRanges {
		return nil, fmt.Errorf("hooks: more than %d gid ranges", MaxGIDRanges)
	}
	set := &GIDSet{}
	for _, p := range parts {
		p = strings.TrimSpace(p)
		lo, hi, isRange := strings.Cut(p, "-")
		a, err := strconv.ParseInt(lo, 10, 64)
		if err != nil || a <= 0 {
			return nil, fmt.Errorf("hooks: bad gid %q", p)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseInt(hi, 10, 64); err != nil || b < a {
				return nil, fmt.Errorf("hooks: bad gid range %q", p)
			}
		}
		set.ranges = append(set.ranges, [2]int64{a, b})
	}
	return set, nil
}

// Contains reports whether gid is in s; a nil set holds every gid.
func (s *GIDSet) Contains(gid int64) bool {
	if s == nil || s.all {
		return true
	}
	for _, r := range s.ranges {
		if gid >= r[0] && gid <= r[1] {
			return true
		}
	}
	return false
}
