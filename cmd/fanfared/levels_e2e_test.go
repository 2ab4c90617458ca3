package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// ledger is a client that follows docs/protocol.md §10: it tracks the last seq it
// holds, pulls any gap a push reveals, pulls after summary, resync and (on
// demand) after degraded, and drops duplicates by seq. Its reads run on
// the test goroutine.
type ledger struct {
	t      *testing.T
	rc     *rawConn
	gid    int64
	have   map[int64]wire.Msg
	last   int64 // highest seq held with everything below it
	want   int64 // highest seq known to exist (pull up to it)
	level  int   // last effective level announced for gid (or node-wide)
	pulls  int
	frames map[string]int
}

func newLedger(t *testing.T, rc *rawConn, gid int64) *ledger {
	return &ledger{t: t, rc: rc, gid: gid, have: map[int64]wire.Msg{}, frames: map[string]int{}}
}

func (l *ledger) add(m wire.Msg) {
	if m.GID != l.gid {
		return
	}
	l.have[m.Seq] = m // duplicates by seq replace themselves
	l.want = max(l.want, m.Seq)
	for {
		if _, ok := l.have[l.last+1]; !ok {
			return
		}
		l.last++
	}
}

// handle applies one frame: it adds pushed messages and records what must
// be pulled (a gap below a push, a summary's or resync's last_seq).
func (l *ledger) handle(f wire.ServerFrame) {
	switch m := f.(type) {
	case *wire.Msg:
		l.frames["msg"]++
		l.add(*m)
	case *wire.Batch:
		l.frames["batch"]++
		for _, x := range m.Messages {
			l.add(x)
		}
	case *wire.Summary:
		l.frames["summary"]++
		l.want = max(l.want, m.LastSeq)
	case *wire.Resync:
		l.frames["resync"]++
		l.want = max(l.want, m.LastSeq)
	case *wire.Messages:
		for _, x := range m.Messages {
			l.add(x)
		}
	case *wire.Degraded:
		l.frames["degraded"]++
		l.level = m.Level
	}
}

// fill pulls over the socket until it holds everything up to want (up to
// last_seq when upToLast), page by page, handling pushes meanwhile.
func (l *ledger) fill(upToLast bool) {
	for upToLast || l.last < l.want {
		l.pulls++
		id := fmt.Sprintf("pull-%d", l.pulls)
		to := l.want
		if upToLast {
			to = 0
		}
		l.rc.send(fmt.Sprintf(`{"type":"pull","id":%q,"gid":%d,"from_seq":%d,"to_seq":%d}`, id, l.gid, l.last+1, to))
		for {
			f := l.rc.read(10 * time.Second)
			if e, ok := f.(*wire.Error); ok {
				l.t.Fatalf("pull %s: %+v", id, e)
			}
			l.handle(f)
			if m, ok := f.(*wire.Messages); ok && m.ID == id {
				l.want = max(l.want, m.LastSeq*btoi(upToLast))
				if upToLast && (l.last >= m.LastSeq || len(m.Messages) == 0) {
					upToLast = false
				}
				break
			}
		}
	}
}

