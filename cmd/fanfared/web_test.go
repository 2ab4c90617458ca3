package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// get fetches path and returns the status, the headers and the body.
func (ts *testServer) get(path string) (int, http.Header, string) {
	ts.t.Helper()
	resp, err := http.Get(ts.http + path)
	if err != nil {
		ts.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// demoToken calls POST /demo/token with body (JSON) and decodes the answer.
func (ts *testServer) demoToken(body string, out any) (int, http.Header) {
	ts.t.Helper()
	req, _ := http.NewRequest("POST", ts.http+"/demo/token", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		_ = json.Unmarshal(raw, out)
	}
	return resp.StatusCode, resp.Header
}

// TestWebPagesByMode: which pages a node serves in each mode and with
// each flag, with their content types and security headers; the
// development token route exists only in embedded mode with the demo on.
func TestWebPagesByMode(t *testing.T) {
	type want struct{ demo, admin, token int }
	for _, tt := range []struct {
		name  string
		mode  string
		flags []string
		want  want
	}{
		{"embedded default", "embedded", nil, want{200, 200, 200}},
		{"embedded demo off", "embedded", []string{"-demo", "off"}, want{404, 200, 404}},
		{"embedded console off", "embedded", []string{"-admin-console=false"}, want{200, 404, 200}},
		{"cluster default", "cluster", nil, want{404, 200, 404}},
		{"cluster demo on", "cluster", []string{"-demo", "on"}, want{200, 200, 404}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t, tt.mode, tt.flags...)
			for _, p := range []struct {
				path, ctype string
				status      int
			}{
				{"/demo/", "text/html; charset=utf-8", tt.want.demo},
				{"/demo/demo.js", "text/javascript; charset=utf-8", tt.want.demo},
				{"/demo/demo.css", "text/css; charset=utf-8", tt.want.demo},
				{"/demo/config.json", "application/json", tt.want.demo},
				{"/admin/", "text/html; charset=utf-8", tt.want.admin},
				{"/admin/admin.js", "text/javascript; charset=utf-8", tt.want.admin},
				{"/admin/chart.js", "text/javascript; charset=utf-8", tt.want.admin},
				{"/sdk/src/index.js", "text/javascript; charset=utf-8", 200},
				{"/sdk/index.d.ts", "text/plain; charset=utf-8", 200},
			} {
				st, h, _ := ts.get(p.path)
				if st != p.status {
					t.Errorf("GET %s: got %d, want %d", p.path, st, p.status)
					continue
				}
				if st != 200 {
					if ct := h.Get("Content-Type"); ct != "application/json" {
						t.Errorf("GET %s: got Content-Type %q on %d, want the API's JSON error", p.path, ct, st)
					}
					continue
				}
				if ct := h.Get("Content-Type"); ct != p.ctype {
					t.Errorf("GET %s: got Content-Type %q, want %q", p.path, ct, p.ctype)
				}
				if p.path == "/demo/config.json" {
					continue // an API answer: no-store, no page headers
				}
				for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache", "X-Frame-Options": "DENY"} {
					if got := h.Get(k); got != v {
						t.Errorf("GET %s: got %s %q, want %q", p.path, k, got, v)
					}
				}
				if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "default-src 'none'") {
					t.Errorf("GET %s: got CSP %q, want default-src 'none' and frame-ancestors 'none'", p.path, csp)
				}
				if h.Get("ETag") == "" {
					t.Errorf("GET %s: no ETag", p.path)
				}
			}
			st, _ := ts.demoToken(`{"user":"alice","group":"lobby"}`, nil)
			if st != tt.want.token {
				t.Errorf("POST /demo/token: got %d, want %d", st, tt.want.token)
			}
			// The API's own routes under /admin/ stay the API's.
			if st, _, _ := ts.get("/admin/v1/degrade"); st != http.StatusUnauthorized {
				t.Errorf("GET /admin/v1/degrade without a token: got %d, want 401", st)
			}
			if st, _, _ := ts.get("/admin/nothing-here"); st != http.StatusNotFound {
				t.Errorf("GET /admin/nothing-here: got %d, want 404", st)
			}
		})
	}
}

