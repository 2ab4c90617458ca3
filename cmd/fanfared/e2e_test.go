package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// collector reads one raw connection's pushes for a group in the
// background and records the seqs in arrival order.
type collector struct {
	rc   *rawConn
	gid  int64
	mu   sync.Mutex
	seqs []int64
	done chan struct{}
}

func collect(rc *rawConn, gid int64) *collector {
	c := &collector{rc: rc, gid: gid, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			f, err := rc.tryRead(30 * time.Second)
			if err != nil {
				return
			}
			switch m := f.(type) {
			case *wire.Msg:
				if m.GID == gid {
					c.mu.Lock()
					c.seqs = append(c.seqs, m.Seq)
					c.mu.Unlock()
				}
			case *wire.Batch:
				c.mu.Lock()
				for _, x := range m.Messages {
					c.seqs = append(c.seqs, x.Seq)
				}
				c.mu.Unlock()
			}
		}
	}()
	return c
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seqs)
}

// TestMessageLife is a message's whole life on one node: 2,000 members,
// 500 online over raw WebSockets, several senders over WebSocket and HTTP;
// every online client receives every seq exactly once and in order; offline
// members sync and pull everything from their join_seq; a member who joins
// later never sees earlier messages.
func TestMessageLife(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode)
			const members, online, senders, perSender = 2000, 500, 4, 40
			uids := make([]string, members)
			for i := range uids {
				uids[i] = fmt.Sprintf("u%04d", i)
			}
			gid := ts.createGroup(uids...)

			cols := make([]*collector, online)
			for i := range online {
				cols[i] = collect(ts.dialRaw(uids[i]), gid)
			}
			// Connections register with the engine off the event loop:
			// wait until every one is online by sending a probe.
			probe := ts.dialRaw(uids[members-1])
			probe.send(fmt.Sprintf(`{"type":"send","id":"probe","gid":%d,"body":"probe"}`, gid))
			if a, _ := readUntil[*wire.Ack](probe, 10*time.Second); a.Seq != 1 {
				t.Fatalf("probe ack: seq %d, want 1", a.Seq)
			}

			var wg sync.WaitGroup
			acked := make(chan int64, senders*perSender)
			for s := range senders {
				wg.Go(func() {
					uid := uids[online+s] // senders are online members too
					if s%2 == 0 {
						rc := ts.dialRaw(uid)
						for i := range perSender {
							rc.send(fmt.Sprintf(`{"type":"send","id":"s%d-%d","gid":%d,"body":{"n":%d}}`, s, i, gid, i))
							a, _ := readUntil[*wire.Ack](rc, 20*time.Second)
							acked <- a.Seq
						}
						return
					}
					tok := ts.token(uid, 0)
					for i := range perSender {
						var r wire.SendResponse
						if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), tok,
							fmt.Sprintf(`{"id":"h%d-%d","body":{"n":%d}}`, s, i, i), &r); st != http.StatusOK {
							t.Errorf("http send: status %d", st)
							return
						}
						acked <- r.Seq
					}
				})
			}
			wg.Wait()
			close(acked)
			var got []int64
			for s := range acked {
				got = append(got, s)
			}
			slices.Sort(got)
			total := int64(1 + senders*perSender)
			for i, s := range got {
				if s != int64(i+2) {
					t.Fatalf("acked seqs are not dense from 2: %v", got)
				}
			}

			deadline := time.Now().Add(30 * time.Second)
			for _, c := range cols {
				for c.count() < int(total) && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
			}
			for i, c := range cols {
				c.mu.Lock()
				seqs := slices.Clone(c.seqs)
				c.mu.Unlock()
				if int64(len(seqs)) != total {
					t.Fatalf("client %d got %d messages, want %d", i, len(seqs), total)
				}
				for k, s := range seqs {
					if s != int64(k+1) {
						t.Fatalf("client %d: seqs not exactly once in order: %v", i, seqs)
					}
				}
			}

			// An offline member: sync, then pull everything over HTTP.
			off := ts.token(uids[members-2], 0)
			var sync wire.SyncResponse
			ts.do("GET", "/v1/sync", off, nil, &sync)
			if len(sync.Groups) != 1 || sync.Groups[0].LastSeq != total || sync.Groups[0].Unread != total {
				t.Fatalf("sync: got %+v, want last_seq and unread %d", sync.Groups, total)
			}
			var all []wire.Msg
			for from := int64(1); from <= total; {
				var page wire.MessagesPage
				ts.do("GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=%d", gid, from), off, nil, &page)
				if len(page.Messages) == 0 {
					t.Fatalf("empty page from %d", from)
				}
				all = append(all, page.Messages...)
				from = page.Messages[len(page.Messages)-1].Seq + 1
			}
			for i, m := range all {
				if m.Seq != int64(i+1) {
					t.Fatalf("pulled seqs not dense: %d at %d", m.Seq, i)
				}
			}

			// A late joiner sees nothing before its join_seq, by pull or push.
			ms := ts.addMembers(gid, "late")
			if ms[0].JoinSeq != total+1 {
				t.Fatalf("late join_seq: got %d, want %d", ms[0].JoinSeq, total+1)
			}
			late := ts.dialRaw("late")
			late.send(fmt.Sprintf(`{"type":"pull","id":"p","gid":%d,"from_seq":1,"to_seq":0}`, gid))
			if m, _ := readUntil[*wire.Messages](late, 5*time.Second); len(m.Messages) != 0 || m.LastSeq != total {
				t.Fatalf("late pull: got %d messages, last_seq %d; want none, %d", len(m.Messages), m.LastSeq, total)
			}
			probe.send(fmt.Sprintf(`{"type":"send","id":"after","gid":%d,"body":"after"}`, gid))
			if m, _ := readUntil[*wire.Msg](late, 5*time.Second); m.Seq != total+1 {
				t.Fatalf("late push: got seq %d, want %d", m.Seq, total+1)
			}
		})
	}
}

