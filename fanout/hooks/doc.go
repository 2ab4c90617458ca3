// Package hooks holds fanfare's application hooks (docs/protocol.md §13,
// docs/architecture.md §17): the synchronous before-send hook, which lets
// an application allow, reject or rewrite each send before it is stored,
// and the after-commit event stream (messages with their offline members,
// connects, disconnects, joins, leaves), delivered at least once to an
// HTTP receiver from a durable journal. Every request is signed
// (HMAC-SHA256 over the timestamp and the body, Sign and Verify).
//
// Invariants it owns:
//   - A before-send call is one POST per group per commit batch, bounded
//     by its timeout; its answer is checked whole (one result per send,
//     codes of [a-z0-9_.-], rewritten bodies valid JSON within the body
//     limit) or treated as a failure, which fails open or closed as
//     configured: never a partial answer.
//   - Emit returns nil only once its events are durable in the Journal
//     (or dropped by an explicit drop policy, counted); the engine acks
//     the sends after it. A full journal holds Emit (back-pressure) by
//     default.
//   - The deliverer moves the journal's cursor only after the receiver
//     answered 2xx for the batch (or, with MaxAttempts, after dropping it,
//     counted): at least once, in journal order, message events of one
//     group sorted by seq within a batch.
//   - Every queue is bounded: the journal (its capacity), the async queue
//     of connect/disconnect events (AsyncQueue), a POST (Batch events,
//     bodies above BodyMax left out, offline lists capped at OfflineMax),
//     an answer read (bounded by the batch's body limit).
//
// Goroutines: Stream.Run is the deliverer and owns the async writer it
// starts; Shutdown ends both. BeforeSend has none (its caller's).
//
// The journal backends are fanout/hooks/pebblejournal (embedded mode) and
// fanout/hooks/redisjournal (cluster mode); only cmd picks one.
package hooks