// TestDemoToken: the route signs a token for demo-<user> that the chat
// socket takes, joins the user to the demo group, refuses what is not a
// demo user or group, and the demo page's origin may open the socket.
func TestDemoToken(t *testing.T) {
	ts := startServer(t, "embedded", "-demo-token-ttl", "2m")
	var got struct {
		UID       string `json:"uid"`
		Token     string `json:"token"`
		ExpiresAt int64  `json:"expires_at"`
		GID       int64  `json:"gid"`
	}
	st, _ := ts.demoToken(`{"user":"alice","group":"lobby","tier":2}`, &got)
	if st != 200 || got.UID != "demo-alice" || got.GID == 0 || got.Token == "" {
		t.Fatalf("got %d %+v, want 200, uid demo-alice, a gid and a token", st, got)
	}
	if d := time.Until(time.UnixMilli(got.ExpiresAt)); d > 2*time.Minute+time.Second || d < time.Minute {
		t.Errorf("got expiry in %v, want about 2m (-demo-token-ttl)", d)
	}
	// The same group again: the same gid.
	var again struct{ GID int64 }
	if ts.demoToken(`{"user":"bob","group":"lobby"}`, &again); again.GID != got.GID {
		t.Errorf("bob's lobby: got gid %d, want %d", again.GID, got.GID)
	}
	// The token opens the chat socket from the demo page's origin (the
	// HTTP port) and the user is a member: its group is in sync.
	hdr := ws.HandshakeHeaderHTTP(http.Header{"Origin": {ts.http}})
	d := ws.Dialer{Header: hdr}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, _, err := d.Dial(ctx, ts.ws+"/ws?token="+got.Token)
	if err != nil {
		t.Fatalf("dial with the demo token from origin %s: %v", ts.http, err)
	}
	c.Close()
	var sync wire.SyncResponse
	if st := ts.do("GET", "/v1/sync", got.Token, nil, &sync); st != 200 || len(sync.Groups) != 1 || sync.Groups[0].GID != got.GID {
		t.Errorf("sync: got %d %+v, want the lobby", st, sync)
	}
	// Another origin is still refused.
	bad := ws.Dialer{Header: ws.HandshakeHeaderHTTP(http.Header{"Origin": {"http://evil.example:1234"}})}
	if c, _, _, err := bad.Dial(ctx, ts.ws+"/ws?token="+got.Token); err == nil {
		c.Close()
		t.Error("dial from another origin: got a connection, want 403")
	}

	for _, tt := range []struct{ body, want string }{
		{`{"user":"Alice"}`, "user:"},
		{`{"user":""}`, "user:"},
		{`{"user":"` + strings.Repeat("a", 33) + `"}`, "user:"},
		{`{"user":"a","tier":4}`, "tier:"},
		{`{"user":"a","group":"secret"}`, "group:"},
		{`{"user":"a","gid":1}`, "unknown field"},
		{`{"user":"` + strings.Repeat("a", 2000) + `"}`, "larger than 1024 bytes"},
	} {
		var e struct{ Error wire.ErrorBody }
		st, _ := ts.demoToken(tt.body, &e)
		if st/100 != 4 || !strings.Contains(e.Error.Message, tt.want) {
			t.Errorf("%.60s: got %d %q, want 4xx naming %q", tt.body, st, e.Error.Message, tt.want)
		}
	}
	req, _ := http.NewRequest("POST", ts.http+"/demo/token", strings.NewReader(`{"user":"a"}`))
	req.Header.Set("Content-Type", "text/plain") // what a cross-site form or simple fetch sends
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("text/plain body: got %d, want 400", resp.StatusCode)
	}
}

