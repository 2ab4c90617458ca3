package web

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/fanfare-im/fanfare/gateway"
)

// RoomsConfig configures the hosted waiting-room page at /rooms/{room}/.
type RoomsConfig struct {
	// Exists reports whether a room of this name exists: the page of an
	// unknown room is a 404 page. Required.
	Exists func(room string) bool
	// WSURL is the public base of the WebSocket listener the page opens the
	// room socket on (ws:// or wss://, e.g. wss://queue.example.com when a
	// proxy routes /rooms/{room}/ws to the WebSocket port); empty = the
	// page's own host on Config.WSPort, wss when the page came over https.
	WSURL string
}

// Validate reports every problem of c.
func (c RoomsConfig) Validate() error {
	var errs []error
	if c.Exists == nil {
		errs = append(errs, errors.New("web: RoomsConfig.Exists is required"))
	}
	if err := ValidateWSURL(c.WSURL); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ValidateWSURL checks a public WebSocket base for the room page (see
// RoomsConfig.WSURL): empty, or ws:// or wss:// with a host name, an
// optional port and path, and nothing else (it is repeated in a CSP).
func ValidateWSURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("web: room page WebSocket URL %q: %w", s, err)
	}
	h := u.Hostname()
	if (u.Scheme != "ws" && u.Scheme != "wss") || h == "" || !(hostname.MatchString(h) || hostname.MatchString("["+h+"]")) ||
		u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.User != nil || u.Opaque != "" ||
		strings.ContainsAny(u.Path, " ;,'\"") || (u.Port() != "" && !validPort(u.Port())) {
		return fmt.Errorf("web: room page WebSocket URL %q: want ws:// or wss://host[:port][/path], no query, fragment or user", s)
	}
	return nil
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n < 65536
}

// roomName is what a room may be called (waitroom's rule): anything else
// is not a room, and never reaches a page or a CSP.
var roomName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// roomPage serves /rooms/{room}/: the page's files (the same for every
// room), its config.json, and the 404 page of an unknown room.
type roomPage struct {
	cfg      RoomsConfig
	wsPort   func() string
	index    *file
	files    map[string]*file
	notFound *template.Template
	csp      func(*http.Request) string
}

// roomFiles are the page's files other than index.html and notfound.html,
// served at /rooms/{room}/<name> for every room.
func registerRooms(a *gateway.API, cfg Config) error {
	if err := cfg.Rooms.Validate(); err != nil {
		return err
	}
	sub, _ := fs.Sub(assets, "room")
	p := &roomPage{cfg: *cfg.Rooms, wsPort: cfg.WSPort, files: map[string]*file{}}
	p.csp = p.policy
	err := fs.WalkDir(sub, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(sub, name)
		if err != nil {
			return err
		}
		switch name {
		case "notfound.html":
			p.notFound, err = template.New(name).Parse(string(b))
			return err
		case "index.html":
			p.index = newFile(name, b, p.csp)
		default:
			if strings.Contains(name, "/") {
				return fmt.Errorf("web: room page file %s: the page's files are flat", name)
			}
			p.files[name] = newFile(name, b, p.csp)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("web: /rooms/: %w", err)
	}
	if p.index == nil || p.notFound == nil {
		return fmt.Errorf("web: /rooms/: index.html and notfound.html are required")
	}
	a.HandlePublic("GET /rooms/{room}/{$}", http.HandlerFunc(p.page))
	a.HandlePublic("GET /rooms/{room}", http.HandlerFunc(p.redirect))
	a.HandlePublic("GET /rooms/{room}/config.json", http.HandlerFunc(p.config))
	for name, f := range p.files {
		a.HandlePublic("GET /rooms/{room}/"+name, f)
	}
	return nil
}

// policy is the page's CSP: the node's own scripts and styles, images from
// the node, data: and https: (a room's logo may live on the site's CDN),
// and connections to the node and its room socket.
func (p *roomPage) policy(r *http.Request) string {
	connect := "'self'"
	if p.cfg.WSURL != "" {
		u, _ := url.Parse(p.cfg.WSURL) // validated
		connect += " " + u.Scheme + "://" + u.Host
	} else if ws := wsSources(r, p.wsPort); ws != "" {
		connect += " " + ws
	}
	return "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: https:; connect-src " + connect +
		"; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}

// page answers the page of a room, or the 404 page when there is no such
// room (the status says so too: a crawler or a monitor sees 404).
func (p *roomPage) page(w http.ResponseWriter, r *http.Request) {
	room := r.PathValue("room")
	if !roomName.MatchString(room) || !p.cfg.Exists(room) {
		p.writeNotFound(w, r, room)
		return
	}
	p.index.ServeHTTP(w, r)
}

// writeNotFound writes the 404 page; the room's name is shown only when it
// is a valid name (and is escaped by html/template anyway).
func (p *roomPage) writeNotFound(w http.ResponseWriter, r *http.Request, room string) {
	if !roomName.MatchString(room) {
		room = ""
	}
	var buf bytes.Buffer
	if err := p.notFound.Execute(&buf, struct{ Room string }{room}); err != nil {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	h := w.Header()
	setSecurityHeaders(h, p.csp(r))
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNotFound)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

// redirect sends /rooms/{room} to /rooms/{room}/ (the page's files are
// relative to it).
func (p *roomPage) redirect(w http.ResponseWriter, r *http.Request) {
	room := r.PathValue("room")
	if !roomName.MatchString(room) {
		p.writeNotFound(w, r, "")
		return
	}
	http.Redirect(w, r, room+"/", http.StatusMovedPermanently)
}

// roomPageConfig is GET /rooms/{room}/config.json: where the page opens
// the room socket. Its room is not looked up: it says nothing about one.
type roomPageConfig struct {
	// WSURL is the configured public WebSocket base, when there is one.
	WSURL string `json:"ws_url,omitempty"`
	// WSPort is the WebSocket listener's port, for a page on the node's
	// own host (no WSURL).
	WSPort string `json:"ws_port,omitempty"`
}

func (p *roomPage) config(w http.ResponseWriter, r *http.Request) {
	c := roomPageConfig{WSURL: strings.TrimSuffix(p.cfg.WSURL, "/")}
	if c.WSURL == "" && p.wsPort != nil {
		c.WSPort = p.wsPort()
	}
	gateway.WriteJSON(w, http.StatusOK, c)
}
