package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

const testRoomSecret = "room-secret-0123456789abcdef-0123456789"

// dialRoom connects uid (at VIP level lvl) to a waiting room.
func (ts *testServer) dialRoom(room, uid string, lvl int) *rawConn {
	ts.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, br, _, err := ws.Dial(ctx, ts.ws+"/rooms/"+room+"/ws?token="+ts.token(uid, lvl))
	if err != nil {
		ts.t.Fatalf("dial room %s as %s: %v", room, uid, err)
	}
	rc := &rawConn{t: ts.t, c: c, rw: c}
	if br != nil {
		rc.rw = bufferedRW(br, c)
	}
	ts.t.Cleanup(func() { c.Close() })
	return rc
}

// TestWaitingRoom is a waiting user's life: a room admitting one user at a
// time; the first is granted a token the protected service verifies with
// the secret alone; the second waits at position 1, then is granted when the
// first closes its socket; an unknown room is refused before the upgrade.
func TestWaitingRoom(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-room-token-secret", testRoomSecret)
			var cfg wire.RoomConfig
			if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"sale","max_active":1,"admit_rate":20,"grace_s":60}`, &cfg); st != http.StatusOK {
				t.Fatalf("create room: %d", st)
			}
			if cfg.MaxActive != 1 || cfg.State != "open" || cfg.MaxWaitS != 1200 {
				t.Fatalf("room config: %+v", cfg)
			}

			alice := ts.dialRoom("sale", "alice", 0)
			g, _ := readUntil[*wire.Granted](alice, 10*time.Second)
			claims, err := roomtoken.Verify(g.AccessToken, []byte(testRoomSecret), "sale", time.Second)
			if err != nil || claims.UID() != "alice" {
				t.Fatalf("access token: %v, claims %+v", err, claims)
			}
			if g.ExpiresAt <= time.Now().UnixMilli() {
				t.Errorf("granted expires_at %d is in the past", g.ExpiresAt)
			}

			bob := ts.dialRoom("sale", "bob", 0)
			q, _ := readUntil[*wire.Queue](bob, 10*time.Second)
			if q.Position != 1 || q.Ahead != 0 || q.Room != "sale" {
				t.Fatalf("bob's queue frame: %+v", q)
			}
			var st wire.RoomStatus
			ts.do("GET", "/admin/v1/rooms/sale", ts.admin, nil, &st)
			if st.Active != 1 || st.Depth != 1 || !slices.Equal(st.WaitingByTier, []int64{1, 0, 0, 0}) {
				t.Errorf("room status: %+v, want 1 active, 1 waiting (tier 0)", st)
			}
			// A VIP of tier 3 waits too, then goes away: the per-tier
			// counts follow it in and out of the queue.
			vip := ts.dialRoom("sale", "vip", 3)
			readUntil[*wire.Queue](vip, 10*time.Second)
			ts.do("GET", "/admin/v1/rooms/sale", ts.admin, nil, &st)
			if st.Depth != 2 || st.VIPWaiting != 1 || !slices.Equal(st.WaitingByTier, []int64{1, 0, 0, 1}) {
				t.Errorf("room status with the VIP: %+v, want 2 waiting, by tier [1 0 0 1]", st)
			}
			vip.c.Close()
			waitFor(t, 10*time.Second, "the VIP away", func() bool {
				var st wire.RoomStatus
				ts.do("GET", "/admin/v1/rooms/sale", ts.admin, nil, &st)
				return st.Away == 1 && st.Depth == 1 && slices.Equal(st.WaitingByTier, []int64{1, 0, 0, 0})
			})

			alice.c.Close() // alice's session ends: bob is next
			if g, _ := readUntil[*wire.Granted](bob, 15*time.Second); g.Room != "sale" {
				t.Fatalf("bob granted: %+v", g)
			}

			// Not a room: refused with 404 before any upgrade.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, _, _, err = ws.Dial(ctx, ts.ws+"/rooms/nope/ws?token="+ts.token("carol", 0))
			if se, ok := err.(ws.StatusError); !ok || int(se) != http.StatusNotFound {
				t.Errorf("unknown room: got %v, want 404", err)
			}
			if st := ts.do("GET", "/admin/v1/rooms/nope", ts.admin, nil, nil); st != http.StatusNotFound {
				t.Errorf("status of unknown room: %d, want 404", st)
			}
		})
	}
}

// TestRoomStatusAdmissions: the status document (and the rooms list the
// console reads) counts this node's admissions by tier and gives the
// distribution of their waits by tier. A room admitting one user a second
// admits three normal users and a tier-2 VIP who all arrived at once, so
// someone waits at least two whole seconds.
func TestRoomStatusAdmissions(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-room-token-secret", testRoomSecret)
			if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"stats","max_active":10,"admit_rate":1}`, nil); st != http.StatusOK {
				t.Fatalf("create room: %d", st)
			}
			var st wire.RoomStatus
			ts.do("GET", "/admin/v1/rooms/stats", ts.admin, nil, &st)
			if !slices.Equal(st.AdmittedByTier, []int64{0, 0, 0, 0}) || len(st.WaitByTier) != 4 || st.WaitByTier[0] != (wire.WaitSummary{}) {
				t.Fatalf("new room: admitted_by_tier %v, wait_by_tier %+v; want zeros for 4 tiers", st.AdmittedByTier, st.WaitByTier)
			}
			users := []struct {
				uid string
				lvl int
			}{{"n1", 0}, {"n2", 0}, {"n3", 0}, {"v2", 2}}
			conns := make([]*rawConn, len(users))
			for i, u := range users {
				conns[i] = ts.dialRoom("stats", u.uid, u.lvl)
			}
			for i, c := range conns {
				if g, _ := readUntil[*wire.Granted](c, 20*time.Second); g.Room != "stats" {
					t.Fatalf("%s granted: %+v", users[i].uid, g)
				}
			}
			// In cluster mode the grant can reach the user (by the
			// admissions channel) just before the admitting step has
			// counted it: wait for the count, then check the document.
			want := []int64{3, 0, 1, 0}
			waitFor(t, 10*time.Second, "admitted_by_tier [3 0 1 0]", func() bool {
				ts.do("GET", "/admin/v1/rooms/stats", ts.admin, nil, &st)
				return slices.Equal(st.AdmittedByTier, want)
			})
			if len(st.WaitByTier) != 4 {
				t.Fatalf("wait_by_tier: got %d tiers, want 4", len(st.WaitByTier))
			}
			var longest float64
			for tier, w := range st.WaitByTier {
				if want := []int{3, 0, 1, 0}[tier]; w.N != want {
					t.Errorf("wait_by_tier[%d].n: got %d, want %d", tier, w.N, want)
				}
				if !(0 <= w.P50S && w.P50S <= w.P90S && w.P90S <= w.P99S && w.P99S <= w.MaxS && w.MaxS <= 60) {
					t.Errorf("wait_by_tier[%d]: got %+v, want 0 <= p50 <= p90 <= p99 <= max <= 60 s", tier, w)
				}
				longest = max(longest, w.MaxS)
			}
			// Four admissions at 1/s with a one-token burst take 3 s: the
			// last one waited at least 2 whole seconds.
			if longest < 2 {
				t.Errorf("longest wait: got %v s, want at least 2 (wait_by_tier %+v)", longest, st.WaitByTier)
			}
			// The rooms list (embedded mode has the demo's room too)
			// carries the same fields.
			var list struct {
				Rooms []wire.RoomStatus `json:"rooms"`
			}
			ts.do("GET", "/admin/v1/rooms", ts.admin, nil, &list)
			i := slices.IndexFunc(list.Rooms, func(r wire.RoomStatus) bool { return r.Room == "stats" })
			if i < 0 || !slices.Equal(list.Rooms[i].AdmittedByTier, st.AdmittedByTier) || !slices.Equal(list.Rooms[i].WaitByTier, st.WaitByTier) {
				t.Errorf("rooms list: %+v, want room stats with admitted_by_tier %v and wait_by_tier %+v", list.Rooms, st.AdmittedByTier, st.WaitByTier)
			}
		})
	}
}

