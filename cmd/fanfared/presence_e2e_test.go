package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// presenceArgs: a fast feed; groups of at most 3 members are listed and
// get join/leave events.
var presenceArgs = []string{"-presence-interval", "100ms", "-presence-list-max", "3", "-presence-events-max", "3",
	"-presence-flush-interval", "100ms", "-presence-ttl", "1m"}

// presenceLog keeps the presence frames read from each raw connection, so
// that waiting for one group's frame does not lose another group's.
var presenceLog sync.Map // *rawConn -> *[]wire.Presence

// waitPresence returns the first presence frame of gid on rc (kept or
// read now) that satisfies ok, dropping the earlier frames of gid; it fails
// after d.
func waitPresence(rc *rawConn, gid int64, d time.Duration, ok func(*wire.Presence) bool) *wire.Presence {
	rc.t.Helper()
	v, _ := presenceLog.LoadOrStore(rc, new([]wire.Presence))
	kept := v.(*[]wire.Presence)
	var seen []wire.Presence
	take := func() *wire.Presence {
		for i := 0; i < len(*kept); i++ {
			p := (*kept)[i]
			if p.GID != gid {
				continue
			}
			*kept = slices.Delete(*kept, i, i+1)
			i--
			seen = append(seen, p)
			if ok(&p) {
				return &p
			}
		}
		return nil
	}
	deadline := time.Now().Add(d)
	for {
		if p := take(); p != nil {
			return p
		}
		f, err := rc.tryReadAny(time.Until(deadline))
		if err != nil {
			rc.t.Fatalf("presence of %d: %v (its presence frames seen: %+v)", gid, err, seen)
		}
		if p, isP := f.(*wire.Presence); isP {
			*kept = append(*kept, *p)
		}
	}
}

// noPresence fails when a presence frame of gid arrives on rc within d.
func noPresence(rc *rawConn, gid int64, d time.Duration) {
	rc.t.Helper()
	v, _ := presenceLog.LoadOrStore(rc, new([]wire.Presence))
	kept := v.(*[]wire.Presence)
	*kept = slices.DeleteFunc(*kept, func(p wire.Presence) bool { return p.GID == gid }) // already read: before d
	deadline := time.Now().Add(d)
	for {
		f, err := rc.tryReadAny(time.Until(deadline))
		if err != nil {
			return // the deadline: nothing came
		}
		if p, isP := f.(*wire.Presence); isP {
			if p.GID == gid {
				rc.t.Fatalf("unexpected presence frame %+v", *p)
			}
			*kept = append(*kept, *p)
		}
	}
}

func (ts *testServer) onlineMembers(gid int64, uid, query string) (wire.OnlineMembers, int) {
	ts.t.Helper()
	var out wire.OnlineMembers
	st := ts.do("GET", fmt.Sprintf("/v1/groups/%d/online%s", gid, query), ts.token(uid, 0), nil, &out)
	return out, st
}

