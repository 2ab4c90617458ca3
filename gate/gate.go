package gate

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
)

// Defaults of Config.
const (
	// DefaultTokenName is the query parameter (and, unless CookieName
	// says otherwise, the cookie) that carries the access token: the
	// default token_name of a room's site.
	DefaultTokenName = "fanfare_access"
	// DefaultHeader carries the access token in a request header.
	DefaultHeader = "X-Fanfare-Access"
	// DefaultReturnParam is the queue page's query parameter naming where
	// the visitor wanted to go.
	DefaultReturnParam = "return"
	// DefaultLeeway is the clock skew allowed on a token's expiry.
	DefaultLeeway = 5 * time.Second
	// DefaultJWKSMaxAge is how long fetched keys are used before they are
	// fetched again.
	DefaultJWKSMaxAge = 5 * time.Minute
	// DefaultJWKSMinInterval is the least time between two fetches of the
	// key set: a token with an unknown kid makes at most one fetch per
	// interval, whatever the traffic.
	DefaultJWKSMinInterval = 30 * time.Second
	// maxJWKSBytes bounds a fetched key set; maxTokenBytes a token.
	maxJWKSBytes  = 64 << 10
	maxTokenBytes = 4096
	jwksTimeout   = 5 * time.Second
)

// Errors. Every refusal of Verify wraps ErrDenied.
var (
	// ErrDenied: no token, or a token that is invalid, expired, for
	// another room or another user.
	ErrDenied = errors.New("gate: access denied")
	// ErrNoKey: the key set has no key for the token (after a refresh
	// when one was allowed), or could not be fetched.
	ErrNoKey = errors.New("gate: no key for the token")
)

// Config configures a Gate. Room, QueueURL and exactly one key (Secret,
// PublicKey or JWKSURL) are required.
type Config struct {
	// Room is the waiting room whose access tokens open the gate.
	Room string
	// QueueURL is the room's queue page, where the gate sends visitors
	// without a valid token: e.g. https://queue.example/rooms/sale/.
	QueueURL string

	// Secret is the HS256 secret the room signs with (-room-token-secret).
	Secret []byte
	// PublicKey is the Ed25519 key the room signs with (-room-token-key).
	PublicKey ed25519.PublicKey
	// JWKSURL is fanfared's GET /v1/rooms/jwks: EdDSA keys are fetched
	// from it, cached for JWKSMaxAge and fetched again for an unknown kid
	// (at most once per JWKSMinInterval).
	JWKSURL string
	// HTTPClient fetches JWKSURL; nil = a client with a 5 s timeout.
	HTTPClient *http.Client
	// JWKSMaxAge and JWKSMinInterval: 0 = the defaults above.
	JWKSMaxAge      time.Duration
	JWKSMinInterval time.Duration

	// User, when set, returns the request's user as the application knows
	// it (false: nobody is signed in). The token must then name that user:
	// a token handed from one user to another, or to a visitor who is not
	// signed in, does not open the gate.
	User func(*http.Request) (uid string, ok bool)

	// TokenName is the query parameter the token arrives in (the site's
	// token_name); "" = DefaultTokenName.
	TokenName string
	// CookieName is the gate's own cookie keeping the token after it
	// arrived in the query; "" = TokenName.
	CookieName string
	// CookieDomain and CookiePath of that cookie; "" = host only and "/".
	CookieDomain string
	CookiePath   string
	// Header is the request header also accepted; "" = DefaultHeader.
	Header string
	// ReturnParam names the queue page's query parameter carrying the
	// return URL; "" = DefaultReturnParam.
	ReturnParam string
	// SiteURL, when set (scheme and host, e.g. https://shop.example), makes
	// the return URL absolute on that origin; otherwise it is the path
	// and query only. The request's Host header is never used: it is the
	// client's to choose.
	SiteURL string
	// Leeway on expiry; 0 = DefaultLeeway.
	Leeway time.Duration
	// Logger (nil = discard).
	Logger *slog.Logger
	// Now is the clock of the key set's cache (nil = time.Now; token
	// expiry is checked against the real clock).
	Now func() time.Time
}

