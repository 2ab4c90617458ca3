package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestRetention: with -retention, messages older than it disappear from
// pulls in both modes, seqs go on (last_seq stays, a new message takes
// the next seq) and a pull from seq 1 starts at the oldest message left.
func TestRetention(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-retention", "1s", "-retention-interval", "100ms")
			gid := ts.createGroup("alice", "bob")
			alice := ts.token("alice", 0)
			send := func(id string) int64 {
				t.Helper()
				var ack struct{ Seq int64 }
				if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), alice, map[string]string{"id": id, "body": `"hi"`}, &ack); st != http.StatusOK {
					t.Fatalf("send %s: status %d", id, st)
				}
				return ack.Seq
			}
			page := func() wire.MessagesPage {
				t.Helper()
				var p wire.MessagesPage
				if st := ts.do("GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=1", gid), ts.token("bob", 0), nil, &p); st != http.StatusOK {
					t.Fatalf("pull: status %d", st)
				}
				return p
			}
			for i := range 3 {
				send(fmt.Sprint("old-", i))
			}
			if p := page(); len(p.Messages) != 3 {
				t.Fatalf("before expiry: %d messages, want 3", len(p.Messages))
			}
			deadline := time.Now().Add(10 * time.Second)
			for p := page(); len(p.Messages) > 0; p = page() {
				if time.Now().After(deadline) {
					t.Fatalf("messages older than 1 s still there after 10 s: %d", len(p.Messages))
				}
				time.Sleep(50 * time.Millisecond)
			}
			if seq := send("new"); seq != 4 {
				t.Fatalf("new message after expiry: seq %d, want 4", seq)
			}
			p := page()
			if p.LastSeq != 4 || len(p.Messages) != 1 || p.Messages[0].Seq != 4 {
				t.Fatalf("pull from 1 after expiry: last_seq %d, %d messages; want last_seq 4 and seq 4 alone", p.LastSeq, len(p.Messages))
			}
		})
	}
}
