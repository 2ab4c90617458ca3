package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws/wsutil"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// bigBody returns a JSON string body of exactly n bytes, marked with i.
func bigBody(i, n int) string {
	head := fmt.Sprintf(`"%06d`, i)
	return head + strings.Repeat("x", n-len(head)-1) + `"`
}

// sendBig stores count messages of n-byte bodies in gid as uid (admin
// sends over HTTP) and returns their bodies by seq (index 0 = seq 1).
func (ts *testServer) sendBig(gid int64, uid string, count, n int) []string {
	ts.t.Helper()
	bodies := make([]string, count)
	for i := range count {
		bodies[i] = bigBody(i, n)
		var res wire.SendResponse
		req := fmt.Sprintf(`{"id":"big-%d","body":%s}`, i, bodies[i])
		if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages?as=%s", gid, uid), ts.admin, req, &res); st != http.StatusOK {
			ts.t.Fatalf("send %d: status %d", i, st)
		}
		if res.Seq != int64(i+1) {
			ts.t.Fatalf("send %d: seq %d, want %d", i, res.Seq, i+1)
		}
	}
	return bodies
}

// TestPullLargeBodiesSDK is issue 12's reproduction: 150 stored bodies of
// 30 KiB (and 200 of 22 KB) make a 200-message page of 4.4-4.6 MB, above
// the 4 MiB hard outbound bound (4 x the default -outbound-bytes). Before
// pages were bounded by bytes the server closed the reader's socket (1008)
// on every catch-up pull and the Go SDK reconnected forever without
// delivering anything. Now the SDK catches up over the real socket, page
// by page, with no reconnect, and gets every message in order, intact.
func TestPullLargeBodiesSDK(t *testing.T) {
	for _, tc := range []struct{ count, size int }{{150, 30 << 10}, {200, 22000}} {
		for _, mode := range modes {
			t.Run(fmt.Sprintf("%dx%d/%s", tc.count, tc.size, mode), func(t *testing.T) {
				ts := startServer(t, mode)
				gid := ts.createGroup("sender", "reader")
				bodies := ts.sendBig(gid, "sender", tc.count, tc.size)

				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				var (
					mu   sync.Mutex
					got  []client.Message
					done = make(chan struct{})
				)
				c, err := client.Dial(ctx, client.Config{URL: ts.ws + "/ws", Token: ts.token("reader", 0),
					BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
					OnMessage: func(m client.Message) {
						mu.Lock()
						defer mu.Unlock()
						m.Body = append(json.RawMessage(nil), m.Body...)
						got = append(got, m)
						if len(got) == tc.count {
							close(done)
						}
					}})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.Track(gid, 0)
				select {
				case <-done:
				case <-time.After(45 * time.Second):
					mu.Lock()
					n := len(got)
					mu.Unlock()
					t.Fatalf("delivered %d of %d messages in 45 s (stats %+v)", n, tc.count, c.Stats())
				}
				mu.Lock()
				defer mu.Unlock()
				for i, m := range got {
					if m.Seq != int64(i+1) || string(m.Body) != bodies[i] {
						t.Fatalf("message %d: seq %d, body of %d bytes; want seq %d, body of %d bytes", i, m.Seq, len(m.Body), i+1, len(bodies[i]))
					}
				}
				st := c.Stats()
				if st.Reconnects != 0 {
					t.Errorf("got %d reconnects, want 0 (stats %+v)", st.Reconnects, st)
				}
				// Several pages, each within the budget: at least the
				// payload divided by the page budget.
				if min := uint64(tc.count*tc.size/gateway.DefaultPageBytes) + 1; st.Pulls < min {
					t.Errorf("got %d pulls, want at least %d pages of at most %d bytes", st.Pulls, min, gateway.DefaultPageBytes)
				}
			})
		}
	}
}

