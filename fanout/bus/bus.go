package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/store"
)

// Errors returned by a Node.
var (
	// ErrClosed: Publish after Shutdown.
	ErrClosed = errors.New("bus: closed")
	// ErrUnavailable: the backend is down; the batch was dropped (counted).
	ErrUnavailable = errors.New("bus: backend unavailable")
	// ErrFull: the publish queue is full of batches still in flight; the
	// batch was dropped (counted).
	ErrFull = errors.New("bus: publish queue full")
	// ErrTooLarge: a message does not fit in one payload
	// (Config.MaxPayloadBytes); it was dropped (counted).
	ErrTooLarge = errors.New("bus: message larger than a payload")
	// ErrTooManyGroups: Subscribe past Config.MaxGroups.
	ErrTooManyGroups = errors.New("bus: too many subscribed groups")
	// ErrCorrupt: a payload that does not decode.
	ErrCorrupt = errors.New("bus: corrupt payload")
)

// Batch is one group's committed messages as one node published them, in
// seq order.
type Batch struct {
	GID    int64
	Origin string // id of the publishing node
	// MemberVersion is the group's membership version when the last of
	// Msgs was stored (store.AppendResult.MemberVersion): a receiver that
	// applied a lower one missed a membership change.
	MemberVersion int64
	Msgs          []store.Message
	// Tail is set on a tail hint (Msgs empty): the highest seq of the
	// group the origin had committed and published when the group went
	// quiet for Config.TailDelay. A receiver that pushed less than Tail to
	// its members missed a batch (dropped on the way, or by this node):
	// its members must pull up to Tail (fanout.PushResync).
	Tail int64

	pooled bool
}

var batchPool = sync.Pool{New: func() any { return &Batch{pooled: true} }}

// maxPooledMsgs keeps batches whose message slice grew past it out of the
// pool, so one huge payload does not pin memory forever.
const maxPooledMsgs = 4096

// Release hands a delivered batch back to the node for reuse. After it, b
// and b.Msgs must not be used; the message values copied out of b.Msgs
// (strings, bodies) stay valid, since they point into the received
// payload, which is never reused. Calling Release is optional (the garbage
// collector reclaims an unreleased batch) and a no-op on batches not made
// by a Node.
func (b *Batch) Release() {
	if b == nil || !b.pooled {
		return
	}
	clear(b.Msgs)
	b.Msgs = b.Msgs[:0]
	if cap(b.Msgs) > maxPooledMsgs {
		b.Msgs = nil
	}
	b.GID, b.Origin, b.MemberVersion, b.Tail = 0, "", 0, 0
	batchPool.Put(b)
}

// Handler receives the batches other nodes published for the groups this
// node is subscribed to. A Node calls it from one goroutine, in order of
// arrival (per publishing node and group: in the order it published). It
// must not block: route the batch to the group's worker and return. The
// handler owns b (see Batch.Release); the messages' strings and bodies are
// read-only.
type Handler func(b *Batch)

// ControlGID is the channel of membership changes: a group id no group
// has (gids start at 1). Every Node with a MembersHandler holds it for as
// long as it runs, so a change reaches every node, including those where
// no member of the group was online yet (the member just added was the
// first).
const ControlGID int64 = 0

// MemberChange is one group's membership change as one node committed it:
// Members were added (UID, Ordinal and JoinSeq set) or, when Removed,
// removed (UID set).
type MemberChange struct {
	GID     int64
	Origin  string // id of the publishing node
	Version int64  // the group's membership version the change made
	Removed bool
	Members []store.Member
}

// MembersHandler receives the membership changes other nodes published.
// A Node calls it from the Handler's goroutine, in order of arrival (per
// publishing node: in the order it published, and on a single Redis
// server in order with that node's batches too). It must not block. It
// owns c; the uids alias the received payload and are read-only.
type MembersHandler func(c *MemberChange)

