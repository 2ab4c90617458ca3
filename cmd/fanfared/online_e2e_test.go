package main

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// online is the answer of GET /admin/v1/groups/{gid}/online.
type online struct {
	GID        int64  `json:"gid"`
	Online     int64  `json:"online"`
	OnlineHere int    `json:"online_here"`
	Stale      bool   `json:"stale"`
	Scope      string `json:"scope"`
}

func (ts *testServer) online(gid int64) online {
	ts.t.Helper()
	var o online
	if st := ts.do("GET", fmt.Sprintf("/admin/v1/groups/%d/online", gid), ts.admin, nil, &o); st != http.StatusOK {
		ts.t.Fatalf("online %d: status %d", gid, st)
	}
	return o
}

// waitOnline polls ts until gid's answer equals want, or fails after d.
func (ts *testServer) waitOnline(gid int64, want online, d time.Duration) time.Duration {
	ts.t.Helper()
	start := time.Now()
	for {
		got := ts.online(gid)
		if got == want {
			return time.Since(start)
		}
		if time.Since(start) > d {
			ts.t.Fatalf("%s: online of %d: got %+v, want %+v after %v", ts.ws, gid, got, want, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClusterOnline: users online on two nodes (one on both) are counted
// once each by the admin route on either node, within the flush interval
// (plus scheduling slack); a disconnect follows the same way.
func TestClusterOnline(t *testing.T) {
	const interval = 100 * time.Millisecond
	a, b := startTwoNodes(t, "-presence-flush-interval", interval.String(), "-presence-ttl", "1m")
	gid := a.createGroup("u1", "u2", "u3", "u4", "u5")
	other := a.createGroup("u1", "u5") // u5 is never online: count 1

	if st := a.do("GET", "/admin/v1/groups/987654321/online", a.admin, nil, nil); st != http.StatusNotFound {
		t.Fatalf("unknown group: status %d, want 404", st)
	}
	if st := a.do("GET", fmt.Sprintf("/admin/v1/groups/%d/online", gid), a.token("u1", 0), nil, nil); st != http.StatusUnauthorized {
		t.Fatalf("user token: status %d, want 401", st)
	}
	if got := a.online(gid); got != (online{GID: gid, Scope: "cluster"}) {
		t.Fatalf("nobody online: got %+v", got)
	}

	u1 := a.dialRaw("u1")
	a.dialRaw("u2")
	a.dialRaw("u4")
	b.dialRaw("u3")
	b.dialRaw("u4")               // a second device on the other node: counted once
	const slack = 2 * time.Second // scheduling and Redis on a shared machine
	lagA := a.waitOnline(gid, online{GID: gid, Online: 4, OnlineHere: 3, Scope: "cluster"}, interval+slack)
	lagB := b.waitOnline(gid, online{GID: gid, Online: 4, OnlineHere: 2, Scope: "cluster"}, interval+slack)
	t.Logf("cluster count seen after %v on node a, %v more on node b (flush interval %v)", lagA, lagB, interval)
	b.waitOnline(other, online{GID: other, Online: 1, Scope: "cluster"}, interval+slack)

	u1.c.Close()
	b.waitOnline(gid, online{GID: gid, Online: 3, OnlineHere: 2, Scope: "cluster"}, interval+slack)
	b.waitOnline(other, online{GID: other, Online: 0, Scope: "cluster"}, interval+slack)

	m := scrapeValues(t, a)
	if m[`fanfare_presence_cluster_flushes_total{result="ok"}`] < 1 || m["fanfare_presence_cluster_stale"] != 0 ||
		m[`fanfare_presence_cluster_writes_total{kind="full"}`] < 1 || m["fanfare_presence_cluster_resyncs_total"] < 1 {
		t.Fatalf("node a presence view metrics: %v", m)
	}

}

// TestClusterOnlineDrain: a node that drains withdraws its users from the
// cluster view at once. The flush interval is an hour, so only the
// explicit flushes below and the drain's withdrawal write to Redis: without
// the withdrawal node a would count node b's users until the TTL (3 h).
func TestClusterOnlineDrain(t *testing.T) {
	a, b := startTwoNodes(t, "-presence-flush-interval", "1h", "-presence-ttl", "3h")
	gid := a.createGroup("u1", "u2", "u3")
	a.dialRaw("u1")
	b.dialRaw("u2")
	b.dialRaw("u3")
	for _, ts := range []*testServer{a, b} {
		if err := ts.srv.view.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.online(gid); got != (online{GID: gid, Online: 3, OnlineHere: 1, Scope: "cluster"}) {
		t.Fatalf("before the drain: got %+v, want 3 online, 1 here", got)
	}
	b.stop()
	if got := a.online(gid); got != (online{GID: gid, Online: 1, OnlineHere: 1, Scope: "cluster"}) {
		t.Fatalf("after node b drained: got %+v, want u1 on node a only", got)
	}
}

// TestEmbeddedOnline: without Redis the route answers from this node's
// presence, with scope "node".
func TestEmbeddedOnline(t *testing.T) {
	ts := startServer(t, "embedded")
	gid := ts.createGroup("u1", "u2", "u3")
	ts.dialRaw("u1")
	ts.dialRaw("u2")
	ts.dialRaw("u2")
	want := online{GID: gid, Online: 2, OnlineHere: 2, Scope: "node"}
	if got := ts.online(gid); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	var e wire.ErrorResponse
	if st := ts.do("GET", "/admin/v1/groups/987654321/online", ts.admin, nil, &e); st != http.StatusNotFound || e.Error.Code != wire.CodeNotFound {
		t.Fatalf("unknown group: status %d %+v, want 404 not_found", st, e)
	}
	if st := ts.do("GET", "/admin/v1/groups/x/online", ts.admin, nil, nil); st != http.StatusBadRequest {
		t.Fatalf("bad gid: status %d, want 400", st)
	}
}

// scrapeValues returns every sample of ts's /metrics by series.
func scrapeValues(t *testing.T, ts *testServer) map[string]float64 {
	t.Helper()
	resp, err := http.Get(ts.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}
