package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ephemeralLow is the bottom of the kernel's ephemeral port range
// (/proc/sys/net/ipv4/ip_local_port_range).
const ephemeralLow = 32768

// startTimeout bounds a start: waiting for a held port to free and for the
// server to answer. A loaded machine (the race detector on 2 cores) can
// take seconds.
const startTimeout = 20 * time.Second

// Server is a private redis-server on one port.
type Server struct {
	t       testing.TB
	port    int
	busPort int // cluster bus port, 0 outside a cluster
	dir     string
	args    []string

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil while stopped
	exited chan struct{} // closed once cmd has exited and been waited for
}

// Start starts a redis-server on 127.0.0.1:port, in a private directory,
// with persistence off (--save "" --appendonly no); args are passed on
// after these, so they may override them. It waits until the server
// answers PING; t.Cleanup kills it. A port held by another socket is
// waited for, up to 20 s; a port outside 1024-32767 or a missing
// redis-server fails the test.
func Start(t testing.TB, port int, args ...string) *Server {
	t.Helper()
	return start(t, port, 0, args)
}

func start(t testing.TB, port, busPort int, args []string) *Server {
	t.Helper()
	for _, p := range []int{port, busPort} {
		if p != 0 && (p < 1024 || p >= ephemeralLow) {
			t.Fatalf("redistest: port %d: take one in 1024-%d, below the ephemeral range (see the package doc)", p, ephemeralLow-1)
		}
	}
	s := &Server{t: t, port: port, busPort: busPort, dir: t.TempDir(), args: args}
	t.Cleanup(s.Stop)
	s.Start()
	return s
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// Start starts the stopped server again on the same port, empty (nothing
// is persisted), and waits until it answers.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	running := s.cmd != nil
	s.mu.Unlock()
	if running {
		s.t.Fatalf("redistest: Start: the server on %d is running", s.port)
	}
	deadline := time.Now().Add(startTimeout)
	for !s.portsFree() {
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: port %d or %d stayed in use for %v (a leftover redis-server?)", s.port, s.busPort, startTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir}, s.args...)
	cmd := exec.Command("redis-server", args...)
	out := &bytes.Buffer{} // read only once the process has exited
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redistest: start redis-server (make services installs it): %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: 200 * time.Millisecond,
		ReadTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	for {
		select {
		case <-exited:
			s.mu.Lock()
			s.cmd = nil
			s.mu.Unlock()
			s.t.Fatalf("redistest: redis-server on %d exited:\n%s", s.port, out)
		default:
		}
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.Stop()
			s.t.Fatalf("redistest: redis-server on %d did not answer within %v: %v\n%s", s.port, startTimeout, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// portsFree reports whether the server's ports can be bound: a client
// socket or a leftover server may hold one for a while.
func (s *Server) portsFree() bool {
	for _, p := range []int{s.port, s.busPort} {
		if p == 0 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if errors.Is(err, syscall.EADDRINUSE) {
			return false
		}
		if err != nil {
			s.t.Fatalf("redistest: port %d: %v", p, err)
		}
		l.Close()
	}
	return true
}

// Stop kills the server (SIGKILL, as a crash would) and waits for it to
// exit. Stopping a stopped server does nothing; Stop may be called from
// any goroutine.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Pause freezes the server (SIGSTOP): connections stay open and requests
// get no reply, like a hung server. Resume undoes it.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume lets a paused server run on (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("redistest: %v: the server on %d is stopped", sig, s.port)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: %v to the server on %d: %v", sig, s.port, err)
	}
}

// StartCluster starts a Redis Cluster of one master per port, without
// replicas: it starts the servers, joins them and gives each an equal share
// of the 16384 slots, and waits until every node reports the cluster ok.
// Each master's cluster bus port is its port + len(ports) (Redis's own
// default, port + 10000, would land in the ephemeral range for most of
// ours), so n consecutive ports take 2n: StartCluster(t, 16421, 16422,
// 16423) also uses 16424-16426. It returns the masters' addresses.
func StartCluster(t testing.TB, ports ...int) []string {
	t.Helper()
	if len(ports) == 0 {
		t.Fatal("redistest: StartCluster without ports")
	}
	addrs := make([]string, len(ports))
	for i, p := range ports {
		bus := p + len(ports)
		s := start(t, p, bus, []string{"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus),
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"})
		addrs[i] = s.Addr()
	}
	// Join by hand: redis-cli --cluster create would MEET at port + 10000.
	ctx := context.Background()
	for i, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		err := func() error {
			defer c.Close()
			if i > 0 {
				if err := c.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", ports[0], ports[0]+len(ports)).Err(); err != nil {
					return fmt.Errorf("CLUSTER MEET: %w", err)
				}
			}
			lo, hi := i*16384/len(addrs), (i+1)*16384/len(addrs)-1
			if err := c.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
				return fmt.Errorf("CLUSTER ADDSLOTS %d-%d: %w", lo, hi, err)
			}
			return nil
		}()
		if err != nil {
			t.Fatalf("redistest: cluster node %s: %v", a, err)
		}
	}
	deadline := time.Now().Add(startTimeout)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("redistest: cluster not ok on %s within %v: %v\n%s", a, startTimeout, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return addrs
}

// Addr is the shared test Redis of make test: FANFARE_TEST_REDIS_ADDR, or
// 127.0.0.1:6379 when unset. Tests that use it keep their keys under a
// prefix of their own.
func Addr() string {
	if a := os.Getenv("FANFARE_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}