// Gate is an http.Handler middleware admitting only requests that carry a
// valid access token of one waiting room (see the package doc).
type Gate struct {
	cfg    Config
	queue  *url.URL
	site   *url.URL
	log    *slog.Logger
	client *http.Client
	now    func() time.Time
	// fetchMu serializes key set fetches; keysMu (taken inside it, or
	// alone) guards keys, fetched and fetchErr.
	fetchMu  sync.Mutex
	keysMu   sync.RWMutex
	keys     map[string]ed25519.PublicKey
	fetched  time.Time // last fetch attempt
	fetchErr error
}

// New returns a Gate for cfg.
func New(cfg Config) (*Gate, error) {
	var errs []error
	if cfg.Room == "" {
		errs = append(errs, errors.New("gate: Room is required"))
	}
	q, err := url.Parse(cfg.QueueURL)
	if err != nil || cfg.QueueURL == "" || (q.Scheme != "" && q.Scheme != "http" && q.Scheme != "https") ||
		(q.Scheme == "" && !strings.HasPrefix(cfg.QueueURL, "/")) {
		errs = append(errs, fmt.Errorf("gate: QueueURL %q must be an http(s) URL or an absolute path", cfg.QueueURL))
	}
	n := 0
	if cfg.Secret != nil {
		n++
		if len(cfg.Secret) < roomtoken.MinSecretLen {
			errs = append(errs, fmt.Errorf("gate: Secret shorter than %d bytes", roomtoken.MinSecretLen))
		}
	}
	if cfg.PublicKey != nil {
		n++
		if len(cfg.PublicKey) != ed25519.PublicKeySize {
			errs = append(errs, errors.New("gate: PublicKey is not an Ed25519 public key"))
		}
	}
	if cfg.JWKSURL != "" {
		n++
		if u, err := url.Parse(cfg.JWKSURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("gate: JWKSURL %q must be an http(s) URL", cfg.JWKSURL))
		}
	}
	if n != 1 {
		errs = append(errs, errors.New("gate: exactly one of Secret, PublicKey and JWKSURL is required"))
	}
	var site *url.URL
	if cfg.SiteURL != "" {
		if site, err = url.Parse(cfg.SiteURL); err != nil || (site.Scheme != "http" && site.Scheme != "https") || site.Host == "" {
			errs = append(errs, fmt.Errorf("gate: SiteURL %q must be an http(s) origin", cfg.SiteURL))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.TokenName == "" {
		cfg.TokenName = DefaultTokenName
	}
	if cfg.CookieName == "" {
		cfg.CookieName = cfg.TokenName
	}
	if cfg.CookiePath == "" {
		cfg.CookiePath = "/"
	}
	if cfg.Header == "" {
		cfg.Header = DefaultHeader
	}
	if cfg.ReturnParam == "" {
		cfg.ReturnParam = DefaultReturnParam
	}
	if cfg.Leeway == 0 {
		cfg.Leeway = DefaultLeeway
	}
	if cfg.JWKSMaxAge <= 0 {
		cfg.JWKSMaxAge = DefaultJWKSMaxAge
	}
	if cfg.JWKSMinInterval <= 0 {
		cfg.JWKSMinInterval = DefaultJWKSMinInterval
	}
	g := &Gate{cfg: cfg, queue: q, site: site, log: cfg.Logger, client: cfg.HTTPClient, now: cfg.Now}
	if g.now == nil {
		g.now = time.Now
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.client == nil {
		g.client = &http.Client{Timeout: jwksTimeout}
	}
	return g, nil
}

type claimsKey struct{}

// ClaimsFrom returns the access token's claims the gate stored in the
// request context.
func ClaimsFrom(ctx context.Context) (*roomtoken.Claims, bool) {
	c, ok := ctx.Value(claimsKey{}).(*roomtoken.Claims)
	return c, ok
}

// Handler wraps next: requests with a valid token reach it (claims in the
// context, see ClaimsFrom); a token arriving in the query is moved into
// the gate's cookie and the visitor redirected to the same URL without
// it; everybody else is sent to the queue page (303 for GET and HEAD,
// 401 with a Location header for other methods, which a redirect would
// turn into a GET).
func (g *Gate) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if tok := q.Get(g.cfg.TokenName); tok != "" {
			c, err := g.Verify(r, tok)
			if err == nil {
				g.setCookie(w, r, tok, c)
				if r.Method == http.MethodGet || r.Method == http.MethodHead {
					q.Del(g.cfg.TokenName)
					w.Header().Set("Cache-Control", "no-store")
					http.Redirect(w, r, cleanLocal(r.URL.EscapedPath(), q.Encode()), http.StatusSeeOther)
					return
				}
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), claimsKey{}, c)))
				return
			}
			g.log.Debug("gate: query token refused", "room", g.cfg.Room, "err", err)
		}
		for _, tok := range g.candidates(r) {
			if c, err := g.Verify(r, tok); err == nil {
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), claimsKey{}, c)))
				return
			}
		}
		g.deny(w, r)
	})
}