func btoi(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// settle handles frames (pulling what they reveal) until none arrived for
// quiet.
func (l *ledger) settle(quiet time.Duration) {
	for {
		f, err := l.rc.tryRead(quiet)
		if err != nil {
			return
		}
		l.handle(f)
		l.fill(false)
	}
}

// seqs returns the held seqs in order.
func (l *ledger) seqs() []int64 {
	out := make([]int64, 0, len(l.have))
	for s := range l.have {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// quietFrames reads what rc receives until nothing came for quiet.
func quietFrames(rc *rawConn, quiet time.Duration) []wire.ServerFrame {
	var out []wire.ServerFrame
	for {
		f, err := rc.tryRead(quiet)
		if err != nil {
			return out
		}
		out = append(out, f)
	}
}

// sendAll sends n messages as rc (waiting for each answer) and returns the
// acked seqs; errs receives the error frames.
func sendAll(t *testing.T, rc *rawConn, gid int64, prefix string, n int) (acked []int64, errs []*wire.Error) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		rc.send(fmt.Sprintf(`{"type":"send","id":%q,"gid":%d,"body":%q}`, id, gid, id))
		for done := false; !done; {
			switch f := rc.read(10 * time.Second).(type) {
			case *wire.Ack:
				if f.ID == id {
					acked = append(acked, f.Seq)
					done = true
				}
			case *wire.Error:
				if f.ID == id {
					errs = append(errs, f)
					done = true
				}
			}
		}
	}
	return acked, errs
}

func (ts *testServer) degrade(scope string, gid int64, level *int, ttl int64) {
	ts.t.Helper()
	req := wire.DegradeRequest{Scope: scope, GID: gid, Level: level, TTLS: ttl}
	if st := ts.do("PUT", "/admin/v1/degrade", ts.admin, req, nil); st != http.StatusOK {
		ts.t.Fatalf("degrade %s %d %v: status %d", scope, gid, level, st)
	}
}

func lv(n int) *int { return &n }

// dialStatus tries a WebSocket handshake as uid and returns the refusal
// status (0 when it was upgraded).
func (ts *testServer) dialStatus(uid string) int {
	ts.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, _, err := ws.Dial(ctx, ts.ws+"/ws?token="+ts.token(uid, 0))
	var se ws.StatusError
	switch {
	case err == nil:
		c.Close()
		return 0
	case errors.As(err, &se):
		return int(se)
	}
	ts.t.Fatalf("dial %s: %v", uid, err)
	return -1
}

// TestDegradationLevels forces each level (per group and node-wide, over
// the admin API) and checks what clients see: L0 msg frames, L1 batch
// frames, L2 summary frames, L3 one degraded notice then nothing, L4 sends
// refused with unavailable and new connections refused; node L3 refuses
// new connections with 429. Every acked message stays retrievable, and a
// client following docs/protocol.md §10 ends with exactly the stored sequence.
func TestDegradationLevels(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-merge-window", "100ms")
			gid := ts.createGroup("sender", "r0", "led")
			sender, r0 := ts.dialRaw("sender"), ts.dialRaw("r0")
			led := newLedger(t, ts.dialRaw("led"), gid)
			acked := map[int64]string{}
			const n = 8
			phase := func(name string) []int64 {
				seqs, errs := sendAll(t, sender, gid, name, n)
				if len(errs) > 0 {
					t.Fatalf("%s: sends refused: %+v", name, errs[0])
				}
				for i, s := range seqs {
					acked[s] = fmt.Sprintf("%s-%d", name, i)
				}
				return seqs
			}
			const quiet = 400 * time.Millisecond

			// L0: one msg frame per message.
			seqs := phase("l0")
			fs := quietFrames(r0, quiet)
			var got []int64
			for _, f := range fs {
				m, ok := f.(*wire.Msg)
				if !ok {
					t.Fatalf("L0: got %T, want msg frames only", f)
				}
				got = append(got, m.Seq)
			}
			if !slices.Equal(got, seqs) {
				t.Fatalf("L0: got seqs %v, want %v", got, seqs)
			}

			// L1 (group): one degraded notice, then batch frames only.
			ts.degrade(wire.ScopeGroup, gid, lv(1), 0)
			if d, _ := readUntil[*wire.Degraded](r0, 5*time.Second); d.GID != gid || d.Level != 1 {
				t.Fatalf("L1 notice: got %+v", d)
			}
			seqs = phase("l1")
			got = got[:0]
			batches := 0
			for _, f := range quietFrames(r0, quiet) {
				b, ok := f.(*wire.Batch)
				if !ok || b.GID != gid {
					t.Fatalf("L1: got %T %+v, want batch frames only", f, f)
				}
				batches++
				for _, m := range b.Messages {
					got = append(got, m.Seq)
				}
			}
			if !slices.Equal(got, seqs) || batches == 0 || batches >= n {
				t.Fatalf("L1: got seqs %v in %d batches, want %v in fewer than %d", got, batches, seqs, n)
			}

			// L2 (group): summary frames: counts add up, the first of each
			// follows the previous last_seq.
			ts.degrade(wire.ScopeGroup, gid, lv(2), 0)
			if d, _ := readUntil[*wire.Degraded](r0, 5*time.Second); d.Level != 2 {
				t.Fatalf("L2 notice: got %+v", d)
			}
			seqs = phase("l2")
			var count int64
			prev := seqs[0] - 1
			for _, f := range quietFrames(r0, quiet) {
				s, ok := f.(*wire.Summary)
				if !ok || s.GID != gid {
					t.Fatalf("L2: got %T %+v, want summary frames only", f, f)
				}
				if s.First.Seq != prev+1 || s.LastSeq != prev+s.Count {
					t.Fatalf("L2: summary %+v does not follow seq %d", s, prev)
				}
				count += s.Count
				prev = s.LastSeq
			}
			if count != n || prev != seqs[n-1] {
				t.Fatalf("L2: summaries cover %d messages up to %d, want %d up to %d", count, prev, n, seqs[n-1])
			}

			// L3 (group): one degraded notice, then nothing.
			ts.degrade(wire.ScopeGroup, gid, lv(3), 0)
			phase("l3")
			fs = quietFrames(r0, quiet)
			if len(fs) != 1 {
				t.Fatalf("L3: got %d frames %+v, want one degraded notice", len(fs), fs)
			}
			if d, ok := fs[0].(*wire.Degraded); !ok || d.GID != gid || d.Level != 3 {
				t.Fatalf("L3: got %+v, want degraded level 3", fs[0])
			}

			waitLevel := func(want int) {
				t.Helper()
				deadline := time.Now().Add(5 * time.Second)
				for {
					d, _ := readUntil[*wire.Degraded](r0, time.Until(deadline))
					if d.Level == want {
						return
					}
				}
			}
			// Back to L0 with a TTL'd level: a forced L1 that lapses.
			ts.degrade(wire.ScopeGroup, gid, nil, 0)
			waitLevel(0)
			ts.degrade(wire.ScopeGroup, gid, lv(1), 1)
			waitLevel(1)
			var status struct {
				Groups []wire.DegradeState `json:"groups"`
			}
			ts.do("GET", "/admin/v1/degrade", ts.admin, nil, &status)
			if len(status.Groups) != 1 || status.Groups[0].Forced == nil || *status.Groups[0].Forced != 1 || status.Groups[0].ExpiresAt == 0 {
				t.Fatalf("degrade status with ttl: got %+v", status.Groups)
			}
			waitLevel(0) // the TTL lapsed
			phase("l0b")
			for _, f := range quietFrames(r0, quiet) {
				if _, ok := f.(*wire.Msg); !ok {
					t.Fatalf("after the TTL: got %T, want msg frames", f)
				}
			}

			// Node L3: new connections refused with 429; sends still stored.
			ts.degrade(wire.ScopeNode, 0, lv(3), 0)
			if d, _ := readUntil[*wire.Degraded](r0, 5*time.Second); d.GID != 0 || d.Level != 3 {
				t.Fatalf("node L3 notice: got %+v", d)
			}
			if st := ts.dialStatus("r1"); st != http.StatusTooManyRequests {
				t.Errorf("dial at node L3: got status %d, want 429", st)
			}
			phase("n3")
			if fs := quietFrames(r0, quiet); len(fs) != 0 {
				t.Fatalf("node L3: got frames %+v, want none", fs)
			}

			// Node L4: sends refused with unavailable, nothing acked; dial 503.
			ts.degrade(wire.ScopeNode, 0, lv(4), 0)
			if st := ts.dialStatus("r1"); st != http.StatusServiceUnavailable {
				t.Errorf("dial at node L4: got status %d, want 503", st)
			}
			refused, errs := sendAll(t, sender, gid, "n4", 3)
			if len(refused) != 0 || len(errs) != 3 {
				t.Fatalf("node L4: got %d acks and %d errors, want 0 and 3", len(refused), len(errs))
			}
			for _, e := range errs {
				if e.Code != wire.CodeUnavailable || e.RetryAfterMS <= 0 {
					t.Fatalf("node L4: got %+v, want unavailable with retry_after_ms", e)
				}
			}
			var httpErr struct{ Error wire.ErrorBody }
			if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), ts.token("sender", 0), `{"id":"h4","body":1}`, &httpErr); st != http.StatusServiceUnavailable || httpErr.Error.Code != wire.CodeUnavailable {
				t.Errorf("HTTP send at node L4: got %d %q, want 503 unavailable", st, httpErr.Error.Code)
			}
			ts.degrade(wire.ScopeNode, 0, nil, 0)
			waitLevel(0)
			phase("end")

			// Every acked message is stored, with its body, densely.
			var page wire.MessagesPage
			ts.do("GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=1", gid), ts.token("r0", 0), nil, &page)
			if int64(len(page.Messages)) != page.LastSeq || len(page.Messages) != len(acked) {
				t.Fatalf("stored %d messages (last_seq %d), acked %d", len(page.Messages), page.LastSeq, len(acked))
			}
			for i, m := range page.Messages {
				if m.Seq != int64(i+1) || string(m.Body) != fmt.Sprintf("%q", acked[m.Seq]) {
					t.Fatalf("stored message %d: seq %d body %s, acked %q", i, m.Seq, m.Body, acked[m.Seq])
				}
			}

			// The protocol-following client: it pulled what the summaries
			// and L3 left out (on demand for L3: opening the group).
			led.settle(quiet)
			led.fill(true)
			ledSeqs := led.seqs()
			if int64(len(ledSeqs)) != page.LastSeq || led.last != page.LastSeq {
				t.Fatalf("ledger holds %d messages up to %d, store has %d", len(ledSeqs), led.last, page.LastSeq)
			}
			for _, m := range page.Messages {
				if h := led.have[m.Seq]; string(h.Body) != string(m.Body) || h.From != m.From {
					t.Fatalf("ledger seq %d: got %+v, stored %+v", m.Seq, h, m)
				}
			}
			if led.frames["summary"] == 0 || led.frames["batch"] == 0 || led.pulls < 2 {
				t.Errorf("ledger saw frames %v and pulled %d times: the levels were not exercised", led.frames, led.pulls)
			}
		})
	}
}

