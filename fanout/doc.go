// Package fanout is fanfare's engine: it turns client sends into stored,
// ordered messages and pushes each committed batch to the members online on
// this node.
//
// Invariants it owns (DESIGN.md §1, §4):
//   - One group is handled by exactly one shard worker (hash(gid) % shards),
//     so its sends, joins and leaves are applied in order by one goroutine
//     without locks on the hot path.
//   - A send is acked only after the store committed it; a failed commit is
//     a failed send (ErrUnavailable), never "ack now, write later".
//   - Every queue is bounded: a shard's queue has a hard capacity and a soft
//     bound from Little's Law (measured service rate x target wait x safety
//     factor); past it, sends fail fast with ErrOverloaded.
//   - A push goes only to members whose presence bit is set; membership
//     changes are applied on the group's worker between batches, so a new
//     member never receives a message below its join_seq and a removed
//     member receives nothing committed after its removal.
//
// Goroutine model: Run starts Config.Shards workers and waits for them. Send
// and the membership methods may be called from any goroutine; Send never
// blocks (it enqueues or fails). Done callbacks and Pusher.Push run on the
// worker goroutine and must not block.
//
// Lock order: Engine.mu (lifecycle) is never held while calling the store,
// the presence index or the Pusher.
package fanout