// candidates are the tokens of the cookie and the header, in that order.
func (g *Gate) candidates(r *http.Request) []string {
	var out []string
	if c, err := r.Cookie(g.cfg.CookieName); err == nil && c.Value != "" {
		out = append(out, c.Value)
	}
	if h := r.Header.Get(g.cfg.Header); h != "" {
		out = append(out, h)
	}
	return out
}

func (g *Gate) setCookie(w http.ResponseWriter, r *http.Request, tok string, c *roomtoken.Claims) {
	ck := &http.Cookie{Name: g.cfg.CookieName, Value: tok, Path: g.cfg.CookiePath, Domain: g.cfg.CookieDomain,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")}
	if c.ExpiresAt != nil {
		ck.Expires = c.ExpiresAt.Time
	}
	http.SetCookie(w, ck)
}

// deny sends the visitor to the queue page with where it wanted to go.
func (g *Gate) deny(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	q.Del(g.cfg.TokenName)
	ret := cleanLocal(r.URL.EscapedPath(), q.Encode())
	if g.site != nil {
		ret = g.site.Scheme + "://" + g.site.Host + ret
	}
	dst := *g.queue
	qq := dst.Query()
	qq.Set(g.cfg.ReturnParam, ret)
	dst.RawQuery = qq.Encode()
	w.Header().Set("Cache-Control", "no-store")
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		http.Redirect(w, r, dst.String(), http.StatusSeeOther)
		return
	}
	w.Header().Set("Location", dst.String())
	http.Error(w, "a waiting room stands in front of this service: enter it at "+dst.String(), http.StatusUnauthorized)
}

// cleanLocal is a path and query on this host: never "//host" or
// "/\host", which browsers read as another host.
func cleanLocal(path, query string) string {
	if path == "" {
		path = "/"
	}
	path = "/" + strings.TrimLeft(path, "/\\")
	if query != "" {
		return path + "?" + query
	}
	return path
}

// Verify checks tok: signature with the configured key (the algorithm
// fixed by the key type: no "none", no HS256 with a public key), expiry,
// the room, and, when Config.User is set, that it names r's user.
// Every refusal wraps ErrDenied.
func (g *Gate) Verify(r *http.Request, tok string) (*roomtoken.Claims, error) {
	if len(tok) > maxTokenBytes {
		return nil, fmt.Errorf("%w: token longer than %d bytes", ErrDenied, maxTokenBytes)
	}
	var key any
	switch {
	case g.cfg.Secret != nil:
		key = g.cfg.Secret
	case g.cfg.PublicKey != nil:
		key = g.cfg.PublicKey
	default:
		k, err := g.jwksKey(r.Context(), tok)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrDenied, err)
		}
		key = k
	}
	c, err := roomtoken.Verify(tok, key, g.cfg.Room, g.cfg.Leeway)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDenied, err)
	}
	if g.cfg.User != nil {
		uid, ok := g.cfg.User(r)
		if !ok || uid != c.UID() {
			return nil, fmt.Errorf("%w: the token is for another user", ErrDenied)
		}
	}
	return c, nil
}

