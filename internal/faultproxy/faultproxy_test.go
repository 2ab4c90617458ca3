package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// echo starts a TCP server that writes back what it reads and closes its
// side after the client closed its own.
func echo(t *testing.T) string { return echoBuf(t, 0) }

// echoBuf is echo with socket buffers of buf bytes (0 = the kernel's).
func echoBuf(t *testing.T, buf int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if buf > 0 {
				c.(*net.TCPConn).SetReadBuffer(buf)
				c.(*net.TCPConn).SetWriteBuffer(buf)
			}
			wg.Go(func() {
				defer c.Close()
				io.CopyBuffer(c, c, make([]byte, 4096))
				c.(*net.TCPConn).CloseWrite()
			})
		}
	})
	return ln.Addr().String()
}

func dial(t *testing.T, p *Proxy) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// roundTrip writes msg and reads it back within d.
func roundTrip(t *testing.T, c net.Conn, msg []byte, d time.Duration) {
	t.Helper()
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(d))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read back %d bytes: %v", len(msg), err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("read back %q, want %q", got, msg)
	}
}

// silent checks that nothing arrives on c for d: a blackhole can only be
// shown by waiting.
func silent(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	n, err := c.Read(b[:])
	var ne net.Error
	if n != 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("through a blackhole: read %d bytes, err %v; want a timeout", n, err)
	}
}

func TestPassThrough(t *testing.T) {
	p := Start(t, echo(t))
	c := dial(t, p)
	msg := bytes.Repeat([]byte("abc"), 50000) // several chunks
	done := make(chan struct{})
	go func() { defer close(done); roundTrip(t, c, msg, 10*time.Second) }()
	<-done
	// A clean close passes through as FINs, not as a reset.
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after close: read %d, %v; want EOF", n, err)
	}
	st := p.Stats()
	if st.Accepted != 1 || st.Upstream != int64(len(msg)) || st.Downstream != int64(len(msg)) || st.Resets != 0 {
		t.Fatalf("stats: got %+v", st)
	}
}

func TestLatencyAndJitter(t *testing.T) {
	p := Start(t, echo(t))
	c := dial(t, p)
	roundTrip(t, c, []byte("warm"), 5*time.Second)
	p.Set(Upstream, Faults{Latency: 100 * time.Millisecond})
	p.Set(Downstream, Faults{Latency: 50 * time.Millisecond, Jitter: 50 * time.Millisecond})
	start := time.Now()
	roundTrip(t, c, []byte("ping"), 5*time.Second)
	if rtt := time.Since(start); rtt < 150*time.Millisecond {
		t.Fatalf("round trip %v, want at least 150 ms", rtt)
	}
	// Jitter never reorders: many small writes come back in order.
	var want []byte
	for i := range 200 {
		b := []byte{byte(i)}
		want = append(want, b...)
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes reordered under jitter")
	}
	p.Clear()
	start = time.Now()
	roundTrip(t, c, []byte("fast"), 5*time.Second)
	t.Logf("round trip after clear: %v", time.Since(start))
}

func TestBandwidth(t *testing.T) {
	p := Start(t, echo(t))
	c := dial(t, p)
	p.Set(Downstream, Faults{BytesPerSecond: 200 << 10})
	msg := bytes.Repeat([]byte("x"), 100<<10)
	start := time.Now()
	go c.Write(msg)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	// 100 KiB at 200 KiB/s: half a second, less the first burst (1/20 s).
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("100 KiB at 200 KiB/s took %v, want at least 400 ms", d)
	}
}

func TestBlackholeHoldsOneWay(t *testing.T) {
	for _, d := range []Direction{Upstream, Downstream} {
		t.Run(d.String(), func(t *testing.T) {
			p := Start(t, echo(t))
			c := dial(t, p)
			roundTrip(t, c, []byte("before"), 5*time.Second)
			p.Set(d, Faults{Blackhole: true})
			if _, err := c.Write([]byte("held")); err != nil {
				t.Fatal(err) // the connection stays up: writes succeed
			}
			silent(t, c, 300*time.Millisecond)
			if st := p.Stats(); st.Open != 1 {
				t.Fatalf("open connections during the blackhole: %d, want 1", st.Open)
			}
			p.Set(d, Faults{})
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			got := make([]byte, 4)
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "held" {
				t.Fatalf("after the blackhole: got %q, %v; want the held bytes", got, err)
			}
		})
	}
}

