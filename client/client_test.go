package client

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

func dial(t *testing.T, cfg Config) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// recv reads n messages from c within 5 s.
func recv(t *testing.T, c *Conn, n int) []Message {
	t.Helper()
	var out []Message
	timeout := time.After(5 * time.Second)
	for len(out) < n {
		select {
		case m, ok := <-c.Messages():
			if !ok {
				t.Fatalf("Messages closed after %d of %d", len(out), n)
			}
			out = append(out, m)
		case <-timeout:
			t.Fatalf("got %d messages (%v), want %d", len(out), seqsOf(out), n)
		}
	}
	return out
}

// noMore fails if a message arrives within d.
func noMore(t *testing.T, c *Conn, d time.Duration) {
	t.Helper()
	select {
	case m := <-c.Messages():
		t.Fatalf("unexpected message gid %d seq %d", m.GID, m.Seq)
	case <-time.After(d):
	}
}

func seqsOf(ms []Message) []int64 {
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.Seq
	}
	return out
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func wantSeqs(t *testing.T, got []Message, want []int64) {
	t.Helper()
	if g := seqsOf(got); !slices.Equal(g, want) {
		t.Fatalf("got seqs %v, want %v", g, want)
	}
}

func wantPulls(t *testing.T, f *fakeServer, want []pullRec) {
	t.Helper()
	if got := f.pullLog(); !slices.Equal(got, want) {
		t.Fatalf("got pulls %v, want %v", got, want)
	}
}

// waitEvent returns the first event of kind within 5 s.
func waitEvent(t *testing.T, c *Conn, kind EventKind) Event {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("Events closed before %v", kind)
			}
			if ev.Kind == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %v event", kind)
		}
	}
}

func TestDialHello(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	c := dial(t, f.config())
	if got := c.Hello(); got != f.hello {
		t.Fatalf("got hello %+v, want %+v", got, f.hello)
	}
	if got := c.UID(); got != "alice" {
		t.Fatalf("got uid %q, want alice", got)
	}
	if ev := waitEvent(t, c, EventConnected); ev.Hello.Node != "fake" {
		t.Fatalf("got connected event %+v, want node fake", ev)
	}
}

func TestDialErrors(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	tests := []struct {
		name   string
		mod    func(*Config)
		refuse int
		check  func(error) bool
	}{
		{"bad token", func(c *Config) { c.Token = "nope" }, 0, func(err error) bool {
			var he *HandshakeError
			return errors.As(err, &he) && he.Status == 401 && errors.Is(err, ErrUnauthorized)
		}},
		{"L4 refusal", nil, 503, func(err error) bool {
			var he *HandshakeError
			return errors.As(err, &he) && he.Status == 503
		}},
		{"bad config", func(c *Config) { c.URL = "http://x"; c.Token = "" }, 0, func(err error) bool { return err != nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.mu.Lock()
			f.refuse = tt.refuse
			f.mu.Unlock()
			cfg := f.config()
			if tt.mod != nil {
				tt.mod(&cfg)
			}
			c, err := Dial(context.Background(), cfg)
			if err == nil {
				c.Close()
				t.Fatal("got no error")
			}
			if !tt.check(err) {
				t.Fatalf("got error %v (%T)", err, err)
			}
		})
	}
}

func TestSendAck(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	c := dial(t, f.config())
	ctx := context.Background()
	for want := int64(1); want <= 3; want++ {
		ack, err := c.Send(ctx, 7, map[string]string{"text": "hi"})
		if err != nil {
			t.Fatalf("Send: %v", err)
		}
		if ack.Seq != want || ack.GID != 7 || ack.ID == "" || ack.TS == 0 {
			t.Fatalf("got ack %+v, want seq %d gid 7 with id and ts", ack, want)
		}
	}
	ack, err := c.Send(ctx, 7, []byte(`"raw"`), WithID("mine"), WithKind(wire.KindAtAll))
	if err != nil || ack.ID != "mine" || ack.Seq != 4 {
		t.Fatalf("got %+v, %v; want id mine seq 4", ack, err)
	}
	if got := string(f.msg(7, 4).Body); got != `"raw"` {
		t.Fatalf("got body %s, want \"raw\"", got)
	}
	if _, err := c.Send(ctx, 7, []byte(`{bad`)); !isCode(err, wire.CodeBadRequest) {
		t.Fatalf("got %v, want bad_request for invalid JSON", err)
	}
}

func isCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

