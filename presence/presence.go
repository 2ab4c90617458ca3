package presence

import (
	"context"
	"errors"

	"github.com/RoaringBitmap/roaring/v2"
)

// Sentinel errors.
var (
	// ErrConnExists is returned by Connect for a connection handle that is
	// already registered (under any uid).
	ErrConnExists = errors.New("presence: connection already registered")
	// ErrTooManyConns is returned by Connect when the user already holds
	// Config.MaxConnsPerUser connections on this node.
	ErrTooManyConns = errors.New("presence: too many connections for one user")
	// ErrOrdinalRange is returned for an ordinal above Config.MaxOrdinal.
	ErrOrdinalRange = errors.New("presence: ordinal out of range")
	// ErrUnavailable is returned by a cluster view whose backend cannot be
	// reached: the cluster-wide answer is unknown. Local presence keeps
	// working; callers fall back to the local view.
	ErrUnavailable = errors.New("presence: cluster view unavailable")
	// ErrBatchTooLarge is returned by OnlineAnywhere for a batch above the
	// view's bound.
	ErrBatchTooLarge = errors.New("presence: batch too large")
)

// Membership is one group membership of a user: the group and the user's
// ordinal in it (its bit index in the group's presence bitmap).
type Membership struct {
	GID     int64
	Ordinal uint32
}

// Source is the read side of one node's local presence that cluster views
// consume. *Local[C] implements it for every connection type C.
type Source interface {
	// OnlineCount returns the number of members of gid online on this node.
	OnlineCount(gid int64) int
	// ContainsOrdinal reports whether the member with this ordinal in gid is
	// online on this node.
	ContainsOrdinal(gid int64, ordinal uint32) bool
	// CloneBitmap returns a copy of gid's online ordinals on this node, nil
	// when none is online.
	CloneBitmap(gid int64) *roaring.Bitmap
	// AppendGroups appends every gid with at least one member online on this
	// node.
	AppendGroups(dst []int64) []int64
	// DrainDirty appends the gids whose online set changed since the previous
	// call and resets the set. Tracking starts with the first call, so the
	// first caller must follow it with a full scan (AppendGroups).
	DrainDirty(dst []int64) []int64
}

// Cluster is the cluster-wide view of presence: the union over all live
// nodes. A user online on several nodes (or several devices) counts once,
// since bits are keyed by the member's ordinal. Local changes become visible
// in the view after Flush (or the implementation's periodic flush).
//
// When the backend is unreachable, the query methods return an error
// wrapping ErrUnavailable and Stale reports true; local presence is
// unaffected.
type Cluster interface {
	// OnlineCount returns the number of distinct members of gid online on
	// any live node.
	OnlineCount(ctx context.Context, gid int64) (int64, error)
	// Nodes returns the ids of the live nodes with at least one member of gid
	// online, sorted.
	Nodes(ctx context.Context, gid int64) ([]string, error)
	// OnlineAnywhere appends to dst, for each ordinal in order, whether that
	// member of gid is online on any live node.
	OnlineAnywhere(ctx context.Context, gid int64, ordinals []uint32, dst []bool) ([]bool, error)
	// Flush publishes this node's pending local changes now.
	Flush(ctx context.Context) error
	// Stale reports whether the view may currently miss or keep stale data
	// of this node (backend unreachable, or resync after an outage pending).
	Stale() bool
}
