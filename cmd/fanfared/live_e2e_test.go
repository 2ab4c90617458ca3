package main

import (
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestNodeDegradedAfterCloses: a node-wide level reaches every connection
// still open, once, after others closed first, last and in the middle of
// the gateway's list of live connections (a close moves the last one into
// its place).
func TestNodeDegradedAfterCloses(t *testing.T) {
	ts := startServer(t, "embedded")
	uids := []string{"u0", "u1", "u2", "u3", "u4", "u5"}
	conns := map[string]*rawConn{}
	for _, u := range uids {
		conns[u] = ts.dialRaw(u)
	}
	var online struct {
		OnlineUsers float64 `json:"online_users"`
	}
	waitOnline := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ts.do("GET", "/admin/v1/stats", ts.admin, nil, &online)
			if int(online.OnlineUsers) == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("online users: got %v, want %d", online.OnlineUsers, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitOnline(len(uids))
	for _, u := range []string{"u0", "u5", "u2"} { // first, last, middle
		conns[u].c.Close()
		delete(conns, u)
	}
	waitOnline(len(conns))
	ts.degrade(wire.ScopeNode, 0, lv(1), 60)
	for u, rc := range conns {
		d, _ := readUntil[*wire.Degraded](rc, 5*time.Second)
		if d.GID != 0 || d.Level != 1 {
			t.Fatalf("%s: got %+v, want node level 1", u, d)
		}
		if f, err := rc.tryRead(300 * time.Millisecond); err == nil {
			if _, again := f.(*wire.Degraded); again {
				t.Fatalf("%s: a second degraded frame %+v", u, f)
			}
		}
	}
}
