package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
)

// TestRejectedFrame: a room's refusal reaches the room socket through
// MapError with the codes docs/protocol.md §6.4 names.
func TestRejectedFrame(t *testing.T) {
	cases := []struct {
		reason waitroom.RejectReason
		retry  time.Duration
		want   string
	}{
		{waitroom.RejectRoomFull, 2500 * time.Millisecond, `{"type":"rejected","room":"r1","code":"room_full","retry_after_ms":2500}`},
		{waitroom.RejectRoomClosed, 0, `{"type":"rejected","room":"r1","code":"room_closed","retry_after_ms":0}`},
	}
	for _, c := range cases {
		if got := string(appendRejected(nil, "r1", c.reason.Err(c.retry))); got != c.want {
			t.Errorf("%s: got %s, want %s", c.reason, got, c.want)
		}
	}
}

func TestMapError(t *testing.T) {
	_, decodeErr := wire.DecodeClient([]byte(`{"type":"send","id":"c-9","gid":0,"body":1}`))
	wrap := func(err error) error { return fmt.Errorf("engine: send gid=7: %w", err) }
	cases := []struct {
		name    string
		err     error
		scope   Scope
		code    string
		status  int
		message string // exact
		retry   time.Duration
		id      string
	}{
		{"nil", nil, ScopeMember, wire.CodeInternal, 500, "internal error", 0, ""},
		{"unknown", errors.New("pq: something broke at 10.0.0.5"), ScopeMember, wire.CodeInternal, 500, "internal error", 0, ""},
		{"unknown but retryable", RetryLater(errors.New("weird"), 3*time.Second), ScopeMember, wire.CodeUnavailable, 503, "temporarily unavailable", 3 * time.Second, ""},

		{"decode error", decodeErr, ScopeMember, wire.CodeBadRequest, 400, "gid: must be a positive integer", 0, "c-9"},
		{"max bytes", &http.MaxBytesError{Limit: 1024}, ScopeMember, wire.CodeTooLarge, 413, "request body larger than 1024 bytes", 0, ""},
		{"bad request with message", BadRequest("gid: must be a positive integer"), ScopeAdmin, wire.CodeBadRequest, 400, "gid: must be a positive integer", 0, ""},
		{"unauthorized", ErrUnauthorized, ScopeMember, wire.CodeUnauthorized, 401, "missing or invalid credentials", 0, ""},
		{"invalid token", fmt.Errorf("%w: x", auth.ErrInvalidToken), ScopeMember, wire.CodeUnauthorized, 401, "invalid or expired token", 0, ""},
		{"expired token", fmt.Errorf("%w: %w", auth.ErrInvalidToken, auth.ErrExpired), ScopeMember, wire.CodeUnauthorized, 401, "invalid or expired token", 0, ""},
		{"rate limited with hint", RetryLater(ErrRateLimited, 250*time.Millisecond), ScopeMember, wire.CodeRateLimited, 429, "rate limited", 250 * time.Millisecond, ""},
		{"rate limited without hint", ErrRateLimited, ScopeMember, wire.CodeRateLimited, 429, "rate limited", DefaultRetryAfter, ""},
		{"not found", ErrNotFound, ScopeAdmin, wire.CodeNotFound, 404, "not found", 0, ""},
		{"not ready", ErrNotReady, ScopeAdmin, wire.CodeUnavailable, 503, "not ready", DefaultRetryAfter, ""},

		// Member scope: unknown group and non-member are indistinguishable.
		{"member: not a member", wrap(store.ErrNotMember), ScopeMember, wire.CodeForbidden, 403, "not a member of this group", 0, ""},
		{"member: group not found", wrap(store.ErrGroupNotFound), ScopeMember, wire.CodeForbidden, 403, "not a member of this group", 0, ""},
		// Admin scope: existence is not secret.
		{"admin: group not found", wrap(store.ErrGroupNotFound), ScopeAdmin, wire.CodeNotFound, 404, "group not found", 0, ""},
		{"admin: not a member", wrap(store.ErrNotMember), ScopeAdmin, wire.CodeNotFound, 404, "not a member of this group", 0, ""},

		{"muted", store.ErrMuted, ScopeMember, wire.CodeForbidden, 403, "muted in this group", 0, ""},
		{"group closed", wrap(store.ErrGroupClosed), ScopeMember, wire.CodeGroupClosed, 409, "group is muted or dissolved", 0, ""},
		{"group exists", store.ErrGroupExists, ScopeAdmin, wire.CodeBadRequest, 409, "group already exists", 0, ""},
		{"user not found", store.ErrUserNotFound, ScopeAdmin, wire.CodeNotFound, 404, "user not found", 0, ""},
		{"gids exhausted", wrap(store.ErrGIDExhausted), ScopeAdmin, wire.CodeInternal, 507, "no group id left to assign; pass an explicit gid", 0, ""},
		{"store too large", wrap(store.ErrTooLarge), ScopeMember, wire.CodeTooLarge, 413, "too large", 0, ""},
		{"store bad request", fmt.Errorf("%w: inverted range", store.ErrBadRequest), ScopeMember, wire.CodeBadRequest, 400, "bad request", 0, ""},
		{"store unavailable", store.Unavailable(errors.New("dial tcp: refused")), ScopeMember, wire.CodeUnavailable, 503, "storage temporarily unavailable", DefaultRetryAfter, ""},

		{"fanout overloaded", &fanout.RetryError{Err: fanout.ErrOverloaded, After: 1500 * time.Millisecond}, ScopeMember, wire.CodeOverloaded, 503, "overloaded, retry later", 1500 * time.Millisecond, ""},
		{"fanout unavailable (L4)", &fanout.RetryError{Err: fanout.ErrUnavailable, After: 5 * time.Second}, ScopeMember, wire.CodeUnavailable, 503, "temporarily unavailable", 5 * time.Second, ""},
		{"fanout group rate limited", &fanout.RetryError{Err: fanout.ErrRateLimited, After: 2 * time.Second}, ScopeMember, wire.CodeRateLimited, 429, "group rate limited", 2 * time.Second, ""},
		{"fanout @all quota", &fanout.RetryError{Err: fanout.ErrAtAllQuota, After: 3 * time.Hour}, ScopeMember, wire.CodeRateLimited, 429, "@all limit of this group reached for today", 3 * time.Hour, ""},
		{"hook rejected", wrap(&hooks.RejectedError{Code: "spam.link"}), ScopeMember, wire.CodeRejected, 422, "spam.link", 0, ""},
		{"hook unavailable (fail closed)", &fanout.RetryError{Err: errors.Join(fanout.ErrUnavailable, hooks.ErrHookUnavailable), After: time.Second}, ScopeMember, wire.CodeUnavailable, 503, "moderation temporarily unavailable", time.Second, ""},
		{"fanout closed", fanout.ErrClosed, ScopeMember, wire.CodeUnavailable, 503, "shutting down, retry on another node", DefaultRetryAfter, ""},
		{"fanout wrapping store error", &fanout.RetryError{Err: store.ErrNotMember, After: time.Second}, ScopeMember, wire.CodeForbidden, 403, "not a member of this group", 0, ""},

		{"room unknown", waitroom.ErrUnknownRoom, ScopeAdmin, wire.CodeNotFound, 404, "room not found", 0, ""},
		{"room full", waitroom.RejectRoomFull.Err(3 * time.Second), ScopeMember, wire.CodeRoomFull, 503, "waiting room full, retry later", 3 * time.Second, ""},
		{"room full, no hint", waitroom.RejectRoomFull.Err(0), ScopeMember, wire.CodeRoomFull, 503, "waiting room full, retry later", DefaultRetryAfter, ""},
		{"room closed", waitroom.RejectRoomClosed.Err(0), ScopeMember, wire.CodeRoomClosed, 409, "waiting room closed", 0, ""},
		{"room backend", waitroom.ErrUnavailable, ScopeMember, wire.CodeUnavailable, 503, "waiting room temporarily unavailable", DefaultRetryAfter, ""},

		{"cluster presence unavailable", fmt.Errorf("%w: dial tcp: refused", presence.ErrUnavailable), ScopeAdmin, wire.CodeUnavailable, 503, "cluster presence temporarily unavailable", DefaultRetryAfter, ""},

		{"deadline", wrap(context.DeadlineExceeded), ScopeMember, wire.CodeUnavailable, 503, "timed out, retry later", DefaultRetryAfter, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := MapError(tc.err, tc.scope)
			want := ErrorReply{Code: tc.code, Status: tc.status, Message: tc.message, RetryAfter: tc.retry, ID: tc.id}
			if got != want {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
			if got.Retryable() != (got.Status == 429 || got.Status == 503) {
				t.Fatalf("Retryable %v for status %d", got.Retryable(), got.Status)
			}
			if got.Retryable() && got.RetryAfter <= 0 {
				t.Fatalf("retryable reply without retry hint: %+v", got)
			}
		})
	}
}

