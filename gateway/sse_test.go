package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

func TestCursorRoundTrip(t *testing.T) {
	c := cursor{max: 4, e: make([]cursorEntry, 0, 4)}
	for _, e := range []cursorEntry{{3, 5}, {1, 10}, {40, 0}, {3, 4}, {3, 7}} {
		c.set(e.gid, e.seq)
	}
	got := string(appendCursor(nil, &c))
	if want := "c1.a-2.7-11.0"; got != want {
		t.Fatalf("cursor text: got %q, want %q", got, want)
	}
	back, err := parseCursor(got, 4)
	if err != nil || fmt.Sprint(back.e) != fmt.Sprint(c.e) || back.partial {
		t.Fatalf("parse %q: got %+v, %v; want %+v", got, back, err, c.e)
	}
	c.set(50, 1) // room for one more
	c.set(60, 1) // none: partial
	if !c.partial || len(c.e) != 4 {
		t.Fatalf("past max: partial %v, %d entries", c.partial, len(c.e))
	}
	if s := string(appendCursor(nil, &c)); !strings.HasPrefix(s, "p") {
		t.Fatalf("partial cursor text %q", s)
	}
}

func TestParseCursorRefuses(t *testing.T) {
	long := "c" + strings.Repeat("1.1-", 4) + "1.1"
	for _, tc := range []struct {
		in  string
		max int
		ok  bool
	}{
		{"c", 4, true},
		{"p1.0", 4, true},
		{"c1.1-1.1-1.1-1.1", 4, true},
		{long, 4, false}, // five entries
		{"", 4, false},
		{"x1.1", 4, false},
		{"c0.1", 4, false},
		{"c1.-1", 4, false},
		{"c1.1-", 4, false},
		{"c1", 4, false},
		{"c1.1--1.1", 4, false},
		{"c-5.1", 4, false},
		{"czzzzzzzzzzzzzz.1", 4, false}, // gid past int64
		{"c" + strings.Repeat("a", 1+4*maxCursorEntryLen), 4, false}, // past the length bound
		{"cz1ci99jj747d.1-z1ci99jj747d.1", 4, false},                 // gid sum overflows int64
	} {
		_, err := parseCursor(tc.in, tc.max)
		if (err == nil) != tc.ok {
			t.Errorf("parseCursor(%q): err %v, want ok %v", tc.in, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrBadRequest) {
			t.Errorf("parseCursor(%q): %v is not a bad request", tc.in, err)
		}
	}
}

func TestTickets(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tk := newTickets([]byte("secret"), 30*time.Second, 2)
	tk.now = func() time.Time { return now }
	claims := auth.Claims{UID: "bob", Tier: 2, Expires: now.Add(time.Hour)}
	s, notAfter := tk.mint(claims)
	if !notAfter.Equal(now.Add(30 * time.Second)) {
		t.Fatalf("not after %v", notAfter)
	}
	c, err := tk.redeem(s)
	if err != nil || c.UID != "bob" || c.Tier != 2 || !c.Expires.Equal(claims.Expires) {
		t.Fatalf("redeem: %+v %v", c, err)
	}
	if _, err := tk.redeem(s); err == nil {
		t.Fatal("a ticket opened two streams")
	}
	// Tampered, foreign, expired, past the token's expiry, garbage.
	s2, _ := tk.mint(claims)
	bad := []string{s2[:len(s2)-2] + "AA", "", "x", strings.Repeat("A", maxTicketLen+1), "AAAA.AAAA"}
	other := newTickets([]byte("other"), 30*time.Second, 2)
	o, _ := other.mint(claims)
	bad = append(bad, o)
	for _, b := range bad {
		if _, err := tk.redeem(b); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("redeem(%.20q): %v, want unauthorized", b, err)
		}
	}
	now = now.Add(31 * time.Second)
	if _, err := tk.redeem(s2); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("expired ticket: %v", err)
	}
	short, _ := tk.mint(auth.Claims{UID: "eve", Expires: now.Add(time.Second)})
	now = now.Add(2 * time.Second)
	if _, err := tk.redeem(short); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("ticket past its token's expiry: %v", err)
	}
	// The replay cache is bounded: full of live nonces, redemption is
	// refused (retryable) rather than forgetting one.
	a, _ := tk.mint(claims)
	b, _ := tk.mint(claims)
	c3, _ := tk.mint(claims)
	if _, err := tk.redeem(a); err != nil {
		t.Fatal(err)
	}
	if _, err := tk.redeem(b); err != nil {
		t.Fatal(err)
	}
	if _, err := tk.redeem(c3); !errors.Is(err, ErrNotReady) {
		t.Errorf("redeem with the cache full: %v, want not ready", err)
	}
	now = now.Add(time.Minute)
	tk.sweep()
	if len(tk.used) != 0 {
		t.Errorf("sweep kept %d expired nonces", len(tk.used))
	}
}

