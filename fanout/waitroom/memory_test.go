package waitroom_test

import (
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/waitroomtest"
)

// virtualClock is a settable clock for the in-process backend.
type virtualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *virtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *virtualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestMemoryConformance(t *testing.T) {
	waitroomtest.Run(t, func(t *testing.T) waitroomtest.Harness {
		clk := &virtualClock{now: time.Unix(1_750_000_000, 250_000_000)}
		return waitroomtest.Harness{
			Backend: waitroom.NewMemory(waitroom.MemoryConfig{Clock: clk.Now}),
			Sleep:   clk.Advance,
		}
	})
}
