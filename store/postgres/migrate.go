package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fanfare-im/fanfare/migrations"
)

// Migrate applies the embedded migrations to the database at url, in
// schema ("" = the connection's current schema, normally public; created if
// missing). Every pending migration is applied in one transaction under an
// advisory lock keyed by the schema and recorded in schema_migrations, so
// re-running is a no-op and concurrent callers (several nodes starting at
// once) apply each migration exactly once.
func Migrate(ctx context.Context, url, schema string) error {
	if err := validSchema(schema); err != nil {
		return err
	}
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("postgres: bad URL: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return dbErr("connect", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = migrate(ctx, conn, schema)
	return err
}

// migrate applies the pending migrations on conn and returns them.
func migrate(ctx context.Context, conn *pgx.Conn, schema string) ([]migrations.Migration, error) {
	all, err := migrations.All()
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, dbErr("migrate", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	// Serialize migrators of the same schema; other schemas (parallel test
	// schemas) proceed independently.
	if _, err := tx.Exec(ctx,
		`SELECT pg_advisory_xact_lock(hashtext('fanfare.migrate'),
			hashtext(coalesce(nullif($1, ''), current_schema(), 'public')))`, schema); err != nil {
		return nil, dbErr("migrate: lock", err)
	}
	if schema != "" {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+quoteIdent(schema)); err != nil {
			return nil, dbErr("migrate: create schema", err)
		}
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+quoteIdent(schema)); err != nil {
			return nil, dbErr("migrate: search_path", err)
		}
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, dbErr("migrate: schema_migrations", err)
	}
	rows, err := tx.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, dbErr("migrate: versions", err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, dbErr("migrate: versions", err)
	}
	have := make(map[int]bool, len(done))
	for _, v := range done {
		have[int(v)] = true
	}
	var applied []migrations.Migration
	for _, m := range all {
		if have[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, dbErr("migrate: "+m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`,
			m.Version, m.Name); err != nil {
			return nil, dbErr("migrate: record "+m.Name, err)
		}
		applied = append(applied, m)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, dbErr("migrate: commit", err)
	}
	return applied, nil
}
