package wire

import "encoding/json"

// Frame types: the value of the "type" field of every WebSocket frame.
const (
	// Client -> server.
	TypeSend = "send"
	TypeRead = "read"
	TypePull = "pull"
	TypePing = "ping"

	// Server -> client.
	TypeHello    = "hello"
	TypeAck      = "ack"
	TypeMsg      = "msg"
	TypeBatch    = "batch"
	TypeSummary  = "summary"
	TypeDegraded = "degraded"
	TypeResync   = "resync"
	TypeMessages = "messages"
	TypePong     = "pong"
	TypeError    = "error"

	// Waiting room, server -> client.
	TypeQueue    = "queue"
	TypeGranted  = "granted"
	TypeRejected = "rejected"
)

// Message kinds. An absent kind means KindText.
const (
	KindText  = "text"
	KindAtAll = "at_all"
)

// Error codes of error frames and HTTP error bodies (docs/protocol.md §7.1).
const (
	CodeBadRequest   = "bad_request"
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"    // not a member, muted
	CodeNotFound     = "not_found"    // unknown group or user (admin)
	CodeGroupClosed  = "group_closed" // dissolved or muted_all
	CodeRateLimited  = "rate_limited"
	CodeTooLarge     = "too_large"
	CodeOverloaded   = "overloaded"  // queue bound hit; retryable
	CodeUnavailable  = "unavailable" // L4 or store down; retryable
	CodeInternal     = "internal"
	// CodeRejected: the application's before-send hook refused the
	// message; the error's message is the hook's code.
	CodeRejected = "rejected"
)

// Room rejection codes of the rejected frame. CodeRateLimited is shared
// with the error codes.
const (
	CodeRoomFull   = "room_full"
	CodeRoomClosed = "room_closed"
)

// Queue statuses of the queue frame.
const (
	QueueWaiting = "waiting"
	QueuePaused  = "paused"
)

// Room states of the rooms admin API.
const (
	RoomOpen   = "open"
	RoomClosed = "closed"
)

// Group states of the groups API (the same strings as store.GroupState).
const (
	GroupActive    = "active"
	GroupMutedAll  = "muted_all"
	GroupDissolved = "dissolved"
)

// Degradation scopes of PUT /admin/v1/degrade.
const (
	ScopeNode  = "node"
	ScopeGroup = "group"
	// ScopeRooms (an addition) is the waiting rooms' degradation.
	ScopeRooms = "rooms"
)

// Limits enforced by the decoders.
const (
	// MaxIDBytes bounds a request id (client_msg_id); the store's default
	// bound is the same.
	MaxIDBytes = 128
	// MaxDepth bounds the nesting of a frame (the frame object is depth 1,
	// so a send body may nest MaxDepth-1 levels).
	MaxDepth = 32
)

// Degradation levels as they cross the wire: the level of degraded frames
// and of the degrade admin route (docs/protocol.md §5). The engine's
// fanout.Level has the same values (the gateway's TestLevelsMatchWire
// pins them), the SDK and the gateway compare against these names: adding
// a level means a constant here, one in the engine, and the docs.
const (
	LevelNormal    = 0 // one msg per message, as it commits
	LevelMerge     = 1 // one batch per group per merge window
	LevelSummary   = 2 // one summary per group per merge window
	LevelWriteOnly = 3 // no pushes: clients pull
	LevelReject    = 4 // no pushes, sends refused with unavailable
	// MaxLevel is the highest degradation level.
	MaxLevel = LevelReject
)

// ClientFrame is one decoded client frame. Type says which fields are set:
//
//	send: ID, GID, Kind (KindText or KindAtAll, never ""), Body
//	read: GID, Seq
//	pull: ID, GID, FromSeq, ToSeq (0 = up to last_seq)
//	ping: ID (may be "")
//
// Body aliases the decoded input: copy it before the input buffer is reused.
type ClientFrame struct {
	Type    string
	ID      string
	GID     int64
	Seq     int64
	FromSeq int64
	ToSeq   int64
	Kind    string
	Body    json.RawMessage
}

