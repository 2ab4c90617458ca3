// Package bus is the cross-node bus of docs/architecture.md §10: after commit, the
// node that accepted a send publishes the group's new messages; every node
// with members of the group online receives them and pushes them to its
// local connections.
//
// The bus carries hints, never the truth: Postgres holds every message and
// allocates seqs, so a payload lost anywhere (Redis down, a full queue, a
// node restarting) costs only a push; the receiving clients see the gap in
// the next frame's seq and pull it. Hence every bound here drops instead of
// waiting, and drops the oldest first, so the newest hint (the one that
// reveals the gap) is the one that survives.
//
// Invariants it owns:
//   - Publish never blocks and never keeps the caller's messages: it
//     encodes them once, into the pending payload of the group (coalescing
//     with batches not sent yet), under one leaf lock.
//   - Per publishing node and group, payloads are published and handed to
//     the Handler in publish order; a node never receives its own.
//   - The Handler sees only groups subscribed at the time of delivery:
//     after Unsubscribe returns, nothing more of that group is delivered
//     (bar a payload being delivered at that moment).
//   - Bounded everything: pending publish bytes (MaxPendingBytes), one
//     payload (MaxPayloadBytes, MaxBatchMessages), publish age (MaxDelay),
//     the inbox (InboxBytes, InboxBatches), subscribed groups (MaxGroups).
//     Every drop is counted by reason (Stats, fanfare_bus_* metrics).
//   - While the backend is down, Publish drops at once (ErrUnavailable);
//     the publisher probes it every ProbeInterval and resumes by itself.
//     Subscriptions survive the outage (the Transport re-establishes them).
//
// A Node runs on a Transport: Local (in process) or redisbus (Redis sharded
// pub/sub). The wire format is in codec.go: one payload per group, binary,
// decoded without allocation into pooled Batches whose strings and bodies
// alias the received payload.
//
// Goroutine model: Run owns four goroutines and waits for them: the
// transport's receiver(s), which only check a payload's header and queue
// it (never blocking on the Handler); the deliverer, the one goroutine that
// calls the Handler; the publisher, which drains the queue in pipelined
// rounds of MaxPipeline payloads and probes a down backend; the
// controller, which applies subscription changes every FlushInterval (one
// batched transport call, however many Subscribe/Unsubscribe calls) and
// follows Presence every ReconcileInterval. Publish, Subscribe and
// Unsubscribe may be called from any goroutine.
//
// Locks: outbox.mu, inbox.mu and subMu are leaves, never held while
// calling the transport, Presence or the Handler, and never together.
//
// Membership changes ride the same node: PublishMembers queues a change
// on ControlGID, a channel every node with a MembersHandler holds, so it
// reaches nodes not subscribed to the group (a member just added may be
// the first online there). It is queued in order with the node's batches
// and closes the group's pending payload, so a batch published after the
// change never travels ahead of it; a receiver gets both in publish order
// where the transport keeps order across channels (in process, one Redis
// server). Changes take the same bounded queue and inbox as batches and
// are counted apart (Stats.*Changes). Like batches they are hints: each
// carries the group's membership version it made, and each batch the
// version its messages were stored at, so a receiver that lost a change
// sees the hole at the group's next batch and reads the store (package
// fanout does).
//
// The engine wires it like this: after a commit, on the shard worker, for
// each group with new messages, Publish(gid, msgs); the Handler routes a
// remote batch to the group's shard worker, which pushes it with the same
// code as a local commit (and calls Batch.Release); Presence is the local
// presence index, and Subscribe(gid) at join makes a newly online group
// immediate instead of waiting for the next sweep.
package bus
