package socket

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fanfare-im/fanfare/gateway/auth"
)

// loadClientEnv switches the test binary into load-client mode (see
// TestMain): "addr,count" opens count upgraded connections to addr, prints
// "READY n" and holds them until stdin closes. It lets a benchmark keep
// ~19,000 server connections in one process under the 20,000 fd limit
// while the client side lives in another.
const loadClientEnv = "FANFARE_SOCKET_LOADCLIENT"

func TestMain(m *testing.M) {
	if spec := os.Getenv(loadClientEnv); spec != "" {
		os.Exit(runLoadClient(spec))
	}
	os.Exit(m.Run())
}

func runLoadClient(spec string) int {
	addr, countStr, _ := strings.Cut(spec, ",")
	count, _ := strconv.Atoi(countStr)
	conns := make([]net.Conn, count)
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1024)
			for {
				i := int(next.Add(1)) - 1
				if i >= count {
					return
				}
				c, err := net.Dial("tcp", addr)
				if err != nil {
					failed.Add(1)
					continue
				}
				if _, err := c.Write(upgradeRequest("/ws", "load"+strconv.Itoa(i))); err != nil {
					failed.Add(1)
					c.Close()
					continue
				}
				n := 0
				for !bytes.Contains(buf[:n], crlfcrlf) && n < len(buf) {
					m, err := c.Read(buf[n:])
					if err != nil {
						break
					}
					n += m
				}
				if !bytes.HasPrefix(buf[:n], []byte("HTTP/1.1 101")) {
					failed.Add(1)
					c.Close()
					continue
				}
				conns[i] = c
			}
		}()
	}
	wg.Wait()
	fmt.Printf("READY %d %d\n", count-int(failed.Load()), failed.Load())
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	return 0
}

func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func heapInuse() (inuse, alloc uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, ms.HeapAlloc
}

// BenchmarkIdleConnMemory measures the Go heap and RSS per idle upgraded
// connection, with ~19,000 connections held by a separate client process.
// Set FANFARE_SOCKET_IDLE_CONNS to change the count.
func BenchmarkIdleConnMemory(b *testing.B) {
	n := 19000
	if v, err := strconv.Atoi(os.Getenv("FANFARE_SOCKET_IDLE_CONNS")); err == nil && v > 0 {
		n = v
	}
	b.Run(fmt.Sprintf("conns=%d", n), func(b *testing.B) {
		h := &echoHandler{}
		s := startServer(b, Config{Handler: h, MaxConnsPerIP: -1, MaxConnsPerUser: -1, NumLoops: 2})
		time.Sleep(100 * time.Millisecond)
		heap0, alloc0 := heapInuse()
		rss0 := rssBytes()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), loadClientEnv+"="+s.Addr().String()+","+strconv.Itoa(n))
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { stdin.Close(); _ = cmd.Wait() }()
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			b.Fatalf("load client: %v", err)
		}
		var ok, failed int
		fmt.Sscanf(line, "READY %d %d", &ok, &failed)
		waitFor(b, 30*time.Second, "server-side connections", func() bool { return s.Stats().Conns == int64(ok) })
		// The echo handler keeps every Conn: count it, as the engine will.
		heap1, alloc1 := heapInuse()
		rss1 := rssBytes()
		for b.Loop() {
		}
		b.ReportMetric(float64(ok), "conns")
		b.ReportMetric(float64(failed), "failed")
		b.ReportMetric(float64(int64(heap1)-int64(heap0))/float64(ok), "heap-inuse-B/conn")
		b.ReportMetric(float64(int64(alloc1)-int64(alloc0))/float64(ok), "heap-alloc-B/conn")
		b.ReportMetric(float64(rss1-rss0)/float64(ok), "rss-B/conn")
	})
}

// broadcastEnv is a server with n upgraded connections whose client ends
// are raw non-blocking sockets in this process.
type broadcastEnv struct {
	s         *Server
	conns     []*Conn
	serverFDs []int
	clientFDs []int
	clients   []net.Conn
	buf       []byte
	closed    bool
}