// TestDemoTokenBounds: the route's rate (-demo-token-rate, -burst) and a
// demo group's members (-demo-max-members), at their edges.
func TestDemoTokenBounds(t *testing.T) {
	t.Run("rate", func(t *testing.T) {
		ts := startServer(t, "embedded", "-demo-token-rate", "0.01", "-demo-token-burst", "3")
		for i := range 3 {
			if st, _ := ts.demoToken(`{"user":"u"}`, nil); st != 200 {
				t.Fatalf("token %d of the burst of 3: got %d, want 200", i+1, st)
			}
		}
		st, h := ts.demoToken(`{"user":"u"}`, nil)
		if st != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
			t.Errorf("token 4: got %d (Retry-After %q), want 429 with Retry-After", st, h.Get("Retry-After"))
		}
	})
	t.Run("members", func(t *testing.T) {
		ts := startServer(t, "embedded", "-demo-max-members", "2")
		for _, u := range []string{"a", "b"} {
			if st, _ := ts.demoToken(`{"user":"`+u+`","group":"launch"}`, nil); st != 200 {
				t.Fatalf("member %s of 2: got %d, want 200", u, st)
			}
		}
		var e struct{ Error wire.ErrorBody }
		if st, _ := ts.demoToken(`{"user":"c","group":"launch"}`, &e); st != 400 || !strings.Contains(e.Error.Message, "full") {
			t.Errorf("a third member: got %d %q, want 400 full", st, e.Error.Message)
		}
		if st, _ := ts.demoToken(`{"user":"a","group":"launch"}`, nil); st != 200 {
			t.Errorf("a member again: got %d, want 200", st)
		}
		if st, _ := ts.demoToken(`{"user":"c","group":"support"}`, nil); st != 200 {
			t.Errorf("c in another group: got %d, want 200", st)
		}
	})
	t.Run("flags", func(t *testing.T) {
		for _, args := range [][]string{
			{"-demo", "maybe"}, {"-demo-token-ttl", "25h"}, {"-demo-token-ttl", "0s"},
			{"-demo-token-rate", "0"}, {"-demo-token-burst", "0"}, {"-demo-max-members", "0"},
		} {
			if _, err := loadConfig(args, func(string) string { return "" }, io.Discard); err == nil {
				t.Errorf("%v: got no error, want a usage error", args)
			}
		}
		if _, err := loadConfig([]string{"-demo-token-ttl", "24h", "-demo-max-members", "1", "-demo-token-burst", "1"},
			func(string) string { return "" }, io.Discard); err != nil {
			t.Errorf("the edges themselves: %v", err)
		}
	})
}

// TestConsoleRoutes: the admin routes the console reads (stats, rooms,
// online) and the limits dry run.
func TestConsoleRoutes(t *testing.T) {
	ts := startServer(t, "embedded")
	gid := ts.createGroup("alice", "bob")
	ts.dialRaw("alice")
	ts.dialRaw("bob")

	var stats struct {
		Connections float64            `json:"connections"`
		Sends       float64            `json:"sends_total"`
		Deliveries  float64            `json:"deliveries_total"`
		Queues      []map[string]any   `json:"shard_queues"`
		Rooms       map[string]float64 `json:"room_waiting"`
	}
	if st := ts.do("GET", "/admin/v1/stats", ts.admin, nil, &stats); st != 200 || stats.Connections != 2 || len(stats.Queues) == 0 {
		t.Errorf("stats: got %d %+v, want 200, 2 connections and the shard queues", st, stats)
	}
	if st := ts.do("GET", "/admin/v1/stats", "", nil, nil); st != 401 {
		t.Errorf("stats without the admin token: got %d, want 401", st)
	}
	if st := ts.do("POST", "/v1/groups/"+strconv.FormatInt(gid, 10)+"/messages?as=alice", ts.admin, `{"id":"m1","body":"x"}`, nil); st != 200 {
		t.Fatalf("send: %d", st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for stats.Sends < 1 || stats.Deliveries < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("stats after one send to two online members: got %+v, want sends >= 1, deliveries >= 2", stats)
		}
		time.Sleep(50 * time.Millisecond)
		ts.do("GET", "/admin/v1/stats", ts.admin, nil, &stats)
	}

	var rooms struct {
		Rooms []wire.RoomStatus `json:"rooms"`
	}
	if st := ts.do("GET", "/admin/v1/rooms", ts.admin, nil, &rooms); st != 200 || len(rooms.Rooms) != 1 || rooms.Rooms[0].Room != "demo" {
		t.Errorf("rooms: got %d %+v, want the demo room", st, rooms)
	}
	var online struct {
		Groups []struct {
			GID        int64 `json:"gid"`
			Online     int64 `json:"online"`
			OnlineHere int   `json:"online_here"`
		} `json:"groups"`
		GroupsOnline int `json:"groups_online"`
	}
	if st := ts.do("GET", "/admin/v1/online?limit=1", ts.admin, nil, &online); st != 200 || online.GroupsOnline != 1 ||
		len(online.Groups) != 1 || online.Groups[0].GID != gid || online.Groups[0].Online != 2 {
		t.Errorf("online: got %d %+v, want group %d with 2 online", st, online, gid)
	}
	for _, q := range []string{"0", "101", "x"} {
		if st := ts.do("GET", "/admin/v1/online?limit="+q, ts.admin, nil, nil); st != 400 {
			t.Errorf("online?limit=%s: got %d, want 400", q, st)
		}
	}
	if st := ts.do("GET", "/admin/v1/online?limit=100", ts.admin, nil, nil); st != 200 {
		t.Errorf("online?limit=100: got %d, want 200", st)
	}

	var before, dry map[string]any
	ts.do("GET", "/admin/v1/limits", ts.admin, nil, &before)
	rules := before["rules"].(map[string]any)
	rules["user_group"].(map[string]any)["limit"] = 1
	if st := ts.do("PUT", "/admin/v1/limits?dry_run=true", ts.admin, before, &dry); st != 200 {
		t.Fatalf("dry run: got %d, want 200", st)
	}
	var after map[string]any
	ts.do("GET", "/admin/v1/limits", ts.admin, nil, &after)
	if got := after["rules"].(map[string]any)["user_group"].(map[string]any)["limit"]; got == float64(1) {
		t.Errorf("after a dry run: user_group limit %v, want it unchanged", got)
	}
	var e struct{ Error wire.ErrorBody }
	rules["user_group"].(map[string]any)["algorithm"] = "bogus"
	if st := ts.do("PUT", "/admin/v1/limits?dry_run=true", ts.admin, before, &e); st != 400 || e.Error.Message == "" {
		t.Errorf("dry run of a bad document: got %d %+v, want 400 with the reason", st, e)
	}
}

