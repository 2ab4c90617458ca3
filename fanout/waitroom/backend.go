package waitroom

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"
)

// Sentinel errors.
var (
	// ErrUnknownRoom is returned for a room that has not been configured.
	ErrUnknownRoom = errors.New("waitroom: unknown room")
	// ErrShardsImmutable is returned when an update changes a room's Shards.
	ErrShardsImmutable = errors.New("waitroom: shards cannot change for an existing room")
	// ErrUnavailable wraps backend failures that made the room switch to
	// its local fallback or that could not be served at all.
	ErrUnavailable = errors.New("waitroom: backend unavailable")
	// ErrClosed is returned by a Manager that has been shut down.
	ErrClosed = errors.New("waitroom: manager closed")
	// ErrRoomFull: the room refused an entry, its queue full or its node
	// overloaded (RejectedError carries the retry hint).
	ErrRoomFull = errors.New("waitroom: room full")
	// ErrRoomClosed: the room refused an entry, closed or draining.
	ErrRoomClosed = errors.New("waitroom: room closed")
)

// RejectReason says why a room refused an entry. Its values are the
// backends' own names (the Redis script answers them), not wire codes:
// the gateway turns RejectedError into the wire code through its one
// error mapping.
type RejectReason string

// Reject reasons.
const (
	// RejectRoomFull: the queue is at its bound (or the node is
	// overloaded); retry after the hint.
	RejectRoomFull RejectReason = "room_full"
	// RejectRoomClosed: the room is closed or draining.
	RejectRoomClosed RejectReason = "room_closed"
)

// Err returns the error of a refusal for r, retryable after retry (0 =
// no hint): a *RejectedError matching ErrRoomFull or ErrRoomClosed.
func (r RejectReason) Err(retry time.Duration) error {
	return &RejectedError{Reason: r, After: retry}
}

// RejectedError is a room's refusal of an entry. It matches (errors.Is)
// ErrRoomFull or ErrRoomClosed by its Reason.
type RejectedError struct {
	Reason RejectReason
	// After is when a retry may succeed; 0 means no hint.
	After time.Duration
}

func (e *RejectedError) Error() string {
	if e.After > 0 {
		return fmt.Sprintf("waitroom: rejected (%s), retry after %v", e.Reason, e.After)
	}
	return fmt.Sprintf("waitroom: rejected (%s)", e.Reason)
}

// Unwrap returns the sentinel of e.Reason.
func (e *RejectedError) Unwrap() error {
	if e.Reason == RejectRoomClosed {
		return ErrRoomClosed
	}
	return ErrRoomFull
}

// RetryAfter is e.After.
func (e *RejectedError) RetryAfter() time.Duration { return e.After }

// EntryState is where a user stands in a room.
type EntryState uint8

// Entry states.
const (
	// EntryNone: not in the room.
	EntryNone EntryState = iota
	// EntryWaiting: connected and queued.
	EntryWaiting
	// EntryAway: disconnected, position held (grace) or decaying, until the
	// hard timeout removes it. Away users are never admitted.
	EntryAway
	// EntryActive: admitted; the session lasts until disconnect, leave or
	// expiry.
	EntryActive
	// EntryScheduled: in the pre-queue of a scheduled room, without a
	// position until the start orders the pre-queue (RoomConfig.StartsAt).
	EntryScheduled
)

func (s EntryState) String() string {
	switch s {
	case EntryWaiting:
		return "waiting"
	case EntryAway:
		return "away"
	case EntryActive:
		return "active"
	case EntryScheduled:
		return "scheduled"
	default:
		return "none"
	}
}

// EndReason says why an admitted session ended.
type EndReason string

// Session end reasons.
const (
	EndDisconnect EndReason = "disconnect"
	EndLeave      EndReason = "leave"
	EndExpired    EndReason = "expired"
)