func newTestEvents(t *testing.T, cfg EventsConfig) *Events {
	t.Helper()
	cfg.Chat = NewChat(ChatConfig{})
	ev, err := NewEvents(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func pushFrame(gid, seq int64, body int) *socket.Frame {
	b := wire.AppendMsg(nil, &wire.Msg{GID: gid, Seq: seq, From: "a", Kind: "text", Body: []byte(`"` + strings.Repeat("x", body) + `"`)})
	return socket.NewPushFrame(gid, seq, b)
}

func TestEventsConfigValidate(t *testing.T) {
	err := EventsConfig{Heartbeat: time.Millisecond, CursorGroups: MaxSSECursorGroups + 1, Padding: -1, MaxStreamsPerUser: -2,
		IPv6CapPrefix: 8, OutboundBound: 10, OutboundHardBound: 5}.Validate()
	for _, want := range []string{"Chat is required", "Heartbeat must be at least", "CursorGroups", "Padding must not", "MaxStreamsPerUser", "IPv6CapPrefix", "OutboundHardBound"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want it to name %q", err, want)
		}
	}
}

func TestEventsAdmitCaps(t *testing.T) {
	ev := newTestEvents(t, EventsConfig{MaxStreams: 3, MaxStreamsPerUser: 2, MaxStreamsPerIP: 2,
		PerIPExempt: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	open := func(uid, addr string) error {
		return ev.admit(ev.newStream(auth.Claims{UID: uid}, addr, cursor{}))
	}
	if err := open("a", "192.0.2.1:1"); err != nil {
		t.Fatal(err)
	}
	if err := open("a", "192.0.2.2:1"); err != nil {
		t.Fatal(err)
	}
	if err := open("a", "192.0.2.3:1"); err == nil || !strings.Contains(err.Error(), "for this user") {
		t.Errorf("third stream of a user capped at 2: %v", err)
	}
	if err := open("b", "[2001:db8::1]:1"); err != nil {
		t.Fatal(err)
	}
	if err := open("c", "10.1.1.1:1"); err == nil || !strings.Contains(err.Error(), "on this node") {
		t.Errorf("fourth stream of a node capped at 3: %v", err)
	}
	ev2 := newTestEvents(t, EventsConfig{MaxStreamsPerIP: 1, IPv6CapPrefix: 64})
	if err := ev2.admit(ev2.newStream(auth.Claims{UID: "x"}, "[2001:db8::1]:1", cursor{})); err != nil {
		t.Fatal(err)
	}
	// Another address of the same /64 counts as the same client.
	if err := ev2.admit(ev2.newStream(auth.Claims{UID: "y"}, "[2001:db8::2]:1", cursor{})); err == nil || !strings.Contains(err.Error(), "address") {
		t.Errorf("second stream of one /64 capped at 1: %v", err)
	}
	var r ErrorReply
	if r = MapError(errStreamCap("x"), ScopeMember); r.Status != http.StatusTooManyRequests || r.RetryAfter <= 0 {
		t.Errorf("a cap refusal maps to %+v, want 429 with a retry hint", r)
	}
}

func TestEventsSweep(t *testing.T) {
	ev := newTestEvents(t, EventsConfig{Heartbeat: 5 * time.Second, MaxLifetime: time.Minute})
	now := time.Now()
	mk := func(uid string) *stream {
		s := ev.newStream(auth.Claims{UID: uid}, "192.0.2.1:1", cursor{})
		if err := ev.admit(s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	idle, fresh, old, expired := mk("a"), mk("b"), mk("c"), mk("d")
	idle.lastWrite.Store(now.Add(-6 * time.Second).UnixNano())
	fresh.lastWrite.Store(now.UnixNano())
	old.deadline = now.Add(-time.Second).UnixNano()
	expired.expires = now.Add(-time.Second).UnixNano()
	ev.sweep(now)
	if !idle.hb || fresh.hb {
		t.Errorf("heartbeat due: idle %v (want true), fresh %v (want false)", idle.hb, fresh.hb)
	}
	if old.finCode != socket.CloseNormal || expired.finCode != socket.ClosePolicyViolation || expired.finWhy != "token expired" {
		t.Errorf("ends: lifetime %d %q, token %d %q", old.finCode, old.finWhy, expired.finCode, expired.finWhy)
	}
	if fresh.finWhy != "" || idle.finWhy != "" {
		t.Errorf("live streams ended: %q %q", fresh.finWhy, idle.finWhy)
	}
	// The lifetime is shortened by at most a tenth.
	lt := ev.newStream(auth.Claims{UID: "e"}, "", cursor{})
	if d := time.Duration(lt.deadline - time.Now().UnixNano()); d > time.Minute || d < 53*time.Second {
		t.Errorf("lifetime deadline in %v, want 54-60 s", d)
	}
}

func TestStreamHardBound(t *testing.T) {
	ev := newTestEvents(t, EventsConfig{OutboundBound: 40 << 10, OutboundHardBound: 100 << 10})
	s := ev.newStream(auth.Claims{UID: "a"}, "", cursor{max: 4})
	big := pushFrame(0, 0, 30<<10)
	for i := 0; i < 3; i++ {
		s.reply(big)
	}
	if s.finWhy != "" {
		t.Fatalf("ended at %d bytes: %q", s.pend, s.finWhy)
	}
	s.reply(big) // past 100 KiB
	if s.finWhy != "slow consumer" || s.finCode != socket.ClosePolicyViolation {
		t.Fatalf("past the hard bound: %d %q", s.finCode, s.finWhy)
	}
	if q, d := s.push([]*socket.Frame{pushFrame(1, 1, 10)}); q != 0 || d != 0 {
		t.Errorf("push to an ending stream: queued %d dropped %d", q, d)
	}
}

func TestAppendData(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"a":1}`, "data: {\"a\":1}\n\n"},
		{"{\n\"a\":1}", "data: {\ndata: \"a\":1}\n\n"},
		{"{\r\n\"a\":\r1}", "data: {\ndata: \ndata: \"a\":\ndata: 1}\n\n"},
	} {
		if got := string(appendData(nil, []byte(tc.in))); got != tc.want {
			t.Errorf("appendData(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestAppendEventsAllocs: formatting a batch of pushes, cursor id
// included, allocates nothing once the stream's buffer has grown.
func TestAppendEventsAllocs(t *testing.T) {
	ev := newTestEvents(t, EventsConfig{})
	s := ev.newStream(auth.Claims{UID: "a"}, "", cursor{max: 64, e: make([]cursorEntry, 0, 64)})
	batch := []sseItem{{f: pushFrame(1, 1, 100)}, {f: pushFrame(2, 7, 100)}, {f: degradedFrame(2, 1)}}
	buf := s.appendEvents(nil, batch)
	if !strings.Contains(string(buf), "id: c1.1-1.7\ndata: {\"type\":\"msg\",\"gid\":2") || strings.Count(string(buf), "id: ") != 1 {
		t.Fatalf("events:\n%s", buf)
	}
	if n := testing.AllocsPerRun(100, func() { buf = s.appendEvents(buf[:0], batch) }); n != 0 {
		t.Errorf("appendEvents: %v allocs, want 0", n)
	}
}

// smallBufListener shrinks the send buffer of accepted connections, so
// that a client that does not read blocks the server's writes soon.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// TestStreamOverflowResync: a client that stops reading makes its stream
// drop pushes past the outbound bound; once it reads again it gets the
// pushes queued before the drop, in order, then one resync naming the
// highest seq dropped, then the pushes after it. Over a real connection.
func TestStreamOverflowResync(t *testing.T) {
	ev := newTestEvents(t, EventsConfig{OutboundBound: 64 << 10, WriteTimeout: time.Minute})
	s := ev.newStream(auth.Claims{UID: "a"}, "", cursor{max: 4, e: make([]cursorEntry, 0, 4)})
	ended := make(chan string, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		s.write(rc, w, []byte(":\n\n"), time.Now())
		ended <- s.run(r.Context(), rc, w)
	}))
	srv.Listener = smallBufListener{srv.Listener}
	srv.Start()
	defer srv.Close()
	nc, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.(*net.TCPConn).SetReadBuffer(4096)
	req, _ := http.NewRequest("GET", srv.URL+"/", nil)
	if err := req.Write(nc); err != nil {
		t.Fatal(err)
	}
	// Not reading: push until the stream drops.
	const gid = 7
	var seq int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		seq++
		ev.deliver([]*socket.Frame{pushFrame(gid, seq, 4000)}, []*stream{s})
		s.mu.Lock()
		over := s.overflow
		s.mu.Unlock()
		if over {
			break
		}
		if time.Now().After(deadline) || seq > 100000 {
			t.Fatalf("no overflow after %d pushes", seq)
		}
	}
	dropped := seq
	for range 3 { // more drops raise the resync's seq
		seq++
		ev.deliver([]*socket.Frame{pushFrame(gid, seq, 4000)}, []*stream{s})
	}
	lastDropped := seq
	if ev.dropped.Load() < 4 {
		t.Fatalf("dropped %d pushes, want at least 4", ev.dropped.Load())
	}
	// Read everything: msgs in order up to before the first drop, then the
	// resync, then a push made after the drain.
	resp, err := http.ReadResponse(bufio.NewReader(nc), req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	var want int64 = 1
	sawResync := false
	afterResync := func() {
		ev.deliver([]*socket.Frame{pushFrame(gid, lastDropped+1, 10)}, []*stream{s})
	}
	for {
		_ = nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read: %v (at seq %d, resync seen %v)", err, want, sawResync)
		}
		data, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "data: ")
		if !ok {
			continue
		}
		f, err := wire.DecodeServer([]byte(data))
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *wire.Msg:
			if f.Seq != want {
				t.Fatalf("msg seq %d, want %d (resync seen %v)", f.Seq, want, sawResync)
			}
			if sawResync {
				if f.Seq != lastDropped+1 {
					t.Fatalf("after the resync: seq %d, want %d", f.Seq, lastDropped+1)
				}
				if n := ev.resyncs.Load(); n != 1 {
					t.Errorf("resyncs counted %d, want 1", n)
				}
				return
			}
			want++
			if want > dropped {
				t.Fatalf("seq %d arrived, which was dropped", f.Seq)
			}
		case *wire.Resync:
			if f.GID != gid || f.LastSeq != lastDropped || sawResync {
				t.Fatalf("resync %+v, want gid %d last_seq %d once", f, gid, lastDropped)
			}
			sawResync = true
			want = lastDropped + 1
			afterResync()
		}
	}
}

// BenchmarkStreamDeliver: queueing one push on 1,000 streams, and
// writing it out as an event with its id (the per-stream work besides the
// write system call).
func BenchmarkStreamDeliver(b *testing.B) {
	ev, err := NewEvents(EventsConfig{Chat: NewChat(ChatConfig{})})
	if err != nil {
		b.Fatal(err)
	}
	ss := make([]*stream, 1000)
	for i := range ss {
		ss[i] = ev.newStream(auth.Claims{UID: "u"}, "", cursor{max: 64, e: make([]cursorEntry, 0, 64)})
		ss[i].cur.set(1, 0)
		ss[i].cur.set(2, 0)
	}
	frames := []*socket.Frame{pushFrame(1, 1, 60)}
	b.ReportAllocs()
	for b.Loop() {
		ev.deliver(frames, ss)
		for _, s := range ss {
			s.mu.Lock()
			batch := s.q
			s.q, s.spare = s.spare[:0], nil
			s.mu.Unlock()
			s.buf = s.appendEvents(s.buf[:0], batch)
			s.mu.Lock()
			s.pend = 0
			clear(batch)
			s.spare = batch[:0]
			s.mu.Unlock()
			select {
			case <-s.wake:
			default:
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ss)), "ns/delivery")
}
