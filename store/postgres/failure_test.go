package postgres

import (
	"context"
	"errors"
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

	"github.com/fanfare-im/fanfare/store"
)

// throwaway is a private Postgres instance for failure tests, on one of
// the ports 55432-55439; the shared one is never touched.
type throwaway struct {
	bin, dir, data string
	port           int
	asPostgres     bool
}

func (p *throwaway) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", p.port)
}

// startThrowaway runs initdb and starts the server; t.Cleanup stops it and
// removes its files. A missing Postgres installation fails the test.
func startThrowaway(t *testing.T) *throwaway {
	t.Helper()
	bin := pgBinDir(t)
	dir, err := os.MkdirTemp("", "fanfare-pg-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &throwaway{bin: bin, dir: dir, data: filepath.Join(dir, "data"), asPostgres: os.Geteuid() == 0}
	t.Cleanup(func() {
		p.ctl(t, "stop", "-m", "immediate") // ignore: may be stopped already
		os.RemoveAll(dir)
	})
	if err := os.Mkdir(p.data, 0o700); err != nil {
		t.Fatal(err)
	}
	if p.asPostgres { // initdb refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("failure tests need the postgres OS user when run as root: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(p.data, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	for port := 55432; port <= 55439; port++ {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			p.port = port
			break
		}
	}
	if p.port == 0 {
		t.Fatal("no free port in 55432-55439 for a throwaway Postgres")
	}
	if out, err := p.run("initdb", "-D", p.data, "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	if err := p.ctl(t, "start"); err != nil {
		t.Fatalf("start throwaway Postgres: %v", err)
	}
	return p
}

func (p *throwaway) run(prog string, args ...string) *exec.Cmd {
	path := filepath.Join(p.bin, prog)
	if p.asPostgres {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

// ctl runs pg_ctl start or stop (waiting for it to finish).
func (p *throwaway) ctl(t *testing.T, action string, args ...string) error {
	a := []string{"-D", p.data, "-w", "-t", "60", action}
	if action == "start" {
		a = append(a, "-l", filepath.Join(p.data, "log"), "-o",
			fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c shared_buffers=16MB -c max_connections=20", p.port, p.data))
	}
	out, err := p.run("pg_ctl", append(a, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v: %s", action, err, out)
	}
	return nil
}

// pgBinDir finds the Postgres server binaries (initdb, pg_ctl).
func pgBinDir(t *testing.T) string {
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

// TestAppendWhenPostgresStops stops a throwaway Postgres (immediate
// shutdown, i.e. a crash) while an Append is in the middle of its INSERT.
// The Append must fail with ErrUnavailable, Appends while it is down too,
// and after restart none of the batch is visible, last_seq did not move,
// and the same Store (pool) recovers and continues the seqs without a gap.
func TestAppendWhenPostgresStops(t *testing.T) {
	p := startThrowaway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Open(ctx, Config{URL: p.url(), MaxConns: 2})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	var gids []int64
	for range 3 {
		g, err := s.CreateGroup(ctx, store.Group{Name: "g"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddMembers(ctx, g.GID, []string{"u"}); err != nil {
			t.Fatal(err)
		}
		gids = append(gids, g.GID)
	}
	mk := func(i int, cid string) store.AppendRequest {
		return store.AppendRequest{GID: gids[i%len(gids)], Sender: "u", ClientMsgID: cid, Body: []byte(`{"n":1}`)}
	}
	var first []store.AppendRequest
	for i := range 3 {
		first = append(first, mk(i, fmt.Sprint("ok", i)))
	}
	if err := s.Append(ctx, first, make([]store.AppendResult, 3)); err != nil {
		t.Fatalf("Append before the stop: %v", err)
	}

	// A row trigger that stalls on one marked row, so the server can be
	// stopped while the INSERT has already written the rows before it.
	admin, err := pgx.Connect(ctx, p.url())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `
		CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.client_msg_id = 'stall' THEN PERFORM pg_sleep(120); END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER stall BEFORE INSERT ON messages FOR EACH ROW EXECUTE FUNCTION stall();`); err != nil {
		t.Fatal(err)
	}
	var batch []store.AppendRequest
	for i := range 30 {
		batch = append(batch, mk(i, fmt.Sprint("batch", i)))
	}
	batch = append(batch, mk(0, "stall"))
	errc := make(chan error, 1)
	go func() { errc <- s.Append(ctx, batch, make([]store.AppendResult, len(batch))) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Append never reached the stalled row")
		}
		time.Sleep(10 * time.Millisecond)
	}
	admin.Close(ctx)
	if err := p.ctl(t, "stop", "-m", "immediate"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Append interrupted by the stop: got %v, want ErrUnavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Append did not return after the server stopped")
	}
	// While it is down: typed, retryable errors, quickly.
	down := []store.AppendRequest{mk(1, "while-down")}
	if err := s.Append(ctx, down, make([]store.AppendResult, 1)); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Append while down: got %v, want ErrUnavailable", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Ping while down: got %v, want ErrUnavailable", err)
	}
	if _, _, err := s.Messages(ctx, gids[0], "u", 0, 0, 0); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Messages while down: got %v, want ErrUnavailable", err)
	}

	if err := p.ctl(t, "start"); err != nil {
		t.Fatal(err)
	}
	check, err := pgx.Connect(ctx, p.url())
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(ctx)
	var n int
	if err := check.QueryRow(ctx, `SELECT count(*) FROM messages WHERE client_msg_id LIKE 'batch%' OR client_msg_id = 'stall'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("after restart: %d rows of the interrupted batch are visible, want 0", n)
	}
	rows, err := check.Query(ctx, `SELECT last_seq FROM groups ORDER BY gid`)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seqs, []int64{1, 1, 1}) {
		t.Errorf("after restart: got last_seqs %v, want [1 1 1]", seqs)
	}
	if _, err := check.Exec(ctx, `DROP TRIGGER stall ON messages`); err != nil {
		t.Fatal(err)
	}
	// The pool drops its dead connections and the seqs continue densely.
	res := make([]store.AppendResult, 2)
	if err := s.Append(ctx, []store.AppendRequest{mk(0, "after"), mk(0, "batch0")}, res); err != nil {
		t.Fatalf("Append after restart: %v", err)
	}
	if res[0].Seq != 2 || res[1].Seq != 3 || res[1].Duplicate {
		t.Errorf("after restart: got %+v, want seqs 2 and 3 (the lost batch took no seqs and is no duplicate)", res)
	}
}