func TestSendTooLargeIsLocal(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.hello.MaxMessageBytes = 64
	c := dial(t, f.config())
	_, err := c.Send(context.Background(), 1, map[string]string{"text": string(make([]byte, 100))})
	if !isCode(err, wire.CodeTooLarge) {
		t.Fatalf("got %v, want too_large", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sendIDs) != 0 {
		t.Fatalf("got %d sends at the server, want 0", len(f.sendIDs))
	}
}

// The first attempt is stored but its ack is lost with the connection: the
// retry after the reconnect carries the same id and gets the original seq.
func TestSendRetriesSameIDAfterConnectionDrop(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	dropped := false
	f.onSend = func(fc *fakeConn, cf wire.ClientFrame) bool {
		f.mu.Lock()
		first := !dropped
		dropped = true
		if first {
			f.appendLocked(cf.GID, "alice", cf.ID, cf.Body)
		}
		f.mu.Unlock()
		if first {
			fc.nc.Close()
			return true
		}
		return false
	}
	c := dial(t, f.config())
	ack, err := c.Send(context.Background(), 3, "hello")
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	if ack.Seq != 1 {
		t.Fatalf("got seq %d, want 1 (the original)", ack.Seq)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sendIDs) != 2 || f.sendIDs[0] != f.sendIDs[1] || f.sendIDs[0] != ack.ID {
		t.Fatalf("got send ids %v, want the same id twice (%s)", f.sendIDs, ack.ID)
	}
	if n := len(f.groups[3].msgs); n != 1 {
		t.Fatalf("got %d stored messages, want 1", n)
	}
	if f.dials != 2 {
		t.Fatalf("got %d dials, want 2", f.dials)
	}
}

func TestSendServerErrors(t *testing.T) {
	type reply struct {
		code    string
		afterMS int64
	}
	tests := []struct {
		name     string
		replies  []reply // before the default ack
		wantCode string  // "" = success
		wantSent int
		minWait  time.Duration
	}{
		{"overloaded then ack", []reply{{wire.CodeOverloaded, 0}}, "", 2, 0},
		{"unavailable twice then ack", []reply{{wire.CodeUnavailable, 0}, {wire.CodeUnavailable, 0}}, "", 3, 0},
		{"rate_limited honors retry_after", []reply{{wire.CodeRateLimited, 150}}, "", 2, 150 * time.Millisecond},
		{"forbidden is final", []reply{{wire.CodeForbidden, 0}}, wire.CodeForbidden, 1, 0},
		{"group_closed is final", []reply{{wire.CodeGroupClosed, 0}}, wire.CodeGroupClosed, 1, 0},
		{"retry_after beyond MaxRetryAfter is returned", []reply{{wire.CodeRateLimited, 60_000}}, wire.CodeRateLimited, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			f := newFake(t)
			n := 0
			f.onSend = func(fc *fakeConn, cf wire.ClientFrame) bool {
				f.mu.Lock()
				i := n
				n++
				f.mu.Unlock()
				if i < len(tt.replies) {
					fc.write(wire.AppendError(nil, &wire.Error{ID: cf.ID, Code: tt.replies[i].code, Message: "x", RetryAfterMS: tt.replies[i].afterMS}))
					return true
				}
				return false
			}
			c := dial(t, f.config())
			start := time.Now()
			ack, err := c.Send(context.Background(), 1, "x")
			if tt.wantCode == "" {
				if err != nil || ack.Seq != 1 {
					t.Fatalf("got %+v, %v; want seq 1", ack, err)
				}
			} else {
				var e *Error
				if !errors.As(err, &e) || e.Code != tt.wantCode {
					t.Fatalf("got %v, want *Error %s", err, tt.wantCode)
				}
			}
			if el := time.Since(start); el < tt.minWait {
				t.Fatalf("got %v between attempts, want at least %v", el, tt.minWait)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.sendIDs) != tt.wantSent {
				t.Fatalf("got %d attempts, want %d", len(f.sendIDs), tt.wantSent)
			}
			for _, id := range f.sendIDs {
				if id != f.sendIDs[0] {
					t.Fatalf("got ids %v, want one id", f.sendIDs)
				}
			}
		})
	}
}

func TestSendRetriesExhausted(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.onSend = func(fc *fakeConn, cf wire.ClientFrame) bool {
		fc.write(wire.AppendError(nil, &wire.Error{ID: cf.ID, Code: wire.CodeOverloaded, Message: "busy"}))
		return true
	}
	cfg := f.config()
	cfg.MaxRetries = 2
	c := dial(t, cfg)
	if _, err := c.Send(context.Background(), 1, "x"); !isCode(err, wire.CodeOverloaded) {
		t.Fatalf("got %v, want overloaded", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sendIDs) != 3 {
		t.Fatalf("got %d attempts, want 3 (1 + MaxRetries 2)", len(f.sendIDs))
	}
}

func TestSendWithoutAnswerRetriesAfterTimeout(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	first := true
	f.onSend = func(fc *fakeConn, cf wire.ClientFrame) bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if first {
			first = false
			return true // swallowed: no answer
		}
		return false
	}
	cfg := f.config()
	cfg.SendTimeout = 100 * time.Millisecond
	c := dial(t, cfg)
	ack, err := c.Send(context.Background(), 1, "x")
	if err != nil || ack.Seq != 1 {
		t.Fatalf("got %+v, %v; want seq 1", ack, err)
	}
}