// TestWaitingRoomQuota: the node's level-weighted admission quota (limits
// rule room_admit, VIPs 2/3 while normal users wait) applies to a room that
// does not set its own: of three VIPs ranked ahead of a normal user, two are
// admitted, then the normal user, then the third VIP. A room's own negative
// vip_admit_share turns the split off (pure rank order).
func TestWaitingRoomQuota(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-room-token-secret", testRoomSecret)
			run := func(room, body string, want string) {
				t.Helper()
				var cfg wire.RoomConfig
				if st := ts.do("POST", "/admin/v1/rooms", ts.admin, body, &cfg); st != http.StatusOK || cfg.VIPAdmitShare == nil {
					t.Fatalf("create room: %d %+v", st, cfg)
				}
				if room == "plain" && *cfg.VIPAdmitShare != -1 {
					t.Fatalf("vip_admit_share: got %v, want -1", *cfg.VIPAdmitShare)
				}
				// The first user takes the one-token burst; the rest queue
				// and are admitted one per second.
				first := ts.dialRoom(room, "first", 0)
				readUntil[*wire.Granted](first, 10*time.Second)
				// n queues first: the quota puts only a normal user who
				// was there before the VIPs in a VIP's place.
				conns := map[string]*rawConn{"n": ts.dialRoom(room, "n", 0)}
				readUntil[*wire.Queue](conns["n"], 10*time.Second)
				for _, u := range []string{"v1", "v2", "v3"} {
					conns[u] = ts.dialRoom(room, u, 3)
				}
				var order []string
				granted := make(chan string, 4)
				for u, c := range conns {
					go func() {
						for {
							f, err := c.tryRead(20 * time.Second)
							if err != nil {
								return
							}
							if _, ok := f.(*wire.Granted); ok {
								granted <- u
								return
							}
						}
					}()
				}
				for range 4 {
					select {
					case u := <-granted:
						order = append(order, u)
					case <-time.After(20 * time.Second):
						t.Fatalf("%s: admitted so far %v", room, order)
					}
				}
				// The VIPs' joins race each other (and n's) through the
				// server, so only the levels' order is checked.
				kinds := ""
				for _, u := range order {
					kinds += u[:1]
				}
				if kinds != want {
					t.Fatalf("%s: admission order %v, want levels %s (v = VIP, n = normal)", room, order, want)
				}
			}
			run("quota", `{"room":"quota","max_active":10,"admit_rate":1,"smoothing_s":-1}`, "vvnv")
			run("plain", `{"room":"plain","max_active":10,"admit_rate":1,"smoothing_s":-1,"vip_admit_share":-1}`, "vvvn")
		})
	}
}