// Send is the send client frame.
type Send struct {
	ID   string          `json:"id"`
	GID  int64           `json:"gid"`
	Kind string          `json:"kind,omitempty"`
	Body json.RawMessage `json:"body"`
}

// Read is the read client frame: it advances last_read_seq of GID to Seq.
type Read struct {
	GID int64 `json:"gid"`
	Seq int64 `json:"seq"`
}

// Pull is the pull client frame. ToSeq 0 means up to last_seq.
type Pull struct {
	ID      string `json:"id"`
	GID     int64  `json:"gid"`
	FromSeq int64  `json:"from_seq"`
	ToSeq   int64  `json:"to_seq"`
}

// Ping is the application-level ping client frame.
type Ping struct {
	ID string `json:"id,omitempty"`
}

// ServerFrame is a decoded server frame: one of *Hello, *Ack, *Msg, *Batch,
// *Summary, *Degraded, *Resync, *Messages, *Pong, *Error, *Queue, *Granted,
// *Rejected.
type ServerFrame interface {
	// FrameType returns the frame's "type" value.
	FrameType() string
}

// Hello is the first frame after the upgrade.
type Hello struct {
	UID             string `json:"uid"`
	Node            string `json:"node"`
	HeartbeatS      int64  `json:"heartbeat_s"`
	MaxMessageBytes int64  `json:"max_message_bytes"`
}

// Ack confirms a committed send. TS is the commit time in Unix ms.
type Ack struct {
	ID  string `json:"id"`
	GID int64  `json:"gid"`
	Seq int64  `json:"seq"`
	TS  int64  `json:"ts"`
}

// Msg is one group message, the msg frame and the element of every message
// list. TS is the commit time in Unix ms; Body is raw JSON, encoded verbatim;
// Kind "" is encoded as KindText.
type Msg struct {
	GID  int64           `json:"gid"`
	Seq  int64           `json:"seq"`
	From string          `json:"from"`
	TS   int64           `json:"ts"`
	Kind string          `json:"kind"`
	Body json.RawMessage `json:"body"`
}

// Batch carries the messages of one merge window (degradation L1).
type Batch struct {
	GID      int64 `json:"gid"`
	Messages []Msg `json:"messages"`
}

// Summary replaces the messages of one merge window (degradation L2).
type Summary struct {
	GID     int64 `json:"gid"`
	Count   int64 `json:"count"`
	First   Msg   `json:"first"`
	LastSeq int64 `json:"last_seq"`
}

// Degraded announces a change of the effective degradation level seen by
// the client. GID 0 means node-wide (the gid field is absent).
type Degraded struct {
	GID   int64 `json:"gid,omitempty"`
	Level int   `json:"level"`
}

// Resync says pushes were dropped for this connection: the client pulls
// from its last seen seq.
type Resync struct {
	GID     int64 `json:"gid"`
	LastSeq int64 `json:"last_seq"`
}

// Messages answers a pull (docs/protocol.md §4.13). NextSeq (absent
// when 0) says the page stopped before the end of the requested range,
// at its message count or its byte budget: pull again from NextSeq.
type Messages struct {
	ID       string `json:"id"`
	GID      int64  `json:"gid"`
	Messages []Msg  `json:"messages"`
	LastSeq  int64  `json:"last_seq"`
	NextSeq  int64  `json:"next_seq,omitempty"`
}

// Pong answers a ping; ID "" means the ping had none.
type Pong struct {
	ID string `json:"id,omitempty"`
}

