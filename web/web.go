package web

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/fanfare-im/fanfare/gateway"
	"github.com/fanfare-im/fanfare/gateway/auth"
)

//go:embed demo admin room
var assets embed.FS

// Defaults of DevConfig.
const (
	DefaultTokenTTL   = 15 * time.Minute
	DefaultTokenRate  = 2.0
	DefaultTokenBurst = 20
	DefaultMaxMembers = 100
	// MaxTokenTTL is the longest lifetime a demo token may be given.
	MaxTokenTTL = 24 * time.Hour
	// UIDPrefix starts every uid the demo's token route signs: a demo
	// token can never name a real user.
	UIDPrefix = "demo-"
)

// DemoGroups are the groups the demo offers (by name). The token route
// joins users to these and to no other group.
var DemoGroups = []string{"lobby", "launch", "support"}

// Config says which pages Register serves. The zero value serves nothing.
type Config struct {
	// Demo serves /demo/.
	Demo bool
	// Admin serves the admin console at /admin/.
	Admin bool
	// SDK, when not nil, is served at /sdk/ (the JavaScript SDK's files;
	// the demo imports it from there).
	SDK fs.FS
	// WSPort returns the WebSocket listener's port, announced to the demo
	// in /demo/config.json and allowed in its connect-src (a function: the
	// port of -ws-addr :0 is known once the listener runs).
	WSPort func() string
	// Node is the node's id, shown by the demo.
	Node string
	// Rooms, when not nil, serves the hosted waiting-room page at
	// /rooms/{room}/ (rooms.go). Unlike the demo it is meant for
	// production: a site sends its visitors there.
	Rooms *RoomsConfig
	// Dev, when not nil and Demo is set, adds the development token route
	// POST /demo/token. cmd/fanfared sets it in embedded mode only.
	Dev *DevConfig
	// Logger receives the token route's refusals at Debug; nil discards.
	Logger *slog.Logger
}

// DevBackend is what the token route needs from the node.
type DevBackend interface {
	// Token signs a user token for uid of VIP tier tier with lifetime ttl.
	Token(uid string, tier int, ttl time.Duration) (string, error)
	// Group returns the gid and member count of the demo group name,
	// creating the group on first use.
	Group(ctx context.Context, name string) (gid, members int64, err error)
	// IsMember reports whether uid is a member of gid.
	IsMember(ctx context.Context, gid int64, uid string) (bool, error)
	// Join makes uid a member of gid (idempotent).
	Join(ctx context.Context, gid int64, uid string) error
}

// DevConfig configures the development token route.
type DevConfig struct {
	Backend DevBackend
	// TTL is the lifetime of a signed token; 0 = DefaultTokenTTL, at most
	// MaxTokenTTL.
	TTL time.Duration
	// Rate and Burst bound the route for the whole node (tokens per
	// second, and at once): 0 = the defaults (2/s, 20).
	Rate  float64
	Burst int
	// MaxMembers bounds each demo group: past it new users are refused
	// (users already in keep their tokens); 0 = DefaultMaxMembers.
	MaxMembers int
	// Room is the waiting room the demo enters; empty = none.
	Room string
}

// Validate reports every problem of c.
func (c DevConfig) Validate() error {
	var errs []error
	if c.Backend == nil {
		errs = append(errs, errors.New("web: DevConfig.Backend is required"))
	}
	if c.TTL < 0 || c.TTL > MaxTokenTTL {
		errs = append(errs, fmt.Errorf("web: token TTL must be in 0..%v, got %v", MaxTokenTTL, c.TTL))
	}
	if c.Rate < 0 || c.Burst < 0 || c.MaxMembers < 0 {
		errs = append(errs, errors.New("web: token rate, burst and max members must not be negative"))
	}
	return errors.Join(errs...)
}

// Register adds the configured pages to a.
func Register(a *gateway.API, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Demo {
		sub, _ := fs.Sub(assets, "demo")
		if err := serveDir(a, "/demo/", sub, demoCSP(cfg.WSPort)); err != nil {
			return err
		}
		d := &demo{cfg: cfg}
		if cfg.Dev != nil {
			if err := cfg.Dev.Validate(); err != nil {
				return err
			}
			dc := *cfg.Dev
			if dc.TTL == 0 {
				dc.TTL = DefaultTokenTTL
			}
			if dc.Rate == 0 {
				dc.Rate = DefaultTokenRate
			}
			if dc.Burst == 0 {
				dc.Burst = DefaultTokenBurst
			}
			if dc.MaxMembers == 0 {
				dc.MaxMembers = DefaultMaxMembers
			}
			d.dev = &dc
			d.lim = rate.NewLimiter(rate.Limit(dc.Rate), dc.Burst)
			a.HandlePublic("POST /demo/token", http.HandlerFunc(d.token))
		}
		a.HandlePublic("GET /demo/config.json", http.HandlerFunc(d.config))
	}
	if cfg.Admin {
		sub, _ := fs.Sub(assets, "admin")
		if err := serveDir(a, "/admin/", sub, adminCSP); err != nil {
			return err
		}
	}
	if cfg.Rooms != nil {
		if err := registerRooms(a, cfg); err != nil {
			return err
		}
	}
	if cfg.SDK != nil {
		if err := serveDir(a, "/sdk/", cfg.SDK, func(*http.Request) string { return sdkCSP }); err != nil {
			return err
		}
	}
	return nil
}

