package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws/wsutil"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestPushBytesOnWire: fanfare_push_bytes_total is the bytes the
// connections were sent: the gateway's Push reports the wire size of the
// frames it wrote and the engine counts that (there is no estimate), at L0
// (one msg frame a message), L1 (batch frames) and L2 (summary frames).
func TestPushBytesOnWire(t *testing.T) {
	ts := startServer(t, "embedded")
	for _, level := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("level=L%d", level), func(t *testing.T) {
			reader := fmt.Sprintf("bob%d", level) // alone online in the group
			gid := ts.createGroup("alice", reader)
			if level > 0 {
				ts.degrade(wire.ScopeGroup, gid, lv(level), 0)
			}
			before := pushBytes(t, ts)
			bob := ts.dialRaw(reader)
			const sends = 10
			for i := range sends {
				body := fmt.Sprintf(`{"text":"%s"}`, strings.Repeat("y", 40*i))
				if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), ts.token("alice", 0), fmt.Sprintf(`{"id":"m%d","body":%s}`, i, body), nil); st != http.StatusOK {
					t.Fatalf("send %d: status %d", i, st)
				}
			}
			// Read bob's pushes until the last seq arrived, summing their
			// size on the wire (an unmasked server frame: 2 header bytes up
			// to 125 payload bytes, 4 up to 65,535).
			wrote, last := 0, int64(0)
			for last < sends {
				bob.c.SetReadDeadline(time.Now().Add(10 * time.Second))
				b, err := wsutil.ReadServerText(bob.rw)
				if err != nil {
					t.Fatalf("read (last seq %d): %v", last, err)
				}
				f, err := wire.DecodeServer(b)
				if err != nil {
					t.Fatal(err)
				}
				switch f := f.(type) {
				case *wire.Msg:
					last = f.Seq
				case *wire.Batch:
					last = f.Messages[len(f.Messages)-1].Seq
				case *wire.Summary:
					last = f.LastSeq
				default:
					continue // not a push (a degraded notice)
				}
				wrote += len(b) + 2
				if len(b) > 125 {
					wrote += 2
				}
			}
			var got int64
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if got = pushBytes(t, ts) - before; got == int64(wrote) || time.Now().After(deadline) {
					break
				}
			}
			if got != int64(wrote) {
				t.Errorf("fanfare_push_bytes_total grew by %d, want %d (the bytes bob was sent)", got, wrote)
			}
		})
	}
}

var pushBytesLine = regexp.MustCompile(`(?m)^fanfare_push_bytes_total (\S+)$`)

// pushBytes scrapes fanfare_push_bytes_total.
func pushBytes(t *testing.T, ts *testServer) int64 {
	t.Helper()
	resp, err := http.Get(ts.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := pushBytesLine.FindSubmatch(body)
	if m == nil {
		return 0 // not exported before the first push
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return int64(v)
}
