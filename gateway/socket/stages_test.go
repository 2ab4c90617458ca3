package socket

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestOnWritePass: a broadcast frame stamped with an origin is reported once
// per loop pass that wrote it, with the pass's start and end after the
// origin; an unstamped frame is not reported.
func TestOnWritePass(t *testing.T) {
	type pass struct{ origin, first, last int64 }
	var mu sync.Mutex
	var got []pass
	h := &echoHandler{}
	s := startServer(t, Config{NumLoops: 1, Handler: h, OnWritePass: func(origin, first, last int64) {
		mu.Lock()
		got = append(got, pass{origin, first, last})
		mu.Unlock()
	}})
	const nConns = 5
	var cs []*wsClient
	for i := range nConns {
		cs = append(cs, dialWS(t, s, "/ws", fmt.Sprint("u", i)))
	}
	waitFor(t, 3*time.Second, "all opened", func() bool { return h.opened.Load() == nConns })
	conns := h.snapshot()

	s.Broadcast(NewPushFrame(1, 1, []byte("plain")), conns)
	for _, c := range cs {
		readFrames(t, c, 1, 5*time.Second)
	}
	origin := time.Now().UnixNano()
	a, b := NewPushFrame(1, 2, []byte("a")), NewPushFrame(1, 3, []byte("b"))
	a.SetOrigin(origin)
	b.SetOrigin(origin + 1)
	s.BroadcastBatch([]*Frame{a, b}, conns)
	for _, c := range cs {
		readFrames(t, c, 2, 5*time.Second)
	}
	s.sync()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("got %d passes reported (%v), want 2: one per stamped frame, none for the plain one", len(got), got)
	}
	for i, p := range got {
		if p.origin != origin+int64(i) {
			t.Errorf("pass %d: origin %d, want %d (frame order)", i, p.origin, origin+int64(i))
		}
		if p.first < origin || p.last < p.first {
			t.Errorf("pass %d: first %d, last %d: want origin <= first <= last", i, p.first, p.last)
		}
	}
}
