// Package migrations holds fanfare's Postgres schema (docs/architecture.md §3) as
// ordered SQL files embedded in the binary.
//
// Files are named NNNN_name.sql; NNNN is the version, applied in ascending
// order, each exactly once. A file is never edited after it has been
// released: schema changes are new files. The files use unqualified names so
// that they apply to whatever schema is first on the search_path (the
// per-test schemas of the test suites, or public).
//
// This package only lists the files; store/postgres.Migrate applies them in
// one transaction under an advisory lock and records them in
// schema_migrations, so re-running is a no-op and two processes migrating at
// once are safe.
package migrations
