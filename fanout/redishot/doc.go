// Package redishot is the cluster's set of group marks in Redis: it
// implements fanout.HotSet, so every node publishes the groups its own
// traffic makes hot (docs/architecture.md §9) and its offered rate of each
// rate-limited group (so that group limits hold cluster-wide, §8), and
// reads the marks of all nodes.
//
// It sits under fanout, beside the engine that declares the interface it
// implements, as the backends of presence and limiter sit under theirs;
// fanout never imports it (cmd/fanfared chooses it), so the engine does not
// depend on Redis.
//
// Keys, all under the hash tag {hot} so the script runs on one Redis
// Cluster slot:
//
//	<prefix>{hot}:n:<node>  hash gid -> "<rate> <since ms>" (since 0: not
//	                        hot, an offered rate only): the node's marks,
//	                        TTL the ttl of its last Sync
//	<prefix>{hot}:nodes     zset node -> expiry (Redis ms): the live nodes
//
// One Sync is one round trip (EVALSHA of one script, EVAL again only after
// Redis lost the script): it prunes expired nodes, replaces the calling
// node's hash (deleting it when the node has no mark) and returns every
// live node's hash. The script reads the other nodes' hashes by name,
// which Redis Cluster allows because they share the slot of the declared
// keys. Times in Redis come from Redis TIME, never node clocks.
//
// Liveness: a node's hash expires ttl after its last Sync, and its zset
// entry is ignored past its score (and pruned by the next Sync of any
// node), so a dead node's marks go away on their own. Marks are state, not
// deltas: a lost call is repaired by the next one.
//
// Failure: Sync returns the client's error (bounded by its timeouts and
// ctx); the engine then falls back to its own view.
//
// Goroutines: none; Sync is safe for concurrent use.
package redishot