func TestResetAfter(t *testing.T) {
	p := Start(t, echo(t))
	c := dial(t, p)
	roundTrip(t, c, bytes.Repeat([]byte("w"), 1000), 5*time.Second) // not counted: before Set
	p.Set(Downstream, Faults{ResetAfter: 10})
	if _, err := c.Write(bytes.Repeat([]byte("r"), 100)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if len(got) != 10 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read %d bytes, %v; want 10 then a reset", len(got), err)
	}
	if st := p.Stats(); st.Resets != 1 {
		t.Fatalf("resets: %d, want 1", st.Resets)
	}
	// A new connection is reset after 10 bytes of its own.
	c2 := dial(t, p)
	c2.Write(bytes.Repeat([]byte("s"), 30))
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(c2); len(got) != 10 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("new connection: read %d bytes, %v; want 10 then a reset", len(got), err)
	}
	p.Clear()
	roundTrip(t, dial(t, p), []byte("fine again"), 5*time.Second)
}

func TestRefuse(t *testing.T) {
	p := Start(t, echo(t))
	c := dial(t, p)
	// Accepted first: a connection still in the backlog goes with the
	// listener (CI saw it reset when Refuse won the race).
	roundTrip(t, c, []byte("accepted"), 5*time.Second)
	if err := p.Refuse(true); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while refusing: %v, want connection refused", err)
	}
	roundTrip(t, c, []byte("open one goes on"), 5*time.Second)
	if err := p.Refuse(false); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, dial(t, p), []byte("accepted again"), 5*time.Second)
}

func TestPartition(t *testing.T) {
	p := Start(t, echo(t))
	old := dial(t, p)
	roundTrip(t, old, []byte("x"), 5*time.Second)
	p.Partition(true)
	old.Write([]byte("old"))
	fresh := dial(t, p) // accepted, then nothing
	fresh.Write([]byte("new"))
	silent(t, old, 200*time.Millisecond)
	silent(t, fresh, 200*time.Millisecond)
	p.Partition(false)
	for _, c := range []net.Conn{old, fresh} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 3)); err != nil {
			t.Fatalf("after the partition: %v", err)
		}
	}
}

func TestResetAllAndClose(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	a, b := dial(t, p), dial(t, p)
	roundTrip(t, a, []byte("a"), 5*time.Second)
	roundTrip(t, b, []byte("b"), 5*time.Second)
	p.ResetAll()
	for _, c := range []net.Conn{a, b} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("after ResetAll: %v, want a reset", err)
		}
	}
	held := dial(t, p)
	p.Set(Upstream, Faults{Blackhole: true})
	held.Write([]byte("stuck"))
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done: // Close does not wait on a held connection
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return in 10 s with a blackholed connection")
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("dial after Close succeeded")
	}
}

// TestSocketBuffers: with small socket buffers a held direction pushes
// back on the sender after little data: here the echo server's replies are
// held, it stops reading, and the client's writes block. The ends use
// small buffers too, so that what the link holds is the proxy's part.
func TestSocketBuffers(t *testing.T) {
	held := func(buf int) int {
		p := Start(t, echoBuf(t, 16<<10))
		p.SetSocketBuffers(buf)
		c := dial(t, p)
		c.SetWriteBuffer(16 << 10)
		roundTrip(t, c, []byte("hi"), 5*time.Second)
		p.Set(Downstream, Faults{Blackhole: true})
		c.SetWriteDeadline(time.Now().Add(time.Second))
		n, err := c.Write(make([]byte, 64<<20))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("write of 64 MiB into a held link: %d bytes, %v; want a timeout", n, err)
		}
		return n
	}
	// The proxy's queue (16 reads of at most 16 KiB) and four 16 KiB
	// buffers, plus the ends': well under 2 MiB, where loopback's
	// autotuned buffers take several.
	n := held(16 << 10)
	t.Logf("%d bytes written before the held link pushed back", n)
	if n > 2<<20 {
		t.Fatalf("16 KiB buffers: %d bytes went into a held link, want under 2 MiB", n)
	}
}
