package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

const testHookSecret = "hook-secret-0123456789"

// hookReceiver is an application's hook endpoint on a real listener: it
// verifies every request's signature (401 otherwise, counted), and can be
// told to answer 500 or to hang past the server's timeout.
type hookReceiver struct {
	t        *testing.T
	srv      *httptest.Server
	fail     atomic.Int32 // answer 500 to the next n requests
	failAll  atomic.Bool  // answer 500 to every request
	hang     atomic.Int32 // hang the next n requests until the client gives up
	badSigs  atomic.Int32
	requests atomic.Int32

	mu        sync.Mutex
	batches   []int             // before_send: messages per POST
	events    []hooks.Event     // events, in delivery order (duplicates kept)
	eventIDs  []string          // their journal ids
	seen      map[string]bool   // distinct event ids
	perKind   map[string]int    // distinct events per type
	bodies    map[string]string // before_send: client_msg_id -> body seen
	rejectMsg string
}

func newHookReceiver(t *testing.T) *hookReceiver {
	r := &hookReceiver{t: t, seen: map[string]bool{}, perKind: map[string]int{}, bodies: map[string]string{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *hookReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	r.requests.Add(1)
	if err := hooks.Verify([]byte(testHookSecret), req.Header, body, time.Now(), 5*time.Minute); err != nil {
		r.badSigs.Add(1)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if r.hang.Load() > 0 && r.hang.Add(-1) >= 0 {
		<-req.Context().Done() // the server's timeout ends it
		return
	}
	if r.failAll.Load() || (r.fail.Load() > 0 && r.fail.Add(-1) >= 0) {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	switch req.Header.Get(hooks.HeaderKind) {
	case "before_send":
		r.beforeSend(w, body)
	case "events":
		var b struct {
			Events []json.RawMessage `json:"events"`
		}
		if err := json.Unmarshal(body, &b); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, raw := range b.Events {
			var ev hooks.Event
			var id struct {
				ID string `json:"id"`
			}
			_ = json.Unmarshal(raw, &ev)
			_ = json.Unmarshal(raw, &id)
			r.events = append(r.events, ev)
			r.eventIDs = append(r.eventIDs, id.ID)
			if !r.seen[id.ID] {
				r.seen[id.ID] = true
				r.perKind[ev.Type]++
			}
		}
		r.mu.Unlock()
	default:
		w.WriteHeader(http.StatusBadRequest)
	}
}

// beforeSend moderates: a body {"t":"spam"} is rejected with code
// spam.link, {"t":"dirty"} is rewritten to {"t":"clean"}, the rest allowed.
func (r *hookReceiver) beforeSend(w http.ResponseWriter, body []byte) {
	var req struct {
		Type     string `json:"type"`
		GID      int64  `json:"gid"`
		Messages []struct {
			UID         string          `json:"uid"`
			ClientMsgID string          `json:"client_msg_id"`
			Body        json.RawMessage `json:"body"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.Type != "before_send" || req.GID == 0 {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	type result struct {
		Action string          `json:"action"`
		Code   string          `json:"code,omitempty"`
		Body   json.RawMessage `json:"body,omitempty"`
	}
	out := struct {
		Results []result `json:"results"`
	}{}
	r.mu.Lock()
	r.batches = append(r.batches, len(req.Messages))
	for _, m := range req.Messages {
		r.bodies[m.ClientMsgID] = string(m.Body)
		switch string(m.Body) {
		case `{"t":"spam"}`:
			out.Results = append(out.Results, result{Action: "reject", Code: "spam.link"})
		case `{"t":"dirty"}`:
			out.Results = append(out.Results, result{Action: "rewrite", Body: json.RawMessage(`{"t":"clean"}`)})
		default:
			out.Results = append(out.Results, result{Action: "allow"})
		}
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// messageSeqs returns, per gid, the seqs of the message events in the
// order they were delivered (duplicates kept).
func (r *hookReceiver) messageSeqs() map[int64][]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[int64][]int64{}
	for _, ev := range r.events {
		if ev.Type == hooks.EventMessage {
			out[ev.GID] = append(out[ev.GID], ev.Seq)
		}
	}
	return out
}

// checkOrder checks that seqs (one group's deliveries) hold 1..n, each
// first delivered after every lower one (redeliveries of a batch may
// repeat earlier seqs, never skip ahead).
func checkOrder(t *testing.T, gid int64, seqs []int64, n int64) {
	t.Helper()
	next := int64(1)
	for _, s := range seqs {
		switch {
		case s == next:
			next++
		case s > next:
			t.Fatalf("gid %d: seq %d delivered before %d (deliveries %v)", gid, s, next, seqs)
		}
	}
	if next != n+1 {
		t.Fatalf("gid %d: delivered up to %d, want %d (deliveries %v)", gid, next-1, n, seqs)
	}
}

func TestHooksBeforeSend(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			rcv := newHookReceiver(t)
			ts := startServer(t, mode, "-hook-secret", testHookSecret, "-hook-before-send-url", rcv.srv.URL,
				"-hook-before-send-timeout", "300ms")
			gid := ts.createGroup("alice", "bob")
			c := ts.dialRaw("alice")
			c.send(fmt.Sprintf(`{"type":"send","id":"ok-1","gid":%d,"body":{"t":"hi"}}`, gid))
			if a, _ := readUntil[*wire.Ack](c, 10*time.Second); a.ID != "ok-1" || a.Seq != 1 {
				t.Fatalf("allowed send: ack %+v", a)
			}
			// Rejected: an error frame with the code rejected and the
			// receiver's code as its message; nothing stored.
			c.send(fmt.Sprintf(`{"type":"send","id":"spam-1","gid":%d,"body":{"t":"spam"}}`, gid))
			e, _ := readUntil[*wire.Error](c, 10*time.Second)
			if e.ID != "spam-1" || e.Code != wire.CodeRejected || e.Message != "spam.link" {
				t.Fatalf("rejected send: got %+v", e)
			}
			var he wire.ErrorResponse
			if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), ts.token("alice", 0), `{"id":"spam-http","body":{"t":"spam"}}`, &he); st != http.StatusUnprocessableEntity || he.Error.Code != wire.CodeRejected || he.Error.Message != "spam.link" {
				t.Fatalf("rejected HTTP send: status %d, %+v", st, he)
			}
			// Rewritten: stored with the receiver's body.
			c.send(fmt.Sprintf(`{"type":"send","id":"dirty-1","gid":%d,"body":{"t":"dirty"}}`, gid))
			if a, _ := readUntil[*wire.Ack](c, 10*time.Second); a.ID != "dirty-1" || a.Seq != 2 {
				t.Fatalf("rewritten send: ack %+v", a)
			}
			c.send(fmt.Sprintf(`{"type":"pull","id":"p","gid":%d,"from_seq":1}`, gid))
			page, _ := readUntil[*wire.Messages](c, 10*time.Second)
			if len(page.Messages) != 2 || string(page.Messages[0].Body) != `{"t":"hi"}` || string(page.Messages[1].Body) != `{"t":"clean"}` {
				t.Fatalf("stored messages: %+v", page.Messages)
			}
			// Fail closed (the default): a hook that times out refuses the
			// send, retryable; one that answers 500 too.
			rcv.hang.Store(1)
			c.send(fmt.Sprintf(`{"type":"send","id":"to-1","gid":%d,"body":{"t":"x"}}`, gid))
			e, _ = readUntil[*wire.Error](c, 10*time.Second)
			if e.ID != "to-1" || e.Code != wire.CodeUnavailable || e.RetryAfterMS <= 0 {
				t.Fatalf("hook timeout, fail closed: got %+v", e)
			}
			rcv.fail.Store(1)
			c.send(fmt.Sprintf(`{"type":"send","id":"500-1","gid":%d,"body":{"t":"x"}}`, gid))
			if e, _ = readUntil[*wire.Error](c, 10*time.Second); e.ID != "500-1" || e.Code != wire.CodeUnavailable {
				t.Fatalf("hook 500, fail closed: got %+v", e)
			}
			// Recovered: the retry of the refused send passes.
			c.send(fmt.Sprintf(`{"type":"send","id":"500-1","gid":%d,"body":{"t":"x"}}`, gid))
			if a, _ := readUntil[*wire.Ack](c, 10*time.Second); a.ID != "500-1" || a.Seq != 3 {
				t.Fatalf("retry after recovery: ack %+v", a)
			}
			// A burst of one group's sends is asked in few POSTs (one per
			// commit batch), never more than one per send.
			before := rcv.requests.Load()
			for i := range 40 {
				c.send(fmt.Sprintf(`{"type":"send","id":"b-%d","gid":%d,"body":{"i":%d}}`, i, gid, i))
			}
			for range 40 {
				readUntil[*wire.Ack](c, 10*time.Second)
			}
			if n := rcv.requests.Load() - before; n > 40 || n < 1 {
				t.Fatalf("40 sends took %d before-send POSTs", n)
			}
			if n := rcv.badSigs.Load(); n != 0 {
				t.Fatalf("%d requests failed signature verification", n)
			}
		})
	}
}

func TestHooksBeforeSendFailOpen(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			rcv := newHookReceiver(t)
			ts := startServer(t, mode, "-hook-secret", testHookSecret, "-hook-before-send-url", rcv.srv.URL,
				"-hook-before-send-timeout", "200ms", "-hook-before-send-fail-open")
			gid := ts.createGroup("alice")
			c := ts.dialRaw("alice")
			rcv.hang.Store(1)
			c.send(fmt.Sprintf(`{"type":"send","id":"a","gid":%d,"body":{"t":"spam"}}`, gid))
			if a, _ := readUntil[*wire.Ack](c, 10*time.Second); a.Seq != 1 {
				t.Fatalf("timeout, fail open: ack %+v", a)
			}
			rcv.failAll.Store(true)
			c.send(fmt.Sprintf(`{"type":"send","id":"b","gid":%d,"body":{"t":"spam"}}`, gid))
			if a, _ := readUntil[*wire.Ack](c, 10*time.Second); a.Seq != 2 {
				t.Fatalf("500, fail open: ack %+v", a)
			}
			// Groups outside -hook-before-send-groups never reach the hook.
			rcv.failAll.Store(false)
		})
	}
}

func TestHooksBeforeSendGroups(t *testing.T) {
	rcv := newHookReceiver(t)
	ts := startServer(t, "embedded", "-hook-secret", testHookSecret, "-hook-before-send-url", rcv.srv.URL,
		"-hook-before-send-groups", "1000-1999")
	var g wire.Group
	if st := ts.do("POST", "/v1/groups", ts.admin, wire.CreateGroupRequest{GID: 1500, Name: "m", Owner: "alice"}, &g); st != http.StatusCreated {
		t.Fatalf("create: %d", st)
	}
	ts.addMembers(1500, "alice")
	free := ts.createGroup("alice") // gid 1: not moderated
	c := ts.dialRaw("alice")
	c.send(fmt.Sprintf(`{"type":"send","id":"f","gid":%d,"body":{"t":"spam"}}`, free))
	if a, _ := readUntil[*wire.Ack](c, 10*time.Second); a.ID != "f" {
		t.Fatalf("unmoderated group: %+v", a)
	}
	c.send(`{"type":"send","id":"m","gid":1500,"body":{"t":"spam"}}`)
	if e, _ := readUntil[*wire.Error](c, 10*time.Second); e.ID != "m" || e.Code != wire.CodeRejected {
		t.Fatalf("moderated group: %+v", e)
	}
	if n := rcv.requests.Load(); n != 1 {
		t.Fatalf("hook got %d requests, want 1 (the moderated group only)", n)
	}
}

// hookEventArgs are the flags of a node delivering events to url with
// short retries.
func hookEventArgs(url string) []string {
	return []string{"-hook-secret", testHookSecret, "-hook-events-url", url, "-hook-events-timeout", "300ms",
		"-hook-events-backoff", "5ms", "-hook-events-max-backoff", "50ms", "-hook-events-reorder", "20ms", "-hook-events-batch", "7"}
}

func TestHooksEvents(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			rcv := newHookReceiver(t)
			ts := startServer(t, mode, hookEventArgs(rcv.srv.URL)...)
			g1 := ts.createGroup("alice", "bob", "carol")
			g2 := ts.createGroup("bob", "alice")
			// carol is active (she connected) and offline: message events
			// of g1 list her.
			cc := ts.dialRaw("carol")
			cc.c.Close()
			waitFor(t, 10*time.Second, "carol's disconnect event", func() bool {
				rcv.mu.Lock()
				defer rcv.mu.Unlock()
				return rcv.perKind[hooks.EventDisconnect] >= 1
			})
			// Her connect's last-active time reaches the store within
			// -touch-interval (1 s): the offline audience reads it there.
			waitFor(t, 10*time.Second, "carol's last-active time written", func() bool {
				return ts.metricValue("fanfare_user_touches_written_total") >= 1
			})
			// The receiver fails: 500s, then a request that times out,
			// then it recovers. No event is lost and each group's come in
			// seq order.
			rcv.fail.Store(5)
			rcv.hang.Store(1)
			a := ts.dialRaw("alice")
			b := ts.dialRaw("bob")
			const n = 20
			for i := range n {
				a.send(fmt.Sprintf(`{"type":"send","id":"a%d","gid":%d,"body":{"i":%d}}`, i, g1, i))
				b.send(fmt.Sprintf(`{"type":"send","id":"b%d","gid":%d,"body":{"i":%d}}`, i, g2, i))
			}
			for range n {
				readUntil[*wire.Ack](a, 10*time.Second)
				readUntil[*wire.Ack](b, 10*time.Second)
			}
			ts.addMembers(g2, "dave")
			if st := ts.do("DELETE", fmt.Sprintf("/v1/groups/%d/members/dave", g2), ts.admin, nil, nil); st/100 != 2 {
				t.Fatalf("remove member: %d", st)
			}
			waitFor(t, 20*time.Second, "every message event", func() bool {
				s := rcv.messageSeqs()
				return len(slices.Compact(slices.Sorted(slices.Values(s[g1])))) == n && len(slices.Compact(slices.Sorted(slices.Values(s[g2])))) == n
			})
			waitFor(t, 10*time.Second, "the leave event", func() bool {
				rcv.mu.Lock()
				defer rcv.mu.Unlock()
				return rcv.perKind[hooks.EventLeave] >= 1
			})
			seqs := rcv.messageSeqs()
			checkOrder(t, g1, seqs[g1], n)
			checkOrder(t, g2, seqs[g2], n)
			rcv.mu.Lock()
			defer rcv.mu.Unlock()
			if rcv.perKind[hooks.EventJoin] < 5 || rcv.perKind[hooks.EventConnect] < 3 {
				t.Fatalf("events per type: %v", rcv.perKind)
			}
			var sawCarol bool
			for _, ev := range rcv.events {
				if ev.Type == hooks.EventMessage && ev.GID == g1 {
					if ev.UID != "alice" || ev.TS == 0 || !strings.HasPrefix(string(ev.Body), `{"i":`) {
						t.Fatalf("message event: %+v", ev)
					}
					if slices.Contains(ev.Offline, "carol") {
						sawCarol = true
					}
					if slices.Contains(ev.Offline, "alice") {
						t.Fatalf("alice is online but listed offline: %+v", ev)
					}
				}
			}
			if !sawCarol {
				t.Fatal("no message event of g1 lists carol (active, offline) among the offline members")
			}
			if rcv.badSigs.Load() != 0 {
				t.Fatalf("%d event requests failed signature verification", rcv.badSigs.Load())
			}
		})
	}
}

// TestHooksEventsSurviveRestart: events journaled while the receiver is
// down are delivered by the next start of the node (the cursor and the
// journal are durable: pebble in embedded mode, Redis in cluster mode).
func TestHooksEventsSurviveRestart(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			rcv := newHookReceiver(t)
			rcv.failAll.Store(true)
			base := []string{"-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-jwt-secret", testSecret,
				"-admin-token", "test-admin-token", "-log-level", "warn", "-shutdown-timeout", "5s",
				"-limits-file", unlimited(t), "-hook-events-drain", "200ms"}
			args := append(append(base, modeArgs(t, mode)...), hookEventArgs(rcv.srv.URL)...)
			ts := startArgs(t, args)
			gid := ts.createGroup("alice")
			a := ts.dialRaw("alice")
			for i := range 10 {
				a.send(fmt.Sprintf(`{"type":"send","id":"r%d","gid":%d,"body":{"i":%d}}`, i, gid, i))
			}
			for range 10 {
				readUntil[*wire.Ack](a, 10*time.Second)
			}
			ts.stop()
			if got := len(rcv.messageSeqs()[gid]); got != 0 {
				t.Fatalf("%d message events delivered to a failing receiver", got)
			}
			rcv.failAll.Store(false)
			ts2 := startArgs(t, args)
			_ = ts2
			waitFor(t, 20*time.Second, "the journaled events after the restart", func() bool {
				return len(slices.Compact(slices.Sorted(slices.Values(rcv.messageSeqs()[gid])))) == 10
			})
			checkOrder(t, gid, rcv.messageSeqs()[gid], 10)
		})
	}
}

// TestHooksMetrics: a node with both hooks exposes their metrics after
// some traffic (TestDocsMetrics lists them as exceptions: its node has no
// hooks). fanfare_hook_events_dropped_total appears only after a drop.
func TestHooksMetrics(t *testing.T) {
	rcv := newHookReceiver(t)
	mod := newHookReceiver(t) // its own receiver: rcv's failure is for the event POST
	ts := startServer(t, "embedded", append(hookEventArgs(rcv.srv.URL), "-hook-before-send-url", mod.srv.URL)...)
	gid := ts.createGroup("alice")
	rcv.fail.Store(1) // one event POST is retried
	c := ts.dialRaw("alice")
	c.send(fmt.Sprintf(`{"type":"send","id":"m1","gid":%d,"body":{"t":"hi"}}`, gid))
	readUntil[*wire.Ack](c, 10*time.Second)
	waitFor(t, 10*time.Second, "the message event", func() bool { return len(rcv.messageSeqs()[gid]) > 0 })
	want := []string{"fanfare_hook_before_send_seconds_count", "fanfare_hook_before_send_total",
		"fanfare_hook_events_appended_total", "fanfare_hook_events_delivered_total", "fanfare_hook_event_retries_total",
		"fanfare_hook_events_out_of_order_total", "fanfare_hook_events_pending", "fanfare_hook_events_lag_seconds",
		"fanfare_hook_events_held", "fanfare_hook_events_async_queue"}
	got := scrapeUntil(t, ts, want, 5*time.Second)
	for _, n := range want {
		if !got[n] {
			t.Errorf("metric %s not exposed", n)
		}
	}
}
