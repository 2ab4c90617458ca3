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
// Leases (Config.LeaseTTL; fanfared -limits-lease-ttl): a sliding-window
// counter (not weighted: weighted rules and GCRA buckets are always decided
// in Redis, so level weighting is exactly as above) that is hot on a node
// (asked for at least LeaseMinHits units within one LeaseTTL on that node)
// is decided there from a lease: lease.lua takes up to k units of it in one
// call, and the node spends them locally, without Redis, until LeaseTTL
// has passed or they are spent; then the next caller renews it (the same
// call gives the unspent units of the old lease back), the node's other
// callers of that counter waiting for the renewal (callers it did not
// cover renew again, up to four rounds, then go the exact way; callers
// arriving as a renewal ends may take its units before the waiters wake,
// which a hand-off to the waiters would prevent at twice the node's CPU
// per decision, measured: Limiter.LeaseStats counts both ways). k is twice
// what the node admitted from leases of the counter in the last LeaseTTL,
// or the units of the callers waiting if more, at least LeaseMinHits, at
// most LeaseMax and at most what the rule admits in one
// LeaseTTL (Limit x LeaseTTL / Window); a rule for which that is below 2
// is never leased. Cold counters, and every check when a lease cannot be
// had (the window is full, Redis fails), go the exact way above. What a
// lease changes, exactly:
//   - No over-admission, on any number of nodes: leased units are members
//     of the counter's sorted set like any other, but scored at the
//     lease's end (Redis TIME at the take + LeaseTTL), and the node stops
//     spending them LeaseTTL after it sent the take (its own monotonic
//     clock, read before the call). Each spent unit so stays in the window
//     for at least a full window after it was spent (as long as the node's
//     clock and Redis's run at the same rate), and the counter never
//     holds more than Limit: a sliding window still admits at most Limit
//     in any Window. (Key expiries only ever grow, so that a later
//     request cannot expire a key before its leased units leave.)
//   - Under-admission, bounded: units a node holds unspent are denied to
//     every other node until it spends or gives them back, at most LeaseMax
//     (and Limit x LeaseTTL / Window) per counter per node; a spent leased
//     unit occupies the window up to LeaseTTL longer than it would have
//     (at most LeaseTTL / Window of the rule's rate while it is saturated).
//     Unspent units go back at the renewal, or within a LeaseTTL of the
//     lease's end (Limiter.Run), or all of them when Run's context ends. A
//     node that crashes holding a lease keeps its unspent units from the
//     others until LeaseTTL + Window after the take, no longer: they leave
//     the window as any unit does.
//   - All or nothing still: a request's leased units are reserved first
//     and the rest of its checks go to Redis; if Redis denies the request
//     or fails, the reserved units go back to the lease (a denied request
//     spends nothing). If the lease was renewed meanwhile, they stay spent
//     (under-admission of one request's cost). A failed Redis call fails
//     the request with ErrUnavailable as before; limiter.Failover then
//     decides it on its fallback, and a request whose checks are all
//     leased keeps being decided locally until the lease expires.
//   - A lease is sized by what the node admitted, not by what it was asked:
//     a user flooding a group with requests that its own limits deny does
//     not grow the group's lease on that node (its reserved units go back
//     with each denial). What one user can spend of a group's lease is
//     what the request's other checks, its own limits included, admit, as
//     without leases; a user whose own counter is hot gets a lease of it,
//     at most what that rule admits in one LeaseTTL.
//   - Denials of a leased counter are decided in Redis (exact RetryAfter).
//     An admitted decision whose tightest check was leased reports as
//     Remaining what this node's lease has left: a lower bound.
//   - A limits reload makes every lease stale: the new rule is decided
//     from a new lease or the exact way, never from units taken under the
//     old one.
//
// Goroutine model: Allow is safe for concurrent use and starts no
// goroutines; with Config.Batch concurrent callers take turns leading shared
// calls (see batcher); with leases one caller per counter renews while the
// others wait. Run (leases only) gives back expired leases; it is the
// package's only long-lived goroutine, and nothing depends on it for
// correctness. Errors from Redis wrap limiter.ErrUnavailable so
// that limiter.Failover can switch to the in-process limiter.
package redislimit
