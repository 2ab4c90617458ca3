// Package limiter defines fanfare's rate limits (docs/architecture.md §8): the Limiter
// interface, the Limits configuration with the §8 dimensions and their
// defaults, tier-weighted shared quotas (docs/architecture.md §8), decision metrics, and
// Failover, which switches from the shared (Redis) backend to an in-process
// one while Redis is unreachable.
//
// Backends live in sub-packages: limiter/local (in-process, embedded mode
// and fallback) and limiter/redislimit (Lua on Redis, cluster mode). Both
// pass the one conformance suite in limiter/limitertest.
//
// Invariants every backend keeps:
//   - All or nothing: Allow decides every check of a request against one
//     consistent state; either all admit and each consumes its cost, or none
//     consumes anything (a denied request leaves no trace in any counter; a
//     weighted rule only records it as demand).
//   - No over-admission: a sliding window admits at most Limit units in any
//     interval of length Window (an exact log, not a two-bucket estimate); a
//     GCRA bucket at most Burst at once and Limit per Window on average.
//   - Weighted rules never let one class take another class's reserve, and
//     no user exceeds the per-user cap, VIPs included (see Weighted).
//   - A denial is a Decision; an error only means "could not decide".
//   - Limits are swapped atomically (SetLimits); counter state is kept per
//     rule name across reloads.
//
// Goroutine model: Allow, Limits and SetLimits are safe for concurrent use.
// Failover.Run is the only long-lived goroutine of this package; it probes
// the primary while on the fallback. limiter imports no other fanfare
// package.
package limiter
