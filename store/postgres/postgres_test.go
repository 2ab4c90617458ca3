package postgres

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fanfare-im/fanfare/migrations"
	"github.com/fanfare-im/fanfare/store"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none = valid
	}{
		{"ok", Config{URL: "postgres://u@h/db"}, nil},
		{"ok schema", Config{URL: "postgres://u@h/db", Schema: "fanfare_1"}, nil},
		{"no url", Config{}, []string{"URL is required"}},
		{"bad schema and conns", Config{URL: "postgres://u@h/db", Schema: "Bad-Name", MaxConns: -1},
			[]string{"bad schema", "MaxConns"}},
		{"negative limit", Config{URL: "postgres://u@h/db", Limits: store.Limits{MaxRange: -1}}, []string{"MaxRange"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got nil, want error mentioning %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got %q, want it to mention %q", err, w)
				}
			}
		})
	}
}

func TestOpenUnreachableIsUnavailable(t *testing.T) {
	ctx := context.Background()
	// Port 1 on loopback: connection refused.
	_, err := Open(ctx, Config{URL: "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2"})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("got %v, want ErrUnavailable", err)
	}
}

// TestMigrateConcurrentAndIdempotent: several migrators at once apply each
// migration once; re-running is a no-op.
func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	ctx := context.Background()
	schema := newSchema(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = Migrate(ctx, testURL(), schema) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
	}
	if err := Migrate(ctx, testURL(), schema); err != nil {
		t.Fatalf("re-run: %v", err)
	}
	conn, err := pgx.Connect(ctx, testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n, parts int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(schema)+`.schema_migrations`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	all, _ := migrations.All()
	if n != len(all) {
		t.Errorf("got %d schema_migrations rows, want %d", n, len(all))
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_inherits
		WHERE inhparent = ($1 || '.messages')::regclass`, quoteIdent(schema)).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	if parts != 16 {
		t.Errorf("got %d messages partitions, want 16", parts)
	}
}

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, newSchema(t), 4)
	g, err := s.CreateGroup(ctx, store.Group{Name: "g", Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := s.AddMembers(ctx, g.GID, []string{"o", "a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 || ms[0].Role != store.RoleOwner || ms[2].Ordinal != 2 {
		t.Fatalf("got members %+v", ms)
	}
	reqs := []store.AppendRequest{
		{GID: g.GID, Sender: "a", ClientMsgID: "1", Body: []byte(`{"t":"hi"}`)},
		{GID: g.GID, Sender: "x", ClientMsgID: "1", Body: []byte(`{}`)},
		{GID: g.GID, Sender: "b", ClientMsgID: "1", Body: []byte(`"yo"`)},
		{GID: g.GID, Sender: "a", ClientMsgID: "1", Body: []byte(`{"t":"hi"}`)},
	}
	res := make([]store.AppendResult, len(reqs))
	if err := s.Append(ctx, reqs, res); err != nil {
		t.Fatal(err)
	}
	if res[0].Seq != 1 || res[1].Err != store.ErrNotMember || res[2].Seq != 2 || res[3].Seq != 1 || !res[3].Duplicate {
		t.Fatalf("got %+v", res)
	}
	msgs, last, err := s.Messages(ctx, g.GID, "b", 0, 0, 0, 0)
	if err != nil || last != 2 || len(msgs) != 2 || string(msgs[1].Body) != `"yo"` {
		t.Fatalf("got %+v %d %v", msgs, last, err)
	}
}

// TestMigrateAddedXidPrecreated: migration 0004 finds its column and its
// index already made by hand (docs/operations.md §8.4, the index built
// CONCURRENTLY before the first new node starts) and only records itself.
// Fails when a statement of 0004 is not a no-op on them.
func TestMigrateAddedXidPrecreated(t *testing.T) {
	ctx := context.Background()
	schema := newSchema(t)
	if err := Migrate(ctx, testURL(), schema); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	q := quoteIdent(schema)
	// Back to before 0004, then the operator's pre-step.
	for _, sql := range []string{
		`DROP INDEX ` + q + `.group_members_added_idx`,
		`ALTER TABLE ` + q + `.group_members DROP COLUMN added_xid`,
		`DELETE FROM ` + q + `.schema_migrations WHERE version = 4`,
		`ALTER TABLE ` + q + `.group_members ADD COLUMN IF NOT EXISTS added_xid bigint NOT NULL DEFAULT 0`,
		`ALTER TABLE ` + q + `.group_members ALTER COLUMN added_xid SET DEFAULT (pg_current_xact_id()::text::bigint)`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS group_members_added_idx ON ` + q + `.group_members (added_xid, gid, uid) WHERE added_xid > 0`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := Migrate(ctx, testURL(), schema); err != nil {
		t.Fatalf("migrate after the pre-step: %v", err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+q+`.schema_migrations WHERE version = 4`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("migration 4 recorded %d times, want 1", n)
	}
}
