// Package local is the in-process limiter: the semantics of limiter.Limiter
// for one node, used in embedded mode and by limiter.Failover while Redis is
// unreachable.
//
// State lives in a fixed number of shards (hash of rule, key and id), each a
// mutex and three maps: GCRA timestamps, sliding-window logs and weighted
// capacities. Allow locks every shard its checks touch, in ascending shard
// order (the only lock order; no other lock is held meanwhile), judges every
// check, and only then commits all of them: all or nothing.
//
// Time is the injected Config.Now, as nanoseconds since the limiter was
// created (monotonic with the default time.Now). Allow allocates nothing in
// steady state (new counters allocate once). Run sweeps idle counters; it is
// the only goroutine of the package and is owned by the caller.
package local
