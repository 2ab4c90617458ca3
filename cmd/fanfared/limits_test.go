package main

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestRateLimits: the default per-user send limit (5/s, burst 10) answers
// rate_limited with retry_after_ms over WebSocket and 429 with Retry-After
// and RateLimit headers over HTTP; limits change at runtime through the
// admin API and through a SIGHUP reload of the limits file.
func TestRateLimits(t *testing.T) {
	// A limits file naming a retired rule stops the start, naming where
	// the setting lives now; one without them loads.
	for name, flag := range map[string]string{"group": "-group-rate", "downlink": "-downlink-rate", "at_all": "-at-all-per-day", "egress": "-egress-bandwidth"} {
		bad := writeFile(t, "retired-"+name+".json", `{"rules":{"`+name+`":{"limit":0}}}`)
		if _, err := loadLimits(bad); err == nil || !strings.Contains(err.Error(), `rule "`+name+`" was removed`) || !strings.Contains(err.Error(), "fanfared "+flag) {
			t.Errorf("limits file naming %s: got %v, want an error naming %s", name, err, flag)
		}
	}

	file := writeFile(t, "limits.json", `{"rules":{}}`) // the §8 defaults
	ts := startServer(t, "embedded", "-limits-file", file)
	gid := ts.createGroup("alice", "bob")
	rc := ts.dialRaw("alice")
	sendBurst := func(n int, prefix string) (acked int, limited *wire.Error) {
		for i := range n {
			rc.send(fmt.Sprintf(`{"type":"send","id":"%s%d","gid":%d,"body":1}`, prefix, i, gid))
		}
		for answers := 0; answers < n; {
			switch f := rc.read(5 * time.Second).(type) {
			case *wire.Ack:
				acked++
				answers++
			case *wire.Error:
				if f.Code != wire.CodeRateLimited {
					t.Fatalf("got error %+v, want rate_limited", f)
				}
				limited = f
				answers++
			}
		}
		return acked, limited
	}
	acked, limited := sendBurst(15, "a")
	if acked < 10 || acked > 11 || limited == nil || limited.RetryAfterMS <= 0 {
		t.Fatalf("burst of 15 at 5/s burst 10: %d acked, last denial %+v; want 10 (or 11) and rate_limited with retry_after_ms", acked, limited)
	}

	// HTTP: 429 with Retry-After and the IETF RateLimit headers.
	req, _ := http.NewRequest("POST", fmt.Sprintf("%s/v1/groups/%d/messages", ts.http, gid), strings.NewReader(`{"id":"h1","body":1}`))
	req.Header.Set("Authorization", "Bearer "+ts.token("alice", 0))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(resp.Header.Get("RateLimit-Policy"), `"user_group";q=`) || resp.Header.Get("RateLimit") == "" {
		t.Errorf("HTTP over the limit: %d, headers %v", resp.StatusCode, resp.Header)
	}

	// The admin API changes limits at once.
	var lim struct {
		Rules map[string]map[string]any `json:"rules"`
	}
	ts.do("GET", "/admin/v1/limits", ts.admin, nil, &lim)
	if lim.Rules["user_group"]["limit"] != 5.0 {
		t.Fatalf("GET limits: user_group %+v, want limit 5", lim.Rules["user_group"])
	}
	if st := ts.do("PUT", "/admin/v1/limits", ts.admin, `{"rules":{"user_group":{"limit":0},"user_all":{"limit":0}}}`, nil); st != http.StatusOK {
		t.Fatalf("PUT limits: %d", st)
	}
	if acked, limited := sendBurst(30, "b"); acked != 30 {
		t.Fatalf("after lifting the limit: %d of 30 acked (%+v)", acked, limited)
	}
	if st := ts.do("PUT", "/admin/v1/limits", ts.admin, `{"rules":{"user_group":{"limit":-3}}}`, nil); st != http.StatusBadRequest {
		t.Errorf("PUT invalid limits: %d, want 400", st)
	}
	// A rule the engine's tuning governs is refused, naming where it lives;
	// the limits in force are kept.
	var refused struct{ Error wire.ErrorBody }
	if st := ts.do("PUT", "/admin/v1/limits", ts.admin, `{"rules":{"user_group":{"limit":1},"downlink":{"limit":0}}}`, &refused); st != http.StatusBadRequest ||
		refused.Error.Code != wire.CodeBadRequest || !strings.Contains(refused.Error.Message, `rule "downlink" was removed`) ||
		!strings.Contains(refused.Error.Message, "fanfared -downlink-rate") {
		t.Errorf("PUT a retired rule: %d %+v, want 400 bad_request naming -downlink-rate", st, refused.Error)
	}
	ts.do("GET", "/admin/v1/limits", ts.admin, nil, &lim)
	if _, ok := lim.Rules["downlink"]; ok || lim.Rules["user_group"]["limit"] != 0.0 {
		t.Errorf("after the refused PUT: rules %v, want user_group 0 (kept) and no downlink", lim.Rules)
	}

	// SIGHUP re-reads the file: back to a tight limit.
	if err := os.WriteFile(file, []byte(`{"rules":{"user_group":{"algorithm":"gcra","limit":1,"window":"1s","burst":2}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ts.srv.reload(); err != nil {
		t.Fatal(err)
	}
	if acked, _ := sendBurst(5, "c"); acked > 3 {
		t.Errorf("after reload to burst 2: %d of 5 acked", acked)
	}
	// A broken file keeps the limits in force.
	os.WriteFile(file, []byte(`{"rules":`), 0o600)
	if err := ts.srv.reload(); err == nil {
		t.Error("reload of a broken file: got nil error")
	}
}