// TestErrorRulesComplete checks that every rule is reachable: no earlier
// rule shadows a later one.
func TestErrorRulesComplete(t *testing.T) {
	for i, rule := range errorRules {
		got := reply(rule.err)
		if got.Code != rule.code || got.Status != rule.status || got.Message != rule.message {
			t.Errorf("rule %d (%v): got %+v, shadowed by an earlier rule", i, rule.err, got)
		}
		switch rule.code {
		case wire.CodeBadRequest, wire.CodeUnauthorized, wire.CodeForbidden, wire.CodeNotFound, wire.CodeGroupClosed,
			wire.CodeRateLimited, wire.CodeTooLarge, wire.CodeOverloaded, wire.CodeUnavailable, wire.CodeInternal,
			wire.CodeRoomFull, wire.CodeRoomClosed, // the room socket's rejected frame (§6.4)
			wire.CodeRejected: // the before-send hook (§13.2)
		default:
			t.Errorf("rule %d: code %q is not a protocol code", i, rule.code)
		}
	}
}

func TestAppendErrorFrame(t *testing.T) {
	_, decodeErr := wire.DecodeClient([]byte(`{"type":"pull","id":"p-1","gid":3,"from_seq":-1}`))
	cases := []struct {
		name string
		id   string
		err  error
		want wire.Error
	}{
		{"decode error echoes parsed id", "", decodeErr,
			wire.Error{ID: "p-1", Code: wire.CodeBadRequest, Message: "from_seq: must be a non-negative integer"}},
		{"explicit id wins", "c-5", store.ErrGroupNotFound,
			wire.Error{ID: "c-5", Code: wire.CodeForbidden, Message: "not a member of this group"}},
		{"retry hint in ms, rounded up", "c-6", RetryLater(ErrRateLimited, 1500*time.Microsecond),
			wire.Error{ID: "c-6", Code: wire.CodeRateLimited, Message: "rate limited", RetryAfterMS: 2}},
		{"overloaded", "c-7", &fanout.RetryError{Err: fanout.ErrOverloaded, After: 800 * time.Millisecond},
			wire.Error{ID: "c-7", Code: wire.CodeOverloaded, Message: "overloaded, retry later", RetryAfterMS: 800}},
		{"internal hides detail", "", errors.New("secret detail"),
			wire.Error{Code: wire.CodeInternal, Message: "internal error"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			frame := AppendErrorFrame(nil, tc.id, tc.err)
			f, err := wire.DecodeServer(frame)
			if err != nil {
				t.Fatalf("DecodeServer(%s): %v", frame, err)
			}
			got, ok := f.(*wire.Error)
			if !ok || *got != tc.want {
				t.Fatalf("got %s, want %+v", frame, tc.want)
			}
		})
	}
}

