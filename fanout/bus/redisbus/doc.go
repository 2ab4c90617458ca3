// Package redisbus runs the cross-node bus (package bus) on Redis sharded
// pub/sub (SPUBLISH/SSUBSCRIBE, Redis 7).
//
// Why sharded channels: with classic PUBLISH, Redis Cluster broadcasts
// every message to every shard over the cluster bus, so pub/sub cost grows
// with the cluster instead of spreading over it. A sharded channel lives
// on the shard owning its slot; publishes and subscriptions for it touch
// that shard only. On a single server SPUBLISH behaves like PUBLISH.
//
// Channels: <prefix>{<bucket>}<gid>, bucket = gid mod Buckets. The hash tag
// puts every group of a bucket in one slot, so one SSUBSCRIBE (and
// go-redis's resubscribe after a reconnect, which sends all channels of a
// connection in one command) never crosses slots. Per-gid tags would need
// one connection per slot; buckets bound the subscriber connections of a
// node to Buckets on a cluster, and to one on a single server, where cross-
// slot SSUBSCRIBE is allowed. All nodes must agree on Prefix and Buckets.
//
// Publishing: one pipeline of SPUBLISH per round from the bus's publisher
// goroutine (in order: one group, one slot, one connection per round). A
// round is bounded by the client's read/write timeouts (and by the bus's
// PublishTimeout when the client has ContextTimeoutEnabled).
//
// Receiving: one goroutine per subscriber connection reads with a timeout
// of HealthInterval; a silent connection is pinged and, if the ping is not
// answered within another interval, replaced by a new one subscribed to
// every channel. After Redis restarts, go-redis reconnects on the next read
// and resubscribes every channel it holds (including those subscribed
// while Redis was down); reads are retried with a backoff up to
// ReconnectBackoff. On a cluster, an sunsubscribe that this node did not
// ask for (the slot moved) makes the connection be rebuilt on the new
// owner. Payloads are handed to the bus without copying (their strings are
// fresh per message in go-redis).
//
// Goroutines: Run starts one reader per subscriber connection and waits
// for them; Publish, Subscribe and Unsubscribe run on the bus's publisher
// and controller goroutines. Lock: subConn.mu guards a connection's
// go-redis PubSub and channel set; it is held while go-redis writes a
// (S)SUBSCRIBE, never while reading.
package redisbus