// newBroadcastEnv connects n clients; with deflate the server and every
// client negotiate permessage-deflate.
func newBroadcastEnv(b *testing.B, n, loops int, deflate bool) *broadcastEnv {
	b.Helper()
	h := &echoHandler{}
	s := startServer(b, Config{Handler: h, NumLoops: loops, MaxConnsPerIP: -1, MaxConnsPerUser: -1, OutboundBound: 4 << 20, Deflate: deflate,
		IdleTimeout: time.Hour}) // the clients never send; a long run must not idle them out
	var offer []string
	if deflate {
		offer = []string{"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits"}
	}
	env := &broadcastEnv{s: s, buf: make([]byte, 256<<10)}
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > n {
					return
				}
				c, err := net.Dial("tcp", s.Addr().String())
				if err != nil {
					b.Errorf("dial: %v", err)
					return
				}
				_, _ = c.Write(upgradeRequest("/ws", "b"+strconv.Itoa(i), offer...))
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						b.Errorf("handshake: %v", err)
						return
					}
					if line == "\r\n" {
						break
					}
				}
				rc, _ := c.(*net.TCPConn).SyscallConn()
				var fd int
				_ = rc.Control(func(f uintptr) { fd = int(f) })
				mu.Lock()
				env.clients = append(env.clients, c)
				env.clientFDs = append(env.clientFDs, fd)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	waitFor(b, 30*time.Second, "server-side connections", func() bool { return h.opened.Load() == int64(n) })
	env.conns = h.snapshot()
	for _, c := range env.conns {
		env.serverFDs = append(env.serverFDs, c.gc.Fd())
	}
	b.Cleanup(env.close)
	return env
}

// close stops the server and the clients, freeing their descriptors.
func (e *broadcastEnv) close() {
	if e.closed {
		return
	}
	e.closed = true
	for _, c := range e.clients {
		c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.s.Shutdown(ctx)
}

// drain reads everything pending on the client sockets.
func (e *broadcastEnv) drain() (n int) {
	for _, fd := range e.clientFDs {
		for {
			m, err := unix.Read(fd, e.buf)
			if m <= 0 || err != nil {
				break
			}
			n += m
		}
	}
	return n
}

func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

// BenchmarkBroadcast writes a 100-byte payload to ~9,000 loopback
// connections: through Server.BroadcastBatch (1, 8 or 32 frames per
// connection, coalesced into one write each) and, as the baseline in the
// same run, with one raw write(2) per socket of the same bytes. Clients are
// drained outside the timed region. deliveries/s counts frames.
func BenchmarkBroadcast(b *testing.B) {
	n := 9000
	if v, err := strconv.Atoi(os.Getenv("FANFARE_SOCKET_BCAST_CONNS")); err == nil && v > 0 {
		n = v
	}
	payload := bytes.Repeat([]byte("x"), 100)
	for _, loops := range []int{1, 2} {
		env := newBroadcastEnv(b, n, loops, false)
		for _, k := range []int{1, 8, 32} {
			frames := make([]*Frame, k)
			var raw []byte
			for i := range frames {
				frames[i] = NewPushFrame(1, int64(i+1), payload)
				raw = append(raw, frames[i].Bytes()...)
			}
			name := fmt.Sprintf("conns=%d/frames=%d", n, k)
			b.Run(name+fmt.Sprintf("/path=socket-loops%d", loops), func(b *testing.B) {
				env.drain()
				var allocs uint64
				for b.Loop() {
					b.StopTimer()
					m0 := mallocs()
					b.StartTimer()
					if k == 1 {
						env.s.Broadcast(frames[0], env.conns)
					} else {
						env.s.BroadcastBatch(frames, env.conns)
					}
					env.s.sync()
					b.StopTimer()
					allocs += mallocs() - m0
					env.drain()
					b.StartTimer()
				}
				deliveries := float64(b.N * n * k)
				b.ReportMetric(deliveries/b.Elapsed().Seconds(), "deliveries/s")
				b.ReportMetric(float64(allocs)/deliveries, "allocs/delivery")
			})
			if loops != 1 {
				continue
			}
			b.Run(name+"/path=raw-write", func(b *testing.B) {
				env.drain()
				for b.Loop() {
					for _, fd := range env.serverFDs {
						if _, err := unix.Write(fd, raw); err != nil && !errors.Is(err, unix.EAGAIN) {
							b.Fatalf("write: %v", err)
						}
					}
					b.StopTimer()
					env.drain()
					b.StartTimer()
				}
				b.ReportMetric(float64(b.N*n*k)/b.Elapsed().Seconds(), "deliveries/s")
			})
		}
		env.close()
	}
}

// BenchmarkUpgrade measures complete WebSocket upgrades per second over
// loopback, including the Authenticator call (a trivial fake here; the JWT
// one is measured with gateway/auth): connect, request, 101, close with
// RST so no TIME_WAIT builds up. Client and server share the two cores.
// jwtAuth verifies HS256 tokens with gateway/auth, as fanfared does.
type jwtAuth struct {
	v     *auth.Verifier
	calls atomic.Int64
}

func (a *jwtAuth) Authenticate(token string) (Identity, error) {
	a.calls.Add(1)
	c, err := a.v.Verify(token)
	if err != nil {
		return Identity{}, err
	}
	return Identity{UID: c.UID, Tier: c.Tier, Expires: c.Expires}, nil
}

// BenchmarkUpgrade measures complete upgrades per second (TCP connect,
// handshake, authentication, 101), with a trivial authenticator and with
// HS256 JWT verification.
func BenchmarkUpgrade(b *testing.B) {
	secret := []byte("0123456789abcdef0123456789abcdef-bench")
	v, err := auth.NewVerifier(auth.Config{Secret: secret})
	if err != nil {
		b.Fatal(err)
	}
	signer, err := auth.NewSigner(auth.SignerConfig{Secret: secret})
	if err != nil {
		b.Fatal(err)
	}
	tok, err := signer.Sign("bench", 1, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	fake, jwt := &fakeAuth{}, &jwtAuth{v: v}
	for _, bc := range []struct {
		name  string
		a     Authenticator
		token string
		calls func() int64
	}{
		{"auth=fake", fake, "bench:1", fake.calls.Load},
		{"auth=jwt-hs256", jwt, tok, jwt.calls.Load},
	} {
		b.Run(bc.name, func(b *testing.B) { benchUpgrade(b, bc.a, bc.token, bc.calls) })
	}
}

func benchUpgrade(b *testing.B, a Authenticator, token string, calls func() int64) {
	s := startServer(b, Config{Authenticator: a, MaxConnsPerIP: -1, MaxConnsPerUser: -1})
	req := upgradeRequest("/ws", token)
	before := calls()
	b.SetParallelism(4)
	b.ReportAllocs()
	var failed atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 512)
		for pb.Next() {
			c, err := net.Dial("tcp", s.Addr().String())
			if err != nil {
				failed.Add(1)
				continue
			}
			_, _ = c.Write(req)
			n := 0
			for !bytes.Contains(buf[:n], crlfcrlf) && n < len(buf) {
				m, err := c.Read(buf[n:])
				if err != nil {
					break
				}
				n += m
			}
			if !bytes.HasPrefix(buf[:n], []byte("HTTP/1.1 101")) {
				failed.Add(1)
			}
			_ = c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "upgrades/s")
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d upgrades failed", f)
	}
	if n := calls() - before; n < int64(b.N) {
		b.Fatalf("authenticator called %d times for %d upgrades", n, b.N)
	}
}

