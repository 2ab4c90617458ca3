// This file holds the engine's contract with the layers around it: what
// it needs from a connection, the presence index and the bus (Conn,
// Presence, Bus), what it hands the gateway (Push, Pusher), and a send and
// its outcome (SendRequest, SendResult). The walk of a send starts in
// send.go; the engine itself is in engine.go.

package fanout

import (
	"time"

	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
)

// Conn is one client connection as the engine sees it: an opaque,
// comparable handle owned by the gateway. The gateway's Pusher receives the
// same values back.
type Conn interface {
	// UID is the authenticated user of the connection.
	UID() string
}

// Presence is what the engine needs from the local presence index;
// *presence.Local[Conn] implements it.
type Presence interface {
	// Connect registers c for uid and marks uid online in ms.
	Connect(uid string, c Conn, ms []presence.Membership) error
	// Disconnect unregisters c; uid goes offline when it was its last.
	Disconnect(uid string, c Conn) bool
	// Join sets uid's bit in gid if uid is online.
	Join(gid int64, uid string, ordinal uint32) error
	// Leave clears uid's bit in gid at once.
	Leave(gid int64, uid string)
	// AppendConns appends the connections of gid's online members to dst.
	AppendConns(dst []Conn, gid int64) []Conn
	// UIDOf returns the online user holding gid's bit ordinal here, if
	// any (the feed of additions skips members whose bit is set).
	UIDOf(gid int64, ordinal uint32) (string, bool)
	// UserOnline reports whether uid has a connection on this node (tier
	// 2 skips online members: they got the push).
	UserOnline(uid string) bool
}

// PushKind says which frame a Push carries (docs/protocol.md §4.8-§4.10).
type PushKind uint8

// Push kinds, by degradation level.
const (
	PushMsgs    PushKind = iota // L0: one msg frame per message
	PushBatch                   // L1: one batch frame per group per window
	PushSummary                 // L2: one summary frame per group per window
	// PushResync: no messages; the conns may miss some of the group's
	// messages up to LastSeq and must pull them (a resync frame,
	// docs/protocol.md §4.12). The engine sends it when a tail hint of
	// another node shows a batch this node never pushed.
	PushResync
)

// Push is one delivery of a group's committed messages to connections.
type Push struct {
	GID  int64
	Kind PushKind
	// Msgs are the messages in seq order (PushMsgs, PushBatch); for
	// PushSummary, Msgs[0] is the first message of the window.
	Msgs    []store.Message
	Count   int   // messages the push stands for (summary count)
	LastSeq int64 // highest seq in the push
	Conns   []Conn
	// Origin is when the oldest of Msgs entered Engine.Send, in Unix
	// nanoseconds: the start of the latency stages a pusher may observe
	// (Metrics.ObserveWrites). 0 when not known (a batch from another
	// node, a merge window, a resync).
	Origin int64
}

// Pusher delivers pushes to connections. Its methods are called on a shard
// worker (or, for Degraded, on the goroutine that changed a level); they
// must encode each frame once, must not block, and must not retain the
// slices they are given after they return.
type Pusher interface {
	// Push delivers p and returns the bytes it wrote to all of p.Conns
	// together (frames as they go on the wire: a compressed frame counts
	// its compressed size for the connections that get it); the engine
	// counts them as node egress (the egress trigger, docs/architecture.md
	// §8, and fanfare_egress_bytes_total).
	Push(p *Push) (bytes int)
	// Degraded tells conns that the effective level of gid is now level;
	// gid 0 with nil conns means node-wide: every connection.
	Degraded(gid int64, level Level, conns []Conn)
}

// SendRequest is one message to store and push.
type SendRequest struct {
	GID         int64
	UID         string
	ClientMsgID string
	Kind        string // "" = text
	// Body is raw JSON. The engine keeps it after Done (merge windows):
	// the caller must not reuse it.
	Body []byte
	// Done receives the outcome on the shard worker after commit (or at
	// once when the request is refused). It must not block.
	Done func(SendResult)
}

// SendResult is the outcome of a send. Err is nil when the message is stored
// (Seq set; Duplicate when it was stored before under the same client id).
type SendResult struct {
	Seq       int64
	CreatedAt time.Time
	Duplicate bool
	Err       error
}

// Bus is what the engine needs from the cross-node bus; *bus.Node
// implements it.
type Bus interface {
	// Publish hands gid's newly committed messages, stored at
	// membership version version, to the other nodes without blocking (a
	// drop is counted by the bus).
	Publish(gid, version int64, msgs []store.Message) error
	// PublishMembers hands a committed membership change of gid (ms
	// added, or removed) that made membership version version to the
	// other nodes without blocking (a drop is counted by the bus, and
	// repaired by version: see members.go).
	PublishMembers(gid, version int64, removed bool, ms []store.Member) error
	// Subscribe asks for the batches of gid at once (the bus also follows
	// presence on its own).
	Subscribe(gid int64) error
}
