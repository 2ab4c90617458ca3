package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// GroupState is the group-level send gate of docs/architecture.md §3.
type GroupState string

// Group states. Muted and dissolved groups reject sends at the group level.
const (
	StateActive    GroupState = "active"
	StateMutedAll  GroupState = "muted_all"
	StateDissolved GroupState = "dissolved"
)

// Valid reports whether s is one of the defined states.
func (s GroupState) Valid() bool {
	return s == StateActive || s == StateMutedAll || s == StateDissolved
}

// Message kinds.
const (
	KindText  = "text"
	KindAtAll = "at_all"
)

// Member roles. AddMembers gives the group's owner RoleOwner and everybody
// else RoleMember.
const (
	RoleMember = "member"
	RoleOwner  = "owner"
)

// MaxGroupNameBytes bounds Group.Name.
const MaxGroupNameBytes = 256

// Group is one chat group.
type Group struct {
	GID         int64
	Name        string
	Owner       string
	State       GroupState
	LastSeq     int64
	MemberCount int64
	CreatedAt   time.Time
}

// Member is one membership row. Ordinal is a small dense per-group integer
// used as the bit index in presence bitmaps; freed ordinals are reused.
type Member struct {
	GID         int64
	UID         string
	Ordinal     uint32
	JoinSeq     int64 // first seq this member may see (last_seq+1 at join)
	LastReadSeq int64
	Role        string
	Muted       bool
	JoinedAt    time.Time
	// MemberVersion is the group's membership version (see
	// Store.MembersOf) that the AddMembers or RemoveMember call returning
	// the row made; 0 when AddMembers added nobody (every uid was a
	// member) and from other reads.
	MemberVersion int64
}

// AddedCursor is a position in the feed of additions (Store.MembersAdded).
// Its fields belong to the backend that returned it; the zero value asks
// for the position of now.
type AddedCursor struct {
	Set bool // false in the zero value
	// Mark orders additions (embedded: a counter; Postgres: the adding
	// transaction's id), GID and UID break ties within one Mark.
	Mark int64
	GID  int64
	UID  string
	// Postgres: a pass over the feed reads the additions of the
	// transactions at or above Horizon and of those in Running (all
	// below Horizon): what the snapshot the previous pass began with
	// could not see. NextHorizon and NextRunning are the same for the
	// next pass, taken by the first page of this one (NextHorizon 0: not
	// yet). Running holds a bounded number of ids (store/postgres,
	// maxAddedRunning). A cursor's slices are never modified.
	Horizon     int64
	Running     []int64
	NextHorizon int64
	NextRunning []int64
}

// User is the per-user row: VIP tier 0 normal, 1..MaxTier VIP.
// LastActiveAt is when the user last connected, as the engine wrote it:
// the engine coalesces these writes (fanout.Config.TouchInterval), so it
// lags a connect by up to that interval (1 s by default); zero = never.
type User struct {
	UID          string
	Tier         int
	LastActiveAt time.Time
}

// UserTouch is one user's last-active time for TouchUsers.
type UserTouch struct {
	UID string
	At  time.Time
}

// Message is one stored message. Body is raw JSON.
type Message struct {
	GID         int64
	Seq         int64
	Sender      string
	ClientMsgID string
	Kind        string
	Body        []byte
	CreatedAt   time.Time
}

// Size is what m counts against the byte bound of Store.Messages: its
// body and sender bytes, the parts of a message whose size varies.
func (m *Message) Size() int { return len(m.Body) + len(m.Sender) }

// AppendRequest is one message to store. Kind "" means KindText.
type AppendRequest struct {
	GID         int64
	Sender      string
	ClientMsgID string
	Kind        string
	Body        []byte
}

