// Package waitroom is fanfare's VIP-aware virtual waiting room (docs/architecture.md
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
//     its target in steps (one per Maintain, ~1 s) over Smoothing, never
//     past it. Users it passes get vip_ahead_notice.
//   - Idempotent enter, atomic admission. Enter never creates a second
//     entry for a user; one admission step (token bucket, MaxActive, overdue
//     first, then best score) is atomic, so nodes sharing a backend never
//     admit a user twice nor exceed MaxActive. At most AdmitBurst +
//     AdmitRate*T users are admitted in any T seconds.
//   - One clock. Every time is the backend's clock (Redis TIME), in whole
//     seconds for joins and scores; local time only paces the driver.
//   - Reconnect and decay. A disconnected waiting user is "away": never
//     admitted, not counted ahead of others. Back within Grace it keeps its
//     key. Back later, its join time moves later by DecayRate seconds for
//     every second away past Grace, which raises its score by 1.3*DecayRate
//     per such second and restarts its max-wait clock by as much: with the
//     default DecayRate 1, time away past Grace simply does not count as
//     waiting. Past HardTimeout the entry is removed.
//   - Node liveness. Every entry records the node holding the user's
//     socket, and each node heartbeats in Maintain. When a node has been
//     silent for NodeTimeout, any other node's Maintain makes its waiting
//     users away (grace counted from its last heartbeat) and ends its
//     admitted sessions (reason disconnect), so a crashed node neither
//     holds slots nor gets users admitted to nobody.
//   - Bounded. The queue is bounded by Little's Law: L_max = observed
//     admission rate (5-minute window) * TargetWait * SafetyFactor;
//     entrants beyond it are rejected room_full with a retry hint; depth
//     at 50% / 80% of L_max is logged (Warn / Error) and exported.
//   - Truthful ETA. eta = ahead / admission rate over the last 5 minutes;
//     with no admission in that window the status is paused, with no ETA.
//
// # Backends
//
// Backend is the storage with the atomic operations. Memory (this package)
// serves embedded mode and the Redis-down fallback; fanout/waitroom/redisroom
// implements the same semantics with Lua scripts. Both pass
// fanout/waitroom/waitroomtest. Only cmd chooses a backend.
//
// In embedded mode Memory is durable (OpenMemory): it writes every change
// of an operation to a Journal (the embedded store's pebble database)
// before the operation returns, so rooms, queues and admitted sessions
// survive a restart as they do in Redis; the journal is read once, at
// open. Its entries are written through five helpers (own, insertWaiting,
// unqueue, rescore, remove) that mark them dirty; a test compares the
// journal with the live state after every call of the conformance suite.
//
// # Runtime: Manager, Room, Ticket
//
// A Manager runs the rooms of one node. The gateway calls Join for each
// room socket and gets a Ticket; every frame for that user (queue,
// granted with a signed access token, rejected, ended) is delivered as a
// plain Update through the deliver callback, which must not block. On
// socket close the gateway calls Ticket.Close (never blocks); on an
// explicit leave, Ticket.Leave. Admin endpoints call Upsert, Delete,
// Status, Rooms; Position answers from the local snapshot.
//
// # Goroutines
//
// Manager.Run owns every goroutine: one driver per room (each Tick:
// pending disconnects, then every MaintainEvery the expiry/hard-timeout/
// smoothing pass, then one admission step, then every SnapshotEvery a rank
// snapshot of this node's users from which coalesced queue frames are
// pushed, at most one per PushEvery per user unless the status changes or
// a VIP notice is due), a health loop, a configuration sync loop, the
// admissions watcher (Redis pub/sub, so users get granted from whichever
// node admitted them) and the webhook sender. Shutdown stops them all.
//
// # Lock order
//
// Manager.modeMu (read-held around every backend call, write-held to
// switch to or from the fallback), then Manager.mu, then Room.mu, then
// member.mu. No backend call is made with Manager.mu, Room.mu or member.mu
// held; Updates are delivered with only member.mu held, which serializes
// one user's frames.
//
// # Degradation
//
// L1 (backend memory above 80% of maxmemory): every maintenance pass also
// trims stale data (away users past Grace, old placements) and the rank
// snapshot is refreshed only every LiveRefresh. L2 (backend latency above
// OverloadLatency): new entrants are refused room_full (known users still
// get their positions) and positions come from the last snapshot,
// refreshed every LiveRefresh. L3 (backend unreachable FailAfter times in
// a row): the node copies its connected users, with their join times, into
// its local Memory backend and keeps accepting entrants; admission there
// uses FallbackShare of MaxActive and AdmitRate; every queue Update carries
// Local (order holds per node only). When the backend answers again the
// node hands its users back (join times kept; users still queued there
// keep their old entries) and returns to L0. Levels L0-L2 can be forced by
// operators (ForceDegradation).
package waitroom