// Entry is one user's record in a room. Times come from the backend clock
// (Redis TIME) in whole seconds.
type Entry struct {
	UID   string
	Tier  int
	State EntryState
	// Join is the effective join time: the original one, moved later by
	// decay after a long absence. Score and the max-wait rule use it.
	Join time.Time
	// First is the first join of this visit (perceived wait starts here).
	First time.Time
	// Bias is the bias applied at entry (after the VIP share cap).
	Bias float64
	// Score is the stored score: 1.3*Join + Bias once smoothing is done.
	Score float64
	// AwaySince is set while State is EntryAway.
	AwaySince time.Time
	// Back is set while State is EntryWaiting (or EntryActive) after a
	// return from away: the max-wait promise runs from max(Join, Back)
	// (doc.go).
	Back time.Time
	// Admitted and Expires are set while State is EntryActive.
	Admitted time.Time
	Expires  time.Time
	// Node is the node that last entered the user (it holds a socket or a
	// polling visitor; waiting or active); "" when away. Other nodes may
	// hold the user too (a visitor whose polls moved, sockets on several
	// nodes): the entry records them all, and the user is away only once
	// none holds it (Backend.Disconnect).
	Node string
}

// Target is the score the entry converges to: 1.3*Join + Bias.
func (e *Entry) Target() float64 { return Score(e.Join.Unix(), e.Bias) }

// EnterStatus is the outcome of Backend.Enter.
type EnterStatus uint8

// Enter outcomes.
const (
	// EnterQueued: a new entry was created.
	EnterQueued EnterStatus = iota + 1
	// EnterExisting: the user was already waiting; nothing changed.
	EnterExisting
	// EnterRestored: the user came back within grace; position kept.
	EnterRestored
	// EnterDecayed: the user came back after grace; position decayed.
	EnterDecayed
	// EnterActive: the user is already admitted.
	EnterActive
	// EnterRejected: refused; see Reject and RetryAfter.
	EnterRejected
)

func (s EnterStatus) String() string {
	switch s {
	case EnterQueued:
		return "queued"
	case EnterExisting:
		return "existing"
	case EnterRestored:
		return "restored"
	case EnterDecayed:
		return "decayed"
	case EnterActive:
		return "active"
	case EnterRejected:
		return "rejected"
	default:
		return fmt.Sprintf("EnterStatus(%d)", uint8(s))
	}
}

// Restore carries a known entry into a backend, bypassing the open/closed
// and capacity checks: used when a node moves its users between its local
// fallback and Redis. Join and First are kept; Bias is used as given.
type Restore struct {
	Join  time.Time
	First time.Time
	Bias  float64
	// Active re-registers an admitted session that expires at Expires.
	Active   bool
	Admitted time.Time
	Expires  time.Time
}

// EnterRequest asks to put a user in a room.
type EnterRequest struct {
	UID  string
	Tier int // 0 normal, 1..3 VIP; clamped
	// Node is the node holding the user's socket ("" = none tracked); it
	// joins the nodes already holding the user. If that node stops
	// heartbeating (Maintain), it no longer holds its users: those no other
	// node holds are treated as disconnected.
	Node string
	// Restore, when set, re-creates a known entry (fallback hand-over).
	Restore *Restore
}

// EnterResult is the outcome of Enter.
type EnterResult struct {
	Status     EnterStatus
	Reject     RejectReason
	RetryAfter time.Duration
	Entry      Entry
	// Ahead is the number of users admitted before this one if nothing
	// changes; Waiting is the queue depth (connected waiting users).
	Ahead   int64
	Waiting int64
	// Ended is set when Enter found an expired session of the same user
	// and ended it before queueing again.
	Ended *SessionEnd
	// PlacementSeq is the room's latest placement Seq when the entry was
	// read: placements up to it are already reflected in Ahead.
	PlacementSeq int64
	// PreQueue is the pre-queue's size (scheduled rooms).
	PreQueue int64
	Now      time.Time
}

// Departure is the outcome of Disconnect and Leave.
type Departure struct {
	// Prev is the state before the call.
	Prev EntryState
	// Ended is set when an admitted session ended.
	Ended *SessionEnd
	// Held is set when Disconnect changed nothing but the node's hold:
	// another node still holds the user (its entry stays as it was).
	Held bool
	Now  time.Time
}

// SessionEnd describes an admitted session that ended.
type SessionEnd struct {
	Room     string
	UID      string
	Tier     int
	Reason   EndReason
	First    time.Time // first join: Admitted-First is the perceived wait
	Admitted time.Time
	Ended    time.Time
}

// AdmitRequest bounds one admission step.
type AdmitRequest struct {
	// Max caps this step (0 = only the token bucket and MaxActive bound it).
	Max int
}

