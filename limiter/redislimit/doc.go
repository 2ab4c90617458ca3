// Package redislimit is the Redis limiter: the semantics of limiter.Limiter
// shared by every node, decided by Lua scripts with Redis TIME as the only
// clock.
//
// One request is one round trip. Standalone Redis (and Sentinel): a single
// script judges every check and commits only if all admit, atomically. Redis
// Cluster (Config.Cluster): the checks are grouped by hash tag (a user's
// dimensions share the tag {k:uid}, a group's {i:gid}, a weighted capacity
// and its per-user caps {w:rule:key:id}), one script per group, pipelined;
// each group is all-or-nothing, and when one group denies, the admitted
// groups are refunded by a second script (their unique sliding-window
// members removed, GCRA timestamps moved back exactly). Between the two
// round trips other requests may see those units and be denied: the
// cluster path can under-admit briefly, never over-admit.
//
// Keys: Prefix + "{" + tag + "}:" + rule + ":" + s|g (algorithm) + ":" + id
// and, for weighted rules, Prefix + "{w:rule:key:id}:" + t (total), c0-c2
// (classes), u:<uid> (per-user cap), d (demand hash); with expiries of one
// window (sliding), until the bucket is full again (GCRA), or five windows
// (weighted demand). Sliding-window members are unique per request and
// check (node id, counter), so requests in the same microsecond never
// overwrite each other. Scripts run by EVALSHA and fall back to EVAL.
//
// Batching (Config.Batch): concurrent requests are decided together by
// batch.lua, one script call for up to MaxBatch requests (on Redis Cluster
// one call per hash slot of the batch, pipelined). The script decides them
// one after the other in arrival order, each exactly as allow.lua would
// (all or nothing, weighted reserves and demand, the same keys and
// members), and only shares bookkeeping: one TIME, each rule's values
// parsed once, each key trimmed, counted and given its expiry once. A
// failed call fails every request it carried (limiter.Failover then
// decides each of them on its fallback). Redis runs a batch as one script:
// other commands wait behind it for its whole run.
//
// Goroutine model: Allow is safe for concurrent use and starts no
// goroutines; with Config.Batch concurrent callers take turns leading shared
// calls (see batcher). Errors from Redis wrap limiter.ErrUnavailable so
// that limiter.Failover can switch to the in-process limiter.
package redislimit