// TestPresenceFeed, in both modes on one node: members get their group's
// online count pushed when it changes (one frame per interval, none while
// it stays), small groups' frames name who came and went, large groups get
// counts only; the member route lists small groups page by page to members
// only; a group forced to L3 gets no presence frames, and its next frame
// after L0 says more (events were shed).
func TestPresenceFeed(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, presenceArgs...)
			small := ts.createGroup("u1", "u2", "u3")
			large := ts.createGroup("u1", "u2", "u3", "u4")
			const d = 10 * time.Second

			u1 := ts.dialRaw("u1")
			waitPresence(u1, small, d, func(p *wire.Presence) bool { return p.Online == 1 })
			u2 := ts.dialRaw("u2")
			p := waitPresence(u1, small, d, func(p *wire.Presence) bool { return p.Online == 2 })
			if !slices.Equal(p.Joined, []string{"u2"}) || len(p.Left) != 0 {
				t.Fatalf("small group, u2 came online: %+v, want joined [u2]", *p)
			}
			waitPresence(u2, small, d, func(p *wire.Presence) bool { return p.Online == 2 })
			lp := waitPresence(u1, large, d, func(p *wire.Presence) bool { return p.Online == 2 })
			if len(lp.Joined)+len(lp.Left) != 0 {
				t.Fatalf("large group: %+v, want a count only", *lp)
			}
			// Nothing changes: nothing is pushed (several intervals).
			noPresence(u1, small, 500*time.Millisecond)

			// The member route.
			page, st := ts.onlineMembers(small, "u3", "?limit=1")
			if st != http.StatusOK || !page.Listed || page.Online != 2 || !slices.Equal(page.Members, []string{"u1"}) || page.NextCursor != "u1" {
				t.Fatalf("first page: status %d, %+v", st, page)
			}
			page, st = ts.onlineMembers(small, "u3", "?limit=1&cursor=u1")
			if st != http.StatusOK || !slices.Equal(page.Members, []string{"u2"}) || page.NextCursor != "" {
				t.Fatalf("second page: status %d, %+v", st, page)
			}
			page, st = ts.onlineMembers(large, "u4", "")
			if st != http.StatusOK || page.Listed || page.Online != 2 || len(page.Members) != 0 {
				t.Fatalf("large group: status %d, %+v (want a count, no list)", st, page)
			}
			for _, c := range []struct {
				name, uid, query string
				gid              int64
				status           int
			}{
				{"non-member", "u9", "", small, http.StatusForbidden},
				{"unknown group", "u1", "", 987654321, http.StatusForbidden},
				{"limit 0", "u1", "?limit=0", small, http.StatusBadRequest},
				{"limit above the cap", "u1", "?limit=501", small, http.StatusBadRequest},
				{"limit not a number", "u1", "?limit=x", small, http.StatusBadRequest},
				{"cursor too long", "u1", "?cursor=" + strings.Repeat("a", 257), small, http.StatusBadRequest},
			} {
				if _, st := ts.onlineMembers(c.gid, c.uid, c.query); st != c.status {
					t.Errorf("%s: status %d, want %d", c.name, st, c.status)
				}
			}
			if st := ts.do("GET", fmt.Sprintf("/v1/groups/%d/online", small), "", nil, nil); st != http.StatusUnauthorized {
				t.Errorf("no token: status %d, want 401", st)
			}

			u2.c.Close()
			p = waitPresence(u1, small, d, func(p *wire.Presence) bool { return p.Online == 1 })
			if !slices.Equal(p.Left, []string{"u2"}) || len(p.Joined) != 0 {
				t.Fatalf("small group, u2 went offline: %+v, want left [u2]", *p)
			}

			// L3: presence is the first thing shed.
			ts.degrade("group", small, lv(3), 0)
			u3 := ts.dialRaw("u3")
			noPresence(u1, small, 500*time.Millisecond)
			ts.degrade("group", small, nil, 0)
			p = waitPresence(u1, small, d, func(p *wire.Presence) bool { return p.Online == 2 })
			if !p.More || len(p.Joined) != 0 {
				t.Fatalf("first frame after L3: %+v, want the count with more (events were shed)", *p)
			}
			waitPresence(u3, small, d, func(p *wire.Presence) bool { return p.Online == 2 })
		})
	}
}

// TestPresenceRateLimited: the member route is limited by online_list.
func TestPresenceRateLimited(t *testing.T) {
	limits := writeFile(t, "limits.json", `{"rules":{"online_list":{"algorithm":"gcra","limit":1,"window":"1m","burst":2}}}`)
	ts := startServer(t, "embedded", "-limits-file", limits)
	gid := ts.createGroup("u1", "u2")
	for i := range 2 {
		if _, st := ts.onlineMembers(gid, "u1", ""); st != http.StatusOK {
			t.Fatalf("request %d: status %d", i, st)
		}
	}
	if _, st := ts.onlineMembers(gid, "u1", ""); st != http.StatusTooManyRequests {
		t.Fatalf("third request: status %d, want 429", st)
	}
	if _, st := ts.onlineMembers(gid, "u2", ""); st != http.StatusOK {
		t.Fatalf("another user: status %d, want 200 (the limit is per user)", st)
	}
}