// Error answers a failed request. ID is the request's id ("" = none);
// RetryAfterMS 0 means absent.
type Error struct {
	ID           string `json:"id,omitempty"`
	Code         string `json:"code"`
	Message      string `json:"message"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

// Queue is a waiting user's place in a room. ETAS is nil when the queue is
// paused (no recent admissions), and the eta_s field is then absent.
type Queue struct {
	Room           string `json:"room"`
	Status         string `json:"status"`
	Position       int64  `json:"position"`
	Ahead          int64  `json:"ahead"`
	Total          int64  `json:"total"`
	ETAS           *int64 `json:"eta_s,omitempty"`
	VIPAheadNotice bool   `json:"vip_ahead_notice"`
	// Local (an addition, docs/protocol.md §6.2) says the room runs on this node's
	// local queue because Redis is unreachable: order holds only among the
	// users of this node.
	Local bool `json:"local,omitempty"`
	// StartsAt (Unix ms) and StartsInS (an addition, docs/protocol.md §6):
	// with status "scheduled" the user waits for the room's start in the
	// pre-queue; the frame then has no position, ahead nor eta_s.
	StartsAt  int64  `json:"starts_at,omitempty"`
	StartsInS *int64 `json:"starts_in_s,omitempty"`
}

// QueueScheduled is the status of a queue frame in a room's pre-queue.
const QueueScheduled = "scheduled"

// Granted admits the user to the room. ExpiresAt (Unix ms) is the access
// token's expiry.
type Granted struct {
	Room        string `json:"room"`
	AccessToken string `json:"access_token"`
	ExpiresAt   int64  `json:"expires_at"`
	// RedirectURL (an addition, docs/protocol.md §6.7) is where a room with
	// a site sends the granted user: the site's target_url, with the
	// access token in its query when the site's token_in is "query".
	RedirectURL string `json:"redirect_url,omitempty"`
}

// Rejected refuses entry to the room: Code is CodeRoomFull, CodeRoomClosed
// or CodeRateLimited.
type Rejected struct {
	Room         string `json:"room"`
	Code         string `json:"code"`
	RetryAfterMS int64  `json:"retry_after_ms"`
}

// FrameType returns "hello".
func (*Hello) FrameType() string { return TypeHello }

// FrameType returns "ack".
func (*Ack) FrameType() string { return TypeAck }

// FrameType returns "msg".
func (*Msg) FrameType() string { return TypeMsg }

// FrameType returns "batch".
func (*Batch) FrameType() string { return TypeBatch }

// FrameType returns "summary".
func (*Summary) FrameType() string { return TypeSummary }

// FrameType returns "degraded".
func (*Degraded) FrameType() string { return TypeDegraded }

// FrameType returns "resync".
func (*Resync) FrameType() string { return TypeResync }

// FrameType returns "messages".
func (*Messages) FrameType() string { return TypeMessages }

// FrameType returns "pong".
func (*Pong) FrameType() string { return TypePong }

// FrameType returns "error".
func (*Error) FrameType() string { return TypeError }

// FrameType returns "queue".
func (*Queue) FrameType() string { return TypeQueue }

// FrameType returns "granted".
func (*Granted) FrameType() string { return TypeGranted }

// FrameType returns "rejected".
func (*Rejected) FrameType() string { return TypeRejected }

// HTTP API bodies (docs/protocol.md §8, §9). Request bodies name what the
// client sends, responses what the server answers.

// ErrorResponse is the body of every HTTP error: {"error":{...}}.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is the inner object of ErrorResponse. RetryAfterMS 0 = absent.
type ErrorBody struct {
	Code         string `json:"code"`
	Message      string `json:"message"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

// SyncResponse answers GET /v1/sync: one page of the user's groups in
// gid order. NextAfter, present (non-zero) only when more groups remain,
// is the after_gid of the next page (the last gid of this one).
type SyncResponse struct {
	Groups    []SyncGroup `json:"groups"`
	NextAfter int64       `json:"next_after,omitempty"`
}

// SyncGroup is one group of a SyncResponse.
type SyncGroup struct {
	GID         int64 `json:"gid"`
	LastSeq     int64 `json:"last_seq"`
	LastReadSeq int64 `json:"last_read_seq"`
	Unread      int64 `json:"unread"`
}

// MessagesPage answers GET /v1/groups/{gid}/messages. NextSeq is the
// same addition as Messages.NextSeq.
type MessagesPage struct {
	GID      int64 `json:"gid"`
	Messages []Msg `json:"messages"`
	LastSeq  int64 `json:"last_seq"`
	NextSeq  int64 `json:"next_seq,omitempty"`
}

// SendRequest is the body of POST /v1/groups/{gid}/messages: the send
// frame without type and gid. Decode it with DecodeSendRequest.
type SendRequest struct {
	ID   string          `json:"id"`
	Body json.RawMessage `json:"body"`
	Kind string          `json:"kind,omitempty"`
}

// SendResponse answers POST /v1/groups/{gid}/messages.
type SendResponse struct {
	GID int64 `json:"gid"`
	Seq int64 `json:"seq"`
	TS  int64 `json:"ts"`
}

// CreateGroupRequest is the body of POST /v1/groups; GID 0 = assign one.
type CreateGroupRequest struct {
	GID   int64  `json:"gid,omitempty"`
	Name  string `json:"name"`
	Owner string `json:"owner"`
}

// Group describes one group (POST /v1/groups, PATCH /v1/groups/{gid}).
type Group struct {
	GID         int64  `json:"gid"`
	Name        string `json:"name"`
	Owner       string `json:"owner"`
	State       string `json:"state"`
	LastSeq     int64  `json:"last_seq"`
	MemberCount int64  `json:"member_count"`
}

// PatchGroupRequest is the body of PATCH /v1/groups/{gid}: State is one of
// GroupActive, GroupMutedAll, GroupDissolved.
type PatchGroupRequest struct {
	State string `json:"state"`
}

// AddMembersRequest is the body of POST /v1/groups/{gid}/members.
type AddMembersRequest struct {
	UIDs []string `json:"uids"`
}

// MembersResponse answers POST /v1/groups/{gid}/members with one entry per
// distinct uid (existing members as they were: the call is idempotent).
type MembersResponse struct {
	GID     int64    `json:"gid"`
	Members []Member `json:"members"`
}

// Member is one membership. JoinSeq is the first seq the member may see.
type Member struct {
	UID     string `json:"uid"`
	JoinSeq int64  `json:"join_seq"`
	Muted   bool   `json:"muted,omitempty"`
}

// SetUserRequest is the body of PUT /v1/users/{uid}. Level is required
// (0..3); nil means it was absent.
type SetUserRequest struct {
	Level *int `json:"level"`
}

// User answers PUT /v1/users/{uid}.
type User struct {
	UID   string `json:"uid"`
	Level int    `json:"level"`
}

// DegradeStatus answers GET /admin/v1/degrade.
type DegradeStatus struct {
	Node   DegradeState   `json:"node"`
	Groups []DegradeState `json:"groups"`
}

// DegradeState is one scope's degradation: Level is the effective level,
// Forced the operator's level (nil = none forced), Auto the controller's.
// GID 0 (absent) is the node scope; ExpiresAt (Unix ms, 0 = absent) is
// when the forced level lapses.
type DegradeState struct {
	GID       int64 `json:"gid,omitempty"`
	Level     int   `json:"level"`
	Forced    *int  `json:"forced"`
	Auto      int   `json:"auto"`
	ExpiresAt int64 `json:"expires_at,omitempty"`
}

// DegradeRequest is the body of PUT /admin/v1/degrade. Scope is ScopeNode
// or ScopeGroup (then GID is required), or (an addition) ScopeRooms, the
// waiting rooms' level 0-2; Level nil (null or absent) clears the forced
// level; TTLS 0 means no expiry.
type DegradeRequest struct {
	Scope string `json:"scope"`
	GID   int64  `json:"gid,omitempty"`
	Level *int   `json:"level"`
	TTLS  int64  `json:"ttl_s,omitempty"`
}

// HotGroupsResponse answers GET /admin/v1/hot-groups.
type HotGroupsResponse struct {
	Groups []HotGroup `json:"groups"`
}

// HotGroup is one hot group: Rate and Baseline in messages per second on
// the node that answered, Since (Unix ms) when it became hot there (or,
// for a group only other nodes mark, at the earliest of them). Source
// (local, remote or cooling) and Nodes are additions
// (docs/protocol.md §9.7).
type HotGroup struct {
	GID      int64          `json:"gid"`
	Rate     float64        `json:"rate"`
	Baseline float64        `json:"baseline"`
	Since    int64          `json:"since"`
	Source   string         `json:"source"`
	Nodes    []HotGroupNode `json:"nodes"`
}

// HotGroupNode is one node that marks a group hot: its own offered rate of
// the group and since when (Unix ms).
type HotGroupNode struct {
	Node  string  `json:"node"`
	Rate  float64 `json:"rate"`
	Since int64   `json:"since"`
}

// RoomConfig is the body of POST /admin/v1/rooms (create or update). In a
// request, zero fields keep the room's current value (the default on
// create). VIPBiasS maps a VIP level (1..3) to its head start in seconds;
// AdmitRate is admissions per second; VIPShareCap is a fraction (0..1].
type RoomConfig struct {
	Room        string          `json:"room"`
	MaxActive   int64           `json:"max_active"`
	AdmitRate   float64         `json:"admit_rate"`
	MaxWaitS    int64           `json:"max_wait_s"`
	GraceS      int64           `json:"grace_s"`
	VIPBiasS    map[int]float64 `json:"vip_bias_s,omitempty"`
	VIPShareCap float64         `json:"vip_share_cap"`
	TargetWaitS int64           `json:"target_wait_s"`
	State       string          `json:"state"`
	// Additions (docs/protocol.md §9.12): SmoothingS is the VIP smooth-insertion
	// time (negative = immediate), AccessTokenTTLS the admitted session's
	// lifetime, HardTimeoutS how long a disconnected entry is kept.
	SmoothingS      float64 `json:"smoothing_s,omitempty"`
	AccessTokenTTLS int64   `json:"access_token_ttl_s,omitempty"`
	HardTimeoutS    int64   `json:"hard_timeout_s,omitempty"`
	// VIPAdmitShare (an addition) is the room's level-weighted admission
	// quota: the most of the admissions VIPs get while normal users wait.
	// Absent keeps the current value; 0 follows the node's limits (rule
	// room_admit, 2/3 by default); negative turns it off; at most 1.
	VIPAdmitShare *float64 `json:"vip_admit_share,omitempty"`
	// StartsAt and EndsAt (additions, docs/protocol.md §9.12) schedule the
	// room, RFC 3339: absent keeps the current value, "" removes it.
	StartsAt *string `json:"starts_at,omitempty"`
	EndsAt   *string `json:"ends_at,omitempty"`
	// Site (an addition, docs/protocol.md §9.16) is the web site the room
	// stands in front of. Absent or null keeps the current one; {} removes it.
	Site *Site `json:"site,omitempty"`
}

// Site is a room's site object (docs/protocol.md §9.16): where granted
// users go and what the hosted queue page shows.
type Site struct {
	TargetURL   string                       `json:"target_url,omitempty"`
	TokenIn     string                       `json:"token_in,omitempty"`
	TokenName   string                       `json:"token_name,omitempty"`
	Anonymous   bool                         `json:"anonymous,omitempty"`
	Title       string                       `json:"title,omitempty"`
	Text        string                       `json:"text,omitempty"`
	LogoURL     string                       `json:"logo_url,omitempty"`
	Colors      *SiteColors                  `json:"colors,omitempty"`
	Strings     map[string]map[string]string `json:"strings,omitempty"`
	DefaultLang string                       `json:"default_lang,omitempty"`
}

// SiteColors are the queue page's CSS hex colours.
type SiteColors struct {
	Background string `json:"background,omitempty"`
	Text       string `json:"text,omitempty"`
	Accent     string `json:"accent,omitempty"`
}

// RoomSite answers GET /v1/rooms/{room}/site (docs/protocol.md §8.7): the
// room's site (public fields only) and its phase; StartsAt and EndsAt are
// Unix ms, absent when unset.
type RoomSite struct {
	Room     string `json:"room"`
	Site     Site   `json:"site"`
	State    string `json:"state"`
	Phase    string `json:"phase,omitempty"`
	StartsAt int64  `json:"starts_at,omitempty"`
	EndsAt   int64  `json:"ends_at,omitempty"`
}

// RoomPoll answers POST /v1/rooms/{room}/enter and GET
// /v1/rooms/{room}/status (docs/protocol.md §8.8): Frame is the room
// socket's frame for the user (queue, granted or rejected), PollAfterMS
// when to ask again; Ticket only on enter.
type RoomPoll struct {
	Ticket      string          `json:"ticket,omitempty"`
	PollAfterMS int64           `json:"poll_after_ms"`
	Frame       json.RawMessage `json:"frame"`
}

// RoomStatus answers GET /admin/v1/rooms/{room}: Depth users waiting,
// Active users admitted, AdmissionRate the observed admissions per second,
// LMax the queue bound from Little's Law, Level the room's degradation.
type RoomStatus struct {
	Room          string  `json:"room"`
	State         string  `json:"state"`
	Depth         int64   `json:"depth"`
	Active        int64   `json:"active"`
	MaxActive     int64   `json:"max_active"`
	AdmitRate     float64 `json:"admit_rate"`
	AdmissionRate float64 `json:"admission_rate"`
	LMax          int64   `json:"l_max"`
	Level         int     `json:"level"`
	// Additions (docs/protocol.md §9.13): users away within their grace period, VIPs
	// waiting, users past max_wait, whether the room runs on this node's
	// local queue (Redis unreachable), and the L_max alert (1 from 50%, 2
	// from 80%).
	Away       int64 `json:"away"`
	VIPWaiting int64 `json:"vip_waiting"`
	Overdue    int64 `json:"overdue"`
	Local      bool  `json:"local"`
	Alert      int   `json:"alert"`
	// WaitingByTier (an addition) counts the waiting users by tier,
	// index 0 normal and 1..3 the VIP tiers; it sums to Depth.
	WaitingByTier []int64 `json:"waiting_by_tier"`
	// Additions (docs/protocol.md §9.13): the phase (scheduled, open,
	// ended), the schedule (Unix ms, absent when unset), the pre-queue,
	// the admissions that broke the max-wait promise (must stay 0), and the
	// guarantee's ledger: users owed an admission against the capacity
	// promised within max_wait, and the smallest spare among them (absent
	// when nobody is owed).
	Phase             string `json:"phase"`
	StartsAt          int64  `json:"starts_at,omitempty"`
	EndsAt            int64  `json:"ends_at,omitempty"`
	PreQueue          int64  `json:"pre_queue"`
	MaxWaitViolations int64  `json:"max_wait_violations"`
	Owed              int64  `json:"owed"`
	Capacity          int64  `json:"capacity"`
	MinSlack          *int64 `json:"min_slack,omitempty"`
	// Additions (docs/protocol.md §9.13): AdmittedByTier counts, by tier
	// (index 0 normal, 1..3 VIP), the admissions the answering node made
	// in the room since the room appeared on it (node start or room
	// creation); other nodes' admissions are not in it. WaitByTier is, by
	// tier, the distribution of the waits the max-wait promise bounds of
	// that node's admissions in the last 5 minutes (at most the latest 512
	// per tier).
	AdmittedByTier []int64       `json:"admitted_by_tier"`
	WaitByTier     []WaitSummary `json:"wait_by_tier"`
}

// WaitSummary is a wait distribution in seconds: N waits, their
// nearest-rank percentiles and their maximum (all 0 when N is 0).
type WaitSummary struct {
	N    int     `json:"n"`
	P50S float64 `json:"p50_s"`
	P90S float64 `json:"p90_s"`
	P99S float64 `json:"p99_s"`
	MaxS float64 `json:"max_s"`
}
