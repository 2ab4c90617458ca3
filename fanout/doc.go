// Package fanout is fanfare's engine: it turns client sends into stored,
// ordered messages and pushes each committed batch to the members online on
// this node, degrading in explicit levels under load (docs/architecture.md §4, §5, §8,
// §9).
//
// Invariants it owns:
//   - One group is handled by exactly one worker at a time (hash(gid) %
//     shards, in the ordinary pool or, for hot groups, the hot pool), so its
//     sends, joins and leaves are applied in order by one goroutine without
//     locks on the hot path. A group moves between the pools only through a
//     marker task on its old worker (see Engine.move): its order survives
//     the move.
//   - A send is acked only after the store committed it; a failed commit is
//     a failed send (ErrUnavailable), never "ack now, write later". With
//     Config.Events, also only after its event was journaled (hooks.go):
//     a failed journal write answers the stored sends ErrUnavailable, and
//     their retries (duplicates) journal them again.
//   - With Config.BeforeSend, a batch's sends are put to the hook before
//     Append, one call per group, the groups in parallel (hooks.go); a
//     rejected or refused send is answered and never stored.
//   - Degradation drops pushes, never data: every level only changes what
//     is pushed (msg, batch, summary, nothing) or refuses new sends (L4).
//   - Every queue is bounded: a shard's queue has a hard capacity and a soft
//     bound from Little's Law (measured service rate x target wait x safety
//     factor); past it, sends fail fast with ErrOverloaded. A large group's
//     rate-limit buffer holds at most GroupBuffer sends (the newest; older
//     ones are refused with ErrRateLimited); a merge window holds at most
//     MaxMerge messages; tier-2 work is coalesced to one pending seq per
//     group.
//   - A push goes only to members whose presence bit is set; membership
//     changes are applied on the group's worker between batches, after
//     the group's open merge window was pushed to the members as they
//     were, so a new member never receives a message below its join_seq
//     and a removed member receives nothing committed after its removal.
//     Every push (L0, window, summary, remote batch) is also cut, for the
//     group's recent joiners alone, at each one's join_seq (read after
//     the recipients): members added here or, with a bus, whose connect
//     here brought the membership (a window or a late batch may hold
//     older commits of another node), kept until a push reached their
//     join_seq a minute ago. A connect that read a membership before its
//     removal reads again before it sets bits (Engine.leaves).
//   - Sends of non-members and muted members of large and hot groups
//     (and every @all under a quota) are refused with the store's error
//     before the group's limits, triggers or @all quota count them
//     (checkSender: the store's answer, cached per group, cleared by the
//     group's membership changes); Append still checks every send.
//   - With a bus (cluster mode), a membership change committed on this
//     node is published on the bus from the group's worker, ahead of the
//     group's later batches; every other node applies it with the same
//     code (Engine.RemoteMembers) on the group's worker there: bits set and
//     recent joiners kept for added members online there (subscribing the
//     group), bits cleared for removed ones. A change lost on the bus
//     (counted) is detected by version (members.go): the store numbers
//     each group's membership changes, every stored message carries the
//     number, and a node pushes a batch (local or remote) only once its
//     presence reflects that version, re-reading its online members from
//     the store first when it does not (so a removed member gets nothing
//     stored after the removal; a failed re-read pushes nothing). A lost
//     addition is found by the store's feed of additions, which every
//     node reads every MemberFeedInterval (at once when a loss shows):
//     an added member online here without its bit is checked against
//     the store on the group's worker and joined, with a resync, without
//     a reconnect (members.go).
//   - With a HotSet (cluster mode), a group any node marks hot is hot on
//     every node (docs/architecture.md §9): a node marks the groups its own rate keeps
//     hot, publishes its marks and reads every node's in one HotSet call per
//     HotSync (sooner when a mark appears or goes), moves the groups other
//     nodes mark into its hot pool through the controller (the same
//     order-keeping move), and cools a group only once no node marks it and
//     its own rate stayed low for HotClearAfter. The send path never calls
//     the HotSet; when it fails the node falls back to its own marks.
//   - Group limits hold for the cluster (docs/architecture.md §8). Through the same
//     HotSet each node publishes its offered rate (buffered sends
//     included) of every group it limits, and paces its part of the
//     group's rate, in proportion to that rate (at least 1/s); the L2
//     trigger compares the cluster's offered rate. With an AtAllQuota the
//     @all count of a group is the cluster's: one call on the group's
//     worker per @all (bounded at 100 ms; after a failure the node counts
//     @all itself for 5 s), refunds in the background.
//
// Last-active times (touch.go): a connect records its user's time in
// memory, never calling the store for it; one goroutine writes, every
// TouchInterval (1 s), each user touched since with its latest time, in
// Store.TouchUsers calls of at most 1,000 users in uid order. So
// users.last_active_at lags a user's latest connect by at most
// TouchInterval plus the write (more only while the store fails: a
// failed write is logged, counted and retried at the next interval), and
// Run writes what is left once the workers stopped. Its readers need far
// less: ActiveMembersSince decides who is active for tier 2 and the
// offline audience of hook events, over ActiveWindow (7 days), re-read
// every ActiveRefresh (1 min). At most TouchPendingMax users wait (and as
// many more while a write runs); a touch of a new user beyond it is lost
// (counted) and starts the write at once. A connect never waits for the
// store for it, except after Run ended (shutdown), when it writes its own.
//
// Tiers (docs/architecture.md §5): online members get pushes; active offline members
// (seen within ActiveWindow) get conversations.last_seq advanced by one
// AdvanceConversations per group per merge window, written by the tier-2
// goroutine off the workers; silent members get nothing. @all messages are
// pushed to online members only (they do not advance tier 2).
//
// Levels: the effective level of a group is max(node, group); each scope
// has a forced level (operator, optional TTL) and an automatic one. Group
// triggers (downlink -> L1, group rate -> L2, hot -> at least L1) run on
// the group's worker from per-group sliding windows (rings of buckets, no
// locks); node triggers (egress, commit latency -> L3; store unavailable ->
// L4, cleared by store pings) run on the controller. Every trigger clears
// with hysteresis: its measure must stay below ClearFraction of the
// threshold for ClearAfter. Every change is logged with its cause and
// exported as a metric. All of it reads Config.Now.
//
// Tuning (merge window, queue target, group limits, trigger thresholds,
// hot groups, tier 2) is one struct embedded in Config; each setting is
// one tagged field (name, help, default, bounds), from which validation,
// defaults, the JSON document and fanfared's flags derive (TuningSettings).
// It changes at runtime through Engine.SetTuning: the
// validated value is swapped in an atomic.Pointer that each worker loads
// once per batch or tick (no lock per message), the tier-2 writer and the
// controller once per round; a worker's tick and the tier-2 ticker follow
// a new merge window. Worker counts, queue capacities and the rate-window
// width are fixed at New.
//
// Files, in the order a send walks them: send.go (Engine.Send routes it)
// -> shard.go (the worker's queue, bound and loop) -> admission.go (group
// limits and pacing; eligibility.go checks the sender, atall.go counts
// @all) -> commit.go (one Append, acks, bus publish, tier-2 note) ->
// deliver.go (the push at the group's level, cut for recent joiners) ->
// windows.go (L1/L2 merge windows). Beside it: contract.go (Conn,
// Presence, Bus, Pusher, SendRequest), config.go and tuning.go, engine.go
// (New, Run, Shutdown, routing), members.go and remote.go (membership
// changes here and from the bus, batches from the bus), connect.go,
// triggers.go and levels.go (degradation), hotset.go, tier2.go, group.go
// (per-group state), metrics.go, errors.go, hooks.go (the before-send
// hook and the event stream, docs/architecture.md §17).
//
// Goroutine model: Run starts Config.Shards ordinary and Config.HotShards
// hot workers, the tier-2 goroutine, the touch goroutine (writes the
// last-active times, touch.go), the hot-set goroutine (with a HotSet:
// publishes and reads marks, stores the cluster view in an atomic pointer
// that workers read once per evaluation of a hot group, and asks the
// controller for moves without blocking), and uses its own goroutine as the
// controller (forced-level expiry, node triggers, pool moves); in cluster
// mode also the feed goroutine (reads the store's feed of additions and
// waits, through onWorker, for the repairs it hands the workers); it waits
// for all of them, and for the background @all refunds the workers started. Send and the membership methods may be called from any
// goroutine; Send never blocks (it enqueues or fails). Done callbacks and
// Pusher.Push run on the worker goroutine and must not block.
//
// Lock order: Engine.routeMu (held for reading by Send across route lookup
// and a non-blocking enqueue; for writing by a move) is taken before any
// shard's mailMu and never held while blocking. A leaveStripe.mu (per uid
// stripe) is taken before the presence index's locks: for writing around
// a removal's Leave, for reading by a connect around its registration
// (and its second membership read, the one store call made under it,
// when a removal of the stripe ran during the first). Engine.mu-like locks
// (Levels.mu, hotMu, tier2.mu, shard.mailMu, toucher.mu) are leaves:
// never held while calling the store, the presence index, the Pusher or
// the HotSet; the one exception, memberFeed.startMu, is held across the
// single store read that takes the feed's first cursor and nothing is
// taken under it.
package fanout
