// Package embedded is the store.Store of embedded mode: a durable store in
// a local data directory (default ./data), on the cockroachdb/pebble LSM
// engine, for a single fanfared node with nothing else installed.
//
// Engine choice. bbolt and pebble were measured on this project's 2-vCPU
// VM with fsync on every commit, 1,000 groups, 200-byte bodies and an
// idempotency key per message, after 500,000 messages were stored:
//
//	batch of 100: bbolt  9.5k msg/s (10.5 ms/commit), pebble  91-114k msg/s (0.9-1.1 ms/commit)
//	batch of 500: bbolt 13.7k msg/s (36.5 ms/commit), pebble 122-148k msg/s (3.3-4.1 ms/commit)
//	range of 200: bbolt 44 µs, pebble 78 µs (compacted) to 290 µs (fresh L0)
//
// bbolt's B+tree rewrites a 4 KiB page for nearly every random
// (gid, sender, client_msg_id) insert, while pebble appends the batch to
// its WAL; pebble also used a third of bbolt's CPU for the same writes.
// Reads are slower but far from the bottleneck, so pebble it is.
//
// Invariants (docs/architecture.md §1), and how they are kept:
//   - Every write runs under one mutex (Store.wmu) and reads the committed
//     state with point lookups before building its batch; so seq is
//     allocated as last_seq+1 in the same atomic batch that stores the
//     message, dense and never reused, and never for a rejected request.
//   - Append returns only after its batch is committed with an fsync of
//     the WAL (pebble.Sync). Concurrent Append calls are merged by one
//     committer goroutine into one batch per round (group commit).
//   - Readers never read the engine's latest state: pebble publishes a
//     batch before its WAL sync completes, and a reader that saw a message
//     a crash then undid would see its seq reused. After each commit the
//     writer publishes a snapshot (Store.cur) and every read uses the
//     current snapshot: a consistent, durable, point-in-time view, in which
//     seq N+1 is never visible without N.
//   - (gid, sender, client_msg_id) -> seq is an index written in the same
//     batch as the message; a retry returns the original seq and time.
//   - Messages clamps to the member's join_seq, to last_seq and to
//     Limits.MaxRange, all read from one snapshot.
//
// Append's cost per message is one idempotency lookup plus two keys in the
// batch. Group records and (gid, uid) memberships, which every request
// also needs, come from an in-memory cache (metaCache) that is read and
// written only under wmu: writers of those rows forget them, Append updates
// last_seq after its commit, so the cache always equals the committed
// state. Lookups of a round go through one iterator with bloom filters on
// every level (pebble's Get skips the last level's filters, and an
// idempotency lookup almost always misses).
//
// A failed WAL write or sync is fatal, as in Postgres: pebble cannot tell
// what reached the disk, so it stops the process (Config.Logger gets the
// cause); a restart recovers from the WAL. Commit errors that do return
// (the store is closing) mean nothing was applied.
//
// Durability exceptions, by design: MarkRead, TouchUser, TouchUsers and
// AdvanceConversations commit without waiting for an fsync (the next synced
// commit carries them to disk). They are hints; a crash may move them back,
// never forward, and never loses a message. The waiting room's journal
// (ScanRooms, WriteRooms) waits for an fsync at most once per
// RoomSyncEvery: a machine crash loses at most that much of room changes.
//
// Goroutine model: a Store is safe for concurrent use. It owns one
// goroutine, the Append committer, started by Open and stopped by Close;
// pebble runs its own flush and compaction goroutines. Lock order:
// closeMu (shared by every operation, exclusive in Close) before wmu.
//
// One process at a time: pebble locks the directory, and a second Open of
// the same directory fails with ErrLocked. Tests that need two handles on
// one database share one *Store.
//
// Key layout and record encodings are in keys.go; the format version is
// stored in the data directory and checked by Open.
package embedded
