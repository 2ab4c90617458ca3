// Package postgres is the Postgres implementation of store.Store (pgx v5,
// pgxpool), for cluster mode: any number of fanfare nodes share one database.
//
// Invariants it owns (DESIGN.md §1, §3):
//   - Seq allocation happens under the group row lock. Append takes
//     FOR NO KEY UPDATE on every group of the batch, in ascending gid order
//     (so two nodes appending to overlapping groups cannot deadlock), and
//     advances groups.last_seq by the number of messages it inserts in the
//     same transaction. Seqs are therefore dense per group, never reused,
//     and never allocated to a rejected request. Because the lock is held
//     until COMMIT and Postgres makes a transaction visible before it
//     releases its locks, a group's transactions become visible in seq
//     order: a reader never sees seq N+1 before N.
//   - Duplicates (gid, sender, client_msg_id) are looked up after the locks
//     are held, so a retry racing the original on another node sees it.
//   - Append returns only after COMMIT returned, with synchronous_commit=on
//     forced on every pooled connection.
//   - Messages reads last_seq, join_seq and the rows in one statement (one
//     snapshot), so it never returns a row above the last_seq it reports.
//   - AddMembers and RemoveMember also take the group row lock, which
//     serializes ordinal assignment and makes join_seq = last_seq + 1 exact
//     with respect to concurrent Appends.
//
// Round trips: an Append batch costs two pipelined round trips (BEGIN, lock
// groups, membership, duplicates; then UPDATE groups, one multi-row INSERT
// from unnest'ed arrays, COMMIT) regardless of how many groups or messages
// it spans. Statements are prepared once per connection (pgx statement
// cache).
//
// Errors: failures to reach or talk to Postgres (connection errors,
// shutdown, statement timeout, serialization failures) wrap
// store.ErrUnavailable; anything else is returned as an internal error.
//
// Goroutine model: a Store is safe for concurrent use; it owns a pgxpool
// and no goroutines of its own beyond the pool's health checker.
//
// Schema: Open applies the embedded migrations (package migrations) unless
// Config.SkipMigrate is set; Migrate applies them on its own (used by
// `fanfare migrate`).
package postgres
