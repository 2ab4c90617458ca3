package presence

import (
	"errors"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// TestNoHeartbeats: with Config.NoHeartbeats connections come and go as
// with heartbeats, Touch reports false, Expire drops nothing, and a handle
// is refused twice only within one uid.
func TestNoHeartbeats(t *testing.T) {
	c := newClock()
	l, err := New[int](Config{Now: c.Now, NoHeartbeats: true, MaxConnsPerUser: 2})
	if err != nil {
		t.Fatal(err)
	}
	ms := []Membership{{GID: 7, Ordinal: 3}}
	steps := []struct {
		name string
		do   func() any
		want any
	}{
		{"connect a/1", func() any { return l.Connect("a", 1, ms) }, nil},
		{"online", func() any { return l.AppendConns(nil, 7) }, []int{1}},
		{"touch", func() any { return l.Touch(1) }, false},
		{"expire long after", func() any { c.Advance(time.Hour); return len(l.Expire(c.Now())) }, 0},
		{"still online", func() any { return l.UserOnline("a") }, true},
		{"connect a/1 again", func() any { return errors.Is(l.Connect("a", 1, ms), ErrConnExists) }, true},
		{"connect a/2", func() any { return l.Connect("a", 2, nil) }, nil},
		{"connect a/3 over the cap", func() any { return errors.Is(l.Connect("a", 3, nil), ErrTooManyConns) }, true},
		{"disconnect a/1", func() any { return l.Disconnect("a", 1) }, true},
		{"disconnect a/1 again", func() any { return l.Disconnect("a", 1) }, false},
		{"a still online by 2", func() any { return l.AppendConns(nil, 7) }, []int{2}},
		{"disconnect a/2", func() any { return l.Disconnect("a", 2) }, true},
		{"offline", func() any { return l.UserOnline("a") }, false},
		{"no group left", func() any { return l.Stats() }, Stats{}},
	}
	for _, s := range steps {
		got := s.do()
		if g, ok := got.([]int); ok {
			w := s.want.([]int)
			if len(g) != len(w) || (len(g) > 0 && g[0] != w[0]) {
				t.Fatalf("%s: got %v, want %v", s.name, g, w)
			}
			continue
		}
		if got != s.want {
			t.Fatalf("%s: got %v, want %v", s.name, got, s.want)
		}
	}
}

// handle stands for the gateway's connection handle, an interface value
// (fanout.Conn) in fanfared.
type handle interface{ UID() string }

type testConn struct{ uid string }

func (c *testConn) UID() string { return c.uid }

// TestConnectBytes pins the heap one single-device user with one
// membership costs in a Local as fanfared runs it (interface handles,
// NoHeartbeats): the user, its connection list and membership, its map
// entry and its slot in the group, measured over 20,000 users of one group.
// It was about 330 bytes (heartbeats tracked, the first connection list
// apart) before issue 16; now about 224 (docs/benchmarks.md, "Idle memory
// per connection at 9,000").
func TestConnectBytes(t *testing.T) {
	const n = 20000
	for _, tc := range []struct {
		noBeats bool
		max     float64 // bytes per connection
	}{
		{false, 340},
		{true, 240},
	} {
		conns := make([]handle, n)
		for i := range conns {
			conns[i] = &testConn{uid: "u" + strconv.Itoa(i)}
		}
		l, err := New[handle](Config{NoHeartbeats: tc.noBeats})
		if err != nil {
			t.Fatal(err)
		}
		before := liveHeap()
		for i, c := range conns {
			if err := l.Connect(c.UID(), c, []Membership{{GID: 1, Ordinal: uint32(i)}}); err != nil {
				t.Fatal(err)
			}
		}
		per := float64(liveHeap()-before) / n
		t.Logf("NoHeartbeats %v: %.0f bytes per connection", tc.noBeats, per)
		if per > tc.max {
			t.Errorf("NoHeartbeats %v: %.0f bytes per connection, want at most %.0f", tc.noBeats, per, tc.max)
		}
		runtime.KeepAlive(l)
		runtime.KeepAlive(conns)
	}
}

func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
