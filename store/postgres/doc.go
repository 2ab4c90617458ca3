// Package postgres is the Postgres implementation of store.Store (pgx v5,
// pgxpool), for cluster mode: any number of fanfare nodes share one database.
//
// Invariants it owns (docs/architecture.md §1, §3):
//   - Seq allocation happens under the group row lock. Append takes
//     FOR NO KEY UPDATE on every group of the batch, in ascending gid order
//     (so two nodes appending to overlapping groups cannot deadlock), and
//     advances groups.last_seq by the number of messages it inserts in the
//     same transaction. Seqs are therefore dense per group, never reused,
//     and never allocated to a rejected request. Because the lock is held
//     until COMMIT and Postgres makes a transaction visible before it
//     releases its locks, a group's transactions become visible in seq
//     order: a reader never sees seq N+1 before N.
//   - Duplicates (gid, sender, client_msg_id) are detected after the locks
//     are held (by the unique index, which sees every committed row and
//     waits for in-flight ones), so a retry racing the original on another
//     node gets the original's seq.
//   - Append returns only after the commit returned, with
//     synchronous_commit=on forced on every pooled connection.
//   - Messages reads last_seq, join_seq and the rows in one statement (one
//     snapshot), so it never returns a row above the last_seq it reports.
//   - AddMembers and RemoveMember also take the group row lock, which
//     serializes ordinal assignment and makes join_seq = last_seq + 1 exact
//     with respect to concurrent Appends.
//
// Round trips: an Append batch is normally ONE statement in its own
// implicit transaction, one round trip plus the WAL flush, whatever the
// number of groups and messages (see sqlAppend: lock groups in gid order,
// classify, number, INSERT, advance last_seq). A batch that holds a retry
// of a stored message fails that statement with a unique violation and is
// rerun on the two-round-trip path (BEGIN, lock, membership and duplicate
// lookups; then UPDATE, one INSERT from unnest'ed arrays, COMMIT). Lookups
// are written as LATERAL ... LIMIT 1 so they stay index probes under the
// generic plans that the statement cache uses.
//
// Merging: concurrent Append calls share statements (merge.go). At most
// Config.AppendStatements run at once; calls arriving meanwhile queue and
// run together as the next one, one transaction, in arrival order. A
// merged statement is one Append of the concatenated requests, so the
// invariants above hold for it unchanged; a call returns only after its
// statement committed, and a call cancelled while queued leaves the queue
// unsent.
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
