package socket

import (
	"fmt"
	"runtime"
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

// TestPassYields: with one Go processor, a long write pass lets another
// runnable goroutine run about every PassYield (checked every 64
// connections), not only when the runtime preempts the loop (every
// 10 ms). A spinner goroutine records when it runs; with a yield after
// every 64 connections, most of the pass's yields find it inside the pass.
func TestPassYields(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var mu sync.Mutex
	var first, last int64
	h := &echoHandler{}
	s := startServer(t, Config{NumLoops: 1, Handler: h, PassYield: time.Nanosecond,
		OnWritePass: func(origin, f, l int64) {
			mu.Lock()
			first, last = f, l
			mu.Unlock()
		}})
	const nConns = 640
	var cs []*wsClient
	for i := range nConns {
		cs = append(cs, dialWS(t, s, "/ws", fmt.Sprint("u", i)))
	}
	waitFor(t, 10*time.Second, "all opened", func() bool { return h.opened.Load() == nConns })
	conns := h.snapshot()

	var stamps []int64 // the spinner's, read after it stops
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			stamps = append(stamps, time.Now().UnixNano())
			runtime.Gosched()
		}
	}()
	f := NewPushFrame(1, 1, []byte("yield"))
	f.SetOrigin(time.Now().UnixNano())
	s.Broadcast(f, conns)
	s.sync()
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	inside := 0
	for _, st := range stamps {
		if st > first && st < last {
			inside++
		}
	}
	// 640 connections: a yield after each 64, 9 of them inside the pass.
	if want := nConns/64 - 2; inside < want {
		t.Fatalf("the spinner ran %d times inside a pass of %v, want at least %d (one per yield)", inside, time.Duration(last-first), want)
	}
	for _, c := range cs {
		readFrames(t, c, 1, 5*time.Second)
	}
}