func TestSendContextCanceled(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.onSend = func(*fakeConn, wire.ClientFrame) bool { return true }
	c := dial(t, f.config())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Send(ctx, 1, "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
}

func TestPushesDeliveredInOrderWithoutDuplicates(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(5, 3)
	c := dial(t, f.config())
	f.pushSeqs(5, 1, 2, 2, 1, 3, 3)
	got := recv(t, c, 3)
	wantSeqs(t, got, []int64{1, 2, 3})
	noMore(t, c, 100*time.Millisecond)
	if got[0].GID != 5 || got[0].From != "bob" || string(got[0].Body) != `{"n":1}` || got[0].Pulled {
		t.Fatalf("got message %+v, want gid 5 from bob body {\"n\":1} pushed", got[0])
	}
	if d := c.Stats().Duplicates; d != 3 {
		t.Fatalf("got %d duplicates, want 3", d)
	}
	wantPulls(t, f, nil)
}

func TestGapPullsExactlyTheMissingRange(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(9, 10)
	c := dial(t, f.config())
	f.pushSeqs(9, 1, 2, 6)
	got := recv(t, c, 6)
	wantSeqs(t, got, seqRange(1, 6))
	for _, m := range got {
		if want := m.Seq >= 3 && m.Seq <= 5; m.Pulled != want {
			t.Fatalf("seq %d: got Pulled %v, want %v", m.Seq, m.Pulled, want)
		}
	}
	wantPulls(t, f, []pullRec{{3, 5}})
	f.pushSeqs(9, 7, 8, 9, 10)
	wantSeqs(t, recv(t, c, 4), seqRange(7, 10))
	wantPulls(t, f, []pullRec{{3, 5}})
	// Counters move right after the hand-over: give them a moment.
	deadline := time.Now().Add(time.Second)
	for s := c.Stats(); s.Gaps != 1 || s.Pulled != 3 || s.Delivered != 10; s = c.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("got stats %+v, want 1 gap, 3 pulled, 10 delivered", s)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestReorderWithinGapWaitDoesNotPull(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(9, 3)
	cfg := f.config()
	cfg.GapWait = time.Second
	c := dial(t, cfg)
	f.pushSeqs(9, 1, 3, 2)
	wantSeqs(t, recv(t, c, 3), []int64{1, 2, 3})
	wantPulls(t, f, nil)
}

func TestLargeGapPulledInPages(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(2, 450)
	c := dial(t, f.config())
	f.pushSeqs(2, 1, 450)
	wantSeqs(t, recv(t, c, 450), seqRange(1, 450))
	wantPulls(t, f, []pullRec{{2, 449}, {202, 449}, {402, 449}})
}

// TestCatchUpInBytePages: a server that ends pages at a byte budget (far
// below 200 messages) and says next_seq: Track's catch-up, a resync and
// Pull (socket and HTTP) continue from where each page stopped and
// deliver everything once, in order.
func TestCatchUpInBytePages(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.mu.Lock()
	f.pageBytes = 2000 // about 20 of the fake's messages
	g := f.group(3)
	for range 300 {
		f.appendLocked(3, "bob", "", json.RawMessage(`"`+strings.Repeat("b", 50)+`"`))
	}
	f.mu.Unlock()
	cfg := f.config()
	cfg.HTTPURL = f.httpURL()
	c := dial(t, cfg)
	c.Track(3, 0)
	wantSeqs(t, recv(t, c, 300), seqRange(1, 300))
	if n := len(f.pullLog()); n < 300*len(g.msgs[0].Body)/2000 {
		t.Fatalf("got %d pulls, want one per page of 2000 bytes", n)
	}
	f.mu.Lock()
	for range 100 {
		f.appendLocked(3, "bob", "", json.RawMessage(`"`+strings.Repeat("c", 50)+`"`))
	}
	f.mu.Unlock()
	f.broadcast(wire.AppendResync(nil, &wire.Resync{GID: 3, LastSeq: 400}))
	wantSeqs(t, recv(t, c, 100), seqRange(301, 400))
	noMore(t, c, 50*time.Millisecond)

	p, err := c.Pull(context.Background(), 3, 1, 0)
	if err != nil || !slices.Equal(seqsOf(p.Messages), seqRange(1, 400)) {
		t.Fatalf("Pull: got %d messages, %v; want 1..400", len(p.Messages), err)
	}
	f.mu.Lock()
	f.refuse = 503
	f.mu.Unlock()
	f.dropAll()
	waitEvent(t, c, EventDisconnected)
	p, err = c.Pull(context.Background(), 3, 5, 350)
	if err != nil || !slices.Equal(seqsOf(p.Messages), seqRange(5, 350)) {
		t.Fatalf("Pull over HTTP: got %d messages, %v; want 5..350", len(p.Messages), err)
	}
}

func TestBatchUnpacked(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(4, 4)
	c := dial(t, f.config())
	f.broadcast(wire.AppendBatch(nil, &wire.Batch{GID: 4, Messages: []wire.Msg{f.msg(4, 1), f.msg(4, 2), f.msg(4, 3)}}))
	f.pushSeqs(4, 3, 4)
	wantSeqs(t, recv(t, c, 4), seqRange(1, 4))
	noMore(t, c, 50*time.Millisecond)
	wantPulls(t, f, nil)
}

func TestSummaryPullsTheWindow(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(4, 9)
	cfg := f.config()
	cfg.GapWait = time.Hour // summary gaps must not wait
	c := dial(t, cfg)
	f.pushSeqs(4, 1, 2, 3, 4)
	f.broadcast(wire.AppendSummary(nil, &wire.Summary{GID: 4, Count: 5, First: f.msg(4, 5), LastSeq: 9}))
	got := recv(t, c, 9)
	wantSeqs(t, got, seqRange(1, 9))
	if got[4].Pulled || !got[5].Pulled {
		t.Fatalf("got seq 5 pulled=%v, 6 pulled=%v; want the first pushed, the rest pulled", got[4].Pulled, got[5].Pulled)
	}
	wantPulls(t, f, []pullRec{{6, 9}})
}

func TestResyncPullsWhatWasDropped(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(4, 8)
	cfg := f.config()
	cfg.GapWait = time.Hour
	c := dial(t, cfg)
	f.pushSeqs(4, 1, 2)
	f.broadcast(wire.AppendResync(nil, &wire.Resync{GID: 4, LastSeq: 8}))
	wantSeqs(t, recv(t, c, 8), seqRange(1, 8))
	wantPulls(t, f, []pullRec{{3, 8}})
	if ev := waitEvent(t, c, EventResync); ev.GID != 4 || ev.LastSeq != 8 {
		t.Fatalf("got event %+v, want resync gid 4 last_seq 8", ev)
	}
}

func TestReconnectSyncsAndPulls(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	cfg := f.config()
	cfg.HTTPURL = f.httpURL()
	c := dial(t, cfg)
	f.waitFor("first sync", func() bool { return f.syncs == 1 })
	f.store(6, 3)
	f.pushSeqs(6, 1, 2, 3)
	wantSeqs(t, recv(t, c, 3), seqRange(1, 3))
	f.mu.Lock()
	f.refuse = 503
	f.mu.Unlock()
	f.dropAll()
	waitEvent(t, c, EventDisconnected)
	f.store(6, 4) // 4..7 committed while the client is away
	f.mu.Lock()
	f.refuse = 0
	f.mu.Unlock()
	waitEvent(t, c, EventConnected)
	got := recv(t, c, 4)
	wantSeqs(t, got, seqRange(4, 7))
	wantPulls(t, f, []pullRec{{4, 7}})
	f.mu.Lock()
	defer f.mu.Unlock()
	// One sync per connect; a sync whose answer was lost in the reconnect
	// is retried (getRetrying) and counted again, so at most one more.
	if f.syncs < 2 || f.syncs > 3 {
		t.Fatalf("got %d syncs, want 2 (3 with a retried one)", f.syncs)
	}
	if c.Stats().Reconnects < 1 {
		t.Fatal("got no reconnect counted")
	}
}

func TestReconnectWithoutHTTPProbesTrackedGroups(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	c := dial(t, f.config())
	f.store(6, 3)
	f.pushSeqs(6, 1, 2, 3)
	wantSeqs(t, recv(t, c, 3), seqRange(1, 3))
	f.mu.Lock()
	f.refuse = 503
	f.mu.Unlock()
	f.dropAll()
	waitEvent(t, c, EventDisconnected)
	f.store(6, 4)
	f.mu.Lock()
	f.refuse = 0
	f.mu.Unlock()
	wantSeqs(t, recv(t, c, 4), seqRange(4, 7))
	wantPulls(t, f, []pullRec{{4, 0}})
}

func TestSyncCatchesUpUnreadOfUntrackedGroups(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(8, 250)
	f.mu.Lock()
	f.groups[8].joinSeq = 40
	f.mu.Unlock()
	cfg := f.config()
	cfg.HTTPURL = f.httpURL()
	c := dial(t, cfg)
	got := recv(t, c, 211)
	wantSeqs(t, got, seqRange(40, 250))
	// From last_read_seq 0: the server starts the page at join_seq.
	wantPulls(t, f, []pullRec{{1, 250}, {240, 250}})
	if cur := c.Cursors()[8]; cur != 250 {
		t.Fatalf("got cursor %d, want 250", cur)
	}
}

// TestPushBeforeSyncKeepsUnread: a push of a group the Conn does not
// track yet arrives while the sync after connect is under way (a member
// just added, messages committed since its join): delivery starts where
// the sync says (last_read_seq 0, clamped to join_seq), not at the push,
// which used to skip every unread message below it.
func TestPushBeforeSyncKeepsUnread(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(8, 10)
	f.mu.Lock()
	f.groups[8].joinSeq = 3
	f.mu.Unlock()
	f.syncGate = make(chan struct{})
	cfg := f.config()
	cfg.HTTPURL = f.httpURL()
	c := dial(t, cfg)
	f.waitConns(1)
	f.pushSeqs(8, 10)
	// The push was read once the group is known to the Conn.
	f.waitFor("the push read", func() bool { _, ok := c.Cursors()[8]; return ok })
	close(f.syncGate)
	wantSeqs(t, recv(t, c, 8), seqRange(3, 10))
}

// TestResyncBeforeSyncKeepsUnread: as TestPushBeforeSyncKeepsUnread, with
// a resync (a node's tail hint for a group it missed a push of) in place of
// the push: it used to start the group at its last_seq.
func TestResyncBeforeSyncKeepsUnread(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(8, 10)
	f.mu.Lock()
	f.groups[8].joinSeq = 3
	f.mu.Unlock()
	f.syncGate = make(chan struct{})
	cfg := f.config()
	cfg.HTTPURL = f.httpURL()
	c := dial(t, cfg)
	f.waitConns(1)
	f.broadcast(wire.AppendResync(nil, &wire.Resync{GID: 8, LastSeq: 10}))
	f.waitFor("the resync read", func() bool { _, ok := c.Cursors()[8]; return ok })
	close(f.syncGate)
	wantSeqs(t, recv(t, c, 8), seqRange(3, 10))
}

// waitSynced waits until c has applied the sync after its connect (call it
// once the fake has answered that sync: c.syncing is set before the sync
// is asked for).
func waitSynced(t *testing.T, c *Conn) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		c.mu.Lock()
		syncing := c.syncing
		c.mu.Unlock()
		if !syncing {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the connect sync")
		}
	}
}