// TestBadInput: every frame type and endpoint answers bad input with the
// docs/protocol.md §7.1 error code, and the connection stays usable.
func TestBadInput(t *testing.T) {
	ts := startServer(t, "embedded")
	gid := ts.createGroup("alice", "bob")
	other := ts.createGroup("carol")
	rc := ts.dialRaw("alice")
	frames := []struct {
		name, frame, wantCode, wantID string
	}{
		{"not json", `{"type":`, wire.CodeBadRequest, ""},
		{"unknown type", `{"type":"launch","id":"x"}`, wire.CodeBadRequest, "x"},
		{"send without id", fmt.Sprintf(`{"type":"send","gid":%d,"body":1}`, gid), wire.CodeBadRequest, ""},
		{"send without body", fmt.Sprintf(`{"type":"send","id":"a","gid":%d}`, gid), wire.CodeBadRequest, "a"},
		{"send bad kind", fmt.Sprintf(`{"type":"send","id":"b","gid":%d,"body":1,"kind":"shout"}`, gid), wire.CodeBadRequest, "b"},
		{"send to non-member group", fmt.Sprintf(`{"type":"send","id":"c","gid":%d,"body":1}`, other), wire.CodeForbidden, "c"},
		{"send to unknown group", `{"type":"send","id":"d","gid":999999,"body":1}`, wire.CodeForbidden, "d"},
		{"send too large", fmt.Sprintf(`{"type":"send","id":"e","gid":%d,"body":"%s"}`, gid, strings.Repeat("x", 40<<10)), wire.CodeTooLarge, "e"},
		{"pull inverted", fmt.Sprintf(`{"type":"pull","id":"f","gid":%d,"from_seq":5,"to_seq":2}`, gid), wire.CodeBadRequest, "f"},
		{"pull non-member", fmt.Sprintf(`{"type":"pull","id":"g","gid":%d,"from_seq":1,"to_seq":0}`, other), wire.CodeForbidden, "g"},
		{"read non-member", fmt.Sprintf(`{"type":"read","gid":%d,"seq":1}`, other), wire.CodeForbidden, ""},
	}
	for _, f := range frames {
		rc.send(f.frame)
		e, _ := readUntil[*wire.Error](rc, 5*time.Second)
		if e.Code != f.wantCode || e.ID != f.wantID {
			t.Errorf("%s: got code %q id %q, want %q %q", f.name, e.Code, e.ID, f.wantCode, f.wantID)
		}
	}
	rc.send(`{"type":"ping","id":"still-alive"}`)
	if p, _ := readUntil[*wire.Pong](rc, 5*time.Second); p.ID != "still-alive" {
		t.Errorf("pong: got id %q", p.ID)
	}

	alice := ts.token("alice", 0)
	reqs := []struct {
		name, method, path, tok, body string
		wantStatus                    int
		wantCode                      string
	}{
		{"no token", "GET", "/v1/sync", "", "", 401, wire.CodeUnauthorized},
		{"bad token", "GET", "/v1/sync", "nope", "", 401, wire.CodeUnauthorized},
		{"user on admin route", "POST", "/v1/groups", alice, `{"name":"x","owner":"alice"}`, 401, wire.CodeUnauthorized},
		{"bad gid", "GET", "/v1/groups/abc/messages", alice, "", 400, wire.CodeBadRequest},
		{"negative from_seq", "GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=-1", gid), alice, "", 400, wire.CodeBadRequest},
		{"non-member pull", "GET", fmt.Sprintf("/v1/groups/%d/messages", other), alice, "", 403, wire.CodeForbidden},
		{"unknown group pull", "GET", "/v1/groups/424242/messages", alice, "", 403, wire.CodeForbidden},
		{"send bad json", "POST", fmt.Sprintf("/v1/groups/%d/messages", gid), alice, `{"id":`, 400, wire.CodeBadRequest},
		{"send too large", "POST", fmt.Sprintf("/v1/groups/%d/messages", gid), alice, fmt.Sprintf(`{"id":"big","body":"%s"}`, strings.Repeat("x", 40<<10)), 413, wire.CodeTooLarge},
		{"create group unknown field", "POST", "/v1/groups", ts.admin, `{"name":"x","owner":"a","colour":"red"}`, 400, wire.CodeBadRequest},
		{"create group no owner", "POST", "/v1/groups", ts.admin, `{"name":"x"}`, 400, wire.CodeBadRequest},
		{"create duplicate gid", "POST", "/v1/groups", ts.admin, fmt.Sprintf(`{"gid":%d,"name":"x","owner":"a"}`, gid), 409, wire.CodeBadRequest},
		{"add members empty", "POST", fmt.Sprintf("/v1/groups/%d/members", gid), ts.admin, `{"uids":[]}`, 400, wire.CodeBadRequest},
		{"add members unknown group", "POST", "/v1/groups/424242/members", ts.admin, `{"uids":["a"]}`, 404, wire.CodeNotFound},
		{"remove non-member", "DELETE", fmt.Sprintf("/v1/groups/%d/members/zed", gid), ts.admin, "", 404, wire.CodeNotFound},
		{"patch bad state", "PATCH", fmt.Sprintf("/v1/groups/%d", gid), ts.admin, `{"state":"paused"}`, 400, wire.CodeBadRequest},
		{"user level out of range", "PUT", "/v1/users/alice", ts.admin, `{"level":7}`, 400, wire.CodeBadRequest},
		{"degrade bad scope", "PUT", "/admin/v1/degrade", ts.admin, `{"scope":"planet","level":1}`, 400, wire.CodeBadRequest},
		{"degrade bad level", "PUT", "/admin/v1/degrade", ts.admin, `{"scope":"node","level":9}`, 400, wire.CodeBadRequest},
		{"degrade unknown group", "PUT", "/admin/v1/degrade", ts.admin, `{"scope":"group","gid":424242,"level":2}`, 404, wire.CodeNotFound},
		{"degrade clear unknown group", "PUT", "/admin/v1/degrade", ts.admin, `{"scope":"group","gid":424242,"level":null}`, 404, wire.CodeNotFound},
	}
	for _, r := range reqs {
		var body struct{ Error wire.ErrorBody }
		st := ts.do(r.method, r.path, r.tok, nilIfEmpty(r.body), &body)
		if st != r.wantStatus || body.Error.Code != r.wantCode {
			t.Errorf("%s: got %d %q, want %d %q", r.name, st, body.Error.Code, r.wantStatus, r.wantCode)
		}
	}

	// Group states: muted_all and dissolved refuse sends with group_closed.
	ts.do("PATCH", fmt.Sprintf("/v1/groups/%d", gid), ts.admin, `{"state":"muted_all"}`, nil)
	rc.send(fmt.Sprintf(`{"type":"send","id":"muted","gid":%d,"body":1}`, gid))
	if e, _ := readUntil[*wire.Error](rc, 5*time.Second); e.Code != wire.CodeGroupClosed {
		t.Errorf("send to muted_all group: got %q, want group_closed", e.Code)
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// TestMetrics: /metrics exposes the engine, socket, presence and HTTP
// series after some traffic.
func TestMetrics(t *testing.T) {
	ts := startServer(t, "embedded")
	gid := ts.createGroup("alice", "bob")
	rc := ts.dialRaw("alice")
	rc.send(fmt.Sprintf(`{"type":"send","id":"m","gid":%d,"body":1}`, gid))
	readUntil[*wire.Ack](rc, 5*time.Second)
	want := []string{
		`fanfare_sends_total{result="stored"} 1`,
		`fanfare_ws_connections 1`,
		`fanfare_presence_users 1`,
		`fanfare_queue_wait_seconds_count`,
		`fanfare_batch_process_seconds_count`,
		`fanfare_http_requests_total`,
		`go_goroutines`,
	}
	// The worker counts a batch just after it acks it: scrape until the
	// series are there (or 5 s).
	var missing []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(ts.http + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		missing = missing[:0]
		for _, w := range want {
			if !strings.Contains(string(body), w) {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, w := range missing {
		t.Errorf("/metrics lacks %q", w)
	}
}

// TestHelloIsFirst: frames a client sends right after the upgrade are
// answered after hello, in order.
func TestHelloIsFirst(t *testing.T) {
	ts := startServer(t, "embedded")
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, br, _, err := ws.Dial(ctx, ts.ws+"/ws?token="+ts.token(fmt.Sprintf("early%d", i), 0))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		rc := &rawConn{t: t, c: c, rw: c}
		if br != nil {
			rc.rw = bufferedRW(br, c)
		}
		rc.send(`{"type":"ping","id":"a"}`)
		rc.send(`{"type":"ping","id":"b"}`)
		if _, ok := rc.read(5 * time.Second).(*wire.Hello); !ok {
			t.Fatal("first frame is not hello")
		}
		for _, want := range []string{"a", "b"} {
			if p, ok := rc.read(5 * time.Second).(*wire.Pong); !ok || p.ID != want {
				t.Fatalf("got %+v, want pong %s", p, want)
			}
		}
		c.Close()
	}
}

// TestBannerPrintsOnlyGeneratedSecrets: configured secrets never reach the
// output; generated development ones do (and are kept for the next start).
func TestBannerPrintsOnlyGeneratedSecrets(t *testing.T) {
	ts := startServer(t, "embedded")
	var out strings.Builder
	ts.srv.banner(&out)
	if strings.Contains(out.String(), testSecret) || strings.Contains(out.String(), ts.admin) {
		t.Errorf("banner shows configured secrets:\n%s", out.String())
	}
	dir := t.TempDir()
	dev := startArgs(t, []string{"-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-data-dir", dir, "-log-level", "error"})
	out.Reset()
	dev.srv.banner(&out)
	if !strings.Contains(out.String(), dev.srv.adminToken) || !strings.Contains(out.String(), dev.srv.jwtSecret) {
		t.Errorf("banner lacks the generated development secrets:\n%s", out.String())
	}
	// One configured, one generated: only the generated one is printed.
	for _, args := range [][]string{{"-jwt-secret", testSecret}, {"-admin-token", "configured-admin-token"}} {
		mixed := startArgs(t, append([]string{"-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-data-dir", t.TempDir(),
			"-log-level", "error"}, args...))
		out.Reset()
		mixed.srv.banner(&out)
		if strings.Contains(out.String(), args[1]) {
			t.Errorf("%s configured: banner shows it:\n%s", args[0], out.String())
		}
		generated := mixed.srv.adminToken
		if args[0] == "-admin-token" {
			generated = mixed.srv.jwtSecret
		}
		if !strings.Contains(out.String(), generated) {
			t.Errorf("%s configured: banner lacks the generated other secret:\n%s", args[0], out.String())
		}
	}
}

// TestRedactURL: no form of a Postgres URL shows its password.
func TestRedactURL(t *testing.T) {
	for _, u := range []string{
		"postgres://fanfare:s3cret-pw@db:5432/x?sslmode=disable",
		"postgres://fanfare:s3cret-pw@db/x",
		"postgres://db/x?user=fanfare&password=s3cret-pw",
		"host=db user=fanfare password=s3cret-pw dbname=x",
		"host=db password='s3cret-pw' dbname=x",
		"postgres://fanfare:s3cret-pw@db:5432/x?%zz",
	} {
		if got := redactURL(u); strings.Contains(got, "s3cret") {
			t.Errorf("redactURL(%q) = %q", u, got)
		}
	}
	if got, want := redactURL("postgres://db:5432/x?sslmode=disable"), "postgres://db:5432/x?sslmode=disable"; got != want {
		t.Errorf("redactURL without a password = %q, want %q", got, want)
	}
}

// TestGIDBounds: an explicit gid is refused above -max-gid (a gid of
// 2^63-1 made every later assigned create fail as a retryable
// unavailable in embedded mode); one at the bound does not push the
// allocator there; assigned gids that run out are a permanent 507, not a
// retryable 503.
func TestGIDBounds(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-max-gid", "3")
			create := func(gid int64) (int, wire.Group, wire.ErrorBody) {
				t.Helper()
				var raw json.RawMessage
				st := ts.do("POST", "/v1/groups", ts.admin, wire.CreateGroupRequest{GID: gid, Name: "g", Owner: "alice"}, &raw)
				var g wire.Group
				var e struct{ Error wire.ErrorBody }
				json.Unmarshal(raw, &g)
				json.Unmarshal(raw, &e)
				return st, g, e.Error
			}
			for _, gid := range []int64{4, math.MaxInt64} {
				if st, _, e := create(gid); st != http.StatusBadRequest || e.Code != wire.CodeBadRequest {
					t.Errorf("gid %d: %d %+v, want 400 bad_request", gid, st, e)
				}
			}
			if st, g, _ := create(3); st != http.StatusCreated || g.GID != 3 {
				t.Fatalf("gid 3 (= -max-gid): %d %+v, want 201", st, g)
			}
			for want := int64(1); want <= 2; want++ {
				if st, g, e := create(0); st != http.StatusCreated || g.GID != want {
					t.Fatalf("assigned after gid 3: %d %+v %+v, want 201 gid %d", st, g, e, want)
				}
			}
			st, _, e := create(0)
			if st != http.StatusInsufficientStorage || e.Code != wire.CodeInternal || e.RetryAfterMS != 0 {
				t.Errorf("assigned with every gid taken: %d %+v, want 507 internal without retry", st, e)
			}
		})
	}
}