// TestPullPagesByBytesHTTPAndWS walks 150 x 30 KiB over HTTP and over a raw
// socket: every answer is within -page-bytes, says in next_seq where the
// next page starts until the last one, and the pages together hold every
// message once, in order.
func TestPullPagesByBytesHTTPAndWS(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			const count, size, budget = 150, 30 << 10, 200 << 10
			ts := startServer(t, mode, "-page-bytes", fmt.Sprint(budget))
			gid := ts.createGroup("sender", "reader")
			bodies := ts.sendBig(gid, "sender", count, size)
			tok := ts.token("reader", 0)
			check := func(path string, raw []byte, page *wire.Messages, from int64) int64 {
				t.Helper()
				if len(raw) > budget {
					t.Fatalf("%s: from %d: answer of %d bytes, budget %d", path, from, len(raw), budget)
				}
				if len(page.Messages) == 0 || page.Messages[0].Seq != from {
					t.Fatalf("%s: from %d: page of %d messages, want some from %d", path, from, len(page.Messages), from)
				}
				for i, m := range page.Messages {
					if m.Seq != from+int64(i) || string(m.Body) != bodies[m.Seq-1] {
						t.Fatalf("%s: from %d: message %d has seq %d", path, from, i, m.Seq)
					}
				}
				last := page.Messages[len(page.Messages)-1].Seq
				if page.LastSeq != count {
					t.Fatalf("%s: last_seq %d, want %d", path, page.LastSeq, count)
				}
				switch {
				case last < count && page.NextSeq != last+1:
					t.Fatalf("%s: from %d: page ends at %d with next_seq %d, want %d", path, from, last, page.NextSeq, last+1)
				case last == count && page.NextSeq != 0:
					t.Fatalf("%s: last page has next_seq %d, want none", path, page.NextSeq)
				}
				// The next message would not have fit.
				if page.NextSeq != 0 && len(raw)+size < budget-200 {
					t.Fatalf("%s: from %d: page of %d bytes stopped though %d more would fit", path, from, len(raw), size)
				}
				return page.NextSeq
			}

			pages := 0
			for from := int64(1); from != 0; pages++ {
				path := fmt.Sprintf("/v1/groups/%d/messages?from_seq=%d", gid, from)
				req, _ := http.NewRequest("GET", ts.http+path, nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				raw, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("GET %s: status %d, %v", path, resp.StatusCode, err)
				}
				var p wire.MessagesPage
				if err := json.Unmarshal(raw, &p); err != nil {
					t.Fatal(err)
				}
				from = check("HTTP", raw, &wire.Messages{GID: p.GID, Messages: p.Messages, LastSeq: p.LastSeq, NextSeq: p.NextSeq}, from)
			}
			if want := count*size/budget + 1; pages < want {
				t.Errorf("HTTP: %d pages, want at least %d", pages, want)
			}

			rc := ts.dialRaw("reader")
			for from, n := int64(1), 0; from != 0; n++ {
				rc.send(fmt.Sprintf(`{"type":"pull","id":"p%d","gid":%d,"from_seq":%d}`, n, gid, from))
				rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
				var raw []byte
				var f wire.ServerFrame
				for {
					var err error
					raw, err = wsutil.ReadServerText(rc.rw)
					if err != nil {
						t.Fatalf("pull from %d: %v", from, err)
					}
					if f, err = wire.DecodeServer(raw); err != nil {
						t.Fatal(err)
					}
					if _, p := f.(*wire.Presence); !p {
						break // presence frames (the group's online count) may come between
					}
				}
				page, ok := f.(*wire.Messages)
				if !ok {
					t.Fatalf("pull from %d: got %T, want messages", from, f)
				}
				from = check("WS", raw, page, from)
			}
		})
	}
}