// Bus is the cross-node bus of docs/architecture.md §10 as the engine uses it. *Node
// implements it on any Transport (bus.Local in process, redisbus over
// Redis sharded pub/sub).
type Bus interface {
	// Publish hands one group's newly committed messages (seq order),
	// stored at membership version version, to the other nodes. It
	// never blocks: it encodes msgs into the pending payload of gid
	// (coalescing with batches not yet sent) and returns; msgs may be
	// reused at once. A non-nil error says the batch was dropped
	// (counted); remote clients repair the gap by pull.
	Publish(gid, version int64, msgs []store.Message) error
	// PublishMembers hands a committed membership change of gid (ms added,
	// or removed), which made the membership version version, to every
	// other node, on ControlGID. Like Publish it never blocks and its
	// error is a counted drop; a receiver detects the loss by the version
	// of the group's next batch (see package fanout).
	PublishMembers(gid, version int64, removed bool, ms []store.Member) error
	// Subscribe asks for the batches of gid. Idempotent, O(1), never
	// blocks; the backend sees the change within Config.FlushInterval.
	Subscribe(gid int64) error
	// Unsubscribe stops the batches of gid at once (the handler sees none
	// published after it returns, bar one being delivered); the backend
	// sees the change within Config.FlushInterval.
	Unsubscribe(gid int64)
	// Run runs the node until ctx is done or Shutdown.
	Run(ctx context.Context) error
	// Shutdown sends what is queued (bounded by ctx) and stops Run.
	Shutdown(ctx context.Context) error
}

// Presence is what a Node needs to follow the groups with members online
// on this node; *presence.Local satisfies it.
type Presence interface {
	// AppendGroups appends every gid with a member online on this node.
	AppendGroups(dst []int64) []int64
	// OnlineCount returns the number of members of gid online on this node.
	OnlineCount(gid int64) int
}

// Outgoing is one payload for Transport.Publish.
type Outgoing struct {
	GID     int64
	Payload []byte // valid until Publish returns
}

// Transport is the medium a Node runs on. The Node calls Publish,
// Subscribe and Unsubscribe from one goroutine each and only while Run is
// running.
type Transport interface {
	// Run receives until ctx is done, calling recv for every payload
	// published on a subscribed group, by any node (the Node drops its
	// own). recv may be called from several goroutines, but the payloads
	// of one group come from one goroutine in publish order. payload is
	// immutable and owned by the Node from then on. Run reconnects on its
	// own and re-establishes every subscription after an outage.
	Run(ctx context.Context, recv func(gid int64, payload []byte)) error
	// Publish sends ps in order and returns how many the backend took
	// (a prefix, or all); err says why the rest were not.
	Publish(ctx context.Context, ps []Outgoing) (sent int, err error)
	// Subscribe and Unsubscribe change the subscribed groups. The change
	// is remembered even when they fail (the backend is down) and applied
	// at the next reconnect.
	Subscribe(ctx context.Context, gids []int64) error
	Unsubscribe(ctx context.Context, gids []int64) error
	// Ping checks the backend for publishing; the Node probes with it
	// while Publish is failing.
	Ping(ctx context.Context) error
}

// ReconnectNotifier is implemented by a Transport whose receiving side
// can miss payloads while the backend is unreachable (Redis): it calls fn
// each time it has subscribed again after such a loss.
type ReconnectNotifier interface {
	NotifyReconnect(fn func())
}

