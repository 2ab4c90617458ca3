package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
)

// Errors raised by the gateway itself.
var (
	// ErrUnauthorized: missing or unacceptable credentials.
	ErrUnauthorized = errors.New("gateway: unauthorized")
	// ErrBadRequest: a malformed request (path, query or body). Use
	// BadRequest to attach a client-facing message.
	ErrBadRequest = errors.New("gateway: bad request")
	// ErrRateLimited: a limiter said no. Wrap it with RetryLater to carry
	// the limiter's retry-after.
	ErrRateLimited = errors.New("gateway: rate limited")
	// ErrNotFound: no such route or resource.
	ErrNotFound = errors.New("gateway: not found")
	// ErrNotReady: /readyz failed or the API is draining (503).
	ErrNotReady = errors.New("gateway: not ready")
)

// DefaultRetryAfter is the retry hint of retryable errors that carry none.
const DefaultRetryAfter = time.Second

// RetryAfterer is implemented by errors that know when a retry may succeed
// (fanout.RetryError, RetryLater). MapError finds it with errors.As.
type RetryAfterer interface {
	RetryAfter() time.Duration
}

// RetryLater wraps err with a retry-after hint.
func RetryLater(err error, after time.Duration) error {
	return &retryError{err: err, after: after}
}

type retryError struct {
	err   error
	after time.Duration
}

func (e *retryError) Error() string             { return fmt.Sprintf("%v (retry after %v)", e.err, e.after) }
func (e *retryError) Unwrap() error             { return e.err }
func (e *retryError) RetryAfter() time.Duration { return e.after }

// BadRequest returns an error wrapping ErrBadRequest whose message is sent
// to the client as is: keep it free of internal detail.
func BadRequest(format string, args ...any) error {
	return &clientError{base: ErrBadRequest, msg: fmt.Sprintf(format, args...)}
}

// clientError carries a client-facing message for a gateway sentinel.
type clientError struct {
	base error
	msg  string
}

func (e *clientError) Error() string { return e.base.Error() + ": " + e.msg }
func (e *clientError) Unwrap() error { return e.base }

// Scope says on whose behalf a request runs; it decides how existence is
// reported.
type Scope uint8

const (
	// ScopeMember is a user acting on a group it must belong to (every
	// WebSocket request; the user HTTP endpoints). An unknown group
	// answers exactly like a group the user is not a member of
	// (forbidden, "not a member of this group"), so users cannot probe
	// which gids exist. forbidden rather than not_found because
	// docs/protocol.md §7.4 names forbidden for non-members; both hide existence
	// equally.
	ScopeMember Scope = iota
	// ScopeAdmin is an operator: unknown groups are not_found, and so is
	// a uid that is not a member (DELETE .../members/{uid}).
	ScopeAdmin
)

// ErrorReply is what an error becomes on the wire: the code of error
// frames and HTTP bodies, the HTTP status, a client-facing message (never
// internal detail), the retry hint (0 = none) and, for WebSocket, the
// request id recovered from a decode error.
type ErrorReply struct {
	Code       string
	Status     int
	Message    string
	RetryAfter time.Duration
	ID         string
}

// Retryable reports whether the client should retry after RetryAfter.
func (r ErrorReply) Retryable() bool {
	return r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable
}

// errorRule maps one sentinel (matched with errors.Is) to its reply.
type errorRule struct {
	err     error
	code    string
	status  int
	message string
}

