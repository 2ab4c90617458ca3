// Package redisroom is the Redis implementation of waitroom.Backend, for
// cluster mode: several fanfared nodes share one room through it.
//
// # Keys
//
// Every key of a room carries the hash tag {room:<name>}, so the whole room
// (entries, the join index, away/active/smoothing sets, stats, the
// admission window, the VIP placement log and all K queue shards) lives in
// one Redis Cluster slot and each operation is one atomic Lua script. The
// K shards therefore split one big sorted set into smaller ones (cheaper
// skiplist operations and DEL/UNLINK) but do not spread a room over cluster
// nodes. Spreading it would need a tag per shard ({room:<name>:<i>}), and
// then admission could no longer be one script: each shard would get its
// own share of MaxActive and AdmitRate and the global order would become
// approximate. That trade is not made here; many rooms spread over the
// cluster instead.
//
// Two kinds of keys are not listed in KEYS but derived inside the scripts
// from the room's base (same hash tag, same slot): <base>nodes (node ->
// last heartbeat) and <base>n:<node> (uids whose socket the node holds).
//
// # Clock
//
// Scripts read redis.call('TIME') themselves (Redis 7 replicates script
// effects, so non-deterministic commands are allowed): Redis is the one
// clock of every node. Joins and scores use whole seconds; the token
// bucket uses microseconds.
//
// # Scores
//
// Scores are 1.3*join + bias rounded to milliseconds and written with
// "%.3f", exactly as the in-process backend computes them, so both store
// the same doubles. Ties are ordered by uid bytes, as in a sorted set; the
// scripts compare strings byte by byte, not with the locale's strcoll.
//
// # Rank
//
// ahead(u) = sum over shards of the lower keys (ZRANK in u's shard,
// ZCOUNT plus tie scan elsewhere) + overdue users with a higher key (the
// first 1000 overdue are checked one by one, any beyond are counted as
// ahead). An overdue user's rank is its ZRANK in the join index.
//
// # Batched enters
//
// A node's concurrent Enters of one room share script calls (enterQueue):
// at most Config.EnterInFlight calls of a room are under way, and the
// Enters that arrive meanwhile go together in the next one, up to
// Config.EnterBatch users. The script enters them one after another with
// one clock reading, so a batch has the effect of that many calls in a row
// within one second; the values a script reads several times (sorted-set
// sizes, lmax, pseq, passes, the overdue list) are read once per call and
// kept up to date by the script's own writes. A lone Enter on a quiet node
// still goes at once. Each caller waits for its call or its own context.
//
// # Admissions channel
//
// Each admission step publishes "now\0expires\0uid..." on the room's
// channel (Channel); WatchAdmissions lets every node push granted frames to
// its own connections at once instead of at its next snapshot.
package redisroom
