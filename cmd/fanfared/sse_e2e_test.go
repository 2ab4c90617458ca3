package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// upgradeRefuser is what a proxy that does not pass WebSocket looks like:
// it answers every request, the upgrade included, with 403.
func upgradeRefuser(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = http.ReadRequest(bufio.NewReader(c))
				_, _ = io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			}()
		}
	}()
	return "ws://" + ln.Addr().String() + "/ws"
}

// cutProxy forwards TCP to target; cut severs every connection it carries
// (new ones are still accepted), as a network that drops a stream does.
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestSSEFallbackE2E: a client whose WebSocket is refused (by a proxy that
// does not pass Upgrade) falls back to Server-Sent Events, receives every
// message in order, sends over HTTP, and resumes after its stream is cut
// and after the stream's lifetime ends, without loss or duplicates.
func TestSSEFallbackE2E(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-sse-max-lifetime", "2s", "-sse-heartbeat", "1s")
			gid := ts.createGroup("alice", "bob")
			proxy := newCutProxy(t, strings.TrimPrefix(ts.http, "http://"))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()

			var mu sync.Mutex
			var got []int64
			bob, err := client.Dial(ctx, client.Config{URL: upgradeRefuser(t), HTTPURL: proxy.url(), Token: ts.token("bob", 0),
				BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
				OnMessage: func(m client.Message) {
					if m.GID == gid {
						mu.Lock()
						got = append(got, m.Seq)
						mu.Unlock()
					}
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer bob.Close()
			if tr := bob.Transport(); tr != client.TransportSSE {
				t.Fatalf("bob's transport: got %q, want %q", tr, client.TransportSSE)
			}
			alice, err := client.Dial(ctx, client.Config{URL: ts.ws + "/ws", HTTPURL: ts.http, Token: ts.token("alice", 0)})
			if err != nil {
				t.Fatal(err)
			}
			defer alice.Close()
			if tr := alice.Transport(); tr != client.TransportWebSocket {
				t.Fatalf("alice's transport: got %q, want websocket", tr)
			}

			const total = 300
			for i := 1; i <= total; i++ {
				sender := alice
				if i%3 == 0 {
					sender = bob // over HTTP
				}
				ack, err := sender.Send(ctx, gid, map[string]any{"n": i})
				if err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
				if ack.Seq != int64(i) {
					t.Fatalf("send %d: seq %d", i, ack.Seq)
				}
				switch i {
				case 100, 200:
					proxy.cut() // the stream and bob's HTTP connections drop
				case 150:
					time.Sleep(2500 * time.Millisecond) // past the stream's lifetime
				}
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				mu.Lock()
				n := len(got)
				mu.Unlock()
				if n >= total || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != total {
				t.Fatalf("bob got %d messages, want %d", len(got), total)
			}
			for i, seq := range got {
				if seq != int64(i+1) {
					t.Fatalf("bob's message %d has seq %d, want %d (in order, once)", i, seq, i+1)
				}
			}
			// Two cuts and at least one lifetime end; under load a cut can
			// land while the client is already redialing after an end, and
			// the two count as one reconnect.
			if st := bob.Stats(); st.Reconnects < 2 {
				t.Errorf("bob reconnected %d times, want at least 2 (two cuts and a lifetime end)", st.Reconnects)
			}
			if tr := bob.Transport(); tr != client.TransportSSE {
				t.Errorf("bob's transport after reconnects: got %q, want sse", tr)
			}
		})
	}
}

// sseEvent is one event of a raw stream.
type sseEvent struct {
	id, event, data string
}

// rawStream is GET /v1/events read by hand.
type rawStream struct {
	t    *testing.T
	resp *http.Response
	br   *bufio.Reader
}

func (ts *testServer) openStream(t *testing.T, path string, hdr map[string]string) (*rawStream, int) {
	t.Helper()
	req, err := http.NewRequest("GET", ts.http+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, resp.StatusCode
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &rawStream{t: t, resp: resp, br: bufio.NewReader(resp.Body)}, resp.StatusCode
}

// next returns the next event (comments skipped), failing after d.
func (s *rawStream) next(d time.Duration) sseEvent {
	s.t.Helper()
	type res struct {
		ev  sseEvent
		err error
	}
	ch := make(chan res, 1)
	go func() {
		var ev sseEvent
		var data []string
		for {
			line, err := s.br.ReadString('\n')
			if err != nil {
				ch <- res{err: err}
				return
			}
			line = strings.TrimRight(line, "\r\n")
			switch {
			case line == "":
				if data != nil || ev.event != "" {
					ev.data = strings.Join(data, "\n")
					ch <- res{ev: ev}
					return
				}
			case strings.HasPrefix(line, ":"):
			default:
				k, v, _ := strings.Cut(line, ":")
				v = strings.TrimPrefix(v, " ")
				switch k {
				case "id":
					ev.id = v
				case "event":
					ev.event = v
				case "data":
					data = append(data, v)
				}
			}
		}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			s.t.Fatalf("read event: %v", r.err)
		}
		return r.ev
	case <-time.After(d):
		s.t.Fatalf("no event in %v", d)
	}
	return sseEvent{}
}

// frame returns the next event's frame, presence frames skipped (they
// come whenever a group's count changes, between the frames a test waits
// for); frameAny returns every frame.
func (s *rawStream) frame(d time.Duration) (wire.ServerFrame, sseEvent) {
	s.t.Helper()
	for {
		f, ev := s.frameAny(d)
		if _, ok := f.(*wire.Presence); !ok {
			return f, ev
		}
	}
}

func (s *rawStream) frameAny(d time.Duration) (wire.ServerFrame, sseEvent) {
	s.t.Helper()
	ev := s.next(d)
	f, err := wire.DecodeServer([]byte(ev.data))
	if err != nil {
		s.t.Fatalf("event %+v: %v", ev, err)
	}
	return f, ev
}

// TestSSERawE2E drives GET /v1/events by hand: the headers proxies need,
// hello first, msg events with cursor ids, resume by Last-Event-ID (a
// resync for what was missed) and by ?cursor=, tickets (single use), the
// read route, and the refusals (a token in the URL, a bad cursor, the
// per-user cap).
func TestSSERawE2E(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-max-conns-per-user", "3")
			gid := ts.createGroup("alice", "bob")
			bob := ts.token("bob", 0)
			auth := map[string]string{"Authorization": "Bearer " + bob}
			s, _ := ts.openStream(t, "/v1/events", auth)
			for k, want := range map[string]string{"Content-Type": "text/event-stream; charset=utf-8", "X-Accel-Buffering": "no", "Cache-Control": "no-cache, no-store, no-transform"} {
				if got := s.resp.Header.Get(k); got != want {
					t.Errorf("header %s: got %q, want %q", k, got, want)
				}
			}
			if f, _ := s.frame(5 * time.Second); f.FrameType() != "hello" {
				t.Fatalf("first event: got %s, want hello", f.FrameType())
			}
			alice := ts.token("alice", 0)
			send := func(i int) {
				var r wire.SendResponse
				if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), alice, map[string]any{"id": fmt.Sprint("m", i), "body": map[string]any{"i": i}}, &r); st != 200 {
					t.Fatalf("send %d: status %d", i, st)
				}
			}
			send(1)
			send(2)
			var lastID string
			for want := int64(1); want <= 2; want++ {
				f, ev := s.frame(5 * time.Second)
				m, ok := f.(*wire.Msg)
				if !ok || m.Seq != want {
					t.Fatalf("event: got %+v, want msg seq %d", f, want)
				}
				// The last event of a write carries the cursor (§14.4):
				// seq 1 has none when both were written at once.
				if ev.id == "" && want == 2 {
					t.Fatalf("last msg event without id")
				}
				if ev.id != "" {
					lastID = ev.id
				}
			}
			s.resp.Body.Close() // the cut
			send(3)
			send(4)
			// EventSource resends the last id it saw: the stream tells the
			// client to pull what it missed.
			s2, _ := ts.openStream(t, "/v1/events", map[string]string{"Authorization": "Bearer " + bob, "Last-Event-ID": lastID})
			if f, _ := s2.frame(5 * time.Second); f.FrameType() != "hello" {
				t.Fatalf("first event after resume: %s", f.FrameType())
			}
			f, ev := s2.frame(5 * time.Second)
			rs, ok := f.(*wire.Resync)
			if !ok || rs.GID != gid || rs.LastSeq != 4 {
				t.Fatalf("after resume: got %+v, want resync gid %d last_seq 4", f, gid)
			}
			var page wire.MessagesPage
			if st := ts.do("GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=3", gid), bob, nil, &page); st != 200 || len(page.Messages) != 2 {
				t.Fatalf("pull after resync: status %d, %d messages", st, len(page.Messages))
			}
			send(5)
			if f, _ := s2.frame(5 * time.Second); f.(*wire.Msg).Seq != 5 {
				t.Fatalf("live after resume: %+v", f)
			}
			_ = ev
			// Degradation reaches streams as it reaches sockets: a forced
			// L2 on the group is told at once, and its pushes become
			// summaries (the same frames).
			if st := ts.do("PUT", "/admin/v1/degrade", ts.admin, fmt.Sprintf(`{"scope":"group","gid":%d,"level":2}`, gid), nil); st != 200 {
				t.Fatalf("force L2: status %d", st)
			}
			if f, _ := s2.frame(5 * time.Second); f.FrameType() != "degraded" || f.(*wire.Degraded).GID != gid || f.(*wire.Degraded).Level != 2 {
				t.Fatalf("after forcing L2: %+v, want degraded gid %d level 2", f, gid)
			}
			send(6)
			if f, ev := s2.frame(10 * time.Second); f.FrameType() != "summary" || ev.id == "" {
				t.Fatalf("push at L2: %+v (id %q), want a summary with an id", f, ev.id)
			}
			if st := ts.do("PUT", "/admin/v1/degrade", ts.admin, fmt.Sprintf(`{"scope":"group","gid":%d,"level":null}`, gid), nil); st != 200 {
				t.Fatalf("clear L2: status %d", st)
			}
			if f, _ := s2.frame(5 * time.Second); f.FrameType() != "degraded" {
				t.Fatalf("after clearing: %+v, want degraded", f)
			}

			// A ticket opens one stream, then never again.
			var tk wire.EventTicket
			if st := ts.do("POST", "/v1/events/ticket", bob, nil, &tk); st != 200 || tk.Ticket == "" {
				t.Fatalf("ticket: status %d %+v", st, tk)
			}
			s3, st := ts.openStream(t, "/v1/events?ticket="+tk.Ticket+"&cursor=c"+fmt.Sprintf("%s.0", strconvBase36(gid)), nil)
			if st != 200 {
				t.Fatalf("stream by ticket: status %d", st)
			}
			if f, _ := s3.frame(5 * time.Second); f.FrameType() != "hello" {
				t.Fatalf("ticket stream: first %s", f.FrameType())
			}
			if f, _ := s3.frame(5 * time.Second); f.(*wire.Resync).LastSeq != 6 {
				t.Fatalf("ticket stream from cursor 0: %+v", f)
			}
			if _, st := ts.openStream(t, "/v1/events?ticket="+tk.Ticket, nil); st != 401 {
				t.Errorf("ticket used twice: status %d, want 401", st)
			}
			// The per-user cap: three streams open (s2, s3, and this one
			// fails only past it).
			s4, st := ts.openStream(t, "/v1/events", auth)
			if st != 200 {
				t.Fatalf("third stream: status %d", st)
			}
			_ = s4
			if _, st := ts.openStream(t, "/v1/events", auth); st != 429 {
				t.Errorf("fourth stream of a user capped at 3: status %d, want 429", st)
			}
			for _, tc := range []struct {
				path string
				hdr  map[string]string
				want int
			}{
				{"/v1/events?token=" + bob, nil, 401},
				{"/v1/events", nil, 401},
				{"/v1/events?ticket=AAAA.BBBB", nil, 401},
				{"/v1/events?cursor=x1.1", auth, 400},
				{"/v1/events?cursor=c0.1", auth, 400},
			} {
				if _, st := ts.openStream(t, tc.path, tc.hdr); st != tc.want {
					t.Errorf("GET %s: status %d, want %d", tc.path, st, tc.want)
				}
			}
			// read over HTTP.
			if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/read", gid), bob, `{"seq":4}`, nil); st != 204 {
				t.Fatalf("read: status %d", st)
			}
			var sr wire.SyncResponse
			ts.do("GET", "/v1/sync", bob, nil, &sr)
			if len(sr.Groups) != 1 || sr.Groups[0].LastReadSeq != 4 {
				t.Errorf("sync after read: %+v", sr)
			}
			if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/read", gid), bob, `{"seq":0}`, nil); st != 400 {
				t.Errorf("read seq 0: status %d, want 400", st)
			}
			var stranger json.RawMessage
			if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/read", gid), ts.token("mallory", 0), `{"seq":1}`, &stranger); st != 403 {
				t.Errorf("read by a non-member: status %d, want 403", st)
			}
		})
	}
}

func strconvBase36(v int64) string { return strconv.FormatInt(v, 36) }