const (
	// The console talks to the API on its own origin only.
	adminCSPValue = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
	sdkCSP = "default-src 'none'; frame-ancestors 'none'"
)

func adminCSP(*http.Request) string { return adminCSPValue }

// hostname is what a Host header may hold and a CSP source may repeat.
var hostname = regexp.MustCompile(`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253})$`)

// demoCSP allows the demo's own scripts and styles, its API origin, and
// WebSockets to the same host on the WebSocket port: the page opens
// ws://<the host it was loaded from>:<ws port>/ws.
func demoCSP(port func() string) func(*http.Request) string {
	return func(r *http.Request) string {
		connect := "'self'"
		if ws := wsSources(r, port); ws != "" {
			connect += " " + ws
		}
		return "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src " + connect +
			"; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
	}
}

// wsSources returns the CSP sources "ws://host:port wss://host:port" for
// the host r was sent to on the WebSocket port, or "" when the port is
// unknown or the Host header is not a host name (it cannot inject a
// source).
func wsSources(r *http.Request, port func() string) string {
	wsPort := ""
	if port != nil {
		wsPort = port()
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(r.Host); err == nil {
		host = h
		if strings.Contains(h, ":") {
			host = "[" + h + "]"
		}
	}
	if wsPort == "" || !hostname.MatchString(host) {
		return ""
	}
	return fmt.Sprintf("ws://%s:%s wss://%s:%s", host, wsPort, host, wsPort)
}

// contentTypes are the types of the files served; others are
// application/octet-stream.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".json": "application/json",
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".ico":  "image/x-icon",
	".ts":   "text/plain; charset=utf-8", // TypeScript declarations, for reading
	".md":   "text/markdown; charset=utf-8",
	".txt":  "text/plain; charset=utf-8",
}

// ContentType returns the Content-Type a file of name is served with.
func ContentType(name string) string {
	if t, ok := contentTypes[path.Ext(name)]; ok {
		return t
	}
	return "application/octet-stream"
}

type file struct {
	name string
	body []byte
	etag string
	csp  func(*http.Request) string
}

// newFile returns the served file name with body b.
func newFile(name string, b []byte, csp func(*http.Request) string) *file {
	sum := sha256.Sum256(b)
	return &file{name: name, body: b, etag: `"` + hex.EncodeToString(sum[:12]) + `"`, csp: csp}
}

// serveDir registers every file of fsys under prefix, index.html at the
// prefix itself, and a redirect from the prefix without its slash.
// Exact patterns, not a subtree: paths that name no file fall through to
// the API's JSON 404 (and /admin/v1/... stays the API's).
func serveDir(a *gateway.API, prefix string, fsys fs.FS, csp func(*http.Request) string) error {
	var files []*file
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if strings.HasSuffix(p, "_test.go") || strings.HasSuffix(p, ".go") || strings.Contains(p, "node_modules/") {
			return nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		files = append(files, newFile(p, b, csp))
		return nil
	})
	if err != nil {
		return fmt.Errorf("web: %s: %w", prefix, err)
	}
	for _, f := range files {
		a.HandlePublic("GET "+prefix+f.name, f)
		if f.name == "index.html" {
			a.HandlePublic("GET "+prefix+"{$}", f)
		}
	}
	bare := strings.TrimSuffix(prefix, "/")
	a.HandlePublic("GET "+bare, http.RedirectHandler(prefix, http.StatusMovedPermanently))
	return nil
}

// setSecurityHeaders writes the headers every page and asset carries.
func setSecurityHeaders(h http.Header, csp string) {
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

func (f *file) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	setSecurityHeaders(h, f.csp(r))
	h.Set("Content-Type", ContentType(f.name))
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", f.etag)
	// ServeContent answers If-None-Match with 304 and HEAD without a body.
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
}

type demo struct {
	cfg Config
	dev *DevConfig
	lim *rate.Limiter
}