// vipWithinShare reports whether admitting one more VIP keeps VIPs within
// share of the counted admissions (v VIP, n normal), give or take one
// admission. Both backends admit with it (the Lua copy is in redisroom's
// admitScript); starting from no admissions it yields, for a share of 2/3,
// the steady pattern VIP VIP normal VIP VIP normal... The slack decides
// exact ties (common with rational shares) against the VIP.
func vipWithinShare(v, n, share float64) bool { return v+shareSlack < share*(v+n+1) }

const shareSlack = 0.01

// shareCount counts one admission; past 2^20 both counts are halved,
// which keeps their ratio exactly (and the Lua copy identical).
func shareCount(v, n *float64, vip bool) {
	if vip {
		*v++
	} else {
		*n++
	}
	if *v+*n > 1<<20 {
		*v, *n = *v/2, *n/2
	}
}

// QuotaAhead is how many users are admitted before a waiting user under the
// admission quota with VIP share s (in (0, 1)), if nothing changes, nobody
// is overdue and the counts start from zero: vAhead VIPs and nAhead normal
// users rank ahead of it by score, nWaiting normal users wait in all. It
// follows vipWithinShare step by step:
//   - the (k+1)-th normal user is admitted once the VIPs reach
//     ceil((s*(k+1) - slack)/(1-s)), so a normal user waits for that many
//     VIPs at most (the VIPs ranked ahead of it);
//   - the (m+1)-th VIP is admitted once the normal users reach
//     floor((m + slack)/s - m - 1) + 1, so a VIP also waits for that many
//     normal users (as many as wait), however far behind they rank.
//
// It assumes the quota never yields, i.e. every waiting normal user was
// owed before every waiting VIP's promise (a VIP surge against a normal
// queue). Where VIPs came first, the quota yields to them (memRoom.quotaMay)
// and Ahead is an estimate: low for the normal users who came after them,
// high for those VIPs.
//
// Both backends use it for Ahead (the Lua copy is in redisroom's ahead).
// Computed in floating point and clamped before converting, so no share
// overflows.
func QuotaAhead(vip bool, vAhead, nAhead, nWaiting int64, s float64) int64 {
	if vip {
		m := float64(vAhead)
		normals := math.Floor((m+shareSlack)/s-m-1) + 1
		normals = min(max(normals, 0), float64(nWaiting))
		return vAhead + max(nAhead, int64(normals))
	}
	vips := math.Ceil((s*float64(nAhead+1) - shareSlack) / (1 - s))
	vips = min(max(vips, 0), float64(vAhead))
	return nAhead + int64(vips)
}

// Admission is one admitted user.
type Admission struct {
	UID      string
	Tier     int
	Join     time.Time
	First    time.Time
	Admitted time.Time
	Expires  time.Time
	// Overdue is true when the max-wait rule, not the score, chose the user.
	Overdue bool
	// Late is true when the admission broke the max-wait promise (counted
	// in Stats.MaxWaitViolations; it must not happen). Back is the user's
	// last return from away before it (zero = none): the promise runs from
	// max(Join, Back).
	Late bool
	Back time.Time
}

// promised is when a's max-wait promise started: max(Join, Back).
func (a Admission) promised() time.Time {
	if a.Back.After(a.Join) {
		return a.Back
	}
	return a.Join
}

// AdmitResult is the outcome of Admit.
type AdmitResult struct {
	Admitted []Admission
	Tokens   float64 // left in the bucket
	Now      time.Time
}

// MaintainRequest says which node runs Maintain.
type MaintainRequest struct {
	// Node records a heartbeat for this node ("" = none).
	Node string
	// NodeTimeout: a node without a heartbeat for longer is dead; its
	// waiting users become away (since its last heartbeat) and its
	// admitted sessions end (reason disconnect). 0 disables the sweep.
	NodeTimeout time.Duration
}

// MaintainResult is the outcome of Maintain.
type MaintainResult struct {
	// Ended are sessions ended by expiry, or by the death of their node
	// (reason disconnect).
	Ended   []SessionEnd
	Dropped []string // away entries removed by the hard timeout
	Orphans int      // waiting users of dead nodes made away
	Stepped int      // VIP entries moved by smoothing
	Rate    float64  // admissions/s over the 5-minute window
	LMax    int64
	Now     time.Time
}

