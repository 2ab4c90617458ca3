// Package limitertest is the conformance suite every limiter.Limiter
// backend passes: Run(t, Backend) with the backend's constructor.
//
// Time is a manual Clock. The in-process backend reads it directly, so its
// boundaries are tested to the nanosecond. The Redis backend keeps Redis TIME
// as its only clock; its test constructor shifts that clock so it follows
// the manual one (Redis TIME - wall time elapsed + Clock.Elapsed), so the
// same tests run without sleeping, within a stated tolerance.
//
// It covers boundaries, window sliding, costs, GCRA bursts, all-or-nothing
// across dimensions, decision fields, errors, reloads, the §8 defaults, no
// over-admission under 64 goroutines on two nodes, weighted reserves, the
// per-user cap, and fairness between user levels under floods.
package limitertest
