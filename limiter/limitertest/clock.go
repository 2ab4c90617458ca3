package limitertest

import (
	"sync"
	"time"
)

// Clock is a manual clock shared by a test and the limiters under test. It
// starts at a fixed instant and moves only when Advance is called.
type Clock struct {
	mu    sync.Mutex
	start time.Time
	now   time.Time
}

// NewClock returns a clock standing at a fixed instant.
func NewClock() *Clock {
	t := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return &Clock{start: t, now: t}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Elapsed returns how far the clock has been advanced since NewClock.
func (c *Clock) Elapsed() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now.Sub(c.start)
}
