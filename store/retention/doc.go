// Package retention deletes messages older than a configured age from
// every group, in rounds: the message retention policy of a node. The
// store keeps seqs (last_seq never moves back), so clients that pull below
// the oldest message left get a page that starts at it.
//
// One Sweeper per node; in cluster mode Config.Lock lets one node sweep
// each time slot of one interval and the others skip it. A round walks every group
// (store.GroupIDs, in pages) and deletes each group's expired messages in
// batches (store.ExpireMessages), so no statement or transaction grows
// with the history.
//
// Invariants: only messages created before now - Keep are deleted, oldest
// first per group; seqs and last_seq are untouched (the store's
// ExpireMessages contract).
//
// Goroutines: Run is the only one, owned by its caller; Round may also be
// called directly.
package retention
