package limiter

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"
)

// Rule names of the dimensions of docs/architecture.md §8. Limits.Normalize adds a
// rule with its default for each of these that a Limits document leaves out.
const (
	// UserGroup limits one user's sends into one group: Key=uid, ID=gid.
	UserGroup = "user_group"
	// UserAll limits one user's sends over all groups: Key=uid.
	UserAll = "user_all"
	// Pull limits the pull API: a tier-weighted capacity shared by all users
	// (Key="", ID=0), User=uid for the per-user cap.
	Pull = "pull"
	// Connect limits admission of new connections under load: a
	// tier-weighted capacity per node (Key=node id), User=uid.
	Connect = "connect"
	// RoomAdmit splits every waiting room's admissions between VIP tiers
	// (docs/architecture.md §8, §11): the share of its VIP and normal weights
	// (Rule.VIPShare) is what VIPs get while normal users wait. It is not
	// checked through a Limiter: a room's capacity is its own admit_rate
	// and the counts cover the current contention, so Limit only turns the
	// split on (> 0) or off (0) and Window is not used.
	RoomAdmit = "room_admit"
	// RoomEnter limits one user's waiting-room socket opens: each enters
	// the room in its backend (a Redis script in cluster mode) and takes a
	// join worker, so a reconnect loop must not multiply them. Key=uid,
	// checked on the node, at the handshake.
	RoomEnter = "room_enter"
	// OnlineList limits one user's reads of a group's online members
	// (GET /v1/groups/{gid}/online): Key=uid.
	OnlineList = "online_list"

	// The client frames of the chat socket, limited per connection before
	// any work is queued for them (each counter: ID=connection id, Key
	// unused). They bound what one connection can make a node do, whatever
	// the frame type; the send and pull rules above still apply behind
	// them. Checked on the node only (in-process), never through Redis.
	FrameSend  = "frame_send"  // send frames
	FramePull  = "frame_pull"  // pull frames
	FrameRead  = "frame_read"  // read receipts (each one a store write)
	FramePing  = "frame_ping"  // application pings
	FrameOther = "frame_other" // frames that do not decode or have an unknown type
	// FrameUser limits one user's frames of one type over all its
	// connections on a node: Key=uid, ID=the frame type's number.
	FrameUser = "frame_user"
	// FrameDenied counts one connection's denied frames (ID=connection
	// id): a connection that keeps sending past its frame limits is
	// closed once this rule denies too.
	FrameDenied = "frame_denied"
)

// Algorithm selects how a rule counts.
type Algorithm string

// Algorithms.
const (
	// SlidingWindow admits at most Limit units in any interval of length
	// Window: an exact log of admitted units (not a two-bucket estimate), so
	// no burst at a window edge can exceed Limit. Memory per counter is
	// bounded by Limit.
	SlidingWindow Algorithm = "sliding_window"
	// GCRA is a token bucket (generic cell rate algorithm): Limit units per
	// Window on average, up to Burst at once. One timestamp per counter.
	GCRA Algorithm = "gcra"
)

// Limits of the sliding-window log: its memory per counter grows with Limit.
const (
	MaxSlidingLimit = 100_000
	MaxWindow       = 31 * 24 * time.Hour
	MinWindow       = time.Millisecond
)

// Class is a user class of tier-weighted rules.
type Class uint8

// Classes, from lowest to highest priority.
const (
	ClassLow    Class = iota // anonymous or flagged users: Check.Level < 0
	ClassNormal              // tier 0 up to VIPFromTier-1
	ClassVIP                 // tier >= VIPFromTier
	NumClasses  = 3
)

var classNames = [NumClasses]string{"low", "normal", "vip"}