// TestRoomsDegradeForced: an operator forces the waiting rooms to L2 (new
// entrants refused room_full, those waiting keep their place) through the
// same endpoint as the chat's levels, sees it, cannot force L3 (that
// follows Redis reachability), and clears it.
func TestRoomsDegradeForced(t *testing.T) {
	ts := startServer(t, "embedded", "-room-token-secret", testRoomSecret)
	if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"d","max_active":1,"admit_rate":1}`, nil); st != http.StatusOK {
		t.Fatalf("create room: %d", st)
	}
	first := ts.dialRoom("d", "first", 0)
	readUntil[*wire.Granted](first, 10*time.Second)
	waiting := ts.dialRoom("d", "waiting", 0)
	readUntil[*wire.Queue](waiting, 10*time.Second)

	var resp struct {
		Rooms *wire.DegradeState `json:"rooms"`
	}
	if st := ts.do("PUT", "/admin/v1/degrade", ts.admin, `{"scope":"rooms","level":2,"ttl_s":600}`, &resp); st != http.StatusOK ||
		resp.Rooms == nil || resp.Rooms.Level != 2 || resp.Rooms.Forced == nil || *resp.Rooms.Forced != 2 || resp.Rooms.Auto != 0 || resp.Rooms.ExpiresAt == 0 {
		t.Fatalf("force rooms L2: %d %+v", st, resp.Rooms)
	}
	late := ts.dialRoom("d", "late", 0)
	if r, _ := readUntil[*wire.Rejected](late, 10*time.Second); r.Code != "room_full" || r.RetryAfterMS <= 0 {
		t.Fatalf("entrant at L2: %+v, want room_full with a retry hint", r)
	}
	// The user already waiting is still recognized (a second tab).
	again := ts.dialRoom("d", "waiting", 0)
	if q, _ := readUntil[*wire.Queue](again, 10*time.Second); q.Position != 1 {
		t.Fatalf("waiting user at L2: %+v, want position 1", q)
	}
	if st := ts.do("PUT", "/admin/v1/degrade", ts.admin, `{"scope":"rooms","level":3}`, nil); st != http.StatusBadRequest {
		t.Fatalf("force rooms L3: %d, want 400", st)
	}
	if st := ts.do("PUT", "/admin/v1/degrade", ts.admin, `{"scope":"rooms","level":null}`, &resp); st != http.StatusOK || resp.Rooms.Level != 0 || resp.Rooms.Forced != nil {
		t.Fatalf("clear rooms level: %d %+v", st, resp.Rooms)
	}
	// (users who join within the same second rank by uid: "zz" is after)
	late2 := ts.dialRoom("d", "zz-late", 0)
	if q, _ := readUntil[*wire.Queue](late2, 10*time.Second); q.Position != 2 {
		t.Fatalf("entrant after clearing: %+v, want queued at position 2", q)
	}
}

// TestRoomTokenEdDSA: with -room-token-key (a PKCS#8 PEM Ed25519 key) the
// granted access token verifies with the public key from GET /v1/rooms/jwks
// alone, as a protected service that holds no secret does; with a shared
// secret the route publishes nothing (404).
func TestRoomTokenEdDSA(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := writeFile(t, "room.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})))
	ts := startServer(t, "embedded", "-room-token-key", keyFile)
	if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"sale","max_active":5,"admit_rate":5}`, nil); st != http.StatusOK {
		t.Fatalf("create room: %d", st)
	}
	g, _ := readUntil[*wire.Granted](ts.dialRoom("sale", "alice", 0), 10*time.Second)

	var set struct {
		Keys []struct{ Kty, Crv, X, Kid string }
	}
	if st := ts.do("GET", "/v1/rooms/jwks", "", nil, &set); st != http.StatusOK || len(set.Keys) != 1 || set.Keys[0].Crv != "Ed25519" {
		t.Fatalf("jwks: %d %+v", st, set)
	}
	x, err := base64.RawURLEncoding.DecodeString(set.Keys[0].X)
	if err != nil {
		t.Fatal(err)
	}
	c, err := roomtoken.Verify(g.AccessToken, ed25519.PublicKey(x), "sale", time.Second)
	if err != nil || c.UID() != "alice" {
		t.Fatalf("verify with the published key: %v", err)
	}
	if _, err := roomtoken.Verify(g.AccessToken, []byte(testRoomSecret), "sale", time.Second); err == nil {
		t.Fatal("an EdDSA token verified as HS256")
	}

	hs := startServer(t, "embedded", "-room-token-secret", testRoomSecret)
	if st := hs.do("GET", "/v1/rooms/jwks", "", nil, nil); st != http.StatusNotFound {
		t.Fatalf("jwks with a shared secret: %d, want 404", st)
	}
}