// A member added while online: messages stored between its join and its
// node's first push (the node learnt of the join late) are not skipped.
// The group, unknown to the connect sync, waits for its own sync entry
// and starts at its last_read_seq, as a group found by the sync would.
func TestAddedWhileOnlineKeepsMessagesBeforeFirstPush(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	cfg := f.config()
	cfg.HTTPURL = f.httpURL()
	c := dial(t, cfg)
	f.waitConns(1)
	f.waitFor("the connect sync", func() bool { return f.syncs == 1 })
	waitSynced(t, c)
	f.store(8, 6)
	f.mu.Lock()
	f.groups[8].joinSeq = 3
	f.mu.Unlock()
	f.pushSeqs(8, 6)
	wantSeqs(t, recv(t, c, 4), seqRange(3, 6))
}

// The same for a resync of a group the Conn has never seen, after the
// connect sync (a tail hint, docs/protocol.md §4.12): delivery starts at
// the group's last_read_seq, not at the resync's last_seq.
func TestResyncAfterSyncOfNewGroupKeepsUnread(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	cfg := f.config()
	cfg.HTTPURL = f.httpURL()
	c := dial(t, cfg)
	f.waitConns(1)
	f.waitFor("the connect sync", func() bool { return f.syncs == 1 })
	waitSynced(t, c)
	f.store(8, 10)
	f.mu.Lock()
	f.groups[8].joinSeq = 4
	f.mu.Unlock()
	f.broadcast(wire.AppendResync(nil, &wire.Resync{GID: 8, LastSeq: 10}))
	wantSeqs(t, recv(t, c, 7), seqRange(4, 10))
}

