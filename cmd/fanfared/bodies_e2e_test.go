package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestLoneSurrogateBodyRefused: a body holding an unpaired UTF-16
// surrogate escape is refused with bad_request over the socket and over
// HTTP, and nothing is stored (it used to be stored and relayed as is);
// a body with a surrogate pair is taken.
func TestLoneSurrogateBodyRefused(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode)
			gid := ts.createGroup("alice")
			tok := ts.token("alice", 0)
			rc := ts.dialRaw("alice")
			for i, body := range []string{`"\ud800"`, `{"t":"x\udc00"}`, `["\udf89\ud83c"]`} {
				rc.send(fmt.Sprintf(`{"type":"send","id":"ws-%d","gid":%d,"body":%s}`, i, gid, body))
				e, _ := readUntil[*wire.Error](rc, 5*time.Second)
				if e.Code != wire.CodeBadRequest || e.ID != fmt.Sprintf("ws-%d", i) || !strings.Contains(e.Message, "surrogate") {
					t.Errorf("WS send %s: got %+v, want bad_request about the surrogate", body, e)
				}
				var er wire.ErrorResponse
				if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), tok, fmt.Sprintf(`{"id":"h-%d","body":%s}`, i, body), &er); st != http.StatusBadRequest || er.Error.Code != wire.CodeBadRequest {
					t.Errorf("HTTP send %s: got %d %+v, want 400 bad_request", body, st, er)
				}
			}
			var page wire.MessagesPage
			if st := ts.do("GET", fmt.Sprintf("/v1/groups/%d/messages", gid), tok, nil, &page); st != http.StatusOK || page.LastSeq != 0 {
				t.Fatalf("after refused sends: status %d, last_seq %d; want nothing stored", st, page.LastSeq)
			}
			rc.send(fmt.Sprintf(`{"type":"send","id":"pair","gid":%d,"body":"\ud83c\udf89"}`, gid))
			if a, _ := readUntil[*wire.Ack](rc, 5*time.Second); a.Seq != 1 {
				t.Fatalf("send of a pair: got seq %d, want 1", a.Seq)
			}
		})
	}
}
