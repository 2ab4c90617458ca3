// Package redisquota is the cluster's @all quota in Redis (docs/architecture.md §8:
// at most N @all messages per group per UTC day, whichever node takes
// them): it implements fanout.AtAllQuota.
//
// It sits under fanout, beside the engine that declares the interface it
// implements, like redishot; fanout never imports it (cmd/fanfared
// chooses it).
//
// Keys, one per group and day, under the group's hash tag (Redis Cluster
// places each group's keys on one slot):
//
//	<prefix>{<gid>}:<day>  set of the day's charged @all sends (sender and
//	                       client message id), expiring two days after its
//	                       last charge
//
// Take is one round trip (a script: a member already in the set is
// admitted again uncharged, a full set refuses, else the member is added);
// Refund is one SREM. The day comes from the calling node's clock: nodes
// are expected to keep time (NTP), and a node a little off moves only the
// midnight at which its own sends start the next day's count.
//
// Failure: both return the client's error; the engine then counts @all on
// its own node for a while (fanout.AtAllQuota).
//
// Goroutines: none; a Quota is safe for concurrent use.
package redisquota
