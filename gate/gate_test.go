package gate_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
	"github.com/fanfare-im/fanfare/gate"
)

var secret = []byte(strings.Repeat("s", 32))

func hsToken(t *testing.T, uid, room string, exp time.Duration) string {
	t.Helper()
	s, err := roomtoken.NewHS256(secret)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := s.Sign(uid, room, time.Now(), time.Now().Add(exp))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// app is the protected service: it answers who the gate let through.
var app = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	c, ok := gate.ClaimsFrom(r.Context())
	if !ok {
		http.Error(w, "no claims", 500)
		return
	}
	w.Write([]byte("hello " + c.UID()))
})

func newGate(t *testing.T, cfg gate.Config) *httptest.Server {
	t.Helper()
	if cfg.Room == "" {
		cfg.Room = "sale"
	}
	if cfg.QueueURL == "" {
		cfg.QueueURL = "https://queue.example/rooms/sale/"
	}
	g, err := gate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler(app))
	t.Cleanup(srv.Close)
	return srv
}

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func get(t *testing.T, rawURL string, mod func(*http.Request)) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if mod != nil {
		mod(req)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestGateFlow: a token in the query becomes the gate's cookie and the
// visitor is sent to the clean URL; the cookie and the header then let it
// through; without a token, with another room's, an expired or a
// tampered one, the visitor goes to the queue page with a local return URL.
func TestGateFlow(t *testing.T) {
	srv := newGate(t, gate.Config{Secret: secret})
	tok := hsToken(t, "alice", "sale", time.Minute)

	resp := get(t, srv.URL+"/shop/item?id=7&fanfare_access="+url.QueryEscape(tok), nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/shop/item?id=7" {
		t.Fatalf("query token: %d Location %q, want 303 to the clean URL", resp.StatusCode, resp.Header.Get("Location"))
	}
	var ck *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "fanfare_access" {
			ck = c
		}
	}
	if ck == nil || ck.Value != tok || !ck.HttpOnly || ck.SameSite != http.SameSiteLaxMode || ck.Path != "/" {
		t.Fatalf("gate cookie: %+v", resp.Cookies())
	}
	if resp := get(t, srv.URL+"/shop/item?id=7", func(r *http.Request) { r.AddCookie(ck) }); resp.StatusCode != http.StatusOK {
		t.Fatalf("with the cookie: %d", resp.StatusCode)
	}
	if resp := get(t, srv.URL+"/api", func(r *http.Request) { r.Header.Set("X-Fanfare-Access", tok) }); resp.StatusCode != http.StatusOK {
		t.Fatalf("with the header: %d", resp.StatusCode)
	}

	bad := map[string]string{
		"none":          "",
		"other room":    hsToken(t, "alice", "other", time.Minute),
		"expired":       hsToken(t, "alice", "sale", -time.Minute),
		"tampered":      tok[:len(tok)-3] + "abc",
		"alg none":      noneToken(t, "alice", "sale"),
		"other secret":  otherSecretToken(t),
		"not a token":   "hello",
		"huge":          strings.Repeat("a", 5000),
		"eddsa, not hs": edToken(t, "alice", "sale"),
	}
	for name, tk := range bad {
		resp := get(t, srv.URL+"/shop/item?id=7", func(r *http.Request) {
			if tk != "" {
				r.AddCookie(&http.Cookie{Name: "fanfare_access", Value: tk})
			}
		})
		loc, _ := url.Parse(resp.Header.Get("Location"))
		if resp.StatusCode != http.StatusSeeOther || loc == nil || loc.Host != "queue.example" || loc.Query().Get("return") != "/shop/item?id=7" {
			t.Errorf("%s: %d Location %q, want 303 to the queue with return=/shop/item?id=7", name, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	// A refused query token is not consumed, and is not echoed in the return URL.
	resp = get(t, srv.URL+"/a?fanfare_access="+url.QueryEscape(bad["other room"]), nil)
	if loc, _ := url.Parse(resp.Header.Get("Location")); resp.StatusCode != http.StatusSeeOther || loc.Host != "queue.example" ||
		loc.Query().Get("return") != "/a" {
		t.Errorf("refused query token: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	// A POST without a token is 401 with the queue page in Location.
	req, _ := http.NewRequest("POST", srv.URL+"/cart", nil)
	pr, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	pr.Body.Close()
	if pr.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(pr.Header.Get("Location"), "https://queue.example/") {
		t.Errorf("POST: %d %q", pr.StatusCode, pr.Header.Get("Location"))
	}
}

// TestGateNoOpenRedirect: whatever the path and Host, the gate redirects
// only to the queue page and to paths of its own host.
func TestGateNoOpenRedirect(t *testing.T) {
	srv := newGate(t, gate.Config{Secret: secret, SiteURL: "https://shop.example"})
	tok := hsToken(t, "alice", "sale", time.Minute)
	for _, path := range []string{"//evil.example/x", "/\\evil.example", "/%2F%2Fevil.example"} {
		resp := get(t, srv.URL+path+"?fanfare_access="+url.QueryEscape(tok), nil)
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/") || strings.HasPrefix(loc, "//") || strings.HasPrefix(loc, "/\\") {
			t.Errorf("clean redirect of %q: %d %q", path, resp.StatusCode, loc)
		}
		resp = get(t, srv.URL+path, func(r *http.Request) { r.Host = "evil.example" })
		u, _ := url.Parse(resp.Header.Get("Location"))
		ret, _ := url.Parse(u.Query().Get("return"))
		if u.Host != "queue.example" || ret == nil || ret.Host != "shop.example" {
			t.Errorf("deny of %q: Location %q (return %v), want the queue with a return on shop.example", path, resp.Header.Get("Location"), ret)
		}
	}
}

// TestGateBindsUser: with Config.User the token must name the request's user.
func TestGateBindsUser(t *testing.T) {
	srv := newGate(t, gate.Config{Secret: secret, User: func(r *http.Request) (string, bool) {
		u := r.Header.Get("X-User")
		return u, u != ""
	}})
	tok := hsToken(t, "alice", "sale", time.Minute)
	cases := []struct {
		user string
		want int
	}{{"alice", http.StatusOK}, {"bob", http.StatusSeeOther}, {"", http.StatusSeeOther}}
	for _, c := range cases {
		resp := get(t, srv.URL+"/", func(r *http.Request) {
			r.Header.Set("X-Fanfare-Access", tok)
			if c.user != "" {
				r.Header.Set("X-User", c.user)
			}
		})
		if resp.StatusCode != c.want {
			t.Errorf("user %q: got %d, want %d", c.user, resp.StatusCode, c.want)
		}
	}
}

// jwksServer serves a key set of the given signers' public keys and
// counts its fetches.
type jwksServer struct {
	*httptest.Server
	keys    atomic.Pointer[[]byte]
	fetches atomic.Int32
}

func newJWKS(t *testing.T, s *roomtoken.Signer) *jwksServer {
	j := &jwksServer{}
	j.set(s)
	j.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		j.fetches.Add(1)
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Write(*j.keys.Load())
	}))
	t.Cleanup(j.Close)
	return j
}

func (j *jwksServer) set(s *roomtoken.Signer) {
	b := s.JWKS()
	j.keys.Store(&b)
}

func edSigner(t *testing.T) (*roomtoken.Signer, ed25519.PublicKey) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := roomtoken.NewEdDSA(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, pub
}

// TestGateJWKS: EdDSA keys come from the key set, cached; a token of an
// unknown kid (a rotation) makes the gate fetch again, at most once per
// JWKSMinInterval however many such tokens come; a stale set is fetched
// again after JWKSMaxAge; alg confusion (HS256 signed with the public key
// as secret) is refused.
func TestGateJWKS(t *testing.T) {
	s1, pub1 := edSigner(t)
	s2, _ := edSigner(t)
	j := newJWKS(t, s1)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	srv := newGate(t, gate.Config{JWKSURL: j.URL, JWKSMinInterval: 30 * time.Second, JWKSMaxAge: 5 * time.Minute,
		Now: func() time.Time { return time.Unix(0, now.Load()) }})
	advance := func(d time.Duration) { now.Add(int64(d)) }
	sign := func(s *roomtoken.Signer, uid string) string {
		tok, err := s.Sign(uid, "sale", time.Now(), time.Now().Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	with := func(tok string) int {
		return get(t, srv.URL+"/", func(r *http.Request) { r.Header.Set("X-Fanfare-Access", tok) }).StatusCode
	}
	fetches := func(want int32, when string) {
		t.Helper()
		if n := j.fetches.Load(); n != want {
			t.Fatalf("%s: %d fetches, want %d", when, n, want)
		}
	}
	for range 5 {
		if st := with(sign(s1, "alice")); st != http.StatusOK {
			t.Fatalf("EdDSA token: %d", st)
		}
	}
	fetches(1, "5 tokens of a known key")
	// HS256 with the public key's bytes as the secret: refused.
	confused := jwt.NewWithClaims(jwt.SigningMethodHS256, roomtoken.Claims{Room: "sale", RegisteredClaims: jwt.RegisteredClaims{
		Subject: "mallory", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute))}})
	confused.Header["kid"] = roomtoken.KeyID(pub1)
	ctok, _ := confused.SignedString([]byte(pub1))
	if st := with(ctok); st != http.StatusSeeOther {
		t.Errorf("alg confusion: %d, want 303", st)
	}
	// The room rotates to s2. Within the interval the new kid is refused
	// without a fetch, however many tokens carry it.
	j.set(s2)
	for range 20 {
		if st := with(sign(s2, "alice")); st != http.StatusSeeOther {
			t.Fatalf("new kid within the interval: %d, want 303", st)
		}
	}
	fetches(1, "20 unknown kids within the interval")
	advance(31 * time.Second)
	if st := with(sign(s2, "alice")); st != http.StatusOK {
		t.Fatalf("new kid after the interval: %d, want 200", st)
	}
	fetches(2, "an unknown kid after the interval")
	for range 10 {
		with(sign(s1, "alice")) // the old key, now unknown: no fetch within the interval
	}
	fetches(2, "unknown kids right after a fetch")
	advance(6 * time.Minute)
	with(sign(s2, "alice"))
	fetches(3, "a known kid of a stale set")
}

// TestGateConfig: New names every problem.
func TestGateConfig(t *testing.T) {
	_, err := gate.New(gate.Config{QueueURL: "javascript:x", Secret: []byte("short"), JWKSURL: "ftp://x"})
	for _, w := range []string{"Room", "QueueURL", "Secret", "JWKSURL", "exactly one"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("New: %v, want it to name %s", err, w)
		}
	}
	g, _ := gate.New(gate.Config{Room: "sale", QueueURL: "/rooms/sale/", Secret: secret})
	req := httptest.NewRequest("GET", "/", nil)
	if _, err := g.Verify(req, "x"); !errors.Is(err, gate.ErrDenied) {
		t.Errorf("Verify: %v, want ErrDenied", err)
	}
}

func noneToken(t *testing.T, uid, room string) string {
	tok := jwt.NewWithClaims(jwt.SigningMethodNone, roomtoken.Claims{Room: room, RegisteredClaims: jwt.RegisteredClaims{
		Subject: uid, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute))}})
	s, err := tok.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func otherSecretToken(t *testing.T) string {
	s, _ := roomtoken.NewHS256([]byte(strings.Repeat("x", 32)))
	tok, _ := s.Sign("alice", "sale", time.Now(), time.Now().Add(time.Minute))
	return tok
}

func edToken(t *testing.T, uid, room string) string {
	s, _ := edSigner(t)
	tok, _ := s.Sign(uid, room, time.Now(), time.Now().Add(time.Minute))
	return tok
}
