package web

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fanfare-im/fanfare/gateway"
)

func roomsAPI(t *testing.T, rc RoomsConfig) http.Handler {
	t.Helper()
	if rc.Exists == nil {
		rc.Exists = func(room string) bool { return room == "sale" || room == "a.b-c_d" }
	}
	return newAPI(t, Config{Rooms: &rc, WSPort: func() string { return "8081" }})
}

func get(h http.Handler, path string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", path, nil)
	r.Host = "queue.example:8080"
	h.ServeHTTP(w, r)
	return w
}

// TestRoomPage: a room's page is the page with the room page's CSP; an
// unknown room (or a name no room can have) is the 404 page, as HTML,
// naming the room only when it is a room name, escaped.
func TestRoomPage(t *testing.T) {
	h := roomsAPI(t, RoomsConfig{})
	for _, tt := range []struct {
		path, name string
		want       int
		body, not  string
	}{
		{"/rooms/sale/", "the page", 200, `<script type="module" src="page.js">`, ""},
		{"/rooms/a.b-c_d/", "a name with every allowed character", 200, `id="position"`, ""},
		{"/rooms/nope/", "unknown room", 404, "no waiting room called “<b>nope</b>”", "page.js"},
		{"/rooms/%3Cscript%3E/", "not a room name", 404, "No such waiting room", "script&gt"},
		{"/rooms/" + strings.Repeat("x", 65) + "/", "a name too long", 404, "No such waiting room", strings.Repeat("x", 65)},
	} {
		w := get(h, tt.path)
		csp := w.Header().Get("Content-Security-Policy")
		if w.Code != tt.want || !strings.Contains(w.Body.String(), tt.body) || (tt.not != "" && strings.Contains(w.Body.String(), tt.not)) {
			t.Errorf("%s (%s): got %d, body containing %q: %v, want %d", tt.path, tt.name, w.Code, tt.body, strings.Contains(w.Body.String(), tt.body), tt.want)
		}
		if ct := w.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Errorf("%s: Content-Type %q", tt.path, ct)
		}
		for _, want := range []string{"script-src 'self';", "style-src 'self';", "img-src 'self' data: https:;",
			"connect-src 'self' ws://queue.example:8081 wss://queue.example:8081;", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("%s: CSP %q lacks %q", tt.path, csp, want)
			}
		}
		if w.Header().Get("X-Frame-Options") != "DENY" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: security headers missing: %v", tt.path, w.Header())
		}
	}
}

// TestRoomPageFiles: the page's files are served under every room's path
// (the 404 page uses its stylesheet too), with their types; other paths
// under /rooms/{room}/ are the API's JSON 404; /rooms/{room} redirects.
func TestRoomPageFiles(t *testing.T) {
	h := roomsAPI(t, RoomsConfig{})
	for _, tt := range []struct {
		path string
		want int
		ct   string
	}{
		{"/rooms/sale/page.js", 200, "text/javascript; charset=utf-8"},
		{"/rooms/sale/strings.js", 200, "text/javascript; charset=utf-8"},
		{"/rooms/nope/page.css", 200, "text/css; charset=utf-8"},
		{"/rooms/sale/index.html", 404, "application/json"},    // the page is only at the room's path
		{"/rooms/sale/notfound.html", 404, "application/json"}, // a template, never a file
		{"/rooms/sale/other.js", 404, "application/json"},
	} {
		w := get(h, tt.path)
		if w.Code != tt.want || !strings.HasPrefix(w.Header().Get("Content-Type"), tt.ct) {
			t.Errorf("%s: got %d %q, want %d %q", tt.path, w.Code, w.Header().Get("Content-Type"), tt.want, tt.ct)
		}
	}
	w := get(h, "/rooms/sale")
	if w.Code != http.StatusMovedPermanently || w.Header().Get("Location") != "/rooms/sale/" {
		t.Errorf("/rooms/sale: got %d Location %q, want 301 to /rooms/sale/", w.Code, w.Header().Get("Location"))
	}
	if w := get(h, "/rooms/bad%20name"); w.Code != 404 {
		t.Errorf("/rooms/bad name: got %d, want 404", w.Code)
	}
}

// TestRoomPageConfig: config.json tells the page where the room socket is:
// the configured public base, else the WebSocket port; the CSP allows that
// origin only.
func TestRoomPageConfig(t *testing.T) {
	for _, tt := range []struct {
		wsURL   string
		want    roomPageConfig
		connect string
	}{
		{"", roomPageConfig{WSPort: "8081"}, "connect-src 'self' ws://queue.example:8081 wss://queue.example:8081;"},
		{"wss://edge.example/queue/", roomPageConfig{WSURL: "wss://edge.example/queue"}, "connect-src 'self' wss://edge.example;"},
		{"ws://[::1]:9000", roomPageConfig{WSURL: "ws://[::1]:9000"}, "connect-src 'self' ws://[::1]:9000;"},
	} {
		h := roomsAPI(t, RoomsConfig{WSURL: tt.wsURL})
		w := get(h, "/rooms/sale/config.json")
		var got roomPageConfig
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != 200 || got != tt.want {
			t.Errorf("ws url %q: got %d %s (%v), want %+v", tt.wsURL, w.Code, w.Body, err, tt.want)
		}
		if csp := get(h, "/rooms/sale/").Header().Get("Content-Security-Policy"); !strings.Contains(csp, tt.connect) {
			t.Errorf("ws url %q: CSP %q lacks %q", tt.wsURL, csp, tt.connect)
		}
	}
}

func TestValidateWSURL(t *testing.T) {
	for _, ok := range []string{"", "ws://h", "wss://queue.example.com", "wss://queue.example.com:8443/edge", "ws://127.0.0.1:8081", "ws://[::1]:8081"} {
		if err := ValidateWSURL(ok); err != nil {
			t.Errorf("%q: got %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"http://h", "wss://", "wss://h?x=1", "wss://h#f", "wss://u:p@h", "wss://h; script-src *", "wss://h:0", "wss://h:70000",
		"wss://h/a b", "ws:h", "wss://h/x;y", "wss://h?"} {
		if err := ValidateWSURL(bad); err == nil {
			t.Errorf("%q: got nil, want an error", bad)
		}
	}
	a, err := gateway.NewAPI(gateway.APIConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := Register(a, Config{Rooms: &RoomsConfig{}}); err == nil || !strings.Contains(err.Error(), "Exists") {
		t.Errorf("no Exists: got %v, want it named", err)
	}
}
