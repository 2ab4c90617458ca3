package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// This package's own tests take 16380-16389.

func client(t *testing.T, s *Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRestartEmpty: Stop makes the server unreachable; Start brings it
// back on the same port, empty.
func TestRestartEmpty(t *testing.T) {
	s := Start(t, 16380)
	if s.Port() != 16380 || s.Addr() != "127.0.0.1:16380" {
		t.Fatalf("got port %d addr %s, want 16380 and 127.0.0.1:16380", s.Port(), s.Addr())
	}
	c := client(t, s)
	if err := c.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.Stop() // a second Stop does nothing
	if err := c.Ping(t.Context()).Err(); err == nil {
		t.Fatal("PING after Stop: got nil error")
	}
	s.Start()
	if err := c.Get(t.Context(), "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after a restart: got %v, want redis.Nil (nothing persisted)", err)
	}
}

// TestWaitsForHeldPort: a port held by another socket when Start is called
// is waited for.
func TestWaitsForHeldPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:16381")
	if err != nil {
		t.Fatal(err)
	}
	const hold = 300 * time.Millisecond
	go func() {
		time.Sleep(hold)
		l.Close()
	}()
	begin := time.Now()
	s := Start(t, 16381)
	if d := time.Since(begin); d < hold {
		t.Fatalf("Start returned after %v, before the port was free (%v)", d, hold)
	}
	if err := client(t, s).Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
}

// TestPauseResume: a paused server keeps the connection but does not
// answer; resumed, it answers again.
func TestPauseResume(t *testing.T) {
	s := Start(t, 16382)
	c := client(t, s)
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	s.Pause()
	defer s.Resume()
	var ne net.Error
	if err := c.Ping(t.Context()).Err(); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("PING to a paused server: got %v, want a timeout", err)
	}
	s.Resume()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	for c.Ping(ctx).Err() != nil {
		if ctx.Err() != nil {
			t.Fatal("no PONG after Resume")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fatalTB records the first Fatal and ends the goroutine, as testing does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestRefusesPorts: ports in the ephemeral range or below 1024 fail the
// test before anything starts, the bus ports of a cluster included.
func TestRefusesPorts(t *testing.T) {
	for _, tt := range []struct {
		name  string
		start func(testing.TB)
		want  string
	}{
		{"ephemeral", func(tb testing.TB) { Start(tb, 32768) }, "port 32768"},
		{"privileged", func(tb testing.TB) { Start(tb, 1023) }, "port 1023"},
		{"cluster bus", func(tb testing.TB) { StartCluster(tb, 32766, 32767) }, "port 32768"},
		{"no cluster ports", func(tb testing.TB) { StartCluster(tb) }, "without ports"},
	} {
		f := &fatalTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			tt.start(f)
		}()
		<-done
		if !strings.Contains(f.msg, tt.want) {
			t.Errorf("%s: got Fatal %q, want one naming %q", tt.name, f.msg, tt.want)
		}
	}
}