// Placement records VIPs placed (or moved by smoothing) ahead of others:
// a waiting user whose score lies in [Lo, Hi) and who has not yet been told
// about placement Seq gets vip_ahead_notice. A new VIP's placement is
// [score, +Inf); a smoothing step records one [lowest new score, highest old
// score) for all VIPs it moved (an over-approximation when they are far
// apart). Seq increases by one per placement, per room.
type Placement struct {
	Seq    int64
	At     time.Time
	Lo, Hi float64
}

// PlacementLog is how many placements a backend keeps per room.
const PlacementLog = 4096

// Position is one user's standing in a Snapshot.
type Position struct {
	Entry
	// Ahead is set for waiting users: users that will be admitted first.
	Ahead int64
}

// Stats are a room's counters.
type Stats struct {
	Waiting    int64 // connected waiting users (queue depth)
	Away       int64
	Active     int64
	VIPWaiting int64
	// WaitingByTier counts the waiting users by tier (0 normal, 1..MaxTier
	// VIP); it sums to Waiting and its tiers 1..MaxTier to VIPWaiting.
	WaitingByTier [MaxTier + 1]int64
	Overdue       int64   // waiting users past max_wait
	Rate          float64 // admissions/s over the 5-minute window
	Admitted5m    int64   // admissions in the window
	LMax          int64   // Little's Law capacity of the queue
	// PreQueue counts the users waiting for a scheduled room's start.
	PreQueue int64
	// MaxWaitViolations counts the admissions that broke the max-wait
	// promise since the room was created (must stay 0).
	MaxWaitViolations int64
	// Owed is everyone owed an admission (waiting, away, pre-queue);
	// Capacity the admissions promised within MaxWait (Capacity(cfg));
	// MinSlack the smallest spare of anyone owed (MaxInt64 when nobody).
	Owed, Capacity, MinSlack int64
}

// Snapshot is a consistent view of a room for the given users.
type Snapshot struct {
	Stats
	Positions  []Position  // same order as the requested uids
	Placements []Placement // VIP placements after since, oldest first
	// PlacementSeq is the room's latest placement Seq.
	PlacementSeq int64
	Now          time.Time
}

// Health is what a backend reports about its own state.
type Health struct {
	// MemoryHigh: the store is close to its memory limit (room level L1).
	MemoryHigh bool
	// MemoryUsed and MemoryLimit in bytes (0 when unknown).
	MemoryUsed, MemoryLimit int64
	// Latency of a trivial round trip.
	Latency time.Duration
}

// Backend is the storage of the waiting room with its atomic operations.
// Redis (fanout/waitroom/redisroom) and Memory implement it with the same
// semantics and pass the same suite (fanout/waitroom/waitroomtest). Every
// operation reads the backend's own clock (Redis TIME) and is atomic: two
// nodes calling Admit concurrently never admit one user twice nor exceed
// MaxActive. cfg must have defaults applied and be valid.
type Backend interface {
	// Enter queues a user, idempotently: a user already waiting or active
	// is reported, never added twice; an away user is restored (within
	// Grace) or decayed; an away user past HardTimeout starts over.
	Enter(ctx context.Context, cfg *RoomConfig, req EnterRequest) (EnterResult, error)
	// Disconnect is node's last ticket of the user closing: node no longer
	// holds the user. While another node still holds it (it entered the
	// user since, and has not disconnected it) nothing else changes
	// (Departure.Held); otherwise a waiting user becomes away (position
	// held) and an admitted session ends (reason disconnect). node "" is
	// every holder at once (untracked users, tools).
	Disconnect(ctx context.Context, cfg *RoomConfig, uid, node string) (Departure, error)
	// Holds lists the users whose holders name node: the tickets the
	// backend believes node holds. A node compares them with its live
	// tickets when it starts and after a fallback hand-over, and
	// disconnects the rest (holds of a previous life under the same name,
	// closes lost in the fallback or at shutdown).
	Holds(ctx context.Context, cfg *RoomConfig, node string) ([]string, error)
	// Leave removes a waiting or away user or ends a session (reason leave).
	Leave(ctx context.Context, cfg *RoomConfig, uid string) (Departure, error)
	// Admit runs one atomic admission step: overdue users oldest first,
	// then the best score (or, when the VIPs have used their share of a
	// quota, the best-ranked normal user; RoomConfig.VIPAdmitShare), within
	// the token bucket and MaxActive.
	Admit(ctx context.Context, cfg *RoomConfig, req AdmitRequest) (AdmitResult, error)
	// Maintain ends expired sessions, drops away entries past HardTimeout,
	// steps smooth VIP insertions, refreshes the rate and L_max, records
	// the node's heartbeat and sweeps (a bounded batch of) the users of
	// dead nodes.
	Maintain(ctx context.Context, cfg *RoomConfig, req MaintainRequest) (MaintainResult, error)
	// Snapshot returns the room's stats, the positions of uids and the VIP
	// placements with Seq > since (at most PlacementLog, oldest first).
	Snapshot(ctx context.Context, cfg *RoomConfig, uids []string, since int64) (Snapshot, error)
	// Trim drops data that can be rebuilt or lost without harm (degradation
	// L1): away entries past grace and old VIP placements. It returns how
	// many entries it removed.
	Trim(ctx context.Context, cfg *RoomConfig) (int, error)
	// SaveConfig stores a room's configuration so every node sees it.
	SaveConfig(ctx context.Context, cfg RoomConfig) error
	// LoadConfigs returns all stored room configurations.
	LoadConfigs(ctx context.Context) ([]RoomConfig, error)
	// DeleteRoom removes a room's configuration and all of its data.
	DeleteRoom(ctx context.Context, name string) error
	// Health reports memory pressure and latency.
	Health(ctx context.Context) (Health, error)
}