// kidOf reads the kid of a JWT's header without verifying anything.
func kidOf(tok string) (string, error) {
	h, _, ok := strings.Cut(tok, ".")
	if !ok || len(h) > 1024 {
		return "", errors.New("malformed token")
	}
	b, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		return "", errors.New("malformed token header")
	}
	var hdr struct {
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(b, &hdr); err != nil {
		return "", errors.New("malformed token header")
	}
	return hdr.Kid, nil
}

// jwksKey returns the key of tok's kid, fetching the key set when it is
// older than JWKSMaxAge, or when the kid is unknown and the last fetch is
// older than JWKSMinInterval: an unknown kid makes at most one fetch per
// interval, whatever the traffic. One fetch runs at a time; requests
// needing it wait for it (bounded by the client's timeout), the others
// go on with the keys known.
func (g *Gate) jwksKey(ctx context.Context, tok string) (ed25519.PublicKey, error) {
	kid, err := kidOf(tok)
	if err != nil {
		return nil, err
	}
	g.keysMu.RLock()
	k, known := g.lookupLocked(kid)
	fresh := !g.fetched.IsZero() && g.now().Sub(g.fetched) < g.cfg.JWKSMaxAge
	g.keysMu.RUnlock()
	if known && fresh {
		return k, nil
	}
	g.fetchMu.Lock()
	defer g.fetchMu.Unlock()
	g.keysMu.RLock()
	k, known = g.lookupLocked(kid)
	now := g.now()
	due := g.fetched.IsZero() || now.Sub(g.fetched) >= g.cfg.JWKSMaxAge ||
		(!known && now.Sub(g.fetched) >= g.cfg.JWKSMinInterval)
	lastErr := g.fetchErr
	g.keysMu.RUnlock()
	if due {
		keys, err := g.fetch(ctx)
		g.keysMu.Lock()
		g.fetched, g.fetchErr = now, err
		if err == nil {
			g.keys = keys
		}
		k, known = g.lookupLocked(kid)
		g.keysMu.Unlock()
		if err != nil {
			g.log.Warn("gate: key set fetch failed; keeping the keys known", "url", g.cfg.JWKSURL, "err", err)
		}
		lastErr = err
	}
	if !known {
		if lastErr != nil {
			return nil, fmt.Errorf("%w %q: %w", ErrNoKey, kid, lastErr)
		}
		return nil, fmt.Errorf("%w %q", ErrNoKey, kid)
	}
	return k, nil
}

// lookupLocked finds kid (keysMu held); a token without kid matches a
// set of one key.
func (g *Gate) lookupLocked(kid string) (ed25519.PublicKey, bool) {
	if k, ok := g.keys[kid]; ok {
		return k, true
	}
	if kid == "" && len(g.keys) == 1 {
		for _, k := range g.keys {
			return k, true
		}
	}
	return nil, false
}

// fetch reads the key set: its Ed25519 signing keys by kid.
func (g *Gate) fetch(ctx context.Context) (map[string]ed25519.PublicKey, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jwksTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.cfg.JWKSURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", g.cfg.JWKSURL, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxJWKSBytes {
		return nil, fmt.Errorf("key set larger than %d bytes", maxJWKSBytes)
	}
	var set struct {
		Keys []struct {
			Kty, Crv, X, Alg, Use, Kid string
		} `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return nil, fmt.Errorf("key set: %w", err)
	}
	keys := make(map[string]ed25519.PublicKey, len(set.Keys))
	for _, k := range set.Keys {
		if k.Kty != "OKP" || k.Crv != "Ed25519" || (k.Alg != "" && k.Alg != "EdDSA") || (k.Use != "" && k.Use != "sig") {
			continue
		}
		x, err := base64.RawURLEncoding.DecodeString(k.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			continue
		}
		keys[k.Kid] = ed25519.PublicKey(x)
	}
	if len(keys) == 0 {
		return nil, errors.New("key set holds no Ed25519 signing key")
	}
	return keys, nil
}