func TestTrackBelowJoinSeq(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(3, 8)
	f.mu.Lock()
	f.groups[3].joinSeq = 5
	f.mu.Unlock()
	c := dial(t, f.config())
	c.Track(3, 0)
	wantSeqs(t, recv(t, c, 4), seqRange(5, 8))
	wantPulls(t, f, []pullRec{{1, 0}})
}

func TestCursorsResume(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(3, 6)
	cfg := f.config()
	cfg.Cursors = map[int64]int64{3: 4}
	c := dial(t, cfg)
	wantSeqs(t, recv(t, c, 2), []int64{5, 6})
	wantPulls(t, f, []pullRec{{5, 0}})
}

func TestDegradedLevel3Polls(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(2, 1)
	cfg := f.config()
	cfg.PollInterval = 100 * time.Millisecond
	c := dial(t, cfg)
	f.pushSeqs(2, 1)
	wantSeqs(t, recv(t, c, 1), []int64{1})
	f.broadcast(wire.AppendDegraded(nil, &wire.Degraded{GID: 2, Level: 3}))
	if ev := waitEvent(t, c, EventDegraded); ev.GID != 2 || ev.Level != 3 {
		t.Fatalf("got %+v, want degraded gid 2 level 3", ev)
	}
	f.store(2, 2) // no pushes at L3
	wantSeqs(t, recv(t, c, 2), []int64{2, 3})
	// Back to L0: one last catch-up, then no more polling.
	f.broadcast(wire.AppendDegraded(nil, &wire.Degraded{GID: 2, Level: 0}))
	waitEvent(t, c, EventDegraded)
	time.Sleep(50 * time.Millisecond)
	n := len(f.pullLog())
	time.Sleep(300 * time.Millisecond)
	if m := len(f.pullLog()); m != n {
		t.Fatalf("got %d pulls after leaving L3, want none", m-n)
	}
}

// A level announced for a group before the app tracks it (the server
// announces the levels in force right after hello, before the first sync)
// holds once the group is tracked: at L3 the group is polled.
func TestDegradedBeforeTrack(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(9, 0)
	cfg := f.config()
	cfg.PollInterval = 100 * time.Millisecond
	c := dial(t, cfg)
	f.broadcast(wire.AppendDegraded(nil, &wire.Degraded{GID: 9, Level: wire.LevelWriteOnly}))
	if ev := waitEvent(t, c, EventDegraded); ev.GID != 9 {
		t.Fatalf("got %+v, want degraded gid 9", ev)
	}
	c.Track(9, 0)
	deadline := time.Now().Add(5 * time.Second)
	for len(f.pullLog()) == 0 && time.Now().Before(deadline) { // the first probe of the new group
		time.Sleep(10 * time.Millisecond)
	}
	f.store(9, 2) // no pushes at L3: only polling finds them
	wantSeqs(t, recv(t, c, 2), []int64{1, 2})
}

func TestGroupLostOnForbiddenPull(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	c := dial(t, f.config())
	c.Track(77, 0) // the fake knows no group 77: forbidden
	if ev := waitEvent(t, c, EventGroupLost); ev.GID != 77 || !isCode(ev.Err, wire.CodeForbidden) {
		t.Fatalf("got %+v, want group_lost 77 forbidden", ev)
	}
	if _, ok := c.Cursors()[77]; ok {
		t.Fatal("group 77 still tracked")
	}
}