// errorRules is THE table from errors to wire codes and HTTP statuses,
// checked in order; the first match wins. Extend it here (and in
// TestMapError) when a package adds a sentinel.
var errorRules = []errorRule{
	{ErrUnauthorized, wire.CodeUnauthorized, http.StatusUnauthorized, "missing or invalid credentials"},
	{auth.ErrInvalidToken, wire.CodeUnauthorized, http.StatusUnauthorized, "invalid or expired token"},
	{ErrBadRequest, wire.CodeBadRequest, http.StatusBadRequest, "bad request"},
	{ErrNotFound, wire.CodeNotFound, http.StatusNotFound, "not found"},
	{ErrRateLimited, wire.CodeRateLimited, http.StatusTooManyRequests, "rate limited"},
	{ErrNotReady, wire.CodeUnavailable, http.StatusServiceUnavailable, "not ready"},

	{store.ErrNotMember, wire.CodeForbidden, http.StatusForbidden, "not a member of this group"},
	{store.ErrMuted, wire.CodeForbidden, http.StatusForbidden, "muted in this group"},
	{store.ErrGroupNotFound, wire.CodeNotFound, http.StatusNotFound, "group not found"},
	{store.ErrUserNotFound, wire.CodeNotFound, http.StatusNotFound, "user not found"},
	{store.ErrGroupClosed, wire.CodeGroupClosed, http.StatusConflict, "group is muted or dissolved"},
	// The codes of docs/protocol.md §7.1 have no "exists": a taken gid is a bad request
	// with the 409 status.
	{store.ErrGroupExists, wire.CodeBadRequest, http.StatusConflict, "group already exists"},
	// A permanent state of the server, not an outage: 507, not retryable.
	{store.ErrGIDExhausted, wire.CodeInternal, http.StatusInsufficientStorage, "no group id left to assign; pass an explicit gid"},
	{store.ErrTooLarge, wire.CodeTooLarge, http.StatusRequestEntityTooLarge, "too large"},
	{store.ErrBadRequest, wire.CodeBadRequest, http.StatusBadRequest, "bad request"},
	{store.ErrUnavailable, wire.CodeUnavailable, http.StatusServiceUnavailable, "storage temporarily unavailable"},

	{hooks.ErrRejected, wire.CodeRejected, http.StatusUnprocessableEntity, "rejected"},
	{hooks.ErrHookUnavailable, wire.CodeUnavailable, http.StatusServiceUnavailable, "moderation temporarily unavailable"},
	{fanout.ErrAtAllQuota, wire.CodeRateLimited, http.StatusTooManyRequests, "@all limit of this group reached for today"},
	{fanout.ErrRateLimited, wire.CodeRateLimited, http.StatusTooManyRequests, "group rate limited"},
	{fanout.ErrOverloaded, wire.CodeOverloaded, http.StatusServiceUnavailable, "overloaded, retry later"},
	{fanout.ErrUnavailable, wire.CodeUnavailable, http.StatusServiceUnavailable, "temporarily unavailable"},
	{fanout.ErrClosed, wire.CodeUnavailable, http.StatusServiceUnavailable, "shutting down, retry on another node"},

	{waitroom.ErrRoomFull, wire.CodeRoomFull, http.StatusServiceUnavailable, "waiting room full, retry later"},
	{waitroom.ErrRoomClosed, wire.CodeRoomClosed, http.StatusConflict, "waiting room closed"},
	{waitroom.ErrUnknownRoom, wire.CodeNotFound, http.StatusNotFound, "room not found"},
	{waitroom.ErrUnavailable, wire.CodeUnavailable, http.StatusServiceUnavailable, "waiting room temporarily unavailable"},
	{waitroom.ErrClosed, wire.CodeUnavailable, http.StatusServiceUnavailable, "shutting down, retry on another node"},

	{presence.ErrUnavailable, wire.CodeUnavailable, http.StatusServiceUnavailable, "cluster presence temporarily unavailable"},

	{context.DeadlineExceeded, wire.CodeUnavailable, http.StatusServiceUnavailable, "timed out, retry later"},
	{context.Canceled, wire.CodeUnavailable, http.StatusServiceUnavailable, "request canceled"},
}