// TestWaitingRoomSurvivesRestart: in embedded mode a room, its queue and
// its admitted session are kept in the data directory: after a restart
// the room exists, the waiting users who come back get their positions
// back and the admitted one is granted again.
func TestWaitingRoomSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	start := func() *testServer {
		return startServer(t, "embedded", "-data-dir", dir, "-room-token-secret", testRoomSecret)
	}
	ts := start()
	if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"sale","max_active":1,"admit_rate":20,"grace_s":120}`, nil); st != http.StatusOK {
		t.Fatalf("create room: %d", st)
	}
	if g, _ := readUntil[*wire.Granted](ts.dialRoom("sale", "alice", 0), 10*time.Second); g.Room != "sale" {
		t.Fatalf("alice: %+v", g)
	}
	for i, u := range []string{"bob", "carol"} {
		if q, _ := readUntil[*wire.Queue](ts.dialRoom("sale", u, 0), 10*time.Second); q.Position != int64(i+1) {
			t.Fatalf("%s before the restart: %+v, want position %d", u, q, i+1)
		}
	}
	ts.stop()

	ts = start()
	var st wire.RoomStatus
	if code := ts.do("GET", "/admin/v1/rooms/sale", ts.admin, nil, &st); code != http.StatusOK {
		t.Fatalf("room after the restart: %d, want 200", code)
	}
	if st.Active != 1 || st.Away != 2 || st.Depth != 0 || st.MaxActive != 1 || !slices.Equal(st.WaitingByTier, []int64{0, 0, 0, 0}) {
		t.Errorf("room status after the restart: %+v, want alice's session, 2 away, max_active 1", st)
	}
	for i, u := range []string{"bob", "carol"} {
		if q, _ := readUntil[*wire.Queue](ts.dialRoom("sale", u, 0), 10*time.Second); q.Position != int64(i+1) {
			t.Fatalf("%s after the restart: %+v, want position %d", u, q, i+1)
		}
	}
	ts.do("GET", "/admin/v1/rooms/sale", ts.admin, nil, &st)
	if st.Depth != 2 || !slices.Equal(st.WaitingByTier, []int64{2, 0, 0, 0}) {
		t.Errorf("room status with bob and carol back: %+v, want 2 waiting, by tier [2 0 0 0]", st)
	}
	if g, _ := readUntil[*wire.Granted](ts.dialRoom("sale", "alice", 0), 10*time.Second); g.Room != "sale" {
		t.Fatalf("alice after the restart: %+v", g)
	}
}

// TestRoomEnterLimited: one user's room socket opens are limited
// (room_enter) at the handshake, before the room's backend or a join
// worker sees them: a reconnect loop cannot multiply backend enters.
// Other users are not affected.
func TestRoomEnterLimited(t *testing.T) {
	limits := writeFile(t, "limits.json", `{"rules":{"room_enter":{"algorithm":"gcra","limit":1,"window":"1m","burst":2}}}`)
	ts := startServer(t, "embedded", "-limits-file", limits)
	if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"sale","max_active":1,"admit_rate":1}`, nil); st != http.StatusOK {
		t.Fatalf("create room: %d", st)
	}
	dial := func(uid string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, _, _, err := ws.Dial(ctx, ts.ws+"/rooms/sale/ws?token="+ts.token(uid, 0))
		if err == nil {
			c.Close()
		}
		return err
	}
	for i := range 2 {
		if err := dial("mallory"); err != nil {
			t.Fatalf("open %d of mallory (within the burst): %v", i+1, err)
		}
	}
	if err := dial("mallory"); err == nil {
		t.Fatal("third open of mallory within the minute: admitted, want 429")
	} else if se, ok := err.(ws.StatusError); !ok || int(se) != http.StatusTooManyRequests {
		t.Fatalf("third open of mallory: %v, want 429", err)
	}
	if err := dial("alice"); err != nil {
		t.Fatalf("alice: %v", err)
	}
}