// TestAutomaticLevels floods a large group past its rate limit: sends over
// the limit wait in the group's buffer, the oldest beyond it are refused
// with rate_limited, members are told the group is degraded and get
// summaries, and a client following docs/protocol.md §10 still ends with exactly
// the stored sequence; once the traffic stops the level clears (after the
// hysteresis) and pushes are single messages again.
func TestAutomaticLevels(t *testing.T) {
	ts := startServer(t, "embedded", "-large-group-members", "1", "-group-rate", "20", "-group-buffer", "40",
		"-trigger-clear-after", "1s", "-hot-factor", "-1", "-merge-window", "100ms")
	gid := ts.createGroup("sender", "r0")
	sender := ts.dialRaw("sender")
	led := newLedger(t, ts.dialRaw("r0"), gid)
	const n = 80
	for i := range n {
		sender.send(fmt.Sprintf(`{"type":"send","id":"f%d","gid":%d,"body":"f%d"}`, i, gid, i))
	}
	acked, limited := 0, 0
	for acked+limited < n {
		switch f := sender.read(15 * time.Second).(type) {
		case *wire.Ack:
			acked++
		case *wire.Error:
			if f.Code != wire.CodeRateLimited || f.RetryAfterMS <= 0 {
				t.Fatalf("flood: got error %+v, want rate_limited with retry_after_ms", f)
			}
			limited++
		}
	}
	if limited == 0 || acked < 60 {
		t.Errorf("flood of %d: %d acked, %d rate_limited; want about 60 and 20", n, acked, limited)
	}
	// The ledger follows the pushes (summaries at L2) and pulls.
	deadline := time.Now().Add(10 * time.Second)
	for led.level != 0 || led.frames["summary"] == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("level did not rise and clear: frames %v, level %d", led.frames, led.level)
		}
		if f, err := led.rc.tryRead(200 * time.Millisecond); err == nil {
			led.handle(f)
			led.fill(false)
		}
	}
	if led.frames["degraded"] < 2 {
		t.Errorf("got %d degraded notices, want the rise and the clear", led.frames["degraded"])
	}
	sender.send(fmt.Sprintf(`{"type":"send","id":"after","gid":%d,"body":"after"}`, gid))
	if m, _ := readUntil[*wire.Msg](led.rc, 5*time.Second); m.Seq != int64(acked+1) {
		t.Errorf("after the clear: got msg seq %d, want %d", m.Seq, acked+1)
	} else {
		led.add(*m)
	}
	led.fill(true)
	var page wire.MessagesPage
	ts.do("GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=1", gid), ts.token("r0", 0), nil, &page)
	if len(page.Messages) != acked+1 || led.last != page.LastSeq || len(led.have) != len(page.Messages) {
		t.Fatalf("stored %d (last_seq %d), acked %d+1, ledger holds %d up to %d", len(page.Messages), page.LastSeq, acked, len(led.have), led.last)
	}
	for _, m := range page.Messages {
		if string(led.have[m.Seq].Body) != string(m.Body) {
			t.Fatalf("ledger seq %d: got %s, stored %s", m.Seq, led.have[m.Seq].Body, m.Body)
		}
	}
}
