package bus

import (
	"slices"
	"testing"
	"time"
)

// queuedTails returns the gids of the tail hints in n's queue.
func queuedTails(n *Node) []int64 {
	n.out.mu.Lock()
	defer n.out.mu.Unlock()
	var gids []int64
	for _, e := range n.out.q[n.out.head:] {
		if e.tail {
			gids = append(gids, e.gid)
		}
	}
	return gids
}

// TestTailSlots: the slot index sends each hint at the first tick at or
// after its due time, follows a due time that moved later, keeps what the
// per-tick limit leaves for the next tick, and loses nothing filed in the
// past or across missed ticks.
func TestTailSlots(t *testing.T) {
	n, err := New(Config{NodeID: "a", Handler: func(b *Batch) { b.Release() }, TailDelay: 400 * time.Millisecond}, nopTransport{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_000_000, 0) // on a slot boundary (ticks of 100 ms)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var sent []int64
	tick := func(ms, limit int, want ...int64) {
		t.Helper()
		n.queueDueTails(at(ms), limit)
		got := queuedTails(n)[len(sent):]
		sent = append(sent, got...)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("tick at %d ms: hints %v, want %v", ms, got, want)
		}
	}
	tick(0, tailsPerTick)
	n.noteTail(1, 1, 10, at(400))
	n.noteTail(2, 1, 20, at(450))
	n.noteTail(3, 1, 30, at(900))
	n.noteTail(1, 1, 11, at(800)) // a later publish: due later
	tick(420, tailsPerTick)       // 1 moved on, 2 due later in this slot
	tick(460, tailsPerTick, 2)
	tick(700, tailsPerTick)
	tick(810, tailsPerTick, 1)
	tick(905, tailsPerTick, 3)

	// The limit: what is left goes at the next ticks, nothing lost.
	for gid := int64(10); gid < 15; gid++ {
		n.noteTail(gid, 1, gid, at(1000))
	}
	tick(1000, 2, 10, 11)
	tick(1100, 2, 12, 13)
	tick(1200, 2, 14)

	// A hint noted due in the past (a failed publish requeued) goes into
	// the next slot, not one looked at already.
	n.noteTail(20, 1, 1, at(300))
	tick(1300, tailsPerTick, 20)

	// Missed ticks (an outage): the hints filed meanwhile go at the
	// first tick after, whatever time has passed.
	n.noteTail(30, 1, 1, at(1500))
	n.noteTail(31, 1, 1, at(3000))
	tick(3_600_000, tailsPerTick, 30, 31)

	if len(n.out.tails) != 0 || len(n.out.dueAt) != 0 {
		t.Fatalf("left: %d hints, %d slots", len(n.out.tails), len(n.out.dueAt))
	}
}