// TestScheduledRoom: a room with starts_at holds its entrants in the
// pre-queue (queue frames with status scheduled, total, starts_at and
// starts_in_s, no position; the status document says phase scheduled and
// counts the pre-queue), grants them from the start, and a room past its
// ends_at refuses new entrants room_closed.
func TestScheduledRoom(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-room-token-secret", testRoomSecret)
			start := time.Now().Add(3 * time.Second).Truncate(time.Second).Add(time.Second)
			body := `{"room":"event","max_active":10,"admit_rate":20,"starts_at":"` + start.UTC().Format(time.RFC3339) + `"}`
			var cfg wire.RoomConfig
			if st := ts.do("POST", "/admin/v1/rooms", ts.admin, body, &cfg); st != http.StatusOK || cfg.StartsAt == nil {
				t.Fatalf("create scheduled room: %d %+v", st, cfg)
			}
			if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"bad","starts_at":"tomorrow"}`, nil); st != http.StatusBadRequest {
				t.Fatalf("bad starts_at: %d, want 400", st)
			}
			alice, bob := ts.dialRoom("event", "alice", 0), ts.dialRoom("event", "bob", 2)
			for _, c := range []*rawConn{alice, bob} {
				q, _ := readUntil[*wire.Queue](c, 10*time.Second)
				if q.Status != wire.QueueScheduled || q.StartsAt != start.UnixMilli() || q.StartsInS == nil || *q.StartsInS < 1 || q.Position != 0 {
					t.Fatalf("pre-queue frame: %+v", q)
				}
			}
			var st wire.RoomStatus
			ts.do("GET", "/admin/v1/rooms/event", ts.admin, nil, &st)
			if st.Phase != "scheduled" || st.PreQueue != 2 || st.StartsAt != start.UnixMilli() || st.MaxWaitViolations != 0 || st.Owed != 2 {
				t.Fatalf("status before the start: %+v", st)
			}
			for _, c := range []*rawConn{alice, bob} {
				if g, _ := readUntil[*wire.Granted](c, 20*time.Second); time.Now().Before(start) || g.Room != "event" {
					t.Fatalf("granted %+v at %v, before the start %v", g, time.Now(), start)
				}
			}
			ts.do("GET", "/admin/v1/rooms/event", ts.admin, nil, &st)
			if st.Phase != "open" || st.PreQueue != 0 || st.MaxWaitViolations != 0 {
				t.Fatalf("status after the start: %+v", st)
			}
			end := time.Now().Add(time.Second).Truncate(time.Second).Add(time.Second)
			if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"event","ends_at":"`+end.UTC().Format(time.RFC3339)+`"}`, nil); st != http.StatusOK {
				t.Fatalf("set ends_at: %d", st)
			}
			waitFor(t, 10*time.Second, "the room ended", func() bool {
				var st wire.RoomStatus
				ts.do("GET", "/admin/v1/rooms/event", ts.admin, nil, &st)
				return st.Phase == "ended"
			})
			late := ts.dialRoom("event", "carol", 0)
			if r, _ := readUntil[*wire.Rejected](late, 10*time.Second); r.Code != "room_closed" {
				t.Fatalf("after ends_at: %+v, want room_closed", r)
			}
		})
	}
}