// AppendResult is the outcome of one AppendRequest. Err is nil when the
// message is stored (or was stored before: Duplicate) and one of the typed
// errors below when this message alone was rejected.
type AppendResult struct {
	Seq       int64
	CreatedAt time.Time
	Duplicate bool
	Err       error
	// MemberVersion is the group's membership version when the message
	// was stored (see Store.MembersOf): every membership change committed
	// before it has a version at most this one. 0 for duplicates and
	// rejections.
	MemberVersion int64
}

// SyncEntry is one group of a user's sync answer.
type SyncEntry struct {
	GID         int64
	LastSeq     int64
	LastReadSeq int64
	Unread      int64 // LastSeq - max(LastReadSeq, JoinSeq-1), never negative
}

// ValidateSyncPage checks the page arguments of Store.Sync: limit at
// least 1 (a sync read is always bounded) and afterGID not negative. It
// returns nil or an error wrapping ErrBadRequest.
func ValidateSyncPage(afterGID int64, limit int) error {
	if limit < 1 {
		return fmt.Errorf("%w: sync page limit %d, want at least 1", ErrBadRequest, limit)
	}
	if afterGID < 0 {
		return fmt.Errorf("%w: negative after_gid %d", ErrBadRequest, afterGID)
	}
	return nil
}

// Limits bounds what a store accepts. Zero values mean the defaults.
type Limits struct {
	MaxBodyBytes   int // bytes per message body; 0 = DefaultMaxBodyBytes
	MaxRange       int // messages per range read; 0 = DefaultMaxRange
	MaxBatch       int // requests per Append call; 0 = DefaultMaxBatch
	MaxAddMembers  int // uids per AddMembers call; 0 = DefaultMaxAddMembers
	MaxClientMsgID int // bytes of a client_msg_id; 0 = DefaultMaxClientMsgID
	MaxUID         int // bytes of a uid (members, senders, owners); 0 = DefaultMaxUID
	// MaxGID is the largest gid a group may have, chosen by the caller or
	// assigned; 0 = DefaultMaxGID.
	MaxGID int64
}

// Defaults for Limits.
const (
	DefaultMaxBodyBytes   = 32 << 10
	DefaultMaxRange       = 200
	DefaultMaxBatch       = 4096
	DefaultMaxAddMembers  = 10000
	DefaultMaxClientMsgID = 128
	DefaultMaxUID         = 128
	// DefaultMaxGID is the largest integer a JSON number keeps exactly in
	// JavaScript (2^53-1): a larger gid would reach a browser client as a
	// different group.
	DefaultMaxGID = 1<<53 - 1
)

// WithDefaults returns l with zero fields replaced by the defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxRange <= 0 {
		l.MaxRange = DefaultMaxRange
	}
	if l.MaxBatch <= 0 {
		l.MaxBatch = DefaultMaxBatch
	}
	if l.MaxAddMembers <= 0 {
		l.MaxAddMembers = DefaultMaxAddMembers
	}
	if l.MaxClientMsgID <= 0 {
		l.MaxClientMsgID = DefaultMaxClientMsgID
	}
	if l.MaxUID <= 0 {
		l.MaxUID = DefaultMaxUID
	}
	if l.MaxGID <= 0 {
		l.MaxGID = DefaultMaxGID
	}
	return l
}

// ValidateID checks an identifier (uid, client_msg_id): 1 to max bytes of
// valid UTF-8 without NUL (Postgres text cannot hold NUL). The error wraps
// ErrBadRequest.
func ValidateID(what, id string, max int) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty %s", ErrBadRequest, what)
	case len(id) > max:
		return fmt.Errorf("%w: %s is %d bytes, max %d", ErrBadRequest, what, len(id), max)
	case !utf8.ValidString(id) || strings.IndexByte(id, 0) >= 0:
		return fmt.Errorf("%w: %s is not valid UTF-8 text", ErrBadRequest, what)
	}
	return nil
}