// demoConfig is GET /demo/config.json: what the page needs to connect.
type demoConfig struct {
	WSPort string `json:"ws_port"`
	Node   string `json:"node"`
	// Dev is true when POST /demo/token exists; the page otherwise asks
	// for a token and a gid.
	Dev       bool     `json:"dev"`
	Groups    []string `json:"groups,omitempty"`
	Room      string   `json:"room,omitempty"`
	TokenTTLS int64    `json:"token_ttl_s,omitempty"`
	UIDPrefix string   `json:"uid_prefix,omitempty"`
}

func (d *demo) config(w http.ResponseWriter, r *http.Request) {
	c := demoConfig{Node: d.cfg.Node}
	if d.cfg.WSPort != nil {
		c.WSPort = d.cfg.WSPort()
	}
	if d.dev != nil {
		c.Dev, c.Groups, c.Room, c.TokenTTLS, c.UIDPrefix = true, DemoGroups, d.dev.Room, int64(d.dev.TTL/time.Second), UIDPrefix
	}
	gateway.WriteJSON(w, http.StatusOK, c)
}

// tokenRequest is POST /demo/token's body.
type tokenRequest struct {
	User  string `json:"user"`
	Tier  int    `json:"tier"`
	Group string `json:"group"`
}

// tokenResponse is its answer.
type tokenResponse struct {
	UID       string `json:"uid"`
	Token     string `json:"token"`
	ExpiresAt int64  `json:"expires_at"`
	Tier      int    `json:"tier"`
	Group     string `json:"group,omitempty"`
	GID       int64  `json:"gid,omitempty"`
}

// demoUser is the name a demo user picks: the uid is UIDPrefix + it.
var demoUser = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// maxTokenBody bounds POST /demo/token's body.
const maxTokenBody = 1 << 10

// token signs a short-lived token for demo-<user> and, with a group, makes
// the user a member of that demo group. Development only: see the package
// documentation for its bounds.
func (d *demo) token(w http.ResponseWriter, r *http.Request) {
	if !d.lim.Allow() {
		gateway.WriteError(w, gateway.RetryLater(fmt.Errorf("web: demo token rate: %w", gateway.ErrRateLimited), time.Second), gateway.ScopeAdmin)
		return
	}
	// A JSON content type makes a cross-site request need a CORS
	// preflight, which this route never answers: other sites' pages
	// cannot make a visitor's browser call it.
	if mt, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";"); !strings.EqualFold(strings.TrimSpace(mt), "application/json") {
		gateway.WriteError(w, gateway.BadRequest("Content-Type: application/json required"), gateway.ScopeAdmin)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxTokenBody)
	var req tokenRequest
	if err := gateway.DecodeJSON(r, &req); err != nil {
		gateway.WriteError(w, err, gateway.ScopeAdmin)
		return
	}
	var errs []string
	if !demoUser.MatchString(req.User) {
		errs = append(errs, "user: 1-32 characters of a-z, 0-9, _ and -, starting with a letter or digit")
	}
	if req.Tier < 0 || req.Tier > auth.MaxTier {
		errs = append(errs, fmt.Sprintf("tier: 0-%d", auth.MaxTier))
	}
	if req.Group != "" && !slices.Contains(DemoGroups, req.Group) {
		errs = append(errs, "group: one of "+strings.Join(DemoGroups, ", "))
	}
	if len(errs) > 0 {
		gateway.WriteError(w, gateway.BadRequest("%s", strings.Join(errs, "; ")), gateway.ScopeAdmin)
		return
	}
	uid := UIDPrefix + req.User
	resp := tokenResponse{UID: uid, Tier: req.Tier, Group: req.Group}
	if req.Group != "" {
		gid, members, err := d.dev.Backend.Group(r.Context(), req.Group)
		if err == nil && members >= int64(d.dev.MaxMembers) {
			var in bool
			if in, err = d.dev.Backend.IsMember(r.Context(), gid, uid); err == nil && !in {
				err = gateway.BadRequest("demo group %s is full (%d members, -demo-max-members); pick another group or restart with a fresh data directory", req.Group, members)
			}
		}
		if err == nil {
			err = d.dev.Backend.Join(r.Context(), gid, uid)
		}
		if err != nil {
			d.cfg.Logger.Debug("demo token refused", "uid", uid, "group", req.Group, "err", err)
			gateway.WriteError(w, err, gateway.ScopeAdmin)
			return
		}
		resp.GID = gid
	}
	tok, err := d.dev.Backend.Token(uid, req.Tier, d.dev.TTL)
	if err != nil {
		gateway.WriteError(w, err, gateway.ScopeAdmin)
		return
	}
	resp.Token, resp.ExpiresAt = tok, time.Now().Add(d.dev.TTL).UnixMilli()
	gateway.WriteJSON(w, http.StatusOK, resp) // Cache-Control: no-store
}
