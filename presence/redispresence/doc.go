// Package redispresence is the cluster-wide presence view in Redis
// (docs/architecture.md §7, §10): every node publishes its local online bits, and any
// node can ask for a group's global online count, the live nodes with
// members of the group online, and whether given members are online
// anywhere. fanfared uses the counts (GET /admin/v1/groups/{gid}/online,
// metrics); tier 2 does not ask OnlineAnywhere, which costs Redis round
// trips per call (BenchmarkOnlineAnywhere), so a member online only on
// another node may get a conversation-row write it did not need.
//
// Keys, per group, all under the hash tag {g:<gid>} so every script and
// pipeline of a group stays on one Redis Cluster slot:
//
//	<prefix>{g:<gid>}:n:<node>  this node's online ordinals as a Redis bitmap
//	                            (SETBIT layout), TTL Config.TTL
//	<prefix>{g:<gid>}:nodes     zset node -> expiry (Redis ms): the live nodes
//	<prefix>{g:<gid>}:tmp       scratch key of the count script (never lives
//	                            outside it)
//	<prefix>{g:<gid>}:r         hash node -> JSON array of the node's online
//	                            uids, for groups the member presence feed lists
//	                            (Occupancy, occupancy.go); TTL Config.TTL from
//	                            the last call of any node
//
// Occupancy answers the member presence feed (docs/architecture.md §7.1):
// per group, the count (as OnlineCount) or the union of the live nodes'
// rosters (fields of nodes gone from the nodes zset are pruned by the same
// script), one script call per group, pipelined Batch at a time.
//
// Counting once: bits are keyed by the member's ordinal, so a user online on
// two nodes (or two devices) sets the same bit in two node bitmaps, and the
// global count is BITCOUNT of their OR, never a sum of per-node counts.
//
// Liveness: each node renews its keys and zset entry at least every TTL/3
// (TTL must exceed two flush intervals); a dead node's bitmaps expire after
// TTL and its zset entry is ignored once past its score (and pruned by the
// next write). Times in Redis come from Redis TIME, never node clocks.
// Shutdown withdraws the node's keys at once.
//
// Writes are coalesced: Local marks changed groups (presence.Source
// DrainDirty); each Flush (every FlushInterval from Run, ~1 s) writes each
// changed group once, as a bit delta or the whole bitmap, whichever is
// smaller, in pipelines of Batch groups — never a round trip per connect.
// The View remembers what it wrote; a delta onto a missing key is refused by
// the script and turned into a whole write, so keys lost by Redis (restart,
// eviction) heal within one renewal period.
//
// Failure: when Redis is unreachable, local presence (the push path) is
// untouched; Flush fails, Stale reports true, queries return errors wrapping
// presence.ErrUnavailable. Once Redis answers again the next Flush rewrites
// every group of this node (keys may have expired meanwhile) and Stale turns
// false. Other nodes see this node's users disappear after TTL of outage,
// and reappear at the resync.
//
// Goroutines: Run is the only one (the caller runs it); Flush may also be
// called directly and is serialized with Run's by flushMu. Queries are
// independent of flushing and safe for concurrent use.
package redispresence
