package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gate"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestGateEndToEnd: a Go service behind package gate, keys fetched from a
// real fanfared's GET /v1/rooms/jwks (EdDSA): an anonymous visitor enters
// the room over HTTP, is granted, follows redirect_url through the gate
// (which moves the token into its cookie and cleans the URL) and reaches
// the service as its room identity; GET /rooms/{room}/verify says the
// same; a visitor without a token is sent to the queue page, and a token
// of another room does not open the gate.
func TestGateEndToEnd(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := writeFile(t, "room.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})))
	ts := startServer(t, "embedded", "-room-token-key", keyFile)

	g, err := gate.New(gate.Config{Room: "launch", QueueURL: ts.http + "/rooms/launch/", JWKSURL: ts.http + "/v1/rooms/jwks"})
	if err != nil {
		t.Fatal(err)
	}
	svc := httptest.NewServer(g.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := gate.ClaimsFrom(r.Context())
		io.WriteString(w, "welcome "+c.UID()+" to "+r.URL.Path+"?"+r.URL.RawQuery)
	})))
	defer svc.Close()

	for _, room := range []string{"launch", "other"} {
		body := `{"room":"` + room + `","max_active":5,"admit_rate":50,"site":{"target_url":"` + svc.URL + `/shop?sku=1","anonymous":true}}`
		if st := ts.do("POST", "/admin/v1/rooms", ts.admin, body, nil); st != http.StatusOK {
			t.Fatalf("create room %s: %d", room, st)
		}
	}
	enter := ts.roomReq("POST", "/v1/rooms/launch/enter", "", "")
	if enter.Status != http.StatusOK {
		t.Fatalf("enter: %d %s", enter.Status, enter.Raw)
	}
	gr := pollUntil[*wire.Granted](ts, "launch", enter.Ticket, 10*time.Second)
	if !strings.HasPrefix(gr.RedirectURL, svc.URL+"/shop?") {
		t.Fatalf("redirect_url %q", gr.RedirectURL)
	}

	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	resp, err := browser.Get(gr.RedirectURL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(page), "welcome anon:") || !strings.HasSuffix(string(page), "/shop?sku=1") {
		t.Fatalf("through the gate: %d %q (final URL %s)", resp.StatusCode, page, resp.Request.URL)
	}
	if resp.Request.URL.Query().Has("fanfare_access") {
		t.Errorf("the token stayed in the URL: %s", resp.Request.URL)
	}
	// The cookie keeps the visitor in.
	resp, err = browser.Get(svc.URL + "/shop/cart")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("second page with the gate's cookie: %d", resp.StatusCode)
	}
	uid := strings.Fields(string(page))[1]
	if v := ts.roomReq("GET", "/rooms/launch/verify", gr.AccessToken, ""); v.Status != http.StatusNoContent || v.Header.Get("X-Fanfare-User") != uid {
		t.Fatalf("verify: %d %q, want 204 for %s", v.Status, v.Header.Get("X-Fanfare-User"), uid)
	}

	// Without a token: to the queue page, with the return path.
	resp, err = noFollow.Get(svc.URL + "/shop?sku=2")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc.String() == "" || !strings.HasPrefix(loc.String(), ts.http+"/rooms/launch/") ||
		loc.Query().Get("return") != "/shop?sku=2" {
		t.Fatalf("no token: %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	// A real token of another room does not open it.
	other := ts.roomReq("POST", "/v1/rooms/other/enter", "", "")
	og := pollUntil[*wire.Granted](ts, "other", other.Ticket, 10*time.Second)
	resp, err = noFollow.Get(svc.URL + "/shop?fanfare_access=" + url.QueryEscape(og.AccessToken))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc, _ := url.Parse(resp.Header.Get("Location")); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc.String(), ts.http+"/rooms/launch/") {
		t.Fatalf("other room's token: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
}

var noFollow = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
