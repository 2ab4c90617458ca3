// This file holds the engine's errors; gateway maps them to wire codes.

package fanout

import (
	"errors"
	"fmt"
	"time"
)

// Errors returned by the engine. Store rejections (store.ErrNotMember, ...)
// are passed through unchanged.
var (
	// ErrOverloaded means the shard queue is past its bound; retryable.
	ErrOverloaded = errors.New("fanout: overloaded")
	// ErrUnavailable means the store could not commit, or sends are refused
	// at L4; retryable, nothing was stored.
	ErrUnavailable = errors.New("fanout: unavailable")
	// ErrClosed means the engine is shutting down; retryable elsewhere.
	ErrClosed = errors.New("fanout: shutting down")
	// ErrRateLimited means a group-level limit refused the send (the
	// group's rate-limit buffer overflowed); it comes as a *RetryError
	// with the time after which a retry may pass.
	ErrRateLimited = errors.New("fanout: group rate limited")
	// ErrAtAllQuota means the group used its @all messages of the day; it
	// wraps ErrRateLimited and comes as a *RetryError (until the next UTC
	// day).
	ErrAtAllQuota = fmt.Errorf("fanout: @all quota of the day used up: %w", ErrRateLimited)
)

// RetryError is a retryable failure that carries how long to wait.
type RetryError struct {
	Err   error
	After time.Duration
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("%v (retry after %v)", e.Err, e.After)
}

// Unwrap returns the underlying sentinel.
func (e *RetryError) Unwrap() error { return e.Err }

// RetryAfter reports how long the caller should wait before retrying.
func (e *RetryError) RetryAfter() time.Duration { return e.After }
