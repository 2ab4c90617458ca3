package redishot_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
	"github.com/fanfare-im/fanfare/internal/redistest"
)

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
// TestClusterGroupLimit: two nodes take sends for one large group, 15/s
// each: together they are over its 20/s limit, each alone under it. The
// limit holds for the pair (each node paces its part, in proportion to its
// offered rate) and both move the group to L2 on the cluster's rate.
// Per node, both would store 15/s and neither would degrade.
func TestClusterGroupLimit(t *testing.T) {
	rdb := sharedRedis(t)
	prefix := testPrefix(t, rdb)
	st, gid := enginetest.OpenGroup(t, "alice")
	var nodes [2]*fanout.Engine
	for i, id := range []string{"a", "b"} {
		nodes[i] = enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{LargeGroup: 1, GroupRate: 20, GroupBuffer: 4, HotFactor: -1, DownlinkRate: -1}, Store: st, HotSet: newSet(t, rdb, prefix), NodeID: id,
			HotSync: 100 * time.Millisecond, HotTTL: time.Second, EvalInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	}
	// Count from 2.5 s on: both rates are known, and the bucket has spent
	// the second of burst it started with (offered 15/s against 10/s).
	const perNode, run, from = 15, 5 * time.Second, 2500 * time.Millisecond
	var mu sync.Mutex
	stored := [2]int{}
	start := time.Now()
	var wg sync.WaitGroup
	for i, e := range nodes {
		wg.Go(func() {
			tick := time.NewTicker(time.Second / perNode)
			defer tick.Stop()
			for n := 0; time.Since(start) < run; n++ {
				<-tick.C
				e.Send(fanout.SendRequest{GID: gid, UID: "alice", ClientMsgID: fmt.Sprintf("%d-%d", i, n), Body: []byte(`1`),
					Done: func(r fanout.SendResult) {
						if d := time.Since(start); r.Err == nil && d >= from && d < run {
							mu.Lock()
							stored[i]++
							mu.Unlock()
						}
					}})
			}
		})
	}
	wg.Wait()
	for i, e := range nodes {
		if lv := e.Levels().Effective(gid); lv < fanout.L2Summary {
			t.Errorf("node %d: group level %v, want L2 (30/s offered in the cluster, 20/s limit)", i, lv)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	secs := (run - from).Seconds()
	total := float64(stored[0]+stored[1]) / secs
	t.Logf("stored per second: node a %.1f, node b %.1f, total %.1f (limit 20, offered 2 x %d)", float64(stored[0])/secs, float64(stored[1])/secs, total, perNode)
	// 20/s plus at most 1/s per node, and some slack for this machine's
	// timing; per node the pair would store 30/s.
	if total > 25 || total < 12 {
		t.Errorf("cluster stored %.1f/s, want about 20", total)
	}
	for i, n := range stored {
		if r := float64(n) / secs; r < 4 || r > 14 {
			t.Errorf("node %d stored %.1f/s, want about half of 20", i, r)
		}
	}
}

func TestEngineRedisDown(t *testing.T) {
	srv := redistest.Start(t, 16430)
	// The timeouts fanfared gives its client.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	hs := newSet(t, rdb, "e:")
	st, gid := enginetest.OpenGroup(t, "alice")
	ctx := context.Background()
	var logs enginetest.LogBuffer
	reg := prometheus.NewRegistry()
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{LargeGroup: 1, HotClearAfter: 300 * time.Millisecond}, Store: st, HotSet: hs, NodeID: "n1", HotSync: 100 * time.Millisecond, HotTTL: time.Second,
		EvalInterval: 20 * time.Millisecond,
		Metrics:      fanout.NewMetrics(reg), Logger: slog.New(slog.NewJSONHandler(&logs, nil))})

	mark := func() {
		t.Helper()
		if _, err := hs.Sync(ctx, "n2", []fanout.HotMark{{GID: gid, Rate: 500, Hot: true, Since: time.Now()}}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	remoteHot := func() bool {
		hg := e.HotGroups()
		return e.IsHot(gid) && len(hg) == 1 && hg[0].Source == fanout.HotRemote && len(hg[0].Marks) == 1 && hg[0].Marks[0].Node == "n2"
	}
	mark()
	waitFor(t, "the group marked by n2 to be hot here", 5*time.Second, remoteHot)

	srv.Stop()
	var slowest time.Duration
	for i := range 20 {
		start := time.Now()
		r := e.SendWait(ctx, fanout.SendRequest{GID: gid, UID: "alice", ClientMsgID: "m" + string(rune('a'+i)), Body: []byte(`1`)})
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
		return !e.IsHot(gid) && len(e.HotGroups()) == 0
	})
	waitFor(t, "two failed rounds counted", 5*time.Second, func() bool {
		return counterValue(t, reg, "fanfare_hot_set_syncs_total", "failed") >= 2
	})
	if n := logs.Count("hot set unavailable"); n != 1 {
		t.Errorf("logged the unavailable hot set %d times over several failed rounds, want once", n)
	}

	srv.Start()
	mark()
	waitFor(t, "the group to be hot again once Redis is back", 5*time.Second, remoteHot)
	if n := logs.Count("hot set reachable again"); n != 1 {
		t.Errorf("logged the recovery %d times, want once", n)
	}
	if ok := counterValue(t, reg, "fanfare_hot_set_syncs_total", "ok"); ok < 2 {
		t.Errorf("ok rounds: %v, want at least 2", ok)
	}
}
