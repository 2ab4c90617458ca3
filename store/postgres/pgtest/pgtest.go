// Package pgtest gives tests a Postgres of their own: a fresh schema in the
// shared test database (Schema) or a throwaway server they may stop and
// start (Throwaway), for failure tests that must never touch the shared one.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// URL returns FANFARE_TEST_POSTGRES_URL; an unset variable fails the test.
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("FANFARE_TEST_POSTGRES_URL")
	if u == "" {
		t.Fatal("FANFARE_TEST_POSTGRES_URL is not set (make test sets it)")
	}
	return u
}

// Schema returns the name of a fresh schema for one test, dropped (with
// everything in it) when the test ends. The schema itself is created by
// whoever opens the store with it.
func Schema(t testing.TB, url string) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("pgtest: drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// Throwaway is a private Postgres server on one port of a range.
type Throwaway struct {
	bin, dir, data string
	port           int
	asPostgres     bool
}

// URL is the connection string of the throwaway server's postgres database.
func (p *Throwaway) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", p.port)
}

// Port is the server's TCP port.
func (p *Throwaway) Port() int { return p.port }

// StartThrowaway runs initdb and starts a server on the first free port in
// [firstPort, lastPort]; t.Cleanup stops it and removes its files. Take
// ports below the kernel's ephemeral range (32768-60999): there, the client
// sockets of tests running in parallel can hold the port; the ranges
// taken are listed in internal/redistest. A missing Postgres installation
// fails the test.
func StartThrowaway(t testing.TB, firstPort, lastPort int) *Throwaway {
	t.Helper()
	bin := binDir(t)
	dir, err := os.MkdirTemp("", "fanfare-pg-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &Throwaway{bin: bin, dir: dir, data: filepath.Join(dir, "data"), asPostgres: os.Geteuid() == 0}
	t.Cleanup(func() {
		p.Stop() // ignore: may be stopped already
		os.RemoveAll(dir)
	})
	if err := os.Mkdir(p.data, 0o700); err != nil {
		t.Fatal(err)
	}
	if p.asPostgres { // initdb refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: throwaway servers need the postgres OS user when run as root: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(p.data, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	for port := firstPort; port <= lastPort; port++ {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			p.port = port
			break
		}
	}
	if p.port == 0 {
		t.Fatalf("pgtest: no free port in %d-%d for a throwaway Postgres", firstPort, lastPort)
	}
	if out, err := p.run("initdb", "-D", p.data, "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	if err := p.Start(); err != nil {
		t.Fatalf("start throwaway Postgres: %v", err)
	}
	return p
}

func (p *Throwaway) run(prog string, args ...string) *exec.Cmd {
	path := filepath.Join(p.bin, prog)
	if p.asPostgres {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

// Start starts the (stopped) server and waits until it accepts connections.
func (p *Throwaway) Start() error {
	return p.ctl("start", "-l", filepath.Join(p.data, "log"), "-o",
		fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c shared_buffers=16MB -c max_connections=40", p.port, p.data))
}

// Stop stops the server at once, like a crash (immediate mode).
func (p *Throwaway) Stop() error { return p.ctl("stop", "-m", "immediate") }

func (p *Throwaway) ctl(action string, args ...string) error {
	a := append([]string{"-D", p.data, "-w", "-t", "60", action}, args...)
	out, err := p.run("pg_ctl", a...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v: %s", action, err, out)
	}
	return nil
}

// binDir finds the Postgres server binaries (initdb, pg_ctl).
func binDir(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { // highest major version first
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	t.Fatal("initdb not found (install PostgreSQL: make services)")
	return ""
}
