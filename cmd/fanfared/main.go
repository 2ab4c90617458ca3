// Command fanfared is the fanfare server. See README.md.
package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signalContext()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// signalContext is done on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// run runs the node until ctx is done: errHelp after -h printed the usage
// to stdout, a *usageError for a bad setting, any other error for a
// failure (exitCode maps them to 0, 2 and 1). Logs and the banner go to
// stderr.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(args, getenv, stdout)
	if err != nil {
		return err
	}
	log := newLogger(stderr, cfg.LogLevel)
	s, err := newServer(ctx, cfg, log)
	if err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			s.reload() // logs its outcome
		}
	}()
	return s.run(ctx, func() { s.banner(stderr) })
}

// banner tells a person how to use the node that just started.
func (s *server) banner(w io.Writer) {
	where := "Postgres " + redactURL(s.cfg.PostgresURL)
	if s.mode == "embedded" {
		where = "embedded store in " + s.cfg.DataDir
	}
	fmt.Fprintf(w, `
fanfare node %s is up (%s mode, %s)
  WebSocket:   ws://%s/ws   (waiting rooms: /rooms/{room}/ws)
  HTTP API:    http://%s    (metrics: /metrics)
`, s.cfg.NodeID, s.mode, where, s.wsAddr(), s.httpAddr())
	if s.demoEnabled() {
		fmt.Fprintf(w, "  Demo:        %s   (open it in two browser tabs)\n", pageURL(s.httpAddr(), "/demo/"))
	}
	if s.cfg.RoomPage {
		fmt.Fprintf(w, "  Room page:   %s   (waiting rooms' hosted page)\n", pageURL(s.httpAddr(), "/rooms/{room}/"))
	}
	if s.cfg.AdminConsole {
		fmt.Fprintf(w, "  Admin:       %s   (sign in with the admin token)\n", pageURL(s.httpAddr(), "/admin/"))
	}
	// Configured secrets are never printed; generated development ones
	// are, so that a new user can try the node at once.
	if s.devJWT || s.devAdmin || s.devRoom {
		fmt.Fprintf(w, "  development secrets (generated, kept in %s):\n", filepath.Join(s.cfg.DataDir, "dev-secrets.json"))
	}
	if s.devAdmin {
		fmt.Fprintf(w, "    admin token: %s\n", s.adminToken)
	}
	if s.devJWT {
		fmt.Fprintf(w, "    mint a user token: FANFARE_JWT_SECRET=%s bin/fanfare token -uid alice\n", s.jwtSecret)
	}
	if s.devRoom {
		fmt.Fprintf(w, "    waiting-room access tokens (package gate): FANFARE_ROOM_TOKEN_SECRET=%s\n", s.roomSecret)
	}
	fmt.Fprintln(w)
}

// redactURL hides the password of a Postgres connection string in both
// of its forms: a URL (user info or a password query parameter) and
// keyword/value pairs. What it cannot parse it hides whole.
func redactURL(u string) string {
	if u == "" {
		return u
	}
	if strings.Contains(u, "://") {
		p, err := url.Parse(u)
		if err != nil {
			return "(unparsable URL)"
		}
		if _, ok := p.User.Password(); ok {
			p.User = url.UserPassword(p.User.Username(), "***")
		}
		if q := p.Query(); q.Has("password") {
			q.Set("password", "***")
			p.RawQuery = q.Encode()
		}
		return p.String()
	}
	return dsnPassword.ReplaceAllString(u, "${1}***")
}

// dsnPassword matches the value of password= in a keyword/value string,
// quoted or not.
var dsnPassword = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)