func TestWriteError(t *testing.T) {
	cases := []struct {
		name       string
		err        error
		status     int
		retryAfter string // header; "" = absent
		body       string
		wwwAuth    bool
	}{
		{"429 rounds seconds up", RetryLater(ErrRateLimited, 1500*time.Millisecond), 429, "2",
			`{"error":{"code":"rate_limited","message":"rate limited","retry_after_ms":1500}}`, false},
		{"503 sub-second hint is at least 1 s", &fanout.RetryError{Err: fanout.ErrOverloaded, After: 10 * time.Millisecond}, 503, "1",
			`{"error":{"code":"overloaded","message":"overloaded, retry later","retry_after_ms":10}}`, false},
		{"503 default", store.ErrUnavailable, 503, "1",
			`{"error":{"code":"unavailable","message":"storage temporarily unavailable","retry_after_ms":1000}}`, false},
		{"403 no retry", store.ErrNotMember, 403, "",
			`{"error":{"code":"forbidden","message":"not a member of this group"}}`, false},
		{"401 challenges", ErrUnauthorized, 401, "",
			`{"error":{"code":"unauthorized","message":"missing or invalid credentials"}}`, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			WriteError(rec, tc.err, ScopeMember)
			res := rec.Result()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != tc.status {
				t.Errorf("got status %d, want %d", res.StatusCode, tc.status)
			}
			if got := res.Header.Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("got Retry-After %q, want %q", got, tc.retryAfter)
			}
			if got := strings.TrimSpace(string(body)); got != tc.body {
				t.Errorf("got body %s, want %s", got, tc.body)
			}
			if got := res.Header.Get("Content-Type"); got != "application/json" {
				t.Errorf("got Content-Type %q", got)
			}
			if got := res.Header.Get("WWW-Authenticate") != ""; got != tc.wwwAuth {
				t.Errorf("got WWW-Authenticate present=%v, want %v", got, tc.wwwAuth)
			}
		})
	}
}
