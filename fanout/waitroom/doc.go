// Package waitroom is fanfare's VIP-aware virtual waiting room (DESIGN.md
// §11): it admits users to a scarce downstream at most MaxActive at once
// and at most AdmitRate per second, lets VIPs through faster without
// starving anyone, and tells every waiting user the truth about position
// and wait.
//
// # Invariants
//
//   - Order. A waiting user's stored score is the time-invariant key
//     1.3*join + bias(level) (bias 0 for normal users, -VIPBias[level] for
//     VIPs); lower scores are admitted first, ties by uid bytes. Because the
//     key is time-invariant, a VIP never passes a normal user who joined
//     more than VIPBias/1.3 seconds earlier.
//   - Max wait. A user whose wait reaches MaxWait is admitted before
//     everyone else, oldest join first (a second index by join time), so no
//     connected user waits longer than MaxWait plus the time to admit the
//     users already overdue ahead of it.
//   - Share cap. When VIPs hold more than VIPShareCap of the queue, a new
//     VIP's bias is scaled by cap/share.
//   - Smooth insertion. A new VIP starts at the normal score and moves to
//     its target in steps over Smoothing, never past it.
//   - Idempotent enter, atomic admission. Enter never creates a second
//     entry for a user; one admission step (token bucket, MaxActive, overdue
//     first, then best score) is atomic, so nodes sharing a backend never
//     admit a user twice nor exceed MaxActive.
//   - One clock. Every time is the backend's clock (Redis TIME), in whole
//     seconds for joins and scores.
//   - Reconnect. A disconnected waiting user is "away": not admitted, not
//     counted ahead of others. Back within Grace it keeps its key; later, its
//     join time (hence score and max-wait clock) moves DecayRate seconds
//     later per second away past Grace; past HardTimeout the entry is gone.
//   - Bounded. The queue is bounded by Little's Law, L_max = observed
//     admission rate * TargetWait * SafetyFactor; entrants beyond it are
//     rejected room_full with a retry hint.
//
// # Backends
//
// Backend is the storage with the atomic operations. Memory (this package)
// serves embedded mode and the Redis-down fallback; fanout/waitroom/redisroom
// implements the same semantics with Lua scripts. Both pass
// fanout/waitroom/waitroomtest.
package waitroom