// String returns "low", "normal" or "vip".
func (c Class) String() string {
	if int(c) < NumClasses {
		return classNames[c]
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

// Limits is the whole limits configuration: the document behind
// GET/PUT /admin/v1/limits. The zero value is valid and means the defaults.
type Limits struct {
	// VIPFromTier is the lowest VIP tier (token lvl) counted as VIP; 0 means 1 (JSON vip_from_level).
	// Levels below 0 are the low class, the rest normal.
	VIPFromTier int `json:"vip_from_level"`
	// Rules by name. A §8 dimension left out gets its default; a rule
	// present with limit 0 is disabled (always admits).
	Rules map[string]Rule `json:"rules"`
}

// Rule is one dimension's limit.
type Rule struct {
	Algorithm Algorithm `json:"algorithm"`
	// Limit is the number of units admitted per Window (the shared capacity
	// of a weighted rule); 0 disables the rule.
	Limit int64 `json:"limit"`
	// Window is the sliding window, or the period of a GCRA rate; 0 means 1s.
	Window Duration `json:"window"`
	// Burst is, for GCRA only, the most units admitted at once; 0 means Limit.
	Burst int64 `json:"burst,omitempty"`
	// Weighted, when set, shares Limit between user classes
	// (SlidingWindow only).
	Weighted *Weighted `json:"weighted,omitempty"`
	// FallbackShare is the fraction of this rule a node enforces on its own
	// while the shared backend is unreachable (see Failover); 0 means the
	// node's default share. 1 suits counters that live on one node anyway
	// (a user's connection, a node's handshakes).
	FallbackShare float64 `json:"fallback_share,omitempty"`
}

// Weighted splits a rule's capacity between the user classes (docs/architecture.md §8).
//
// Each class has a share (Limit x weight / sum of weights) and a reserve
// (ReservePct of its share). For every class, the capacity held for it is
//
//	held(c) = max(reserve(c), min(share(c), demand(c))) - used(c), at least 0
//
// where used(c) is what c was admitted in the last Window and demand(c) what
// it asked for (admitted or denied), decayed by exp(-age/Window). A request
// of class c is admitted when the user's per-user cap allows it, the total
// stays within Limit, and the capacity left covers held(c') of every other
// class c' (only their unused reserves while c is within its own reserve).
// Consequences:
//   - under contention every class gets its share: weighted fair;
//   - the share of an idle class is lent out (work-conserving), except its
//     reserve, which is always held: a class arriving cold gets its reserve at
//     once, and the rest of its share as its demand builds up (time constant
//     Window) and borrowed units expire: within a few Windows;
//   - a flood of one class never takes another class's reserve, and a class
//     within its reserve is always admitted (Limit - total never drops below
//     the sum of unused reserves);
//   - the per-user cap applies to VIPs too, so no single user takes a class.
//
// A class with reserve 0 (low, by default) can be starved by others that
// flood while using no more than their shares.
type Weighted struct {
	VIP    ClassQuota `json:"vip"`
	Normal ClassQuota `json:"normal"`
	Low    ClassQuota `json:"low"`
	// UserCap is the most units one user may use per Window, whatever the
	// class; 0 means no per-user cap.
	UserCap int64 `json:"user_cap"`
}

// ClassQuota is one class's part of a weighted rule.
type ClassQuota struct {
	Weight     int64 `json:"weight"`      // relative share
	ReservePct int64 `json:"reserve_pct"` // percent of the share no other class may borrow
}

// DefaultWeighted returns the default split: VIP 60, normal 30, low 10; half
// of the VIP and of the normal share is reserved; no per-user cap.
func DefaultWeighted() Weighted {
	return Weighted{
		VIP:    ClassQuota{Weight: 60, ReservePct: 50},
		Normal: ClassQuota{Weight: 30, ReservePct: 50},
		Low:    ClassQuota{Weight: 10, ReservePct: 0},
	}
}

func (w *Weighted) class(c Class) ClassQuota {
	switch c {
	case ClassVIP:
		return w.VIP
	case ClassNormal:
		return w.Normal
	default:
		return w.Low
	}
}

// Shares returns, per Class, its share of r's capacity:
// floor(Limit x weight / sum of weights). Zero for an unweighted rule.
func (r *Rule) Shares() [NumClasses]int64 {
	var out [NumClasses]int64
	w := r.Weighted
	if w == nil {
		return out
	}
	sum := w.VIP.Weight + w.Normal.Weight + w.Low.Weight
	if sum <= 0 {
		return out
	}
	for c := Class(0); c < NumClasses; c++ {
		out[c] = r.Limit * w.class(c).Weight / sum
	}
	return out
}

// Reserves returns, per Class, the units of r's capacity always held for
// that class: its share x ReservePct / 100. Zero for an unweighted rule.
func (r *Rule) Reserves() [NumClasses]int64 {
	out := r.Shares()
	w := r.Weighted
	if w == nil {
		return out
	}
	for c := Class(0); c < NumClasses; c++ {
		out[c] = out[c] * w.class(c).ReservePct / 100
	}
	return out
}

// VIPShare is the VIP class's part of r's VIP and normal weights: what the
// VIPs of a waiting room (which has no low class) get while normal users
// wait. 0 when r is disabled or not weighted.
func (r *Rule) VIPShare() float64 {
	w := r.Weighted
	if r.Limit <= 0 || w == nil || w.VIP.Weight+w.Normal.Weight <= 0 {
		return 0
	}
	return float64(w.VIP.Weight) / float64(w.VIP.Weight+w.Normal.Weight)
}

// ClassOf maps a user's VIP tier to its class.
func (l *Limits) ClassOf(tier int) Class {
	from := l.VIPFromTier
	if from <= 0 {
		from = 1
	}
	switch {
	case tier < 0:
		return ClassLow
	case tier >= from:
		return ClassVIP
	default:
		return ClassNormal
	}
}

// RetiredRules maps the rules a limits document may no longer name to
// where their setting lives now: the engine enforces those §8 dimensions
// from its tuning (fanfared's flags, GET/PUT /admin/v1/tuning), and a rule
// here was never consulted. Validate refuses a document naming one;
// DropRetired removes them from a document an older node stored.
var RetiredRules = map[string]string{
	"group":    "the large-group rate is fanfared -group-rate, -group-buffer and -hot-group-rate (tuning group_rate, group_buffer, hot_group_rate)",
	"downlink": "the member downlink is fanfared -downlink-rate and -downlink-fraction (tuning downlink_rate, downlink_fraction)",
	"at_all":   "the @all quota is fanfared -at-all-per-day (tuning at_all_per_day)",
	"egress":   "the node egress budget is fanfared -egress-bandwidth and -egress-fraction (tuning egress_bandwidth, egress_fraction)",
}

// DropRetired removes the RetiredRules from l.Rules in place and returns
// their names, sorted: a document stored by an older node carries them
// (with their old defaults), and it must still load.
func (l *Limits) DropRetired() []string {
	var dropped []string
	for _, name := range slices.Sorted(maps.Keys(RetiredRules)) {
		if _, ok := l.Rules[name]; ok {
			delete(l.Rules, name)
			dropped = append(dropped, name)
		}
	}
	return dropped
}

// DefaultRules returns the §8 dimensions the limiter enforces, with their
// defaults. Pull and connect capacities are starting points to size per
// deployment.
func DefaultRules() map[string]Rule {
	sec := Duration(time.Second)
	w := func(capPerUser int64) *Weighted {
		x := DefaultWeighted()
		x.UserCap = capPerUser
		return &x
	}
	return map[string]Rule{
		UserGroup: {Algorithm: GCRA, Limit: 5, Window: sec, Burst: 10, FallbackShare: 1},
		UserAll:   {Algorithm: SlidingWindow, Limit: 20, Window: sec, FallbackShare: 1},
		Pull:      {Algorithm: SlidingWindow, Limit: 2000, Window: sec, Weighted: w(10)},
		Connect:   {Algorithm: SlidingWindow, Limit: 1000, Window: sec, Weighted: w(5), FallbackShare: 1},
		RoomAdmit: {Algorithm: SlidingWindow, Limit: 1, Window: Duration(time.Minute), Weighted: w(0)},
		RoomEnter: {Algorithm: GCRA, Limit: 1, Window: sec, Burst: 5, FallbackShare: 1},
		// A client reads the list when it opens a group's member panel and
		// after a presence frame with more; the feed pushes the rest.
		OnlineList: {Algorithm: GCRA, Limit: 2, Window: sec, Burst: 10, FallbackShare: 1},
		// Frame limits: generous for any client a person drives (the
		// heartbeat is one ping per 30 s; sends are held to 20/s per user
		// by user_all anyway), tight against a flood.
		FrameSend:   {Algorithm: GCRA, Limit: 50, Window: sec, Burst: 100, FallbackShare: 1},
		FramePull:   {Algorithm: GCRA, Limit: 20, Window: sec, Burst: 100, FallbackShare: 1},
		FrameRead:   {Algorithm: GCRA, Limit: 50, Window: sec, Burst: 200, FallbackShare: 1},
		FramePing:   {Algorithm: GCRA, Limit: 2, Window: sec, Burst: 10, FallbackShare: 1},
		FrameOther:  {Algorithm: GCRA, Limit: 5, Window: sec, Burst: 20, FallbackShare: 1},
		FrameUser:   {Algorithm: GCRA, Limit: 200, Window: sec, Burst: 1000, FallbackShare: 1},
		FrameDenied: {Algorithm: GCRA, Limit: 10, Window: sec, Burst: 50, FallbackShare: 1},
	}
}

// Default returns the default limits, normalized.
func Default() Limits {
	return Limits{}.Normalize()
}

// Clone returns a deep copy of l.
func (l Limits) Clone() Limits {
	out := l
	out.Rules = make(map[string]Rule, len(l.Rules))
	for name, r := range l.Rules {
		if r.Weighted != nil {
			w := *r.Weighted
			r.Weighted = &w
		}
		out.Rules[name] = r
	}
	return out
}

// Normalize returns a deep copy of l with defaults filled in: missing §8
// rules, VIPFromLevel, each rule's algorithm (SlidingWindow), window (1s),
// GCRA burst (Limit) and a weighted rule's split when all its weights are 0.
func (l Limits) Normalize() Limits {
	out := l.Clone()
	if out.VIPFromTier <= 0 {
		out.VIPFromTier = 1
	}
	for name, r := range DefaultRules() {
		if _, ok := out.Rules[name]; !ok {
			out.Rules[name] = r
		}
	}
	for name, r := range out.Rules {
		if r.Algorithm == "" {
			r.Algorithm = SlidingWindow
		}
		if r.Window == 0 {
			r.Window = Duration(time.Second)
		}
		if r.Algorithm == GCRA && r.Burst == 0 {
			r.Burst = r.Limit
		}
		if w := r.Weighted; w != nil && w.VIP.Weight == 0 && w.Normal.Weight == 0 && w.Low.Weight == 0 {
			d := DefaultWeighted()
			d.UserCap = w.UserCap
			r.Weighted = &d
		}
		out.Rules[name] = r
	}
	return out
}

// Validate reports every problem of a normalized Limits, joined, each
// wrapping ErrInvalidLimits.
func (l Limits) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidLimits}, a...)...))
	}
	if l.VIPFromTier < 1 {
		bad("vip_from_level %d: must be at least 1", l.VIPFromTier)
	}
	for _, name := range slices.Sorted(maps.Keys(l.Rules)) {
		r := l.Rules[name]
		if where, ok := RetiredRules[name]; ok {
			bad("rule %q was removed: the limiter never enforced it; %s", name, where)
			continue
		}
		if !validName(name) {
			bad("rule name %q: use 1-64 of [a-z0-9_.-]", name)
		}
		if r.Limit < 0 {
			bad("rule %q: limit %d is negative", name, r.Limit)
		}
		if w := time.Duration(r.Window); w < MinWindow || w > MaxWindow {
			bad("rule %q: window %v outside [%v, %v]", name, w, MinWindow, MaxWindow)
		}
		if r.FallbackShare < 0 || r.FallbackShare > 1 || math.IsNaN(r.FallbackShare) {
			bad("rule %q: fallback_share %v outside [0, 1]", name, r.FallbackShare)
		}
		switch r.Algorithm {
		case SlidingWindow:
			if r.Limit > MaxSlidingLimit {
				bad("rule %q: sliding window limit %d above %d (use gcra)", name, r.Limit, MaxSlidingLimit)
			}
			if r.Burst != 0 {
				bad("rule %q: burst applies to gcra only", name)
			}
		case GCRA:
			if r.Limit > 0 && r.Burst < 1 {
				bad("rule %q: burst %d must be at least 1", name, r.Burst)
			}
			if r.Weighted != nil {
				bad("rule %q: weighted quotas need the sliding_window algorithm", name)
			}
		default:
			bad("rule %q: unknown algorithm %q", name, r.Algorithm)
		}
		if w := r.Weighted; w != nil {
			for c := Class(0); c < NumClasses; c++ {
				q := w.class(c)
				if q.Weight < 0 || q.Weight > 1_000_000 {
					bad("rule %q: %s weight %d outside [0, 1000000]", name, c, q.Weight)
				}
				if q.ReservePct < 0 || q.ReservePct > 100 {
					bad("rule %q: %s reserve_pct %d outside [0, 100]", name, c, q.ReservePct)
				}
			}
			if w.VIP.Weight+w.Normal.Weight+w.Low.Weight <= 0 {
				bad("rule %q: weights sum to zero", name)
			}
			if w.UserCap < 0 {
				bad("rule %q: user_cap %d is negative", name, w.UserCap)
			}
		}
	}
	return errors.Join(errs...)
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// Scaled returns a copy of l in which every rule enforces only a fraction of
// its limit: the rule's FallbackShare, or share when that is 0. Limits,
// bursts and per-user caps are rounded up and stay at least 1. This is what
// one node enforces alone while the shared backend is unreachable.
func (l Limits) Scaled(share float64) Limits {
	out := l.Clone()
	for name, r := range out.Rules {
		s := r.FallbackShare
		if s <= 0 {
			s = share
		}
		if s <= 0 || s >= 1 {
			continue
		}
		r.Limit = scale(r.Limit, s)
		r.Burst = scale(r.Burst, s)
		if r.Weighted != nil {
			r.Weighted.UserCap = scale(r.Weighted.UserCap, s)
		}
		out.Rules[name] = r
	}
	return out
}

func scale(v int64, s float64) int64 {
	if v <= 0 {
		return v
	}
	return max(1, int64(math.Ceil(float64(v)*s)))
}

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("1s", "24h"); it also reads a number as milliseconds.
type Duration time.Duration

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string or a number of milliseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var ms float64
		if err := json.Unmarshal(b, &ms); err != nil {
			return fmt.Errorf("limiter: duration must be a string like \"1s\" or milliseconds: %s", b)
		}
		*d = Duration(ms * float64(time.Millisecond))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("limiter: %w", err)
	}
	*d = Duration(v)
	return nil
}

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
