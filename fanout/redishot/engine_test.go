package redishot_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/embedded"
)

// syncBuffer is a log sink shared by the engine's goroutines and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), sub)
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEngineRedisDown runs an engine on a Redis of its own: a group that
// another node marks hot moves to this node's hot pool without local
// traffic. With Redis stopped, sends go on as before (no Redis call on
// their path), the failure is logged once and counted at every round, and
// the group, hot only elsewhere, cools after HotClearAfter (the local
// view). Once Redis is back the engine follows the cluster again.
func TestEngineRedisDown(t *testing.T) {
	srv := redistest.Start(t, 16430)
	// The timeouts fanfared gives its client.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	hs := newSet(t, rdb, "e:")
	st, err := embedded.Open(embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	g, err := st.CreateGroup(ctx, store.Group{Name: "g", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.AddMembers(ctx, g.GID, []string{"alice"}); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	e, err := fanout.New(fanout.Config{Store: st, HotSet: hs, NodeID: "n1", HotSync: 100 * time.Millisecond, HotTTL: time.Second,
		LargeGroup: 1, HotClearAfter: 300 * time.Millisecond, EvalInterval: 20 * time.Millisecond,
		Metrics: fanout.NewMetrics(reg), Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(rctx) }()
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		defer scancel()
		if err := e.Shutdown(sctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		cancel()
		<-done
	})

	mark := func() {
		t.Helper()
		if _, err := hs.Sync(ctx, "n2", []fanout.HotMark{{GID: g.GID, Rate: 500, Since: time.Now()}}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	remoteHot := func() bool {
		hg := e.HotGroups()
		return e.IsHot(g.GID) && len(hg) == 1 && hg[0].Source == fanout.HotRemote && len(hg[0].Marks) == 1 && hg[0].Marks[0].Node == "n2"
	}
	mark()
	waitFor(t, "the group marked by n2 to be hot here", 5*time.Second, remoteHot)

	srv.Stop()
	var slowest time.Duration
	for i := range 20 {
		start := time.Now()
		r := e.SendWait(ctx, fanout.SendRequest{GID: g.GID, UID: "alice", ClientMsgID: "m" + string(rune('a'+i)), Body: []byte(`1`)})
		if r.Err != nil {
			t.Fatalf("send %d with Redis down: %v", i, r.Err)
		}
		slowest = max(slowest, time.Since(start))
		time.Sleep(20 * time.Millisecond)
	}
	// A send never waits for Redis: the dial timeout alone is 500 ms.
	if slowest > 300*time.Millisecond {
		t.Errorf("slowest send with Redis down: %v", slowest)
	}
	waitFor(t, "the group hot only elsewhere to cool with Redis down", 5*time.Second, func() bool {
		return !e.IsHot(g.GID) && len(e.HotGroups()) == 0
	})
	waitFor(t, "two failed rounds counted", 5*time.Second, func() bool {
		return counterValue(t, reg, "fanfare_hot_set_syncs_total", "failed") >= 2
	})
	if n := logs.count("hot set unavailable"); n != 1 {
		t.Errorf("logged the unavailable hot set %d times over several failed rounds, want once", n)
	}

	srv.Start()
	mark()
	waitFor(t, "the group to be hot again once Redis is back", 5*time.Second, remoteHot)
	if n := logs.count("hot set reachable again"); n != 1 {
		t.Errorf("logged the recovery %d times, want once", n)
	}
	if ok := counterValue(t, reg, "fanfare_hot_set_syncs_total", "ok"); ok < 2 {
		t.Errorf("ok rounds: %v, want at least 2", ok)
	}
}
