package web

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway"
)

func newAPI(t *testing.T, cfg Config) http.Handler {
	t.Helper()
	a, err := gateway.NewAPI(gateway.APIConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := Register(a, cfg); err != nil {
		t.Fatal(err)
	}
	return a.Handler()
}

func TestContentType(t *testing.T) {
	for name, want := range map[string]string{
		"index.html": "text/html; charset=utf-8", "a/b.js": "text/javascript; charset=utf-8",
		"x.css": "text/css; charset=utf-8", "index.d.ts": "text/plain; charset=utf-8",
		"blob": "application/octet-stream", "x.exe": "application/octet-stream",
	} {
		if got := ContentType(name); got != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
}

// TestDemoCSPHost: the demo's connect-src names the host the page was
// loaded from on the WebSocket port; a Host header that is not a host
// name adds nothing (it cannot inject a CSP source).
func TestDemoCSPHost(t *testing.T) {
	h := newAPI(t, Config{Demo: true, WSPort: func() string { return "8081" }})
	for _, tt := range []struct{ host, want, not string }{
		{"127.0.0.1:8080", "connect-src 'self' ws://127.0.0.1:8081 wss://127.0.0.1:8081;", ""},
		{"localhost:8080", "ws://localhost:8081", ""},
		{"[::1]:8080", "ws://[::1]:8081", ""},
		{"evil.example:8080; script-src *", "ws://evil.example:8081 ", "script-src *"}, // only the host part is used
		{"evil;script-src *", "connect-src 'self';", "script-src *"},
		{"a b:1", "connect-src 'self';", "ws://"},
	} {
		r := httptest.NewRequest("GET", "/demo/", nil)
		r.Host = tt.host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		csp := w.Header().Get("Content-Security-Policy")
		if w.Code != 200 || !strings.Contains(csp, tt.want) || (tt.not != "" && strings.Contains(csp, tt.not)) {
			t.Errorf("Host %q: got %d CSP %q, want it to contain %q and not %q", tt.host, w.Code, csp, tt.want, tt.not)
		}
	}
}

// TestRevalidate: a page answers If-None-Match with 304, HEAD without a
// body, and other methods with the API's 405.
func TestRevalidate(t *testing.T) {
	h := newAPI(t, Config{Admin: true})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/admin/admin.js", nil))
	etag := w.Header().Get("ETag")
	if w.Code != 200 || etag == "" || w.Body.Len() == 0 {
		t.Fatalf("GET: got %d etag %q and %d bytes", w.Code, etag, w.Body.Len())
	}
	r := httptest.NewRequest("GET", "/admin/admin.js", nil)
	r.Header.Set("If-None-Match", etag)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusNotModified {
		t.Errorf("If-None-Match: got %d, want 304", w.Code)
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("HEAD", "/admin/", nil))
	if w.Code != 200 || w.Body.Len() != 0 || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
		t.Errorf("HEAD: got %d, %d bytes, %q", w.Code, w.Body.Len(), w.Header().Get("Content-Type"))
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/admin/", nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /admin/: got %d, want 405", w.Code)
	}
}

func TestDevConfigValidate(t *testing.T) {
	ok := DevConfig{Backend: nil, TTL: MaxTokenTTL}
	if err := ok.Validate(); err == nil || !strings.Contains(err.Error(), "Backend") {
		t.Errorf("no backend: got %v, want Backend named", err)
	}
	for _, c := range []DevConfig{{TTL: MaxTokenTTL + time.Second}, {TTL: -1}, {Rate: -1}, {Burst: -1}, {MaxMembers: -1}} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "must") {
			t.Errorf("%+v: got %v, want a bound named", c, err)
		}
	}
}

// TestNoTokenRouteWithoutDev: the demo without Config.Dev has no token
// route, and the pages of a turned-off part are not routed.
func TestNoTokenRouteWithoutDev(t *testing.T) {
	h := newAPI(t, Config{Demo: true})
	for _, tt := range []struct {
		method, path string
		want         int
	}{
		{"POST", "/demo/token", http.StatusNotFound},
		{"GET", "/demo/", 200},
		{"GET", "/admin/", http.StatusNotFound},
		{"GET", "/sdk/src/index.js", http.StatusNotFound},
		{"GET", "/rooms/sale/", http.StatusNotFound}, // the room page is off: the API's JSON 404
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(tt.method, tt.path, strings.NewReader("{}")))
		if w.Code != tt.want {
			t.Errorf("%s %s: got %d, want %d", tt.method, tt.path, w.Code, tt.want)
		}
	}
}
