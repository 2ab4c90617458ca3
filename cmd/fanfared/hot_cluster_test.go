package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws/wsutil"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestHotGroupAcrossNodes: a group flooded through node a only becomes hot
// on a; node b, which sees none of its traffic, follows a's mark in the
// Redis hot set: its admin API lists the group (source remote, marked by
// node-a) within a bounded time and b moves it to its hot pool. Once the
// flood stops, a withdraws its mark and both nodes clear the group after
// -hot-clear-after.
func TestHotGroupAcrossNodes(t *testing.T) {
	const clearAfter = 2 * time.Second
	a, b := startTwoNodes(t, "-large-group-members", "1", "-hot-min-rate", "20", "-hot-clear-after", clearAfter.String(),
		"-hot-sync-interval", "200ms", "-hot-ttl", "2s")
	members := []string{"alice", "bob", "carol"}
	gid := a.createGroup(members...)
	other := a.createGroup("dave", "erin") // never hot

	hotGroups := func(ts *testServer) []wire.HotGroup {
		t.Helper()
		var resp wire.HotGroupsResponse
		if st := ts.do("GET", "/admin/v1/hot-groups", ts.admin, nil, &resp); st != http.StatusOK {
			t.Fatalf("hot-groups: status %d", st)
		}
		return resp.Groups
	}
	isHot := func(ts *testServer) bool {
		var status struct {
			Groups []struct {
				GID int64 `json:"gid"`
				Hot bool  `json:"hot"`
			} `json:"groups"`
		}
		ts.do("GET", "/admin/v1/degrade", ts.admin, nil, &status)
		for _, g := range status.Groups {
			if g.GID == gid {
				return g.Hot
			}
		}
		return false
	}

	// The flood: about 150 sends per second through node a.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopFlood := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopFlood()
	rc := a.dialRaw("alice")
	wg.Go(func() {
		for {
			_, err := rc.tryRead(200 * time.Millisecond)
			select {
			case <-stop:
				return
			default:
			}
			_ = err // acks and rate_limited errors: drained only
		}
	})
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for range 3 {
				n++
				if err := wsutil.WriteClientText(rc.rw, fmt.Appendf(nil, `{"type":"send","id":"f%d","gid":%d,"body":%d}`, n, gid, n)); err != nil {
					return
				}
			}
		}
	})

	// Node b lists the group, marked by node-a, and moves it to its own
	// hot pool although it received none of its sends.
	start := time.Now()
	var onB []wire.HotGroup
	for {
		onB = hotGroups(b)
		if len(onB) == 1 && onB[0].GID == gid && onB[0].Source == "remote" && len(onB[0].Nodes) == 1 &&
			onB[0].Nodes[0].Node == "node-a" && onB[0].Nodes[0].Rate >= 20 && onB[0].Since > 0 && isHot(b) {
			break
		}
		if len(onB) > 1 || time.Since(start) > 10*time.Second {
			t.Fatalf("node b's hot groups after %v: got %+v (in its hot pool: %v), want gid %d marked by node-a", time.Since(start), onB, isHot(b), gid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("node b follows node a's hot mark %v after the flood started", time.Since(start))
	onA := hotGroups(a)
	if len(onA) != 1 || onA[0].GID != gid || onA[0].Source != "local" || len(onA[0].Nodes) != 1 || onA[0].Nodes[0].Node != "node-a" || onA[0].Rate < 20 {
		t.Errorf("node a's hot groups: got %+v, want gid %d, local, marked by node-a", onA, gid)
	}
	for _, ts := range []*testServer{a, b} {
		if body := metricsText(t, ts); !strings.Contains(body, "fanfare_cluster_hot_groups 1") || !strings.Contains(body, `fanfare_hot_set_syncs_total{result="ok"}`) {
			t.Errorf("metrics of %s: want fanfare_cluster_hot_groups 1 and ok hot-set rounds", ts.srv.cfg.NodeID)
		}
	}
	// A send through b to the group is handled by b's hot pool and still
	// stored; the other group is untouched.
	bob := b.dialRaw("bob")
	bob.send(fmt.Sprintf(`{"type":"send","id":"b1","gid":%d,"body":1}`, gid))
	readUntil[*wire.Ack](bob, 10*time.Second)
	dave := b.dialRaw("dave")
	dave.send(fmt.Sprintf(`{"type":"send","id":"d1","gid":%d,"body":1}`, other))
	readUntil[*wire.Ack](dave, 10*time.Second)

	// The flood stops: a's rate drops, its mark goes, and both nodes clear
	// the group after -hot-clear-after.
	stopFlood()
	stopped := time.Now()
	for {
		ga, gb := hotGroups(a), hotGroups(b)
		if len(ga) == 0 && len(gb) == 0 && !isHot(a) && !isHot(b) {
			break
		}
		if time.Since(stopped) > 10*time.Second {
			t.Fatalf("10 s after the flood stopped: node a %+v, node b %+v, want none", ga, gb)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if d := time.Since(stopped); d < clearAfter {
		t.Errorf("cleared %v after the flood stopped, before -hot-clear-after (%v): no hysteresis", d, clearAfter)
	}
	t.Logf("both nodes cleared the group %v after the flood stopped", time.Since(stopped))
}
