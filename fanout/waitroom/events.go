package waitroom

import "time"

// UpdateKind says which frame an Update becomes on the wire.
type UpdateKind uint8

// Update kinds. Queue, Granted and Rejected are the docs/protocol.md §6 frames
// `queue`, `granted` and `rejected`; Ended tells the gateway that the
// admitted session is over (expired or ended from another connection),
// so it may close the room socket.
const (
	UpdateQueue UpdateKind = iota + 1
	UpdateGranted
	UpdateRejected
	UpdateEnded
)

func (k UpdateKind) String() string {
	switch k {
	case UpdateQueue:
		return "queue"
	case UpdateGranted:
		return "granted"
	case UpdateRejected:
		return "rejected"
	case UpdateEnded:
		return "ended"
	}
	return "unknown"
}

// QueueStatus is the status field of a queue frame.
type QueueStatus string

// Queue statuses: paused when the room's admission rate over the last five
// minutes is zero (no ETA is given then, never a huge number).
const (
	StatusWaiting QueueStatus = "waiting"
	StatusPaused  QueueStatus = "paused"
	// StatusScheduled: in a scheduled room's pre-queue, before StartsAt
	// (no position: the start shuffles the pre-queue).
	StatusScheduled QueueStatus = "scheduled"
)

// Update is one message for a user's room socket, as plain values; the
// gateway encodes it with gateway/wire.
type Update struct {
	Kind UpdateKind
	Room string

	// Queue.
	Status   QueueStatus
	Position int64 // 1-based: Ahead+1
	Ahead    int64
	Total    int64 // queue depth
	// ETA is Ahead / admission rate, whole seconds; meaningful only when
	// Status is waiting.
	ETA time.Duration
	// VIPAheadNotice: VIPs were just placed ahead of this user.
	VIPAheadNotice bool
	// Local: the room runs on this node's local fallback queue (Redis
	// unreachable, degradation L3); order holds only among this node's
	// users.
	Local bool
	// StartsAt is the room's start while Status is scheduled (Total is
	// then the pre-queue's size).
	StartsAt time.Time

	// Granted.
	AccessToken string
	ExpiresAt   time.Time

	// Rejected: why (Reject.Err(RetryAfter) is the error to report).
	Reject     RejectReason
	RetryAfter time.Duration

	// Ended.
	Reason EndReason
}

// Observer is notified in-process of room events. Methods are called from
// the room's driver goroutine (or the goroutine ending the session) and
// must not block: hand work to a goroutine or a bounded queue.
type Observer interface {
	// SessionEnded is called once per admitted session that ends, on the
	// node that ended it (disconnect, leave or expiry).
	SessionEnded(SessionEnd)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(SessionEnd)

// SessionEnded implements Observer.
func (f ObserverFunc) SessionEnded(e SessionEnd) { f(e) }

// Degradation is the room subsystem's degradation level (docs/architecture.md §11).
type Degradation int

// Degradation levels.
const (
	// L0: normal.
	DegradeNone Degradation = iota
	// L1: backend memory high: stale data trimmed every maintenance pass,
	// rank cache refresh slowed to LiveRefresh.
	DegradeMemory
	// L2: backend overloaded: new entrants refused (room_full), positions
	// answered from the last snapshot (refreshed only every LiveRefresh).
	DegradeOverload
	// L3: backend unreachable: each node runs its local queue and keeps
	// accepting; updates carry Local.
	DegradeLocal
)

func (d Degradation) String() string {
	switch d {
	case DegradeNone:
		return "L0"
	case DegradeMemory:
		return "L1"
	case DegradeOverload:
		return "L2"
	case DegradeLocal:
		return "L3"
	}
	return "L?"
}