// ValidateAppend checks one request against l (zero fields = defaults) the
// way every backend must: gid > 0; sender and client_msg_id valid IDs
// (ValidateID); kind "", KindText or KindAtAll; body valid JSON of at most
// l.MaxBodyBytes. It returns nil or an error wrapping ErrBadRequest or
// ErrTooLarge (body only). It does not modify r.
func ValidateAppend(r *AppendRequest, l Limits) error {
	l = l.WithDefaults()
	if r.GID <= 0 {
		return fmt.Errorf("%w: gid %d", ErrBadRequest, r.GID)
	}
	if err := ValidateID("sender", r.Sender, l.MaxUID); err != nil {
		return err
	}
	if err := ValidateID("client_msg_id", r.ClientMsgID, l.MaxClientMsgID); err != nil {
		return err
	}
	if r.Kind != "" && r.Kind != KindText && r.Kind != KindAtAll {
		return fmt.Errorf("%w: unknown kind %q", ErrBadRequest, r.Kind)
	}
	if len(r.Body) > l.MaxBodyBytes {
		return fmt.Errorf("%w: body is %d bytes, max %d", ErrTooLarge, len(r.Body), l.MaxBodyBytes)
	}
	if !json.Valid(r.Body) {
		return fmt.Errorf("%w: body is not valid JSON", ErrBadRequest)
	}
	return nil
}

// Typed errors. Per-message Append rejections are returned in
// AppendResult.Err; other methods return them directly (possibly wrapped).
var (
	ErrGroupNotFound = errors.New("store: group not found")
	ErrGroupExists   = errors.New("store: group already exists")
	ErrNotMember     = errors.New("store: not a member")
	ErrMuted         = errors.New("store: member is muted")
	ErrGroupClosed   = errors.New("store: group is muted_all or dissolved")
	ErrTooLarge      = errors.New("store: too large")
	ErrBadRequest    = errors.New("store: bad request")
	ErrUserNotFound  = errors.New("store: user not found")
	// ErrGIDExhausted: every gid up to Limits.MaxGID has been assigned. A
	// permanent condition, not retryable: groups can still be created
	// with an explicit free gid, or with a larger MaxGID.
	ErrGIDExhausted = errors.New("store: no gid left to assign")
	// ErrUnavailable wraps failures of the backing database (connection
	// refused, timeout, failed commit): retryable. Nothing was stored,
	// except when the connection broke while COMMIT was in flight: then the
	// batch may have been stored, and a retry of the same sends returns the
	// original seqs (Duplicate) thanks to the client_msg_id key.
	ErrUnavailable = errors.New("store: unavailable")
)