// A reader that does not keep up: pushes overflow the channel and the
// pending buffer, are dropped and pulled back, in order.
func TestSlowReaderLosesNothing(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(1, 50)
	cfg := f.config()
	cfg.MessageBuffer = 1
	cfg.MaxPending = 3
	c := dial(t, cfg)
	for s := int64(1); s <= 50; s++ {
		f.pushSeqs(1, s)
	}
	time.Sleep(100 * time.Millisecond)
	wantSeqs(t, recv(t, c, 50), seqRange(1, 50))
	noMore(t, c, 50*time.Millisecond)
	if s := c.Stats(); s.Overflow == 0 || s.Pulled == 0 {
		t.Fatalf("got stats %+v, want overflow and pulls", s)
	}
}

func TestHeartbeatDetectsDeadConnection(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.silent = true
	cfg := f.config()
	cfg.Heartbeat = 50 * time.Millisecond
	c := dial(t, cfg)
	ev := waitEvent(t, c, EventDisconnected)
	if !errors.Is(ev.Err, ErrConnLost) {
		t.Fatalf("got %v, want ErrConnLost", ev.Err)
	}
	f.mu.Lock()
	f.silent = false
	f.mu.Unlock()
	waitEvent(t, c, EventConnected)
	// Answered pings keep the connection up.
	time.Sleep(300 * time.Millisecond)
	if !c.Connected() {
		t.Fatal("disconnected although pongs come")
	}
}

func TestPull(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(5, 450)
	cfg := f.config()
	cfg.HTTPURL = f.httpURL()
	c := dial(t, cfg)
	ctx := context.Background()
	p, err := c.Pull(ctx, 5, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.LastSeq != 450 {
		t.Fatalf("got last_seq %d, want 450", p.LastSeq)
	}
	if got := seqsOf(p.Messages); !slices.Equal(got, seqRange(1, 450)) {
		t.Fatalf("got %d messages, want 1..450", len(got))
	}
	p, err = c.Pull(ctx, 5, 10, 20)
	if err != nil || !slices.Equal(seqsOf(p.Messages), seqRange(10, 20)) {
		t.Fatalf("got %v, %v; want 10..20", seqsOf(p.Messages), err)
	}
	if _, err := c.Pull(ctx, 99, 1, 0); !isCode(err, wire.CodeForbidden) {
		t.Fatalf("got %v, want forbidden", err)
	}
	if _, err := c.Pull(ctx, 5, 9, 3); !isCode(err, wire.CodeBadRequest) {
		t.Fatalf("got %v, want bad_request", err)
	}
	// Socket down: over HTTP.
	f.mu.Lock()
	f.refuse = 503
	f.mu.Unlock()
	f.dropAll()
	waitEvent(t, c, EventDisconnected)
	p, err = c.Pull(ctx, 5, 300, 0)
	if err != nil || !slices.Equal(seqsOf(p.Messages), seqRange(300, 450)) {
		t.Fatalf("got %v, %v; want 300..450", seqsOf(p.Messages), err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.httpPulls != 1 {
		t.Fatalf("got %d HTTP pulls, want 1", f.httpPulls)
	}
}

func TestReadMarks(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	c := dial(t, f.config())
	if err := c.Read(4, 9); err != nil {
		t.Fatal(err)
	}
	f.waitFor("read frame", func() bool { return len(f.reads) == 1 })
	f.mu.Lock()
	got := f.reads[0]
	f.mu.Unlock()
	if got != (wire.Read{GID: 4, Seq: 9}) {
		t.Fatalf("got %+v, want gid 4 seq 9", got)
	}
	if err := c.Read(0, 1); !isCode(err, wire.CodeBadRequest) {
		t.Fatalf("got %v, want bad_request", err)
	}
}

func TestOnMessageCallback(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(1, 5)
	got := make(chan Message, 10)
	cfg := f.config()
	cfg.OnMessage = func(m Message) {
		m.Body = append([]byte(nil), m.Body...)
		got <- m
	}
	c := dial(t, cfg)
	if c.Messages() != nil {
		t.Fatal("Messages is not nil with OnMessage")
	}
	f.pushSeqs(1, 1, 2, 4, 5)
	var seqs []int64
	for len(seqs) < 5 {
		select {
		case m := <-got:
			seqs = append(seqs, m.Seq)
		case <-time.After(5 * time.Second):
			t.Fatalf("got %v, want 1..5", seqs)
		}
	}
	if !slices.Equal(seqs, seqRange(1, 5)) {
		t.Fatalf("got %v, want 1..5", seqs)
	}
}

func TestCloseEndsEverything(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.onSend = func(*fakeConn, wire.ClientFrame) bool { return true }
	c := dial(t, f.config())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Send(context.Background(), 1, "x")
		errc <- err
	}()
	f.waitFor("the send", func() bool { return len(f.sendIDs) == 1 })
	c.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v, want ErrClosed", err)
	}
	if _, ok := <-c.Messages(); ok {
		t.Fatal("Messages not closed")
	}
	if c.Err() != nil {
		t.Fatalf("got Err %v after Close, want nil", c.Err())
	}
	f.waitConns(0)
}

func TestRedialGivesUpOnUnauthorized(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	c := dial(t, f.config())
	f.mu.Lock()
	f.token = "rotated"
	f.mu.Unlock()
	f.dropAll()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Conn still redialing with a refused token")
	}
	if !errors.Is(c.Err(), ErrUnauthorized) {
		t.Fatalf("got %v, want ErrUnauthorized", c.Err())
	}
	if _, err := c.Send(context.Background(), 1, "x"); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("got %v, want ErrUnauthorized", err)
	}
}