// BenchmarkBroadcastDeflate pushes chat-shaped JSON frames (200 bytes, 1
// and 4 KiB) to 1,000 and 9,000 loopback connections on one loop, without
// and with permessage-deflate, in one run: server CPU per delivery and
// bytes on the wire per delivery. A new Frame each iteration, as the
// gateway makes one per push, so each deflate iteration pays for one
// compression, shared by all recipients. FANFARE_SOCKET_DEFLATE_CONNS
// replaces the connection counts (comma-separated).
func BenchmarkBroadcastDeflate(b *testing.B) {
	counts := []int{1000, 9000}
	if v := os.Getenv("FANFARE_SOCKET_DEFLATE_CONNS"); v != "" {
		counts = counts[:0]
		for _, f := range strings.Split(v, ",") {
			if n, err := strconv.Atoi(f); err == nil && n > 0 {
				counts = append(counts, n)
			}
		}
	}
	for _, n := range counts {
		for _, deflate := range []bool{false, true} {
			env := newBroadcastEnv(b, n, 1, deflate)
			for _, size := range []int{200, 1024, 4096} {
				name := fmt.Sprintf("conns=%d/bytes=%d/deflate=%v", n, size, deflate)
				b.Run(name, func(b *testing.B) {
					env.drain()
					seq := 0
					wire := 0
					var cpu time.Duration
					for b.Loop() {
						seq++
						payload := chatJSON(seq, size)
						c0 := cpuTime()
						f := NewPushFrame(1, int64(seq), payload)
						env.s.Broadcast(f, env.conns)
						env.s.sync()
						cpu += cpuTime() - c0
						b.StopTimer()
						wire += env.drain()
						b.StartTimer()
					}
					deliveries := float64(b.N * n)
					b.ReportMetric(deliveries/b.Elapsed().Seconds(), "deliveries/s")
					// CPU time of the process while the server encodes,
					// compresses and writes (the clients are drained outside
					// it): steadier than wall time on a loaded machine.
					b.ReportMetric(float64(cpu.Nanoseconds())/deliveries, "cpu-ns/delivery")
					b.ReportMetric(float64(wire)/deliveries, "wire-bytes/delivery")
				})
			}
			env.close()
		}
	}
}

// cpuTime is the process's user plus system CPU time.
func cpuTime() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