// Unavailable wraps err so that errors.Is(err, ErrUnavailable) holds.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// Store is the durable state of fanfare. Implementations: store/postgres
// and store/embedded; both pass store/storetest.
//
// Invariants every implementation keeps (docs/architecture.md §1):
//   - seq per group is dense and strictly increasing, allocated in the same
//     transaction as the message insert; a reader never sees seq N+1 before N;
//   - Append returns only after the batch is durably committed;
//   - (gid, sender, client_msg_id) is unique: a retry returns the original seq;
//   - range reads never return seq < member.join_seq.
type Store interface {
	// CreateGroup creates g. g.GID == 0 assigns one; State "" means active;
	// LastSeq and MemberCount are ignored (a new group has neither).
	// Assigned gids come from an allocator that explicit gids do not move
	// (it skips the ones taken), so no gid chosen by a caller uses up the
	// space of assigned ones; ErrGIDExhausted once it passes
	// Limits.MaxGID. ErrGroupExists if the gid is taken; ErrBadRequest for
	// a gid outside 1..Limits.MaxGID, an unknown state, an invalid owner
	// (ValidateID, if set) or a name that is not UTF-8 text of at most
	// MaxGroupNameBytes.
	CreateGroup(ctx context.Context, g Group) (Group, error)
	// Group returns one group or ErrGroupNotFound.
	Group(ctx context.Context, gid int64) (Group, error)
	// SetGroupState changes a group's state and returns the group
	// (ErrGroupNotFound, ErrBadRequest for an unknown state).
	SetGroupState(ctx context.Context, gid int64, state GroupState) (Group, error)

	// AddMembers adds uids (idempotent: existing members are returned as
	// they are). New members get dense ordinals (freed ones reused first,
	// smallest first) and join_seq = last_seq + 1; the owner gets RoleOwner.
	// Returns one Member per distinct uid, in first-occurrence order.
	// ErrGroupNotFound; ErrGroupClosed if the group is dissolved;
	// ErrTooLarge for more than Limits.MaxAddMembers uids; ErrBadRequest for
	// an invalid uid (ValidateID).
	AddMembers(ctx context.Context, gid int64, uids []string) ([]Member, error)
	// RemoveMember removes uid and frees its ordinal; returns the removed
	// row. ErrNotMember if uid is not a member.
	RemoveMember(ctx context.Context, gid int64, uid string) (Member, error)
	// SetMemberMuted mutes or unmutes one member (ErrNotMember).
	SetMemberMuted(ctx context.Context, gid int64, uid string, muted bool) error
	// Member returns one membership or ErrNotMember (also for an unknown group).
	Member(ctx context.Context, gid int64, uid string) (Member, error)
	// MembersOf returns the members of gid among uids (in any order;
	// uids that are not members, duplicates and unstorable ones are left
	// out) and the group's membership version, read together: ms
	// reflects every change up to version. The version starts at 0 and
	// every AddMembers that adds someone and every RemoveMember raises it
	// by one, under the lock Append takes on the group, so a message
	// stored after a change carries a version (AppendResult.MemberVersion)
	// at least that change's. ErrGroupNotFound; ErrTooLarge for more than
	// Limits.MaxAddMembers uids.
	MembersOf(ctx context.Context, gid int64, uids []string) (ms []Member, version int64, err error)
	// MembersAdded reads the feed of additions: the memberships of any
	// group added after cursor and still held now, at most limit of them
	// (fewer: the caller has caught up), in the backend's order, and the
	// cursor to read on from. Every membership whose addition committed
	// after cursor was returned is returned by one of the calls that
	// follow (a call may return one again: callers skip what they have).
	// The zero cursor reads no members and returns the cursor of now: the
	// additions committed after it. ErrBadRequest for limit < 1; a limit
	// above Limits.MaxAddMembers is lowered to it.
	MembersAdded(ctx context.Context, cursor AddedCursor, limit int) (ms []Member, next AddedCursor, err error)
	// UserGroups returns every membership of uid.
	UserGroups(ctx context.Context, uid string) ([]Member, error)
	// ActiveMembersSince returns the uids of gid's members whose
	// users.last_active_at >= since.
	ActiveMembersSince(ctx context.Context, gid int64, since time.Time) ([]string, error)

	// SetUserTier creates or updates a user's VIP tier (0..MaxTier).
	SetUserTier(ctx context.Context, uid string, tier int) error
	// TouchUser creates the user if needed and sets last_active_at = at,
	// unless it is already later (never backwards: nodes touch concurrently).
	TouchUser(ctx context.Context, uid string, at time.Time) error
	// TouchUsers is TouchUser of every touch in one transaction (the
	// engine's coalesced writes of connects): a uid given more than once
	// takes its latest At, a uid ValidateID refuses is left out (it can
	// be no user), and nothing else is refused. Backends write the users
	// in uid order, so that concurrent calls of several nodes cannot
	// deadlock on each other's rows.
	TouchUsers(ctx context.Context, touches []UserTouch) error
	// User returns one user or ErrUserNotFound.
	User(ctx context.Context, uid string) (User, error)

	// Append stores a batch spanning any number of groups in one
	// transaction. res must have len(reqs); res[i] receives the outcome of
	// reqs[i]. A non-nil error means nothing was stored (ErrUnavailable
	// wrapped, or ErrBadRequest / ErrTooLarge for the batch as a whole);
	// otherwise per-message rejections (ErrGroupNotFound, ErrNotMember,
	// ErrMuted, ErrGroupClosed, ErrTooLarge, ErrBadRequest) are in res and
	// the rest committed. Seqs are assigned in request order per group, and
	// never to a rejected request (no gaps). Requests are checked with
	// ValidateAppend; a stored (gid, sender, client_msg_id) is answered with
	// its original seq and CreatedAt and Duplicate set, before any member or
	// group-state check, and so is a repeat of an earlier request of the
	// same batch (which shares that request's outcome, rejection included).
	Append(ctx context.Context, reqs []AppendRequest, res []AppendResult) error

	// Messages returns uid's view of gid in [fromSeq, toSeq] in seq order:
	// fromSeq is raised to the member's join_seq, toSeq lowered to last_seq,
	// and the first limit (<= Limits.MaxRange; 0 = MaxRange) messages
	// stored at or above fromSeq are returned (after ExpireMessages the
	// page starts at the oldest message left). toSeq == 0 means "up to last_seq". Also returns
	// the group's last_seq. maxBytes > 0 also bounds the page by size: it
	// ends before the first message that would take the sum of
	// Message.Size past maxBytes, but always holds at least one message
	// (so a reader paging through a range progresses); 0 = no byte bound.
	// ErrNotMember for non-members and unknown groups;
	// ErrBadRequest for negative seqs, limit or maxBytes, or toSeq != 0 && toSeq <
	// fromSeq. A limit above Limits.MaxRange is lowered to it.
	Messages(ctx context.Context, gid int64, uid string, fromSeq, toSeq int64, limit, maxBytes int) ([]Message, int64, error)
	// Sync returns one page of uid's groups with last_seq, last_read_seq
	// and unread: the first limit groups with a gid above afterGID, in gid
	// order (afterGID 0 = from the first). The read is bounded by limit
	// (a keyset or range scan, never all of uid's memberships), so a
	// caller pages through a user in any number of groups with afterGID =
	// the last gid of the previous page; an empty page means no more.
	// ErrBadRequest for limit < 1 or a negative afterGID.
	Sync(ctx context.Context, uid string, afterGID int64, limit int) ([]SyncEntry, error)
	// MarkRead advances last_read_seq to seq (clamped to last_seq); it never
	// moves backwards. ErrNotMember for non-members; ErrBadRequest for a
	// negative seq.
	MarkRead(ctx context.Context, gid int64, uid string, seq int64) error
	// AdvanceConversations sets conversations.last_seq = lastSeq for uids in
	// gid (never backwards), in one statement. uids that are not members of
	// gid are ignored; duplicates are allowed. ErrBadRequest for a negative
	// lastSeq.
	AdvanceConversations(ctx context.Context, gid int64, uids []string, lastSeq int64) error
	// Conversations returns uid's tier-2 index: gid -> last_seq.
	Conversations(ctx context.Context, uid string) (map[int64]int64, error)

	// ExpireMessages deletes gid's oldest messages created before before,
	// in seq order, at most limit of them, stopping at the first message
	// created at or after before; it returns how many it deleted. last_seq
	// does not change (seqs are never reused); a retry of a deleted
	// message's (sender, client_msg_id) is stored anew. An unknown group
	// deletes nothing; ErrBadRequest for limit <= 0.
	ExpireMessages(ctx context.Context, gid int64, before time.Time, limit int) (int, error)
	// GroupIDs returns up to limit gids above after, ascending: a walk
	// over every group. ErrBadRequest for limit <= 0.
	GroupIDs(ctx context.Context, after int64, limit int) ([]int64, error)

	// Ping checks that the backing database answers.
	Ping(ctx context.Context) error
	// Close releases resources.
	Close() error
}