func TestJoinRoom(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	eta := int64(12)
	f.roomFrame = [][]byte{
		wire.AppendQueue(nil, &wire.Queue{Room: "sale", Status: wire.QueueWaiting, Position: 3, Ahead: 2, Total: 9, ETAS: &eta}),
		wire.AppendGranted(nil, &wire.Granted{Room: "sale", AccessToken: "at", ExpiresAt: 42}),
	}
	cfg := f.config()
	cfg.URL = "ws" + f.srv.URL[len("http"):] + "/rooms/sale/ws"
	r, err := JoinRoom(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []wire.ServerFrame
	for len(got) < 2 {
		select {
		case fr := <-r.Updates():
			got = append(got, fr)
		case <-time.After(5 * time.Second):
			t.Fatalf("got %d updates, want 2", len(got))
		}
	}
	q, ok := got[0].(*wire.Queue)
	if !ok || q.Position != 3 || q.ETAS == nil || *q.ETAS != 12 {
		t.Fatalf("got %#v, want queue position 3 eta 12", got[0])
	}
	if g, ok := got[1].(*wire.Granted); !ok || g.AccessToken != "at" {
		t.Fatalf("got %#v, want granted", got[1])
	}
}

func TestJoinRoomRejected(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.roomFrame = [][]byte{wire.AppendRejected(nil, &wire.Rejected{Room: "sale", Code: wire.CodeRoomFull, RetryAfterMS: 5000})}
	cfg := f.config()
	cfg.URL = "ws" + f.srv.URL[len("http"):] + "/rooms/sale/ws"
	r, err := JoinRoom(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fr := <-r.Updates()
	if rj, ok := fr.(*wire.Rejected); !ok || rj.Code != wire.CodeRoomFull {
		t.Fatalf("got %#v, want rejected room_full", fr)
	}
	<-r.Done()
	var e *Error
	if !errors.As(r.Err(), &e) || e.Code != wire.CodeRoomFull || e.RetryAfter != 5*time.Second {
		t.Fatalf("got %v, want room_full retry 5s", r.Err())
	}
}

// A pull answered from a snapshot older than pushes that arrive before the
// answer: the empty page (last_seq below from) must not be read as "the
// pushed seqs' predecessors do not exist". Seen in CI as seqs 1-4 skipped.
func TestStalePullPageDoesNotSkipLaterPushes(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(5, 0)
	var once sync.Once
	f.onPull = func(fc *fakeConn, cf wire.ClientFrame) {
		once.Do(func() {
			// The page (empty, last_seq 0) is read; three messages are
			// stored and two pushed before it goes out.
			f.store(5, 3)
			f.pushSeqs(5, 2, 3)
		})
	}
	c := dial(t, f.config())
	c.Track(5, 0)
	wantSeqs(t, recv(t, c, 3), seqRange(1, 3))
	noMore(t, c, 50*time.Millisecond)
}

// A resync that raises the target while a pull is out survives the pull's
// older, empty page: the catch-up it asks for still runs.
func TestResyncDuringPullKeepsTarget(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(7, 0)
	var once sync.Once
	f.onPull = func(fc *fakeConn, cf wire.ClientFrame) {
		once.Do(func() {
			f.store(7, 3)
			fc.write(wire.AppendResync(nil, &wire.Resync{GID: 7, LastSeq: 3}))
		})
	}
	c := dial(t, f.config())
	c.Track(7, 0)
	wantSeqs(t, recv(t, c, 3), seqRange(1, 3))
}

// A server whose pull says pushed seqs' predecessors do not exist, known
// before the pull was sent, is trusted: they are skipped, once.
func TestPushedGapTheServerDenies(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(6, 3)
	cfg := f.config()
	cfg.GapWait = 0
	c := dial(t, cfg)
	f.mu.Lock()
	f.groups[6].msgs = f.groups[6].msgs[:0] // the store lost them
	f.mu.Unlock()
	m := wire.Msg{GID: 6, Seq: 3, From: "bob", TS: 1, Kind: wire.KindText, Body: []byte(`{"n":1}`)}
	c.Track(6, 1)
	f.broadcast(wire.AppendMsg(nil, &m))
	ev := waitEvent(t, c, EventSkipped)
	if ev.From != 2 || ev.To != 2 {
		t.Fatalf("got skip %d-%d, want 2-2", ev.From, ev.To)
	}
	wantSeqs(t, recv(t, c, 1), []int64{3})
}

// Concurrent senders while connections drop and pushes are lost or
// duplicated: every send is acked once with a distinct seq, and a receiver
// gets every seq exactly once, in order.
func TestLedgerUnderDropsAndLostPushes(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.autoPush, f.pushLoss, f.pushDup = true, 10, 10
	const gid, senders, each = 11, 4, 60
	cfg := f.config()
	cfg.SendTimeout = 500 * time.Millisecond
	f.store(gid, 0) // the group exists (else the probe gets forbidden)
	recvC := dial(t, cfg)
	recvC.Track(gid, 0)
	sendC := dial(t, cfg)
	stop := make(chan struct{})
	dropped := make(chan struct{})
	go func() {
		defer close(dropped)
		for {
			select {
			case <-stop:
				return
			case <-time.After(40 * time.Millisecond):
				f.dropAll()
			}
		}
	}()
	acks := make(chan Ack, senders*each)
	errs := make(chan error, senders)
	for range senders {
		go func() {
			for i := range each {
				ack, err := sendC.Send(context.Background(), gid, map[string]int{"i": i})
				if err != nil {
					errs <- err
					return
				}
				acks <- ack
			}
			errs <- nil
		}()
	}
	for range senders {
		if err := <-errs; err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	close(stop)
	<-dropped
	close(acks)
	seen := map[int64]bool{}
	for a := range acks {
		if seen[a.Seq] {
			t.Fatalf("seq %d acked twice", a.Seq)
		}
		seen[a.Seq] = true
	}
	const n = senders * each
	if len(seen) != n {
		t.Fatalf("got %d acks, want %d", len(seen), n)
	}
	f.mu.Lock()
	stored := len(f.groups[gid].msgs)
	f.mu.Unlock()
	if stored != n {
		t.Fatalf("got %d stored messages, want %d (retries stored twice)", stored, n)
	}
	// A lost push of the last message is revealed by no later seq: the app
	// asks for a catch-up.
	recvC.Track(gid, 0)
	wantSeqs(t, recv(t, recvC, n), seqRange(1, n))
	noMore(t, recvC, 50*time.Millisecond)
}

func TestInvalidUTF8FromServerDropsTheConnection(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	c := dial(t, f.config())
	f.broadcast([]byte("{\"type\":\"msg\",\"gid\":1,\"seq\":1,\"from\":\"\xff\",\"ts\":1,\"kind\":\"text\",\"body\":1}"))
	ev := waitEvent(t, c, EventDisconnected)
	if ev.Err == nil || !strings.Contains(ev.Err.Error(), "utf8") && !strings.Contains(ev.Err.Error(), "UTF") {
		t.Fatalf("got %v, want an invalid UTF-8 error", ev.Err)
	}
	waitEvent(t, c, EventConnected)
}

// TestSyncFollowsCursor: with a server answering sync in pages
// (next_after), Sync returns every group in gid order and the catch-up
// after connect pulls the groups of every page; a cursor that does not
// move is a protocol error, not an endless loop.
func TestSyncFollowsCursor(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.mu.Lock()
	f.syncPage = 2
	f.mu.Unlock()
	for gid := int64(1); gid <= 5; gid++ {
		f.store(gid*10, 1)
	}
	cfg := f.config()
	cfg.HTTPURL = f.httpURL()
	c := dial(t, cfg)
	got := recv(t, c, 5) // one message of each group, groups 30..50 past the first page
	gids := make([]int64, 0, len(got))
	for _, m := range got {
		gids = append(gids, m.GID)
	}
	slices.Sort(gids)
	if want := []int64{10, 20, 30, 40, 50}; !slices.Equal(gids, want) {
		t.Fatalf("catch-up after connect: got messages of groups %v, want %v", gids, want)
	}
	f.mu.Lock()
	if f.syncs != 3 {
		t.Errorf("first sync: got %d requests, want 3 pages", f.syncs)
	}
	f.mu.Unlock()
	sg, err := c.Sync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	gids = gids[:0]
	for _, g := range sg {
		gids = append(gids, g.GID)
	}
	if want := []int64{10, 20, 30, 40, 50}; !slices.Equal(gids, want) {
		t.Fatalf("Sync: got gids %v, want %v", gids, want)
	}
	f.mu.Lock()
	f.syncStuck = true
	f.mu.Unlock()
	if _, err := c.Sync(context.Background()); !errors.Is(err, ErrProtocol) {
		t.Fatalf("Sync with a cursor that does not move: got %v, want ErrProtocol", err)
	}
}

// TestSyncRetriesLostAnswers: a sync whose HTTP connection the server
// closed under the request, or that was answered 503 with retry_after_ms,
// is retried (a GET is idempotent) instead of failing the caller; a
// server that keeps failing exhausts MaxRetries and the error says why.
func TestSyncRetriesLostAnswers(t *testing.T) {
	checkLeaks(t)
	f := newFake(t)
	f.store(10, 1)
	cfg := f.config()
	cfg.HTTPURL = f.httpURL()
	cfg.MaxRetries = 3
	c := dial(t, cfg)
	recv(t, c, 1)
	f.mu.Lock()
	// Two cuts: Go's transport replays a GET once by itself when a reused
	// connection closes under it; the second is the SDK's to retry.
	f.syncCut, f.sync503 = 2, 1
	f.mu.Unlock()
	sg, err := c.Sync(context.Background())
	if err != nil {
		t.Fatalf("sync after two cuts and one 503: %v", err)
	}
	if len(sg) != 1 || sg[0].GID != 10 {
		t.Fatalf("sync: got %+v, want group 10", sg)
	}
	f.mu.Lock()
	f.syncCut = 10
	f.mu.Unlock()
	_, err = c.Sync(context.Background())
	if !errors.Is(err, ErrConnLost) {
		t.Fatalf("sync against a server that always cuts: %v, want ErrConnLost", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := 10 - f.syncCut; n < 4 || n > 8 {
		t.Errorf("always-cutting server: %d requests, want 1 + MaxRetries (3), each replayed at most once by the transport", n)
	}
}