// TestFailedStartFreesHTTPPort: the HTTP port is bound before the socket
// server is built (SiblingPorts); a start that fails after it returns the
// error (no panic) and frees the port.
func TestFailedStartFreesHTTPPort(t *testing.T) {
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	cfg, err := loadConfig([]string{"-data-dir", t.TempDir(), "-http-addr", addr, "-ws-addr", "127.0.0.1:0",
		"-allowed-origins", "not-an-origin"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newServer(context.Background(), cfg, newLogger(io.Discard, "error")); err == nil || !strings.Contains(err.Error(), "origin") {
		t.Fatalf("got %v, want the socket server's origin error", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the HTTP port after a failed start: %v", err)
	}
	ln.Close()
}

// TestRoomPageFlags: the hosted room page is on by default (with the SDK it
// imports, also when the other pages are off), answers an unknown room with
// its 404 page, and is not routed with -room-page=false;
// -room-page-ws-url is validated and names the socket in config.json.
func TestRoomPageFlags(t *testing.T) {
	ts := startServer(t, "embedded", "-demo", "off", "-admin-console=false", "-room-page-ws-url", "wss://queue.example.com")
	for _, p := range []struct {
		path, ctype string
		status      int
	}{
		{"/rooms/demo/", "text/html; charset=utf-8", 404}, // no demo, so no demo room
		{"/rooms/nope/", "text/html; charset=utf-8", 404},
		{"/rooms/nope/page.js", "text/javascript; charset=utf-8", 200},
		{"/sdk/src/index.js", "text/javascript; charset=utf-8", 200},
		{"/demo/", "application/json", 404},
	} {
		st, h, body := ts.get(p.path)
		if st != p.status || h.Get("Content-Type") != p.ctype {
			t.Errorf("GET %s: got %d %q, want %d %q", p.path, st, h.Get("Content-Type"), p.status, p.ctype)
		}
		if p.path == "/rooms/nope/" && !strings.Contains(body, "No such waiting room") {
			t.Errorf("GET %s: got %q, want the 404 page", p.path, body)
		}
	}
	if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"sale"}`, nil); st != http.StatusOK {
		t.Fatalf("create room: got %d", st)
	}
	st, h, _ := ts.get("/rooms/sale/")
	if csp := h.Get("Content-Security-Policy"); st != 200 || !strings.Contains(csp, "connect-src 'self' wss://queue.example.com;") {
		t.Errorf("GET /rooms/sale/: got %d CSP %q, want 200 and the configured socket origin", st, csp)
	}
	if _, _, body := ts.get("/rooms/sale/config.json"); !strings.Contains(body, `"ws_url":"wss://queue.example.com"`) {
		t.Errorf("config.json: got %s", body)
	}

	off := startServer(t, "embedded", "-room-page=false")
	if st, h, _ := off.get("/rooms/demo/"); st != 404 || h.Get("Content-Type") != "application/json" {
		t.Errorf("-room-page=false: GET /rooms/demo/ got %d %q, want the API's JSON 404", st, h.Get("Content-Type"))
	}
	for _, bad := range []string{"http://queue.example.com", "wss://queue.example.com?x=1", "wss://h; script-src *"} {
		if _, err := loadConfig([]string{"-room-page-ws-url", bad}, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("-room-page-ws-url %q: got no error", bad)
		}
	}
}