// TestPresenceAcrossNodes: in cluster mode the pushed counts and the list
// are the cluster's: members on two nodes see each other come and go, a
// user on both nodes counts once, and large groups get the cluster count.
func TestPresenceAcrossNodes(t *testing.T) {
	a, b := startTwoNodes(t, presenceArgs...)
	small := a.createGroup("u1", "u2", "u3")
	large := a.createGroup("u1", "u2", "u3", "u4")
	const d = 10 * time.Second

	u1 := a.dialRaw("u1")
	waitPresence(u1, small, d, func(p *wire.Presence) bool { return p.Online == 1 })
	u2 := b.dialRaw("u2")
	p := waitPresence(u1, small, d, func(p *wire.Presence) bool { return p.Online == 2 })
	if !slices.Equal(p.Joined, []string{"u2"}) {
		t.Fatalf("u2 online on the other node: %+v, want joined [u2]", *p)
	}
	waitPresence(u2, small, d, func(p *wire.Presence) bool { return p.Online == 2 })
	b.dialRaw("u1") // a second device on the other node: still 2
	b.dialRaw("u4")
	waitPresence(u1, large, d, func(p *wire.Presence) bool { return p.Online == 3 })
	waitPresence(u2, large, d, func(p *wire.Presence) bool { return p.Online == 3 })

	page, st := b.onlineMembers(small, "u3", "")
	if st != http.StatusOK || !slices.Equal(page.Members, []string{"u1", "u2"}) || page.Online != 2 {
		t.Fatalf("list on node b: status %d, %+v", st, page)
	}
	u2.c.Close()
	p = waitPresence(u1, small, d, func(p *wire.Presence) bool { return p.Online == 1 })
	if !slices.Equal(p.Left, []string{"u2"}) {
		t.Fatalf("u2 offline on the other node: %+v, want left [u2]", *p)
	}
}

// TestPresenceSDK: the Go SDK hands presence frames to OnPresence, keeps
// the latest per group (Conn.Online) and reads the list.
func TestPresenceSDK(t *testing.T) {
	ts := startServer(t, "embedded", presenceArgs...)
	gid := ts.createGroup("u1", "u2")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	var got []client.Presence
	c1, err := client.Dial(ctx, client.Config{URL: ts.ws + "/ws", HTTPURL: ts.http, Token: ts.token("u1", 0),
		OnPresence: func(p client.Presence) {
			mu.Lock()
			got = append(got, p)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2, err := client.Dial(ctx, client.Config{URL: ts.ws + "/ws", HTTPURL: ts.http, Token: ts.token("u2", 0)})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if p, ok := c1.Online(gid); ok && p.Online == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("c1 never saw 2 online (frames %+v)", got)
		case <-time.After(10 * time.Millisecond):
		}
	}
	members, n, listed, err := c1.AllOnlineMembers(ctx, gid)
	if err != nil || !listed || n != 2 || !slices.Equal(members, []string{"u1", "u2"}) {
		t.Fatalf("AllOnlineMembers: %v %d %v %v", members, n, listed, err)
	}
	c2.Close()
	for {
		if p, ok := c1.Online(gid); ok && p.Online == 1 {
			if !slices.Equal(p.Left, []string{"u2"}) {
				t.Fatalf("u2 left: %+v", p)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("c1 never saw u2 leave")
		case <-time.After(10 * time.Millisecond):
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) < 2 {
		t.Fatalf("OnPresence got %d frames, want at least 2", len(got))
	}
	if _, err := c1.OnlineMembers(ctx, 987654321, "", 0); err == nil {
		t.Fatal("OnlineMembers of a group u1 is not in: no error")
	}
}

// TestPresenceOverEventStream: an event stream gets its groups' presence
// frames like a socket, with no id (they move no group's position).
func TestPresenceOverEventStream(t *testing.T) {
	ts := startServer(t, "embedded", presenceArgs...)
	small := ts.createGroup("u1", "u2", "u3")
	s, st := ts.openStream(t, "/v1/events", map[string]string{"Authorization": "Bearer " + ts.token("u1", 0)})
	if st != http.StatusOK {
		t.Fatalf("open stream: %d", st)
	}
	if f, _ := s.frame(10 * time.Second); f.FrameType() != "hello" {
		t.Fatalf("first frame %T, want hello", f)
	}
	deadline := time.Now().Add(15 * time.Second)
	wait := func(online int64) (*wire.Presence, sseEvent) {
		for {
			f, ev := s.frameAny(time.Until(deadline))
			if p, ok := f.(*wire.Presence); ok && p.GID == small && p.Online == online {
				return p, ev
			}
		}
	}
	wait(1) // the stream itself
	ts.dialRaw("u2")
	if p, ev := wait(2); !slices.Equal(p.Joined, []string{"u2"}) || ev.id != "" {
		t.Fatalf("presence event %+v (id %q), want joined [u2] and no id", *p, ev.id)
	}
}
