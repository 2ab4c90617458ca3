package postgres

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/postgres/pgtest"
)

// testURL is the shared test database; an unreachable one fails the test.
func testURL() string {
	if u := os.Getenv("FANFARE_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// newSchema returns a fresh random schema name and drops the schema (if it
// was created) when t ends.
func newSchema(t testing.TB) string { return pgtest.Schema(t, testURL()) }

func dropSchema(url, schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+quoteIdent(schema)+" CASCADE")
	return err
}

// openTest opens a Store on schema of the test database, closed when t ends.
func openTest(t testing.TB, schema string, maxConns int32) *Store {
	t.Helper()
	return openTestLimits(t, schema, maxConns, store.Limits{})
}

// openTestLimits is openTest with limits.
func openTestLimits(t testing.TB, schema string, maxConns int32, lim store.Limits) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, Config{URL: testURL(), Schema: schema, MaxConns: maxConns, Limits: lim})
	if err != nil {
		t.Fatalf("open %s (is Postgres running? make services): %v", testURL(), err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var _ store.Store = (*Store)(nil)
