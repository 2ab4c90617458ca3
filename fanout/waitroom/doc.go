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
//   - Max wait (the rule). A user whose wait reaches MaxWait is admitted
//     before everyone else, oldest join first (a second index by join
//     time).
//   - Max wait (the guarantee, by construction; see "Max-wait guarantee"
//     below). A user admitted to the queue at join time J (or back from
//     away at B) is admitted by max(J, B) + MaxWait + one admission step,
//     as long as the admission rate binds (MaxActive does not) and steps
//     come at least every GuaranteeTick. Whoever the room could not admit
//     in time is refused room_full at once, with a retry hint.
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
//   - Node liveness. Every entry records the nodes holding the user (a
//     socket or a polling visitor; the latest to enter it first, Entry.Node;
//     holders.go), and each node heartbeats in Maintain. A node's
//     Disconnect only takes it off the list; the user is disconnected
//     (waiting: away; admitted: session ended) when the last holder goes,
//     so a visitor whose polls moved to another node is not made away by
//     the old node's poll timeout. When a node has been silent for
//     NodeTimeout, any other node's Maintain takes it off every list the
//     same way: the users no live node holds become away (grace counted
//     from its last heartbeat) or end their sessions (reason disconnect),
//     so a crashed node neither holds slots nor gets users admitted to
//     nobody.
//   - Bounded. Besides the guarantee's bound, the queue is bounded by
//     Little's Law against the observed rate (which falls below AdmitRate
//     when MaxActive binds): L_max = observed admission rate (5-minute
//     window) * TargetWait * SafetyFactor; entrants beyond it are rejected
//     room_full with a retry hint; depth at 50% / 80% of L_max is logged
//     (Warn / Error) and exported.
//   - Scheduled rooms. Before StartsAt entrants wait in a pre-queue
//     (EntryScheduled, no position, nobody admitted), bounded by the same
//     guarantee counted from the start. At the start (the first Enter,
//     Admit or Maintain of any node on or after it) the pre-queue moves
//     into the queue exactly once: in the order of shuffle keys drawn with
//     crypto/rand at entry (i.i.d. uniform keys: a uniformly random
//     order), every one with join = the start and score 1.3*start + bias -
//     0.001*(n - rank), so VIP bias still applies on top of the shuffle
//     and everyone arriving after the start ranks behind. Redis moves it
//     in batches of 5000, admitting nobody until the last batch. From
//     EndsAt new entrants are refused room_closed; the users already in
//     stay and are served.
//   - Truthful ETA. eta = ahead / admission rate over the last 5 minutes;
//     with no admission in that window the status is paused, with no ETA.
//
// # Max-wait guarantee
//
// Notation: R = GuaranteeRate (AdmitRate, or floor(B)/(B/AdmitRate + tick)
// when the bucket B = AdmitBurst cannot carry a step's refill:
// B < 1 + AdmitRate*tick),
// W = MaxWait in whole seconds, C = Capacity = floor(R*(W-1)). The owed set
// O is every waiting, away (until the hard timeout removes it) and
// pre-queue entry; |O| is Stats.Owed.
//
// Work conservation. While a user u waits, every admission step spends
// all whole tokens on someone (u at least is eligible), so the bucket
// never reaches AdmitBurst and no refill is lost: in any interval (t, t+x]
// at least floor(R*x) admissions happen by the first step after t+x, at
// most one tick later. (This needs MaxActive not to bind and the steps to
// run; with MaxActive binding or the L3 fallback, the guarantee is void
// and only the max-wait rule and L_max remain.)
//
// Who can be admitted before u. A user u that enters at time t has join
// J = floor(t). Everyone admitted before u is either (a) in O at t, or (b)
// a VIP entering after t whose score is below u's: a normal user entering
// later has a higher score and a later join, so neither the score nor the
// max-wait rule (oldest join first) puts it ahead of u. A decayed returner
// is in O the whole time it is away, so it is (a). The admission quota
// (VIPAdmitShare) keeps this for VIPs too: it admits the best normal user
// n instead of the best VIP only if n was owed before the promise of every
// waiting VIP, and otherwise yields (the VIP is admitted, counted for
// neither class). Every entry draws a number from one counter per room
// (seq; Redis: oseq) when it becomes owed; a VIP draws a new one whenever
// its slack is set (entry, decayed return, the start, after every
// pre-queue entry); n qualifies when its number is below the lowest of the
// waiting VIPs' (an index of them by number), so n is in O at the promise
// of every VIP it is admitted before: (a). Without that rule a VIP surge
// into a quiet room followed by a stream of normal users broke the promise
// (TestQuotaVIPPromise: the surge's last VIPs waited for their share of
// normal users who came after them). The quota's purpose holds: in a VIP
// surge against a long normal queue the normal users were there first, so
// they get their share; normal users who came after VIPs still waiting
// queue behind those VIPs, as their score says. While VIPs keep arriving
// the quota therefore does little: only normal users older than the
// oldest waiting VIP can take its turns (a simulation with VIPs and
// normal users at 2/s each, rate 2, max wait 2 min, share 2/3: mean normal
// wait 1m35s, against 1m16s for the quota that broke the promise and 1m56s
// with no quota); RoomConfig.VIPAdmitShare states this contract. Entrants of the same
// second as u with a lower uid (equal score or join) are not in O at t,
// but they are in O at the last such entrant's t' < J + 1, whose slack
// counted u and everyone ahead of u still owed; so at most C - 1 precede u
// after t', and t' < J + 1 is all the proof below needs.
//
// Slack. Each owed user carries a slack s_u = C - 1 - |O at t| - p_u,
// where p_u counts the VIPs that entered with a head start after u did: an
// upper bound on (a) is |O at t| and on (b) is p_u. The room stores one
// counter P (Stats: the VIP passes so far) and, per user, the key
// k_u = (C - 1 - |O at t|) + P(t), so s_u = k_u - P; the smallest slack is
// min(k) - P (Stats.MinSlack), one ordered-set lookup.
//
// Rules. (1) A normal entrant is queued only if its slack at entry is at
// least VIPReserve (room left for VIPs to pass it later); a VIP only if it
// is at least 0. Otherwise room_full, retry after the missing admissions at
// rate R (FullRetry). (2) A VIP gets its head start only if every owed user
// can spare one more admission (min slack >= 1); then P grows by one, which
// lowers every slack by one; otherwise it queues at the normal score and
// passes nobody. (3) Departures only lower |O|; they never lower a slack.
// (4) A user back after grace gets its decayed join, but never so early that
// its deadline leaves no room for everyone owed (its key is recomputed with
// the time it has left); back within grace it keeps its key.
//
// Claim: every slack stays >= 0, hence u is admitted by J + W + one tick.
// Rules (1) and (2) keep every slack >= 0 (2 lowers them only when all are
// >= 1). With s_u >= 0, at most |O at t| + p_u <= C - 1 admissions precede
// u, so u's own admission is among the first C after t; by work
// conservation those take at most C/R <= W - 1 seconds plus one tick, and
// t < J + 1, so u is admitted by J + W + tick. A user that is away at its
// deadline cannot be admitted; back within grace it is overdue and goes
// first among the overdue at the next step, so the promise runs from
// max(J, B) (Entry.Back). A pre-queue user's slack is set at the start with
// every pre-queue user and everyone owed ahead of it (the shuffle may put
// it anywhere), from the start's deadline.
//
// Measured: an admission more than W + 1 s after max(J, B) on the backend's
// whole-second clock is a violation (Admission.Late, counted per room in
// Stats.MaxWaitViolations and per node in
// fanfare_room_max_wait_violations_total); TestPropertyMaxWait checks the
// exact bound (W + 100 ms step) over steady, burst, VIP-surge, reconnect,
// multi-node and scheduled arrivals on the virtual clock.
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
// Status, Rooms; Position answers from the local snapshot. Status reads
// the room from the backend, except AdmittedByTier and WaitByTier: this
// node's own admissions and their waits, kept by the Room in fixed memory
// (at most WaitLogSize waits per tier) and lost at restart.
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