// Config configures a Node. Only Handler is required; every other zero
// value means the default given.
type Config struct {
	// NodeID identifies this node in Batch.Origin; it must be unique in
	// the cluster. "" = host-pid-random.
	NodeID string
	// Handler receives remote batches (required).
	Handler Handler
	// Members receives remote membership changes; nil = this node ignores
	// them (and does not subscribe to ControlGID).
	Members MembersHandler
	// Reconnected, when set, is called after the transport lost the
	// backend and subscribed again (a Redis restart, a broken link): the
	// batches published meanwhile were not received here, nor their tail
	// hints, so the handler checks gids, the groups subscribed here,
	// against the store (fanout.Engine.BusReconnected). It is called from
	// a goroutine of its own, one call at a time.
	Reconnected func(gids []int64)
	// Presence, when set, drives subscriptions: every ReconcileInterval
	// the node subscribes to each group with a member online here and
	// unsubscribes from each group with none. Explicit Subscribe calls
	// (at join) make a new group immediate instead of waiting for it.
	Presence Presence

	// FlushInterval coalesces subscription changes into one backend call
	// per interval; 0 = 50ms.
	FlushInterval time.Duration
	// ReconcileInterval is the Presence sweep period; 0 = 1s.
	ReconcileInterval time.Duration
	// MaxGroups bounds the subscribed groups; 0 = 1<<20.
	MaxGroups int

	// MaxPendingBytes bounds the encoded payloads queued or in flight for
	// publishing; past it the oldest queued payloads are dropped; 0 = 16
	// MiB.
	MaxPendingBytes int
	// MaxPayloadBytes bounds one payload (coalesced batches split at it);
	// 0 = 512 KiB. Must hold the largest message (body + ids + ~40 bytes).
	MaxPayloadBytes int
	// MaxBatchMessages bounds the messages of one payload, published and
	// received; 0 = 4096.
	MaxBatchMessages int
	// MaxPipeline bounds the payloads per backend round trip; 0 = 256.
	MaxPipeline int
	// MaxDelay drops message payloads queued longer than it (a hint that
	// late is a burst, not a help; clients pull the gap); membership
	// changes are sent however late. 0 = 5s.
	MaxDelay time.Duration
	// TailDelay: a group Publish was called for and then not for
	// TailDelay gets one tail hint (Batch.Tail) with its last seq, so
	// that a node whose copy of the group's last batch was lost (a
	// backend stall, a full queue or inbox) still tells its clients to
	// pull it; without it only the group's next message would. A hint is
	// kept until it is sent (across a backend outage, unlike a batch),
	// one per group. 0 = 2s; negative = no tail hints.
	TailDelay time.Duration
	// MaxTails bounds the groups waiting for their tail hint; past it a
	// group's hint is not kept (counted); 0 = 65536.
	MaxTails int
	// PublishTimeout bounds one backend publish round; 0 = 2s.
	PublishTimeout time.Duration
	// ProbeInterval is how often a down backend is pinged; 0 = 250ms.
	ProbeInterval time.Duration

	// InboxBytes and InboxBatches bound the received payloads waiting for
	// the handler; past them the oldest are dropped; 0 = 16 MiB, 8192.
	InboxBytes   int
	InboxBatches int

	// Now is the clock for MaxDelay; nil = time.Now.
	Now func() time.Time
	// Registerer receives the node's metrics; nil = not exported.
	Registerer prometheus.Registerer
	// Logger; nil = discard.
	Logger *slog.Logger
}

// MaxNodeID bounds Config.NodeID.
const MaxNodeID = 255

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	if c.Handler == nil {
		errs = append(errs, errors.New("bus: Handler is required"))
	}
	if len(c.NodeID) > MaxNodeID {
		errs = append(errs, fmt.Errorf("bus: NodeID longer than %d bytes", MaxNodeID))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"FlushInterval", c.FlushInterval}, {"ReconcileInterval", c.ReconcileInterval},
		{"MaxDelay", c.MaxDelay}, {"PublishTimeout", c.PublishTimeout}, {"ProbeInterval", c.ProbeInterval},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("bus: %s is negative", d.name))
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"MaxGroups", c.MaxGroups}, {"MaxPendingBytes", c.MaxPendingBytes},
		{"MaxPayloadBytes", c.MaxPayloadBytes}, {"MaxBatchMessages", c.MaxBatchMessages},
		{"MaxPipeline", c.MaxPipeline}, {"InboxBytes", c.InboxBytes}, {"InboxBatches", c.InboxBatches},
		{"MaxTails", c.MaxTails},
	} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("bus: %s is negative", n.name))
		}
	}
	if c.MaxPayloadBytes > 0 && c.MaxPayloadBytes < 1024 {
		errs = append(errs, errors.New("bus: MaxPayloadBytes below 1 KiB"))
	}
	if c.MaxPayloadBytes > 0 && c.MaxPendingBytes > 0 && c.MaxPendingBytes < c.MaxPayloadBytes {
		errs = append(errs, errors.New("bus: MaxPendingBytes below MaxPayloadBytes"))
	}
	return errors.Join(errs...)
}

func (c *Config) fill() {
	if c.FlushInterval == 0 {
		c.FlushInterval = 50 * time.Millisecond
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = time.Second
	}
	if c.MaxGroups == 0 {
		c.MaxGroups = 1 << 20
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = 512 << 10
	}
	if c.MaxPendingBytes == 0 {
		c.MaxPendingBytes = max(16<<20, c.MaxPayloadBytes)
	}
	if c.MaxBatchMessages == 0 {
		c.MaxBatchMessages = 4096
	}
	if c.MaxPipeline == 0 {
		c.MaxPipeline = 256
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = 5 * time.Second
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 2 * time.Second
	}
	if c.TailDelay == 0 {
		c.TailDelay = 2 * time.Second
	}
	if c.MaxTails == 0 {
		c.MaxTails = 1 << 16
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = 250 * time.Millisecond
	}
	if c.InboxBytes == 0 {
		c.InboxBytes = 16 << 20
	}
	if c.InboxBatches == 0 {
		c.InboxBatches = 8192
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}
