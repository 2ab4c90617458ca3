package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestSyncPages: GET /v1/sync answers at most -sync-page groups in gid
// order, with next_after only while more remain; following it (after_gid)
// visits every group once. A client that ignores the cursor gets the first
// page. The Go SDK follows the cursor: Sync returns every group and the
// catch-up after connect reaches groups past the first page. A user in
// exactly one page gets no cursor, and a bad after_gid is bad_request.
func TestSyncPages(t *testing.T) {
	const page, groups = 4, 11 // pages of 4, 4 and 3
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-sync-page", fmt.Sprint(page))
			var want []int64 // reader's gids, ascending
			for i := range groups {
				gid := ts.createGroup("sender", "reader")
				want = append(want, gid)
				ts.sendBig(gid, "sender", i%3+1, 16)
				if i == 5 {
					ts.createGroup("sender") // a gid between the reader's
				}
			}
			var exact []int64
			for range page {
				exact = append(exact, ts.createGroup("sender", "exact"))
			}
			reader := ts.token("reader", 0)

			// Raw pages: each within the bound, next_after only while
			// more remain, together every group once, in gid order.
			var seen []int64
			var after int64
			for n := 0; ; n++ {
				path := "/v1/sync"
				if after > 0 {
					path += fmt.Sprintf("?after_gid=%d", after)
				}
				var raw map[string]json.RawMessage
				if st := ts.do("GET", path, reader, nil, &raw); st != http.StatusOK {
					t.Fatalf("GET %s: status %d", path, st)
				}
				var resp wire.SyncResponse
				body, _ := json.Marshal(raw)
				if err := json.Unmarshal(body, &resp); err != nil {
					t.Fatal(err)
				}
				if len(resp.Groups) > page {
					t.Fatalf("GET %s: got %d groups, want at most %d", path, len(resp.Groups), page)
				}
				if n == 0 && len(resp.Groups) != page {
					t.Fatalf("first page (the answer of a client that ignores the cursor): got %d groups, want %d", len(resp.Groups), page)
				}
				for _, g := range resp.Groups {
					seen = append(seen, g.GID)
					i := slices.Index(want, g.GID)
					if wantSeq := int64(i%3 + 1); i < 0 || g.LastSeq != wantSeq || g.Unread != wantSeq {
						t.Errorf("GET %s: entry %+v, want one of the reader's groups with last_seq and unread %d", path, g, wantSeq)
					}
				}
				_, hasNext := raw["next_after"]
				if more := len(seen) < groups; hasNext != more {
					t.Fatalf("GET %s: next_after present %v (%d), want %v after %d of %d groups", path, hasNext, resp.NextAfter, more, len(seen), groups)
				}
				if !hasNext {
					break
				}
				if last := resp.Groups[len(resp.Groups)-1].GID; resp.NextAfter != last {
					t.Fatalf("GET %s: next_after %d, want the page's last gid %d", path, resp.NextAfter, last)
				}
				after = resp.NextAfter
			}
			if !slices.Equal(seen, want) {
				t.Fatalf("pages: got gids %v, want %v", seen, want)
			}

			// Exactly one page: no cursor. Past the end: empty, no cursor.
			var raw map[string]json.RawMessage
			ts.do("GET", "/v1/sync", ts.token("exact", 0), nil, &raw)
			if _, ok := raw["next_after"]; ok || string(raw["groups"]) == "" {
				t.Errorf("a user in exactly one page: got %s, want its groups and no next_after", mustJSON(t, raw))
			}
			var resp wire.SyncResponse
			ts.do("GET", fmt.Sprintf("/v1/sync?after_gid=%d", exact[len(exact)-1]), ts.token("exact", 0), nil, &resp)
			if len(resp.Groups) != 0 || resp.NextAfter != 0 {
				t.Errorf("after the last group: got %+v, want no groups and no next_after", resp)
			}
			for _, bad := range []string{"-1", "x"} {
				var er wire.ErrorResponse
				if st := ts.do("GET", "/v1/sync?after_gid="+bad, reader, nil, &er); st != http.StatusBadRequest || er.Error.Code != wire.CodeBadRequest {
					t.Errorf("after_gid=%s: got %d %+v, want 400 bad_request", bad, st, er)
				}
			}

			// The SDK: Sync follows the cursor, and the catch-up after
			// connect delivers the messages of every group.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var (
				mu    sync.Mutex
				got   = map[int64]int{}
				total int
				done  = make(chan struct{})
			)
			for i := range groups {
				total += i%3 + 1
			}
			c, err := client.Dial(ctx, client.Config{URL: ts.ws + "/ws", HTTPURL: ts.http, Token: reader,
				OnMessage: func(m client.Message) {
					mu.Lock()
					defer mu.Unlock()
					got[m.GID]++
					if total--; total == 0 {
						close(done)
					}
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			select {
			case <-done:
			case <-ctx.Done():
				mu.Lock()
				t.Fatalf("catch-up after connect: got messages per group %v, want all %d groups", got, groups)
			}
			sg, err := c.Sync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var gids []int64
			for _, g := range sg {
				gids = append(gids, g.GID)
			}
			if !slices.Equal(gids, want) {
				t.Errorf("client Sync: got gids %v, want %v", gids, want)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
