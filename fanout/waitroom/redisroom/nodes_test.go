package redisroom_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/redisroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
	"github.com/fanfare-im/fanfare/internal/redistest"
)

// TestTwoNodesNeverDoubleAdmit: two backends on separate connections (two
// nodes) run admission steps concurrently while sessions end; no user is
// ever admitted twice and Redis never holds more than max_active sessions.
func TestTwoNodesNeverDoubleAdmit(t *testing.T) {
	c1, c2 := testClient(t), testClient(t)
	prefix := testPrefix(t, c1)
	b1, _ := redisroom.New(redisroom.Config{Client: c1, Prefix: prefix})
	b2, _ := redisroom.New(redisroom.Config{Client: c2, Prefix: prefix})
	rc := waitroom.RoomConfig{Name: "race", MaxActive: 25, AdmitRate: 2000, AdmitBurst: 40, Shards: 3}.WithDefaults()
	ctx := t.Context()
	const users = 600
	for i := range users {
		b := b1
		if i%2 == 1 {
			b = b2
		}
		if _, err := b.Enter(ctx, &rc, waitroom.EnterRequest{UID: fmt.Sprintf("u%04d", i), Tier: i % 4}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	admitted := make(map[string]int)
	var done atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for w := range 8 {
		b := b1
		if w%2 == 1 {
			b = b2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []string
			for !done.Load() {
				r, err := b.Admit(ctx, &rc, waitroom.AdmitRequest{})
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				for _, a := range r.Admitted {
					admitted[a.UID]++
					mine = append(mine, a.UID)
				}
				total := len(admitted)
				mu.Unlock()
				if total == users {
					done.Store(true)
				}
				for len(mine) > 0 && rng.IntN(2) == 0 { // sessions end, freeing slots
					if _, err := b.Leave(ctx, &rc, mine[0]); err != nil {
						errc <- err
						return
					}
					mine = mine[1:]
				}
			}
		}()
	}
	wg.Add(1)
	maxSeen := int64(0)
	go func() { // watch the active count in Redis itself
		defer wg.Done()
		for !done.Load() {
			s, err := b1.Snapshot(ctx, &rc, nil, math.MaxInt64)
			if err != nil {
				errc <- err
				return
			}
			maxSeen = max(maxSeen, s.Active)
		}
	}()
	deadline := time.AfterFunc(60*time.Second, func() { done.Store(true) })
	wg.Wait()
	deadline.Stop()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for u, n := range admitted {
		if n != 1 {
			t.Fatalf("%s admitted %d times, want once", u, n)
		}
	}
	if len(admitted) != users {
		t.Fatalf("admitted: got %d users, want %d", len(admitted), users)
	}
	if maxSeen > int64(rc.MaxActive) || maxSeen == 0 {
		t.Fatalf("active sessions seen: got max %d, want 1..%d", maxSeen, rc.MaxActive)
	}
}

type grants struct {
	mu sync.Mutex
	n  map[string]int
	ok map[string]bool
}

func (g *grants) deliver(uid string, tk func() *waitroom.Ticket) func(waitroom.Update) {
	return func(u waitroom.Update) {
		if u.Kind != waitroom.UpdateGranted {
			return
		}
		g.mu.Lock()
		g.n[uid]++
		_, err := roomtoken.Verify(u.AccessToken, []byte(strings.Repeat("k", 32)), "shared", time.Second)
		g.ok[uid] = err == nil
		g.mu.Unlock()
		// the user is served for a moment, then leaves
		go func() {
			time.Sleep(20 * time.Millisecond)
			for tk() == nil {
				time.Sleep(time.Millisecond)
			}
			tk().Close()
		}()
	}
}

func newManager(t *testing.T, b waitroom.Backend, node string, fb waitroom.Backend) *waitroom.Manager {
	m, _ := newManagerStop(t, b, node, fb)
	return m
}

// newManagerStop also returns a function that stops the node abruptly
// (its drivers stop, nothing is drained: a crash as far as Redis knows).
func newManagerStop(t *testing.T, b waitroom.Backend, node string, fb waitroom.Backend) (*waitroom.Manager, func()) {
	t.Helper()
	signer, _ := roomtoken.NewHS256([]byte(strings.Repeat("k", 32)))
	m, err := waitroom.New(waitroom.Config{Backend: b, Fallback: fb, Node: node, Signer: signer, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		Tick: 20 * time.Millisecond, SnapshotEvery: 200 * time.Millisecond, PushEvery: 200 * time.Millisecond,
		HealthEvery: 200 * time.Millisecond, SyncEvery: 200 * time.Millisecond, FailAfter: 2, CallTimeout: 500 * time.Millisecond,
		MaintainEvery: 200 * time.Millisecond, NodeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		m.Run(ctx)
		close(done)
	}()
	stop := func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return m, stop
}

// TestCrashedNodeFreesItsSlots: node 2 holds the only admitted session and
// a waiting user, then stops without draining. After NodeTimeout node 1
// ends the session (reason disconnect), marks the waiting user away, and
// admits its own waiting user.
func TestCrashedNodeFreesItsSlots(t *testing.T) {
	c := testClient(t)
	prefix := testPrefix(t, c)
	b1, _ := redisroom.New(redisroom.Config{Client: c, Prefix: prefix})
	b2, _ := redisroom.New(redisroom.Config{Client: testClient(t), Prefix: prefix})
	m1 := newManager(t, b1, "n1", nil)
	var ends []waitroom.SessionEnd
	var mu sync.Mutex
	m1.AddObserver(waitroom.ObserverFunc(func(e waitroom.SessionEnd) { mu.Lock(); ends = append(ends, e); mu.Unlock() }))
	m2, crash := newManagerStop(t, b2, "n2", nil)
	rc := waitroom.RoomConfig{Name: "crash", MaxActive: 1, AdmitRate: 100, AccessTokenTTL: time.Hour}
	if _, err := m1.Upsert(t.Context(), rc); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Upsert(t.Context(), rc); err != nil {
		t.Fatal(err)
	}
	x, y, z := &updates{}, &updates{}, &updates{}
	if _, err := m2.Join(t.Context(), "crash", "x", 0, x.add); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "x granted on node 2", func() bool { return x.last().Kind == waitroom.UpdateGranted })
	if _, err := m2.Join(t.Context(), "crash", "y", 0, y.add); err != nil {
		t.Fatal(err)
	}
	if _, err := m1.Join(t.Context(), "crash", "z", 0, z.add); err != nil {
		t.Fatal(err)
	}
	crash()
	waitFor(t, "z granted after node 2 died", func() bool { return z.last().Kind == waitroom.UpdateGranted })
	mu.Lock()
	defer mu.Unlock()
	if len(ends) != 1 || ends[0].UID != "x" || ends[0].Reason != waitroom.EndDisconnect {
		t.Fatalf("session ends seen by node 1: got %+v, want x by disconnect", ends)
	}
	st, err := m1.Status(t.Context(), "crash")
	if err != nil || st.Away != 1 || st.Active != 1 || st.Waiting != 0 {
		t.Fatalf("status: got %+v, %v, want y away, z active", st.Stats, err)
	}
}

// TestTwoManagersShareRedis: users spread over two nodes; admissions by
// either node reach the user's node (pub/sub or snapshot); each user is
// granted exactly once; max_active holds.
func TestTwoManagersShareRedis(t *testing.T) {
	c := testClient(t)
	prefix := testPrefix(t, c)
	b1, _ := redisroom.New(redisroom.Config{Client: c, Prefix: prefix})
	b2, _ := redisroom.New(redisroom.Config{Client: testClient(t), Prefix: prefix})
	m1 := newManager(t, b1, "n1", nil)
	m2 := newManager(t, b2, "n2", nil)
	if _, err := m1.Upsert(t.Context(), waitroom.RoomConfig{Name: "shared", MaxActive: 3, AdmitRate: 200}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for { // the room reaches node 2 through the config sync
		if _, ok := m2.Config("shared"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("room not synced to the second node")
		}
		time.Sleep(50 * time.Millisecond)
	}
	g := &grants{n: make(map[string]int), ok: make(map[string]bool)}
	const users = 60
	var tmu sync.Mutex
	tickets := make(map[string]*waitroom.Ticket)
	for i := range users {
		uid := "u" + strconv.Itoa(i)
		m := m1
		if i%2 == 1 {
			m = m2
		}
		get := func() *waitroom.Ticket { tmu.Lock(); defer tmu.Unlock(); return tickets[uid] }
		tk, err := m.Join(t.Context(), "shared", uid, i%4, g.deliver(uid, get))
		if err != nil || tk == nil {
			t.Fatalf("Join %s: %v %v", uid, tk, err)
		}
		tmu.Lock()
		tickets[uid] = tk
		tmu.Unlock()
	}
	maxActive := int64(0)
	deadline = time.Now().Add(30 * time.Second)
	for {
		st, err := m1.Status(t.Context(), "shared")
		if err != nil {
			t.Fatal(err)
		}
		maxActive = max(maxActive, st.Active)
		g.mu.Lock()
		n := len(g.n)
		g.mu.Unlock()
		if n == users && st.Active == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("granted %d of %d users in 30 s (status %+v)", n, users, st.Stats)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for uid, n := range g.n {
		if n != 1 || !g.ok[uid] {
			t.Fatalf("%s granted %d times (token ok %v), want once with a valid token", uid, n, g.ok[uid])
		}
	}
	if maxActive > 3 {
		t.Fatalf("active sessions: saw %d, want <= 3", maxActive)
	}
}

// TestRedisHangingFallsBack: Redis stops answering (SIGSTOP: connections
// open, no replies); calls time out, the node goes local and keeps
// accepting; after SIGCONT it hands its users back.
func TestRedisHangingFallsBack(t *testing.T) {
	srv := redistest.Start(t, 16390)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, MaxRetries: -1, PoolSize: 8,
		ContextTimeoutEnabled: true}) // cmd must set it too, or call timeouts are ignored
	t.Cleanup(func() { c.Close() })
	b, _ := redisroom.New(redisroom.Config{Client: c, Prefix: "hang:"})
	m := newManager(t, b, "n1", nil) // CallTimeout 500 ms, shorter than the client's read timeout
	if _, err := m.Upsert(t.Context(), waitroom.RoomConfig{Name: "hang", MaxActive: 1, AccessTokenTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	a, x := &updates{}, &updates{}
	if _, err := m.Join(t.Context(), "hang", "a", 0, a.add); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a granted", func() bool { return a.last().Kind == waitroom.UpdateGranted })
	srv.Pause()
	defer srv.Resume() // before the cleanups, which talk to Redis
	waitFor(t, "local fallback while Redis hangs", func() bool { return m.Degradation() == waitroom.DegradeLocal })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if _, err := m.Join(ctx, "hang", "x", 0, x.add); err != nil {
		t.Fatalf("Join while Redis hangs: %v", err)
	}
	if u := x.last(); u.Kind != waitroom.UpdateQueue || !u.Local || u.Position != 1 {
		t.Fatalf("entrant while Redis hangs: got %+v, want a local queue frame", u)
	}
	srv.Resume()
	waitFor(t, "back on Redis", func() bool { return m.Degradation() != waitroom.DegradeLocal })
	waitFor(t, "x told it is back on the shared queue", func() bool { return !x.last().Local && x.last().Position == 1 })
}

// TestRedisDownFallsBackLocally: Redis dies mid-run; the node switches to
// its local queue, keeps accepting entrants and says so (Local, L3);
// waiting users keep their order; when Redis is back the users are handed
// back and the flag clears.
func TestRedisDownFallsBackLocally(t *testing.T) {
	srv := redistest.Start(t, 16391)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	b, _ := redisroom.New(redisroom.Config{Client: c, Prefix: "fb:"})
	m := newManager(t, b, "n1", nil)
	if _, err := m.Upsert(t.Context(), waitroom.RoomConfig{Name: "fb", MaxActive: 1, AdmitRate: 100,
		AccessTokenTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	recs := make(map[string]*updates)
	joinU := func(uid string, level int) *waitroom.Ticket {
		r := &updates{}
		recs[uid] = r
		tk, err := m.Join(t.Context(), "fb", uid, level, r.add)
		if err != nil || tk == nil {
			t.Fatalf("Join %s: %v %v (%+v)", uid, tk, err, r.last())
		}
		return tk
	}
	joinU("holder", 0)
	waitFor(t, "holder granted", func() bool { return recs["holder"].last().Kind == waitroom.UpdateGranted })
	joinU("a", 0)
	time.Sleep(1100 * time.Millisecond)
	joinU("b", 0)
	waitFor(t, "b behind a", func() bool { return recs["b"].last().Position == 2 })

	srv.Stop()    // Redis dies
	joinU("c", 0) // keeps accepting
	if m.Degradation() != waitroom.DegradeLocal {
		t.Fatalf("level after Redis died: got %v, want L3", m.Degradation())
	}
	if u := recs["c"].last(); u.Kind != waitroom.UpdateQueue || !u.Local || u.Position != 3 {
		t.Fatalf("entrant on the fallback: got %+v, want local queue frame at position 3", u)
	}
	waitFor(t, "a and b told they are on the local queue", func() bool {
		return recs["a"].last().Local && recs["b"].last().Local && recs["a"].last().Position == 1 && recs["b"].last().Position == 2
	})
	st, err := m.Status(t.Context(), "fb")
	if err != nil || !st.Local || st.Active != 1 || st.Waiting != 3 {
		t.Fatalf("status on the fallback: got %+v, %v", st, err)
	}

	srv.Start() // Redis is back, empty
	waitFor(t, "back on Redis", func() bool { return m.Degradation() != waitroom.DegradeLocal })
	waitFor(t, "users told they are back on the shared queue", func() bool {
		return !recs["c"].last().Local && recs["c"].last().Position == 3 && recs["a"].last().Position == 1
	})
	st, err = m.Status(t.Context(), "fb")
	if err != nil || st.Local || st.Active != 1 || st.Waiting != 3 {
		t.Fatalf("status back on Redis: got %+v, %v", st, err)
	}
}

type updates struct {
	mu  sync.Mutex
	ups []waitroom.Update
}

func (u *updates) add(x waitroom.Update) {
	u.mu.Lock()
	u.ups = append(u.ups, x)
	u.mu.Unlock()
}

func (u *updates) last() waitroom.Update {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.ups) == 0 {
		return waitroom.Update{}
	}
	return u.ups[len(u.ups)-1]
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMemoryHighTrims: with Redis memory above the limit the node goes to
// L1 and its maintenance pass trims away users past grace (stale data);
// when memory is fine again the level returns to L0.
func TestMemoryHighTrims(t *testing.T) {
	c := testClient(t)
	prefix := testPrefix(t, c)
	b, _ := redisroom.New(redisroom.Config{Client: c, Prefix: prefix, MemoryLimit: 1}) // any usage is "high"
	h, err := b.Health(t.Context())
	if err != nil || !h.MemoryHigh || h.MemoryUsed <= 0 {
		t.Fatalf("Health: got %+v, %v, want memory high", h, err)
	}
	m := newManager(t, b, "n1", nil)
	waitFor(t, "L1", func() bool { return m.Degradation() == waitroom.DegradeMemory })
	if _, err := m.Upsert(t.Context(), waitroom.RoomConfig{Name: "mem", MaxActive: 1, Grace: time.Second,
		AccessTokenTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"holder", "a", "b"} {
		if _, err := m.Join(t.Context(), "mem", u, 0, func(waitroom.Update) {}); err != nil {
			t.Fatal(err)
		}
	}
	tk, err := m.Join(t.Context(), "mem", "gone", 0, func(waitroom.Update) {})
	if err != nil {
		t.Fatal(err)
	}
	tk.Close()
	waitFor(t, "the away user trimmed after grace", func() bool {
		st, err := m.Status(t.Context(), "mem")
		return err == nil && st.Away == 0 && st.Waiting == 2 && st.Active == 1
	})
	b2, _ := redisroom.New(redisroom.Config{Client: c, Prefix: prefix})
	if h, err := b2.Health(t.Context()); err != nil || h.MemoryHigh {
		t.Fatalf("Health without a limit: got %+v, %v, want not high", h, err)
	}
}
