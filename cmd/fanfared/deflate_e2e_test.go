package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/client"
)

// TestDeflateEndToEnd: with -ws-deflate, a Go SDK client that offers
// permessage-deflate and one that does not both get every message, in
// order and intact (large bodies compressed, small ones plain), and
// fanfare_push_bytes_total counts the compressed bytes: less than the
// plain bytes of the same pushes, more than nothing.
func TestDeflateEndToEnd(t *testing.T) {
	ts := startServer(t, "embedded", "-ws-deflate")
	gid := ts.createGroup("alice", "zed", "plain")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dial := func(uid string, deflate bool) *client.Conn {
		c, err := client.Dial(ctx, client.Config{URL: ts.ws + "/ws", HTTPURL: ts.http, Token: ts.token(uid, 0),
			Deflate: deflate, Cursors: map[int64]int64{gid: 0}})
		if err != nil {
			t.Fatalf("dial %s: %v", uid, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	zed, plain := dial("zed", true), dial("plain", false)
	time.Sleep(200 * time.Millisecond) // both registered before the first push (a miss would be pulled, not pushed)
	before := pushBytes(t, ts)
	const sends = 20
	want := make([]string, sends)
	plainBytes := 0
	for i := range sends {
		text := strings.Repeat(fmt.Sprintf("goal by number %d in minute %d! ", i, 10+i), 1+i*3)
		want[i] = fmt.Sprintf(`{"text":%q}`, text)
		if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), ts.token("alice", 0),
			fmt.Sprintf(`{"id":"m%d","body":%s}`, i, want[i]), nil); st != http.StatusOK {
			t.Fatalf("send %d: status %d", i, st)
		}
	}
	for name, c := range map[string]*client.Conn{"zed (deflate)": zed, "plain": plain} {
		for i := range sends {
			select {
			case m := <-c.Messages():
				if m.Seq != int64(i+1) || string(m.Body) != want[i] {
					t.Fatalf("%s: message %d: seq %d body %.60q, want seq %d body %.60q", name, i, m.Seq, m.Body, i+1, want[i])
				}
				if name == "plain" {
					plainBytes += len(m.Body)
				}
			case <-ctx.Done():
				t.Fatalf("%s: got %d of %d messages", name, i, sends)
			}
		}
	}
	// Both recipients' bytes: the plain one gets at least the bodies, the
	// deflate one a fraction of them.
	var got int64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got = pushBytes(t, ts) - before; got > int64(plainBytes) {
			break
		}
	}
	if got <= int64(plainBytes) || got >= int64(2*plainBytes) {
		t.Fatalf("fanfare_push_bytes_total grew by %d; want between the plain recipient's %d body bytes and twice that (the deflate one gets far less)", got, plainBytes)
	}
	t.Logf("push bytes for both recipients: %d; bodies alone for one: %d", got, plainBytes)
}