// AdmissionEvent is one admission step as seen by every node sharing a
// backend: the node holding a user's socket pushes granted.
type AdmissionEvent struct {
	Room     string
	UIDs     []string
	Admitted time.Time
	Expires  time.Time
}

// AdmissionWatcher is implemented by backends shared by several nodes
// (Redis): WatchAdmissions calls fn for every admission step of every room
// until ctx is done.
type AdmissionWatcher interface {
	WatchAdmissions(ctx context.Context, fn func(AdmissionEvent)) error
}

// RateWindow is the sliding window of the admission rate behind the ETA.
const RateWindow = 300 // seconds

// StallAfter is how long users may wait with no admission in the rate
// window before the room's observed rate is taken as zero for L_max.
const StallAfter = 60 // seconds

// Alert levels of the queue depth against L_max (docs/architecture.md §11).
const (
	AlertWarn     = 0.5
	AlertCritical = 0.8
)

// lmax computes Little's Law capacity from the observed rate. When nothing
// was admitted in the window it uses the configured rate, unless users
// have waited longer than StallAfter (the room is stalled: capacity 0).
func lmax(cfg *RoomConfig, rate float64, admitted5m, waiting int64, oldestWaitS int64) int64 {
	lambda := rate
	if admitted5m == 0 {
		lambda = cfg.AdmitRate
		if waiting > 0 && oldestWaitS >= StallAfter {
			lambda = 0
		}
	}
	return int64(lambda * cfg.TargetWait.Seconds() * cfg.SafetyFactor)
}

// RetryAfter is the retry hint of a room_full rejection: the time to drain
// the excess at the observed (or configured) rate, clamped to 1 s..5 min.
func RetryAfter(cfg *RoomConfig, waiting, lmaxV int64, rate float64) time.Duration {
	if rate <= 0 {
		rate = cfg.AdmitRate
	}
	if lmaxV <= 0 {
		return 30 * time.Second
	}
	s := float64(waiting-lmaxV+1) / rate
	d := time.Duration(s * float64(time.Second))
	return min(max(d, time.Second), 5*time.Minute)
}

// RateOf is the admission rate over the window: count / span, where span
// runs from the oldest second with an admission in the window to now.
func RateOf(count int64, oldest, now int64) float64 {
	if count == 0 {
		return 0
	}
	span := min(now-oldest+1, RateWindow)
	if span < 1 {
		span = 1
	}
	return float64(count) / float64(span)
}

var nodeRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{0,64}$`)

// ValidNode reports whether name is usable as a node name: up to 64
// characters of [A-Za-z0-9_.:-].
func ValidNode(name string) bool { return nodeRE.MatchString(name) }

// clampTier maps any level into 0..MaxLevel.
func clampTier(l int) int { return min(max(l, 0), MaxTier) }

// ShardOf is the shard index of uid among k shards (FNV-1a 32). Both
// backends use it; the Redis backend records it in the entry.
func ShardOf(uid string, k int) int {
	if k <= 1 {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(uid); i++ {
		h ^= uint32(uid[i])
		h *= 16777619
	}
	return int(h % uint32(k))
}
