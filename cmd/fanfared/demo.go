package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/web"
)

// Values of -demo.
const (
	demoAuto = "auto" // on in embedded mode, off in cluster mode
	demoOn   = "on"
	demoOff  = "off"
)

// demoRoom is the waiting room the demo enters (embedded mode): one
// admitted user at a time, so that a second tab waits in line.
const demoRoom = "demo"

// demoOwner owns the demo's groups (in the demo namespace: never a real
// user).
const demoOwner = web.UIDPrefix + "owner"

// demoEnabled says whether /demo/ is served.
func (s *server) demoEnabled() bool {
	switch s.cfg.Demo {
	case demoOn:
		return true
	case demoOff:
		return false
	}
	return s.mode == "embedded"
}

// devTokens says whether the development token route exists: embedded
// mode with the demo on, never in cluster mode.
func (s *server) devTokens() bool { return s.mode == "embedded" && s.demoEnabled() }

// webConfig is what fanfared serves at /demo/, /admin/, /rooms/{room}/ and /sdk/.
func (s *server) webConfig(ctx context.Context, sdk fs.FS) (web.Config, error) {
	wc := web.Config{Demo: s.demoEnabled(), Admin: s.cfg.AdminConsole, Node: s.cfg.NodeID, Logger: s.log, WSPort: func() string {
		_, port, _ := net.SplitHostPort(s.wsAddr())
		return port
	}}
	if s.cfg.RoomPage {
		wc.Rooms = &web.RoomsConfig{WSURL: s.cfg.RoomPageWSURL, Exists: func(room string) bool {
			_, ok := s.wr.Config(room)
			return ok
		}}
	}
	if wc.Demo || wc.Admin || wc.Rooms != nil {
		wc.SDK = sdk // the pages import the SDK from /sdk/
	}
	if !s.devTokens() {
		return wc, nil
	}
	signer, err := auth.NewSigner(auth.SignerConfig{Secret: []byte(s.jwtSecret)})
	if err != nil {
		return wc, err
	}
	if _, ok := s.wr.Config(demoRoom); !ok {
		if _, err := s.wr.Upsert(ctx, waitroom.RoomConfig{Name: demoRoom, MaxActive: 1, AdmitRate: 1,
			AccessTokenTTL: 5 * time.Minute}); err != nil {
			return wc, fmt.Errorf("demo room: %w", err)
		}
	}
	wc.Dev = &web.DevConfig{
		Backend:    &demoBackend{signer: signer, st: s.st, eng: s.eng, path: filepath.Join(s.cfg.DataDir, "demo-groups.json")},
		TTL:        s.cfg.DemoTokenTTL,
		Rate:       s.cfg.DemoTokenRate,
		Burst:      s.cfg.DemoTokenBurst,
		MaxMembers: s.cfg.DemoMaxMembers,
		Room:       demoRoom,
	}
	return wc, nil
}

// demoBackend is web.DevBackend on the node's store and engine. The
// demo's groups are created on first use and remembered by name in
// <data-dir>/demo-groups.json, so that a restart finds them again.
type demoBackend struct {
	signer *auth.Signer
	st     store.Store
	eng    *fanout.Engine
	path   string

	mu   sync.Mutex
	gids map[string]int64 // nil until loaded
}

func (b *demoBackend) Token(uid string, tier int, ttl time.Duration) (string, error) {
	return b.signer.Sign(uid, tier, ttl)
}

func (b *demoBackend) Group(ctx context.Context, name string) (int64, int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gids == nil {
		b.gids = map[string]int64{}
		if raw, err := os.ReadFile(b.path); err == nil {
			_ = json.Unmarshal(raw, &b.gids) // a damaged file: the groups are made again
		}
	}
	if gid, ok := b.gids[name]; ok {
		g, err := b.st.Group(ctx, gid)
		if err == nil {
			return gid, g.MemberCount, nil
		}
		if !errors.Is(err, store.ErrGroupNotFound) {
			return 0, 0, err
		}
	}
	g, err := b.st.CreateGroup(ctx, store.Group{Name: "demo " + name, Owner: demoOwner})
	if err != nil {
		return 0, 0, err
	}
	b.gids[name] = g.GID
	raw, _ := json.Marshal(b.gids)
	if err := os.WriteFile(b.path, raw, 0o600); err != nil {
		return 0, 0, err
	}
	return g.GID, g.MemberCount, nil
}

func (b *demoBackend) IsMember(ctx context.Context, gid int64, uid string) (bool, error) {
	_, err := b.st.Member(ctx, gid, uid)
	if errors.Is(err, store.ErrNotMember) {
		return false, nil
	}
	return err == nil, err
}

func (b *demoBackend) Join(ctx context.Context, gid int64, uid string) error {
	_, err := b.eng.AddMembers(ctx, gid, []string{uid})
	return err
}

// pageURL is the address to open the HTTP port's page at: the listen
// address, with a loopback host for an unspecified one (0.0.0.0, ::).
func pageURL(addr, path string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + path
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + path
}
