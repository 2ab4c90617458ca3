// Package presence knows who is online (docs/architecture.md §7).
//
// Local[C] is one node's index. For each group with members online here it
// keeps a roaring bitmap of their ordinals (the dense per-group member index
// of store.Member) and ordinal -> user; for each online uid, its connections
// (one per device: the push path yields every connection, so a user on two
// devices gets each message twice, once per device) and its memberships; for
// each connection, its last heartbeat. C is the caller's connection handle
// (the gateway's connection pointer); presence only compares and hashes it
// and imports nothing of fanfare's.
//
// Invariants:
//   - A user exists in Local exactly while it has at least one connection;
//     a group exists exactly while it has at least one online member.
//   - In every group, bit o is set iff ordinal o maps to an online user; an
//     ordinal maps to at most one user (the latest Join wins, since ordinals
//     are reused after leave).
//   - Leave and Disconnect of a user's last connection clear its bits before
//     they return: a push collected afterwards does not reach it. A push
//     collected concurrently may or may not (the caller orders membership
//     changes and pushes of one group if it needs more, e.g. on the group's
//     shard worker).
//   - Connect, Disconnect, Join, Leave, Touch and OnlineCount are O(1)
//     (Connect and last-connection Disconnect are O(memberships)); Expire is
//     O(connections expired); AppendConns and ForEachOnline are O(online) and
//     allocate nothing per recipient.
//
// Push path: each group keeps its online members in a dense slot array
// (ordinal, user, and the connection inline for single-device users), so
// AppendConns / AppendRecipients / ForEachOnline scan memory sequentially
// (about 2-3 ns per recipient at 100k online) instead of chasing a map and
// a user per ordinal. Slots are reused through a free list and compacted
// only when no push is iterating, so a push that releases the lock between
// chunks never skips or repeats a member who stays online.
//
// Membership comes from the caller (the engine reads it from the store):
// Local never consults the store. Join for an offline uid is a no-op, since
// Connect brings the memberships. Hence one race the caller must close: a
// Leave that runs after the caller read the memberships but before Connect
// finds the user offline and is lost, and the stale membership then arrives
// with Connect. Serialize membership changes and connects per user, re-read
// memberships after Connect, or check membership per recipient on the push
// path (Recipient.Ordinal indexes the caller's join_seq table).
//
// Lock order (a lock may be taken while holding only locks listed above it):
//
//  1. user.mu (per uid; held for a whole Connect/Disconnect/Join/Leave)
//  2. group.mu (per gid, RW; the push path takes it shared, in chunks of
//     512 slots, so connects to a huge group wait at most one chunk)
//  3. leaf locks, never held while taking another: userShard.mu,
//     groupShard.mu, groupShard.dirtyMu, connShard.mu.
//
// Shard maps are only looked up or updated under their leaf lock; a user or
// group removed from its map is first marked dead under its own lock, and
// lookups retry past dead entries, so no lock is ever held across two map
// levels. A user's connection list is an immutable slice swapped atomically,
// so the push path reads it without user.mu.
//
// Heartbeats: each connection shard keeps its connections in a list ordered
// by last heartbeat; Touch moves one to the tail in O(1), and Expire pops
// from the heads, so its cost is the number expired. With
// Config.NoHeartbeats (a caller whose transport closes silent connections
// itself, as fanfared's sockets do) there are no connection shards entries
// at all: a connection is then only in its user's list and its groups'
// slots.
//
// Cluster is the cluster-wide view (global online counts, the nodes with
// members of a group online, batch "online anywhere" lookups for the active
// tier). Embedded implements it for a single node from the local index;
// presence/redispresence implements it across nodes in Redis;
// presence/presencetest is the suite both pass.
//
// Goroutines: none. Local is driven by its callers (RunExpiry is a
// convenience loop run by the caller).
package presence
