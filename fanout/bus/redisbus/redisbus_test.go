package redisbus

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/fanout/bus/bustest"
	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/store"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func init() {
	// The outage tests make go-redis log every refused dial.
	redis.SetLogger(quietLogger{})
}

// client connects to addr; unreachable fails the test.
func client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr: addr, DialTimeout: 200 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s (FANFARE_TEST_REDIS_ADDR) unreachable: %v", addr, err)
	}
	return rdb
}

func randomPrefix() string {
	var b [6]byte
	_, _ = crand.Read(b[:])
	return "fanfaretest:bus:" + hex.EncodeToString(b[:]) + ":"
}

// medium is one prefix on one Redis: the nodes of a test cluster.
type medium struct {
	addr   string
	prefix string
	srv    *redistest.Server // outage media only
	opts   func(*Config)
}

func (m *medium) NewNode(t *testing.T, cfg bus.Config) *bus.Node {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr: m.addr, DialTimeout: 200 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	c := Config{Bus: cfg, Client: rdb, Prefix: m.prefix}
	if m.opts != nil {
		m.opts(&c)
	}
	n, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (m *medium) Stop(*testing.T)  { m.srv.Stop() }
func (m *medium) Start(*testing.T) { m.srv.Start() }

func TestConformance(t *testing.T) {
	addr := redistest.Addr()
	client(t, addr)
	bustest.Run(t, bustest.Harness{
		NewMedium: func(*testing.T) bustest.Medium { return &medium{addr: addr, prefix: randomPrefix()} },
		NewOutage: func(t *testing.T) bustest.Outage {
			srv := redistest.Start(t, 16420)
			return &medium{addr: srv.Addr(), prefix: randomPrefix(), srv: srv}
		},
	})
}

func TestChannel(t *testing.T) {
	tests := []struct {
		prefix  string
		buckets int
		gid     int64
		want    string
	}{
		{"", 0, 5, "fanfare:bus:{5}5"},
		{"p:", 16, 37, "p:{5}37"},
		{"p:", 4, -1, "p:{3}-1"}, // uint64(-1) % 4
		{"x", 1, 1 << 62, "x{0}4611686018427387904"},
	}
	for _, tc := range tests {
		if got := Channel(tc.prefix, tc.buckets, tc.gid); got != tc.want {
			t.Errorf("Channel(%q, %d, %d): got %q, want %q", tc.prefix, tc.buckets, tc.gid, got, tc.want)
		}
		tr := &transport{prefix: tc.prefix, buckets: tc.buckets}
		if tr.prefix == "" {
			tr.prefix = DefaultPrefix
		}
		if gid, ok := tr.parseGID(Channel(tc.prefix, tc.buckets, tc.gid)); !ok || gid != tc.gid {
			t.Errorf("parseGID: got %d %v, want %d", gid, ok, tc.gid)
		}
	}
}

func TestValidate(t *testing.T) {
	h := func(*bus.Batch) {}
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	defer rdb.Close()
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{Bus: bus.Config{Handler: h}, Client: rdb}, true},
		{"no client", Config{Bus: bus.Config{Handler: h}}, false},
		{"no handler", Config{Client: rdb}, false},
		{"brace", Config{Bus: bus.Config{Handler: h}, Client: rdb, Prefix: "a{b"}, false},
		{"buckets", Config{Bus: bus.Config{Handler: h}, Client: rdb, Buckets: MaxBuckets + 1}, false},
		{"health", Config{Bus: bus.Config{Handler: h}, Client: rdb, HealthInterval: -1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Errorf("got %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestSilentConnectionReplaced: a subscriber connection that goes silent
// without an error (a half-open TCP connection: here a proxy that stops
// forwarding but keeps the sockets open) is pinged, then replaced, and
// delivery resumes on the new connection.
func TestSilentConnectionReplaced(t *testing.T) {
	addr := redistest.Addr()
	client(t, addr)
	px := newProxy(t, addr)
	prefix := randomPrefix()
	got := make(chan int64, 100)
	sub := redis.NewClient(&redis.Options{Addr: px.addr(), DialTimeout: 200 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = sub.Close() })
	b, err := New(Config{Client: sub, Prefix: prefix, HealthInterval: 100 * time.Millisecond,
		Bus: bus.Config{NodeID: "b", Handler: func(bt *bus.Batch) { got <- bt.Msgs[0].Seq; bt.Release() }}})
	if err != nil {
		t.Fatal(err)
	}
	a := (&medium{addr: addr, prefix: prefix}).NewNode(t, bus.Config{NodeID: "a", Handler: func(bt *bus.Batch) { bt.Release() }})
	run(t, a)
	run(t, b)
	if err := b.Subscribe(1); err != nil {
		t.Fatal(err)
	}
	syncSubs(t, b)
	_ = a.Publish(1, 0, []store.Message{{Seq: 1, Body: []byte("1")}})
	if s := <-got; s != 1 {
		t.Fatalf("got seq %d, want 1", s)
	}
	px.freeze() // every connection made so far goes silent
	deadline := time.Now().Add(10 * time.Second)
	for seq := int64(2); ; seq++ {
		_ = a.Publish(1, 0, []store.Message{{Seq: seq, Body: []byte("1")}})
		select {
		case s := <-got:
			if s < 2 {
				t.Fatalf("got seq %d, want >= 2", s)
			}
			if px.conns() < 2 {
				t.Fatalf("delivered over %d proxied connections, want a new one", px.conns())
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no delivery after the subscriber connection went silent")
		}
	}
}

// proxy forwards TCP connections to target; freeze makes the existing ones
// silent (bytes are swallowed, sockets stay open).
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	pairs  []*pair
	n      int
}

type pair struct {
	frozen chan struct{}
	once   sync.Once
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	var wg sync.WaitGroup
	var open []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			pr := &pair{frozen: make(chan struct{})}
			p.mu.Lock()
			p.pairs = append(p.pairs, pr)
			p.n++
			open = append(open, c, u)
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					select {
					case <-pr.frozen:
						if err != nil {
							return
						}
						continue // swallow
					default:
					}
					if n > 0 {
						if _, werr := dst.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						_ = dst.Close()
						return
					}
				}
			}
			wg.Go(func() { pipe(u, c) })
			wg.Go(func() { pipe(c, u) })
		}
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.pairs {
		pr.once.Do(func() { close(pr.frozen) })
	}
}

func (p *proxy) conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// TestCluster runs nodes on a three-shard Redis Cluster: each bucket's
// connection lands on the shard owning it, every group is delivered in
// order, and unsubscribed groups are not.
func TestCluster(t *testing.T) {
	addrs := redistest.StartCluster(t, 16421, 16422, 16423)
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DialTimeout: time.Second})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	prefix := randomPrefix()
	type rec struct {
		mu   sync.Mutex
		seqs map[int64][]int64
	}
	var recs [3]*rec
	var nodes [3]*bus.Node
	for i := range nodes {
		r := &rec{seqs: make(map[int64][]int64)}
		recs[i] = r
		n, err := New(Config{Client: newClient(), Prefix: prefix, Buckets: 8, Bus: bus.Config{
			NodeID: "n" + strconv.Itoa(i),
			Handler: func(b *bus.Batch) {
				r.mu.Lock()
				for _, m := range b.Msgs {
					r.seqs[b.GID] = append(r.seqs[b.GID], m.Seq)
				}
				r.mu.Unlock()
				b.Release()
			},
		}})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = n
		run(t, n)
	}
	// Buckets must spread over more than one shard for the test to mean
	// anything.
	owners := map[string]bool{}
	cc := newClient()
	for b := range 8 {
		slot, err := cc.ClusterKeySlot(t.Context(), "{"+strconv.Itoa(b)+"}").Result()
		if err != nil {
			t.Fatal(err)
		}
		owners[slotOwner(t, cc, slot)] = true
	}
	if len(owners) < 2 {
		t.Fatalf("8 buckets on %d shards, want >= 2", len(owners))
	}
	// Node 1 takes the even gids, node 2 the odd ones and the multiples
	// of 4; node 0 publishes and takes none.
	want := func(node int, g int64) bool {
		switch node {
		case 1:
			return g%2 == 0
		case 2:
			return g%2 == 1 || g%4 == 0
		}
		return false
	}
	const groups = 32
	for node := 1; node <= 2; node++ {
		for g := range int64(groups) {
			if want(node, g) {
				if err := nodes[node].Subscribe(g); err != nil {
					t.Fatal(err)
				}
			}
		}
		syncSubs(t, nodes[node])
	}
	const per = 20
	for k := range per {
		for g := range int64(groups) {
			if err := nodes[0].Publish(g, 0, []store.Message{{GID: g, Seq: int64(k + 1), Body: []byte(`1`)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for node := 1; node <= 2; node++ {
		r := recs[node]
		deadline := time.Now().Add(10 * time.Second)
		for {
			r.mu.Lock()
			total := 0
			for _, s := range r.seqs {
				total += len(s)
			}
			r.mu.Unlock()
			expect := 0
			for g := range int64(groups) {
				if want(node, g) {
					expect += per
				}
			}
			if total == expect {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d: got %d messages, want %d", node, total, expect)
			}
			time.Sleep(10 * time.Millisecond)
		}
		r.mu.Lock()
		for g := range int64(groups) {
			s := r.seqs[g]
			if !want(node, g) {
				if len(s) != 0 {
					t.Errorf("node %d gid %d: got %d messages, want none", node, g, len(s))
				}
				continue
			}
			if len(s) != per || !slices.IsSorted(s) {
				t.Errorf("node %d gid %d: got %v, want 1..%d in order", node, g, s, per)
			}
		}
		r.mu.Unlock()
	}
	if s := nodes[0].Stats(); s.Dropped != (bus.Drops{}) {
		t.Errorf("publisher drops: got %+v, want none", s.Dropped)
	}

	// Resharding: move gid 0's slot to another shard. Redis drops the
	// sharded subscriptions of that slot (sunsubscribe); node 1 must
	// resubscribe on the new owner by itself.
	slot, err := cc.ClusterKeySlot(t.Context(), "{0}").Result()
	if err != nil {
		t.Fatal(err)
	}
	from := slotOwner(t, cc, slot)
	var to string
	for _, a := range addrs {
		if a != from {
			to = a
			break
		}
	}
	toID, err := client(t, to).ClusterMyID(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range append([]string{to, from}, addrs...) {
		if err := client(t, a).Do(t.Context(), "cluster", "setslot", slot, "node", toID).Err(); err != nil {
			t.Fatalf("CLUSTER SETSLOT %d NODE on %s: %v", slot, a, err)
		}
	}
	r := recs[1]
	deadline := time.Now().Add(15 * time.Second)
	for seq := int64(1000); ; seq++ {
		_ = nodes[0].Publish(0, 0, []store.Message{{GID: 0, Seq: seq, Body: []byte(`1`)}})
		time.Sleep(20 * time.Millisecond)
		r.mu.Lock()
		s := r.seqs[0]
		moved := s[len(s)-1] >= 1000
		r.mu.Unlock()
		if moved {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no delivery of gid 0 after its slot moved from %s to %s", from, to)
		}
	}
}

func slotOwner(t *testing.T, cc *redis.ClusterClient, slot int64) string {
	t.Helper()
	shards, err := cc.ClusterShards(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start <= slot && slot <= r.End {
				for _, n := range sh.Nodes {
					if n.Role == "master" {
						return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
					}
				}
			}
		}
	}
	t.Fatalf("slot %d has no owner", slot)
	return ""
}

func run(t *testing.T, n *bus.Node) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
}

func syncSubs(t testing.TB, n *bus.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.SyncSubscriptions(ctx); err != nil {
		t.Fatalf("SyncSubscriptions: %v", err)
	}
}
