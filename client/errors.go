package client

import (
	"errors"
	"fmt"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// Sentinel errors.
var (
	// ErrClosed is returned by calls on a Conn or Room that was closed,
	// and wraps the terminal error when the Conn gave up by itself.
	ErrClosed = errors.New("client: closed")
	// ErrConnLost means the connection (the socket, or an HTTP request's
	// connection) dropped before the answer came; Send, Pull and Sync
	// retry it, and return it when their retries are exhausted.
	ErrConnLost = errors.New("client: connection lost")
	// ErrTimeout means no answer came within Config.SendTimeout.
	ErrTimeout = errors.New("client: timed out waiting for the answer")
	// ErrUnauthorized is a 401 answer to the upgrade or an HTTP request:
	// the token is missing, malformed or expired.
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrNoHTTP is returned by Sync when Config.HTTPURL is empty.
	ErrNoHTTP = errors.New("client: Config.HTTPURL is not set")
	// ErrIDInFlight is returned by Send when a request with the same id is
	// still waiting for its answer on this Conn.
	ErrIDInFlight = errors.New("client: a request with this id is in flight")
	// ErrProtocol means the server sent something docs/protocol.md does not
	// allow (e.g. no hello first).
	ErrProtocol = errors.New("client: protocol violation")
)

// Error is an error answered by the server: an error frame or an HTTP error
// body. Read it with errors.As.
type Error struct {
	// Code is one of the docs/protocol.md §7.1 error codes (wire.Code*).
	Code string
	// Message is the server's explanation, for humans.
	Message string
	// RetryAfter is the server's retry_after_ms (0 = absent).
	RetryAfter time.Duration
	// Status is the HTTP status of an HTTP answer; 0 for WebSocket frames.
	Status int
}

// Error returns "client: server error CODE: MESSAGE".
func (e *Error) Error() string {
	s := "client: server error " + e.Code
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	return s
}

// Retryable reports whether the same request may succeed later:
// overloaded, unavailable and rate_limited are retryable.
func (e *Error) Retryable() bool {
	switch e.Code {
	case wire.CodeOverloaded, wire.CodeUnavailable, wire.CodeRateLimited:
		return true
	}
	return false
}

// Is makes errors.Is(err, ErrUnauthorized) true for an unauthorized code.
func (e *Error) Is(target error) bool {
	return target == ErrUnauthorized && e.Code == wire.CodeUnauthorized
}

func errorFrom(f *wire.Error) *Error {
	return &Error{Code: f.Code, Message: f.Message, RetryAfter: time.Duration(f.RetryAfterMS) * time.Millisecond}
}

// HandshakeError is a refused upgrade: the server answered with a plain
// HTTP status (401 bad token, 403 origin, 429 node busy, 503 L4).
type HandshakeError struct {
	Status int
}

// Error returns "client: handshake refused: HTTP STATUS".
func (e *HandshakeError) Error() string {
	return fmt.Sprintf("client: handshake refused: HTTP %d", e.Status)
}

// Unwrap returns ErrUnauthorized for 401.
func (e *HandshakeError) Unwrap() error {
	if e.Status == 401 {
		return ErrUnauthorized
	}
	return nil
}

// permanent reports whether redialing cannot help without a new token.
func (e *HandshakeError) permanent() bool { return e.Status == 401 || e.Status == 403 }
