package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/limiter"
)

// RateLimitedError is a limiter denial: it maps to rate_limited (429) with
// the decision's retry-after, and HTTP answers carry RateLimit headers.
type RateLimitedError struct {
	Decision limiter.Decision
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("gateway: rate limited by %s (%s), retry after %v", e.Decision.Rule, e.Decision.Reason, e.Decision.RetryAfter)
}

// Unwrap makes the error match ErrRateLimited.
func (e *RateLimitedError) Unwrap() error { return ErrRateLimited }

// RetryAfter is the decision's retry-after.
func (e *RateLimitedError) RetryAfter() time.Duration { return e.Decision.RetryAfter }

// allow runs checks and turns a denial into a *RateLimitedError. A limiter
// that cannot decide admits the request: limits protect the service, and
// the in-process fallback takes over while Redis is unreachable.
func allow(ctx context.Context, lim limiter.Limiter, checks ...limiter.Check) error {
	if lim == nil {
		return nil
	}
	d, err := lim.Allow(ctx, checks...)
	if err != nil || d.Allowed {
		return nil
	}
	return &RateLimitedError{Decision: d}
}

// setRateLimitHeaders writes the IETF RateLimit and RateLimit-Policy
// headers (draft-ietf-httpapi-ratelimit-headers) for a denial.
func setRateLimitHeaders(h http.Header, d limiter.Decision) {
	if d.Rule == "" || d.Limit <= 0 {
		return
	}
	w := int64((d.Window + time.Second - 1) / time.Second)
	t := int64((d.RetryAfter + time.Second - 1) / time.Second)
	h.Set("RateLimit-Policy", strconv.Quote(d.Rule)+";q="+strconv.FormatInt(d.Limit, 10)+";w="+strconv.FormatInt(max(w, 1), 10))
	h.Set("RateLimit", strconv.Quote(d.Rule)+";r="+strconv.FormatInt(d.Remaining, 10)+";t="+strconv.FormatInt(t, 10))
}

// sendChecks fills dst with the per-user send dimensions of docs/architecture.md §8:
// user -> group and user -> all groups. The group rate (buffer, then newest
// N) and the @all quota (which must not charge a retried or refused send)
// are enforced by the engine on the group's worker.
func sendChecks(dst []limiter.Check, uid string, level int, gid int64) []limiter.Check {
	return append(dst[:0],
		limiter.Check{Rule: limiter.UserGroup, Key: uid, ID: gid, Tier: level},
		limiter.Check{Rule: limiter.UserAll, Key: uid, Tier: level},
	)
}

func (h *routes) getLimits(w http.ResponseWriter, r *http.Request) error {
	if h.lim == nil {
		return ErrNotFound
	}
	WriteJSON(w, http.StatusOK, h.lim.Limits())
	return nil
}

func (h *routes) putLimits(w http.ResponseWriter, r *http.Request) error {
	if h.lim == nil {
		return ErrNotFound
	}
	var l limiter.Limits
	if err := DecodeJSON(r, &l); err != nil {
		return err
	}
	l = l.Normalize()
	if err := l.Validate(); err != nil {
		return BadRequest("%v", err)
	}
	// ?dry_run=true (an addition, docs/protocol.md §9.10): validate and
	// answer the normalized document without putting it in force.
	if dry := r.URL.Query().Get("dry_run"); dry == "true" || dry == "1" {
		WriteJSON(w, http.StatusOK, l)
		return nil
	}
	apply := h.apply
	if apply == nil {
		apply = func(_ context.Context, l limiter.Limits) error { return h.lim.SetLimits(l) }
	}
	if err := apply(r.Context(), l); err != nil {
		return err
	}
	WriteJSON(w, http.StatusOK, h.lim.Limits())
	return nil
}

// Frame types as the per-user frame counters number them
// (limiter.FrameUser's ID).
const (
	frameSend int64 = 1 + iota
	framePull
	frameRead
	framePing
	frameOther
)

// admitFrame applies the frame limits to one decoded frame (err: it did
// not decode), before any work is queued for it: per connection and
// frame type, and per user and frame type over the user's connections on
// this node. A denied frame is answered rate_limited with the limit's
// retry_after_ms and costs nothing else; a connection whose denied frames
// pass limiter.FrameDenied is closed (1008). It allocates nothing.
// checks is the connection's scratch: its frames are handled one at a
// time.
func admitFrame(lim limiter.Limiter, log *slog.Logger, c *socket.Conn, checks *[2]limiter.Check, f *wire.ClientFrame, err error) bool {
	if lim == nil {
		return true
	}
	rule, typ := limiter.FrameOther, frameOther
	if err == nil {
		switch f.Type {
		case wire.TypeSend:
			rule, typ = limiter.FrameSend, frameSend
		case wire.TypePull:
			rule, typ = limiter.FramePull, framePull
		case wire.TypeRead:
			rule, typ = limiter.FrameRead, frameRead
		case wire.TypePing:
			rule, typ = limiter.FramePing, framePing
		}
	}
	checks[0] = limiter.Check{Rule: rule, ID: int64(c.ID()), Tier: c.Tier()}
	checks[1] = limiter.Check{Rule: limiter.FrameUser, Key: c.UID(), ID: typ, Tier: c.Tier()}
	d, lerr := lim.Allow(context.Background(), checks[:]...)
	if lerr != nil || d.Allowed {
		return true // an in-process limiter cannot fail but on a bad rule: limits protect, they do not break
	}
	checks[0] = limiter.Check{Rule: limiter.FrameDenied, ID: int64(c.ID()), Tier: c.Tier()}
	if dd, lerr := lim.Allow(context.Background(), checks[:1]...); lerr == nil && !dd.Allowed {
		log.Info("closing a connection that keeps sending past its frame limits", "uid", c.UID(), "rule", d.Rule)
		c.Close(socket.ClosePolicyViolation, "rate limited")
		return false
	}
	id := ""
	if err == nil {
		id = f.ID
	}
	_ = c.Write(socket.NewTextFrame(AppendErrorFrame(nil, id, &RateLimitedError{Decision: d})))
	return false
}