// MapError turns err into its wire reply for scope. This is the one place
// where errors become codes and statuses: HTTP handlers (WriteError) and
// the WebSocket path (AppendErrorFrame) both use it. Unknown errors are
// internal (500) with a generic message; retryable replies (429, 503)
// always carry a RetryAfter, DefaultRetryAfter when err has none.
func MapError(err error, scope Scope) ErrorReply {
	var r ErrorReply
	var de *wire.DecodeError
	var mb *http.MaxBytesError
	var ce *clientError
	switch {
	case err == nil:
		return ErrorReply{Code: wire.CodeInternal, Status: http.StatusInternalServerError, Message: "internal error"}
	case errors.As(err, &de):
		r = ErrorReply{Code: wire.CodeBadRequest, Status: http.StatusBadRequest, Message: de.Message(), ID: de.ID}
	case errors.As(err, &mb):
		r = ErrorReply{Code: wire.CodeTooLarge, Status: http.StatusRequestEntityTooLarge,
			Message: "request body larger than " + strconv.FormatInt(mb.Limit, 10) + " bytes"}
	case scope == ScopeMember && errors.Is(err, store.ErrGroupNotFound):
		r = reply(store.ErrNotMember) // hide existence: see ScopeMember
	case scope == ScopeAdmin && errors.Is(err, store.ErrNotMember):
		r = ErrorReply{Code: wire.CodeNotFound, Status: http.StatusNotFound, Message: "not a member of this group"}
	default:
		r = reply(err)
		var rej *hooks.RejectedError
		if errors.As(err, &ce) {
			r.Message = ce.msg
		} else if errors.As(err, &rej) {
			r.Message = rej.Code // the application's code, [a-z0-9_.-]
		}
	}
	if r.Status == http.StatusInternalServerError {
		var ra RetryAfterer
		if errors.As(err, &ra) {
			// An unknown error that knows it is transient.
			r = ErrorReply{Code: wire.CodeUnavailable, Status: http.StatusServiceUnavailable, Message: "temporarily unavailable"}
		}
	}
	if r.Retryable() {
		var ra RetryAfterer
		if errors.As(err, &ra) {
			r.RetryAfter = ra.RetryAfter()
		}
		if r.RetryAfter <= 0 {
			r.RetryAfter = DefaultRetryAfter
		}
	}
	return r
}

func reply(err error) ErrorReply {
	for _, rule := range errorRules {
		if errors.Is(err, rule.err) {
			return ErrorReply{Code: rule.code, Status: rule.status, Message: rule.message}
		}
	}
	return ErrorReply{Code: wire.CodeInternal, Status: http.StatusInternalServerError, Message: "internal error"}
}

// retryAfterMS is the retry hint in milliseconds, rounded up.
func (r ErrorReply) retryAfterMS() int64 {
	return int64((r.RetryAfter + time.Millisecond - 1) / time.Millisecond)
}

// retryAfterSeconds is the Retry-After header value: whole seconds,
// rounded up, at least 1.
func (r ErrorReply) retryAfterSeconds() int64 {
	s := int64((r.RetryAfter + time.Second - 1) / time.Second)
	return max(s, 1)
}

// AppendErrorFrame appends the WebSocket error frame for err, answering
// request id (when id is "" the id recovered from a decode error is used).
// WebSocket requests are always ScopeMember.
func AppendErrorFrame(dst []byte, id string, err error) []byte {
	r := MapError(err, ScopeMember)
	if id == "" {
		id = r.ID
	}
	return wire.AppendError(dst, &wire.Error{ID: id, Code: r.Code, Message: r.Message, RetryAfterMS: r.retryAfterMS()})
}

// appendRejected appends the room socket's rejected frame for err (a
// waitroom.RejectedError): code and retry hint from MapError.
func appendRejected(dst []byte, room string, err error) []byte {
	r := MapError(err, ScopeMember)
	return wire.AppendRejected(dst, &wire.Rejected{Room: room, Code: r.Code, RetryAfterMS: r.retryAfterMS()})
}

// WriteError writes err as an HTTP error response for scope:
// {"error":{"code","message","retry_after_ms"?}} with the mapped status and
// Retry-After (seconds, rounded up) on 429 and 503. It returns the reply so
// the caller can log internal errors.
func WriteError(w http.ResponseWriter, err error, scope Scope) ErrorReply {
	r := MapError(err, scope)
	h := w.Header()
	if r.Retryable() {
		h.Set("Retry-After", strconv.FormatInt(r.retryAfterSeconds(), 10))
	}
	var rl *RateLimitedError
	if errors.As(err, &rl) {
		setRateLimitHeaders(h, rl.Decision)
	}
	if r.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="fanfare"`)
	}
	body := wire.AppendErrorResponse(make([]byte, 0, 128), &wire.ErrorBody{Code: r.Code, Message: r.Message, RetryAfterMS: r.retryAfterMS()})
	writeRaw(w, r.Status, append(body, '\n'))
	return r
}