// TestPullPageMinBudget: at the smallest -page-bytes, a message of the
// largest body the store takes still makes a page of its own (a page
// always holds one message), within the budget, over both paths.
func TestPullPageMinBudget(t *testing.T) {
	ts := startServer(t, "embedded", "-page-bytes", fmt.Sprint(gateway.MinPageBytes))
	gid := ts.createGroup("sender", "reader")
	// The largest body; and a sender name of 128 bytes that escapes to
	// six bytes each on the wire.
	long := strings.Repeat("\x01", 128)
	ts.addMembers(gid, long)
	var res wire.SendResponse
	body := bigBody(0, 32<<10)
	for i, as := range []string{"sender", strings.Repeat("%01", 128)} {
		if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages?as=%s", gid, as), ts.admin, fmt.Sprintf(`{"id":"m%d","body":%s}`, i, body), &res); st != http.StatusOK {
			t.Fatalf("send %d: status %d", i, st)
		}
	}
	rc := ts.dialRaw("reader")
	for from := int64(1); from <= 2; from++ {
		rc.send(fmt.Sprintf(`{"type":"pull","id":"p%d","gid":%d,"from_seq":%d}`, from, gid, from))
		rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		raw, err := wsutil.ReadServerText(rc.rw)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := wire.DecodeServer(raw)
		page, ok := f.(*wire.Messages)
		if !ok {
			t.Fatalf("pull from %d: got %T %+v", from, f, f)
		}
		if len(page.Messages) != 1 || page.Messages[0].Seq != from {
			t.Fatalf("pull from %d: got %d messages, want only seq %d", from, len(page.Messages), from)
		}
		if len(raw) > gateway.MinPageBytes {
			t.Fatalf("pull from %d: page of %d bytes, budget %d", from, len(raw), gateway.MinPageBytes)
		}
		if from == 1 && page.NextSeq != 2 {
			t.Fatalf("pull from 1: next_seq %d, want 2", page.NextSeq)
		}
	}
}

// TestPullBadRangeSameOnHTTPAndWS: a range the pull frame refuses is
// refused by GET /v1/groups/{gid}/messages with the same code and message
// (400). An inverted range used to reach the store over HTTP and come back
// as a bare "bad request" while the socket said "to_seq: must not be below
// from_seq".
func TestPullBadRangeSameOnHTTPAndWS(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode)
			gid := ts.createGroup("reader")
			tok := ts.token("reader", 0)
			rc := ts.dialRaw("reader")
			for i, tc := range []struct {
				gid, from, to string // JSON values; "" = absent
			}{
				{fmt.Sprint(gid), "9", "3"},
				{fmt.Sprint(gid), "-1", ""},
				{fmt.Sprint(gid), "", "-5"},
				{fmt.Sprint(gid), "1", "99999999999999999999"},
				{"0", "1", "2"},
				{"-3", "1", "2"},
			} {
				frame := fmt.Sprintf(`{"type":"pull","id":"r%d","gid":%s`, i, tc.gid)
				q := "?"
				if tc.from != "" {
					frame += `,"from_seq":` + tc.from
					q += "from_seq=" + tc.from + "&"
				}
				if tc.to != "" {
					frame += `,"to_seq":` + tc.to
					q += "to_seq=" + tc.to
				}
				rc.send(frame + "}")
				wsErr, _ := readUntil[*wire.Error](rc, 5*time.Second)
				var httpErr wire.ErrorResponse
				st := ts.do("GET", "/v1/groups/"+tc.gid+"/messages"+q, tok, nil, &httpErr)
				if st != http.StatusBadRequest || wsErr.Code != wire.CodeBadRequest || wsErr.ID != fmt.Sprintf("r%d", i) {
					t.Errorf("%s: HTTP %d, WS %+v; want 400 and bad_request", frame, st, wsErr)
				}
				if httpErr.Error.Code != wsErr.Code || httpErr.Error.Message != wsErr.Message {
					t.Errorf("%s: HTTP says %s %q, WS says %s %q", frame, httpErr.Error.Code, httpErr.Error.Message, wsErr.Code, wsErr.Message)
				}
			}
		})
	}
}
