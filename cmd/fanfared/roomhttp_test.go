package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// pollAnswer is a decoded enter/status answer with its status and cookies.
type pollAnswer struct {
	Status  int
	Ticket  string
	After   int64
	Frame   wire.ServerFrame
	Raw     string
	Cookies []*http.Cookie
	Header  http.Header
}

// roomReq sends one request of the polling path: bearer tok, ticket in
// X-Fanfare-Ticket (when set).
func (ts *testServer) roomReq(method, path, bearer, ticket string) pollAnswer {
	ts.t.Helper()
	req, err := http.NewRequest(method, ts.http+path, nil)
	if err != nil {
		ts.t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	if ticket != "" {
		req.Header.Set("X-Fanfare-Ticket", ticket)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := pollAnswer{Status: resp.StatusCode, Raw: string(raw), Cookies: resp.Cookies(), Header: resp.Header}
	if resp.StatusCode != http.StatusOK || !strings.Contains(path, "/v1/rooms/") || strings.HasSuffix(path, "/site") {
		return a
	}
	var body struct {
		Ticket string          `json:"ticket"`
		After  int64           `json:"poll_after_ms"`
		Frame  json.RawMessage `json:"frame"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		ts.t.Fatalf("%s %s: %q: %v", method, path, raw, err)
	}
	a.Ticket, a.After = body.Ticket, body.After
	if a.Frame, err = wire.DecodeServer(body.Frame); err != nil {
		ts.t.Fatalf("%s %s: frame %s: %v", method, path, body.Frame, err)
	}
	return a
}

// pollRoomUntil polls status with ticket until the frame is a T.
func pollRoomUntil[T wire.ServerFrame](ts *testServer, room, ticket string, d time.Duration) T {
	ts.t.Helper()
	deadline := time.Now().Add(d)
	for {
		a := ts.roomReq("GET", "/v1/rooms/"+room+"/status", "", ticket)
		if a.Status == http.StatusOK {
			if f, ok := a.Frame.(T); ok {
				return f
			}
		} else if a.Status != http.StatusTooManyRequests {
			ts.t.Fatalf("status: %d %s", a.Status, a.Raw)
		}
		if time.Now().After(deadline) {
			var zero T
			ts.t.Fatalf("no %T in %v; last %s", zero, d, a.Raw)
		}
		time.Sleep(300 * time.Millisecond) // a poll interval, not synchronisation
	}
}

// leaveRoom leaves room with ticket (after the poll limit's retry hint,
// if any).
func (ts *testServer) leaveRoom(room, ticket string) {
	ts.t.Helper()
	for range 20 {
		a := ts.roomReq("POST", "/v1/rooms/"+room+"/leave", "", ticket)
		if a.Status == http.StatusNoContent {
			return
		}
		if a.Status != http.StatusTooManyRequests {
			ts.t.Fatalf("leave: %d %s", a.Status, a.Raw)
		}
		time.Sleep(500 * time.Millisecond) // the room_poll rule's pace
	}
	ts.t.Fatal("leave: still rate limited after 10 s")
}

// dialRoomTicket opens the room socket with ?ticket=.
func (ts *testServer) dialRoomTicket(room, ticket string) (*rawConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, br, _, err := ws.Dial(ctx, ts.ws+"/rooms/"+room+"/ws?ticket="+url.QueryEscape(ticket))
	if err != nil {
		return nil, err
	}
	rc := &rawConn{t: ts.t, c: c, rw: c}
	if br != nil {
		rc.rw = bufferedRW(br, c)
	}
	ts.t.Cleanup(func() { c.Close() })
	return rc, nil
}

// TestRoomPollingPath is a site room's life over HTTP, in both modes: the
// site object round-trips and is public; anonymous visitors enter, get a
// ticket and a cookie; the first is granted with a redirect_url carrying
// an access token that /rooms/{room}/verify accepts; the second waits,
// polls, moves to the room socket with ?ticket= keeping its place, and is
// granted when the first leaves. Forged, other-room and missing tickets
// are 401.
func TestRoomPollingPath(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-room-token-secret", testRoomSecret)
			site := `{"target_url":"https://shop.example/checkout?x=1","anonymous":true,"title":"Big sale",
				"colors":{"accent":"#ff0066"},"strings":{"en":{"position":"You are number {position}"}},"default_lang":"en"}`
			var cfg wire.RoomConfig
			if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"sale","max_active":1,"admit_rate":20,"grace_s":60,"site":`+site+`}`, &cfg); st != http.StatusOK {
				t.Fatalf("create room: %d", st)
			}
			if cfg.Site == nil || cfg.Site.TargetURL != "https://shop.example/checkout?x=1" || !cfg.Site.Anonymous || cfg.Site.Colors.Accent != "#ff0066" {
				t.Fatalf("site in the config answer: %+v", cfg.Site)
			}
			if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"other"}`, nil); st != http.StatusOK {
				t.Fatalf("create room other: %d", st)
			}
			var rs wire.RoomSite
			if st := ts.do("GET", "/v1/rooms/sale/site", "", nil, &rs); st != http.StatusOK || rs.Site.Title != "Big sale" || rs.Phase != "open" ||
				rs.Site.Strings["en"]["position"] == "" {
				t.Fatalf("GET site: %d %+v", st, rs)
			}
			if st := ts.do("GET", "/v1/rooms/nope/site", "", nil, nil); st != http.StatusNotFound {
				t.Fatalf("GET site of an unknown room: %d, want 404", st)
			}

			first := ts.roomReq("POST", "/v1/rooms/sale/enter", "", "")
			if first.Status != http.StatusOK || first.Ticket == "" || first.After <= 0 {
				t.Fatalf("enter: %d %s", first.Status, first.Raw)
			}
			var cookie *http.Cookie
			for _, c := range first.Cookies {
				if c.Name == "fanfare_ticket_sale" {
					cookie = c
				}
			}
			if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteLaxMode || cookie.Value != first.Ticket {
				t.Fatalf("ticket cookie: %+v", first.Cookies)
			}
			// The room is empty: its first admission step may come before
			// the enter's answer is written, which is then granted (and
			// suggests PollMax). A queue answer at the head says PollMin.
			if first.After > 1200 && !strings.Contains(first.Raw, `"type":"granted"`) {
				t.Errorf("poll_after_ms %d at the head of the queue, want about 1000 (%s)", first.After, first.Raw)
			}
			g := pollRoomUntil[*wire.Granted](ts, "sale", first.Ticket, 10*time.Second)
			claims, err := roomtoken.Verify(g.AccessToken, []byte(testRoomSecret), "sale", time.Second)
			if err != nil || !strings.HasPrefix(claims.UID(), "anon:") {
				t.Fatalf("access token: %v %+v", err, claims)
			}
			ru, err := url.Parse(g.RedirectURL)
			if err != nil || ru.Host != "shop.example" || ru.Query().Get("fanfare_access") != g.AccessToken || ru.Query().Get("x") != "1" {
				t.Fatalf("redirect_url %q", g.RedirectURL)
			}
			v := ts.roomReq("GET", "/rooms/sale/verify", g.AccessToken, "")
			if v.Status != http.StatusNoContent || v.Header.Get("X-Fanfare-User") != claims.UID() {
				t.Fatalf("verify: %d %s %v", v.Status, v.Raw, v.Header)
			}
			if v := ts.roomReq("GET", "/rooms/other/verify", g.AccessToken, ""); v.Status != http.StatusUnauthorized {
				t.Fatalf("verify for another room: %d, want 401", v.Status)
			}

			second := ts.roomReq("POST", "/v1/rooms/sale/enter", "", "")
			q, ok := second.Frame.(*wire.Queue)
			if second.Status != http.StatusOK || !ok || q.Position != 1 {
				t.Fatalf("second visitor: %d %s", second.Status, second.Raw)
			}
			// Entering again with the ticket keeps the identity and place.
			again := ts.roomReq("POST", "/v1/rooms/sale/enter", "", second.Ticket)
			if q2, ok := again.Frame.(*wire.Queue); !ok || q2.Position != 1 {
				t.Fatalf("enter again: %s", again.Raw)
			}
			st := ts.roomReq("GET", "/v1/rooms/sale/status", "", second.Ticket)
			if _, ok := st.Frame.(*wire.Queue); st.Status != http.StatusOK || !ok {
				t.Fatalf("status: %d %s", st.Status, st.Raw)
			}
			for name, tk := range map[string]string{
				"none": "", "forged": second.Ticket[:len(second.Ticket)-3] + "AAA", "garbage": "ft1.x.y",
			} {
				if a := ts.roomReq("GET", "/v1/rooms/sale/status", "", tk); a.Status != http.StatusUnauthorized {
					t.Errorf("status with %s ticket: %d %s, want 401", name, a.Status, a.Raw)
				}
			}
			if a := ts.roomReq("GET", "/v1/rooms/other/status", "", second.Ticket); a.Status != http.StatusUnauthorized {
				t.Errorf("status in another room: %d, want 401", a.Status)
			}
			// A room without anonymous visitors refuses an enter without credentials.
			if a := ts.roomReq("POST", "/v1/rooms/other/enter", "", ""); a.Status != http.StatusUnauthorized {
				t.Errorf("anonymous enter into other: %d, want 401", a.Status)
			}
			// A user token enters other with its uid.
			if a := ts.roomReq("POST", "/v1/rooms/other/enter", ts.token("carol", 2), ""); a.Status != http.StatusOK {
				t.Errorf("user enter into other: %d %s", a.Status, a.Raw)
			}

			// The second visitor waits on the socket with its ticket: same place.
			rc, err := ts.dialRoomTicket("sale", second.Ticket)
			if err != nil {
				t.Fatalf("dial with ticket: %v", err)
			}
			if q, _ := readUntil[*wire.Queue](rc, 10*time.Second); q.Position != 1 {
				t.Fatalf("socket queue frame: %+v", q)
			}
			if _, err := ts.dialRoomTicket("other", second.Ticket); err == nil {
				t.Fatal("socket of another room took the ticket")
			}
			// The first leaves: the second is granted, on the socket and by polling.
			ts.leaveRoom("sale", first.Ticket)
			gs, _ := readUntil[*wire.Granted](rc, 10*time.Second)
			gp := pollRoomUntil[*wire.Granted](ts, "sale", second.Ticket, 10*time.Second)
			if gs.RedirectURL == "" || gp.AccessToken == "" {
				t.Fatalf("granted: socket %+v, poll %+v", gs, gp)
			}
		})
	}
}

// TestRoomMixedTransportsOneOrder: socket users and polling users of one
// room, VIPs among them, spread over the nodes (two sharing Redis in
// cluster mode, each user sticking to one): with one admission at a time,
// they are admitted in the order of their scores (VIP tiers first, then
// by join), whatever their transport or node. Each admitted user frees
// the slot (socket close; POST leave) before the next is expected.
func TestRoomMixedTransportsOneOrder(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			flags := []string{"-room-token-secret", testRoomSecret, "-room-poll-grace", "2m"}
			var nodes []*testServer
			if mode == "embedded" {
				nodes = []*testServer{startServer(t, mode, flags...)}
			} else {
				a, b := startTwoNodes(t, flags...)
				nodes = []*testServer{a, b}
			}
			body := `{"room":"mix","max_active":1,"admit_rate":50,"grace_s":300,"smoothing_s":-1,"vip_share_cap":1,"vip_admit_share":-1}`
			if st := nodes[0].do("POST", "/admin/v1/rooms", nodes[0].admin, body, nil); st != http.StatusOK {
				t.Fatalf("create room: %d", st)
			}
			for _, n := range nodes[1:] { // the other node learns the room from Redis
				deadline := time.Now().Add(20 * time.Second)
				for n.do("GET", "/v1/rooms/mix/site", "", nil, nil) != http.StatusOK {
					if time.Now().After(deadline) {
						t.Fatal("room not seen by the second node")
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			blocker := nodes[0].dialRoom("mix", "blocker", 0)
			readUntil[*wire.Granted](blocker, 10*time.Second)

			type user struct {
				uid    string
				tier   int
				node   *testServer
				sock   *rawConn
				ticket string
			}
			tiers := map[int]int{2: 3, 5: 1, 9: 2}
			var users []*user
			for i := range 12 {
				u := &user{uid: fmt.Sprintf("u%02d", i), tier: tiers[i], node: nodes[i%len(nodes)]}
				if i%2 == 0 {
					u.sock = u.node.dialRoom("mix", u.uid, u.tier)
					readUntil[*wire.Queue](u.sock, 10*time.Second)
				} else {
					a := u.node.roomReq("POST", "/v1/rooms/mix/enter", u.node.token(u.uid, u.tier), "")
					if _, ok := a.Frame.(*wire.Queue); a.Status != http.StatusOK || !ok {
						t.Fatalf("enter %s: %d %s", u.uid, a.Status, a.Raw)
					}
					u.ticket = a.Ticket
				}
				users = append(users, u)
			}
			// Expected: tier 3, 2, 1, then the normal users by join (= uid order here).
			want := []string{"u02", "u09", "u05", "u00", "u01", "u03", "u04", "u06", "u07", "u08", "u10", "u11"}
			byUID := map[string]*user{}
			for _, u := range users {
				byUID[u.uid] = u
			}
			// A polling user's position already reflects the one order.
			for i, uid := range want {
				if u := byUID[uid]; u.ticket != "" {
					deadline := time.Now().Add(15 * time.Second)
					for {
						a := u.node.roomReq("GET", "/v1/rooms/mix/status", "", u.ticket)
						if q, ok := a.Frame.(*wire.Queue); ok && q.Position == int64(i+1) {
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("%s: position %s, want %d", uid, a.Raw, i+1)
						}
						time.Sleep(100 * time.Millisecond)
					}
				}
			}
			blocker.c.Close()
			for _, uid := range want {
				u := byUID[uid]
				if u.sock != nil {
					readUntil[*wire.Granted](u.sock, 15*time.Second)
					u.sock.c.Close()
				} else {
					pollRoomUntil[*wire.Granted](u.node, "mix", u.ticket, 15*time.Second)
					u.node.leaveRoom("mix", u.ticket)
				}
			}
		})
	}
}

// TestRoomPollerMovesNode: two nodes sharing Redis, no sticky routing. A
// polling visitor whose polls move from node a to node b, and one who
// polls a and b in turn and then only a, are never away when the node
// they left times out its poller (the room's entry lists both nodes, and
// that node's disconnect only takes it off the list), and both are
// admitted before a user who entered after them.
func TestRoomPollerMovesNode(t *testing.T) {
	a, b := startTwoNodes(t, "-room-token-secret", testRoomSecret,
		"-room-poll-min", "100ms", "-room-poll-max", "200ms", "-room-poll-grace", "1s")
	body := `{"room":"move","max_active":1,"admit_rate":50,"grace_s":300,"smoothing_s":-1,"vip_admit_share":-1}`
	if st := a.do("POST", "/admin/v1/rooms", a.admin, body, nil); st != http.StatusOK {
		t.Fatalf("create room: %d", st)
	}
	waitFor(t, 20*time.Second, "the room on node b", func() bool {
		return b.do("GET", "/v1/rooms/move/site", "", nil, nil) == http.StatusOK
	})
	blocker := a.dialRoom("move", "blocker", 0)
	readUntil[*wire.Granted](blocker, 10*time.Second)
	enter := func(uid string) string {
		t.Helper()
		r := a.roomReq("POST", "/v1/rooms/move/enter", a.token(uid, 0), "")
		if _, ok := r.Frame.(*wire.Queue); r.Status != http.StatusOK || !ok {
			t.Fatalf("enter %s: %d %s", uid, r.Status, r.Raw)
		}
		return r.Ticket
	}
	poll := func(n *testServer, ticket string) {
		t.Helper()
		// a 429 of the room_poll rule is a poll too (the visitor reached the node)
		if r := n.roomReq("GET", "/v1/rooms/move/status", "", ticket); r.Status != http.StatusOK && r.Status != http.StatusTooManyRequests {
			t.Fatalf("status: %d %s", r.Status, r.Raw)
		}
	}
	mover, turns := enter("mover"), enter("turns")
	time.Sleep(1100 * time.Millisecond) // a later second: entrants of one second rank by uid
	late := b.dialRoom("move", "late", 0)
	readUntil[*wire.Queue](late, 10*time.Second)
	// Several poll timeouts (2 x 200 ms + 1 s) and sweeps (1 s) of the
	// node each visitor left.
	start := time.Now()
	for i := 0; time.Since(start) < 7*time.Second; i++ {
		poll(b, mover)
		if time.Since(start) < 2*time.Second && i%2 == 1 {
			poll(b, turns)
		} else {
			poll(a, turns)
		}
		var st wire.RoomStatus
		a.do("GET", "/admin/v1/rooms/move", a.admin, nil, &st)
		if st.Away != 0 || st.Depth != 3 {
			t.Fatalf("after %v: %d away, %d waiting; want 0 and 3 (a visitor that moved node was made away)",
				time.Since(start).Round(time.Millisecond), st.Away, st.Depth)
		}
		time.Sleep(450 * time.Millisecond) // a poll interval within room_poll's 2/s, not synchronisation
	}
	blocker.c.Close()
	pollRoomUntil[*wire.Granted](b, "move", mover, 15*time.Second)
	b.leaveRoom("move", mover)
	pollRoomUntil[*wire.Granted](a, "move", turns, 15*time.Second)
	a.leaveRoom("move", turns)
	readUntil[*wire.Granted](late, 15*time.Second)
}
