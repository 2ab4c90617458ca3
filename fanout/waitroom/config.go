package waitroom

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"
)

// RoomState says whether a room accepts new entrants.
type RoomState string

// Room states. A closed room refuses new entrants (rejected room_closed) but
// keeps admitting the users already waiting, so it drains.
const (
	StateOpen   RoomState = "open"
	StateClosed RoomState = "closed"
)

// MaxTier is the highest VIP tier (docs/architecture.md §3: 0 normal, 1..3 VIP; the token's lvl).
const MaxTier = 3

// ScoreFactor is the 1.3 of the time-invariant key 1.3*join + bias(tier)
// (docs/architecture.md §11): the decaying score join + bias - 0.3*(now-join) orders users
// exactly like it, so that invariant key is what is stored.
const ScoreFactor = 1.3

// Defaults filled in by RoomConfig.WithDefaults.
const (
	DefaultMaxActive      = 100
	DefaultAdmitRate      = 10.0
	DefaultMaxWait        = 20 * time.Minute
	DefaultGrace          = 2 * time.Minute
	DefaultHardTimeout    = 30 * time.Minute
	DefaultDecayRate      = 1.0
	DefaultVIPShareCap    = 0.3
	DefaultSmoothing      = 15 * time.Second
	DefaultSafetyFactor   = 0.6
	DefaultShards         = 1
	DefaultAccessTokenTTL = 10 * time.Minute
	MaxShards             = 64
)

// DefaultVIPBias is the head start per VIP tier, in seconds of score
// (docs/architecture.md §11): VIP1 600 s, VIP2 1800 s, VIP3 3600 s. A VIP of tier L
// passes normal users who joined less than DefaultVIPBias[L]/1.3 s earlier.
var DefaultVIPBias = map[int]time.Duration{
	1: 600 * time.Second,
	2: 1800 * time.Second,
	3: 3600 * time.Second,
}

var roomNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// RoomConfig configures one waiting room. Its zero value (plus a Name) is a
// working room: WithDefaults fills every zero field. Rooms are created and
// updated at runtime through Manager.Upsert.
type RoomConfig struct {
	// Name identifies the room in URLs (/rooms/{room}/ws) and Redis keys:
	// 1-64 characters of [A-Za-z0-9_.-]. Required.
	Name string
	// State is open (default) or closed.
	State RoomState
	// Site is the web site the room stands in front of (site.go); nil =
	// none. An update replaces it whole.
	Site *Site `json:",omitempty"`
	// MaxActive is the number of users admitted at once. 0 means 100.
	MaxActive int
	// AdmitRate is the admissions per second the downstream can take.
	// 0 means 10.
	AdmitRate float64
	// AdmitBurst is the token-bucket capacity: at most AdmitBurst + AdmitRate*T
	// admissions happen in any interval of T seconds. 0 means
	// max(1, AdmitRate), i.e. one second's worth.
	AdmitBurst float64
	// MaxWait is the wait after which a user is admitted before everyone
	// else, oldest first. 0 means 20 min.
	MaxWait time.Duration
	// Grace is how long a disconnected waiting user keeps the position.
	// 0 means 2 min.
	Grace time.Duration
	// HardTimeout is how long a disconnected user's entry is kept at all;
	// past it the entry is removed. 0 means 30 min. Must be >= Grace.
	HardTimeout time.Duration
	// DecayRate is the position decay after Grace: every second away beyond
	// Grace moves the user's join time (and so both the score and the
	// max-wait clock) DecayRate seconds later. 0 means 1, i.e. time away past
	// the grace period does not count as waiting.
	DecayRate float64
	// VIPBias is the head start per VIP tier 1..3, in seconds of score
	// (bias(tier) = -VIPBias[tier]). nil means DefaultVIPBias; a level
	// missing from a non-nil map has no bias.
	VIPBias map[int]time.Duration
	// VIPShareCap is the share of the waiting queue VIPs may hold before new
	// VIPs get a proportionally reduced bias (bias * cap/share). 0 means 0.3.
	VIPShareCap float64
	// Smoothing is the time over which a new VIP's score moves, in steps,
	// from the normal score to its target (never past it). 0 means 15 s;
	// negative means immediate insertion.
	Smoothing time.Duration
	// TargetWait is the wait the room's capacity is sized for
	// (L_max = observed admission rate * TargetWait * SafetyFactor).
	// 0 means MaxWait.
	TargetWait time.Duration
	// SafetyFactor scales L_max (0.5-0.7 suits most rooms: docs/architecture.md §11). 0 means 0.6.
	SafetyFactor float64
	// Shards is K, the number of sorted sets the queue is split into by
	// hash of uid. 0 means 1. Fixed once the room exists.
	Shards int
	// AccessTokenTTL is the lifetime of an admitted session and of its
	// access token. 0 means 10 min.
	AccessTokenTTL time.Duration
	// VIPAdmitShare is the tier-weighted admission quota (docs/architecture.md §8).
	// Its contract: once the VIPs' share of the admissions (counted while
	// both classes wait) is used, the best-ranked normal user is admitted
	// instead of the best-ranked VIP only if that normal user was owed an
	// admission before every waiting VIP's max-wait promise (its entry seq
	// is below every waiting VIP's); otherwise the quota yields and the VIP
	// is admitted, so no VIP waits past MaxWait. So VIPs get at most this
	// share only against normal users who came before the VIPs still
	// waiting (a VIP surge against a long queue); while VIPs keep arriving,
	// a normal user who came after a waiting VIP queues behind it and the
	// quota does little (measured in a simulation, VIPs and normal users at
	// 2/s each, rate 2, max wait 2 min, share 2/3: mean normal wait 1m35s,
	// against 1m16s with a quota that ignored the promise and 1m56s with
	// the quota off). When no normal user waits, VIPs take every admission
	// (the quota lends an idle share). It never holds a normal user back
	// for a VIP: the score already ranks VIPs ahead by their bias, and a VIP
	// must not pass a normal user who joined more than bias/1.3 s earlier.
	// The counts cover the current contention: they start from zero
	// whenever a class has nobody waiting (no credit is earned for a share
	// lent out). Overdue users (max-wait) are admitted first and are not
	// counted. The quota admits a normal user in a VIP's place only if it
	// was owed an admission before every waiting VIP's max-wait promise was
	// made (doc.go, "Max-wait guarantee"); otherwise it yields to the VIP
	// and counts nothing.
	// 0 means the node's default (Manager Config.AdmitQuota: the limiter's
	// room_admit weights, VIPAdmitShare = VIP/(VIP+normal) = 2/3 by default); negative
	// turns the quota off; at most 1 (1 = no limit).
	VIPAdmitShare float64
	// StartsAt and EndsAt schedule the room (zero = none): before StartsAt
	// entrants wait in a pre-queue that the start orders by a uniformly
	// random shuffle; from EndsAt new entrants are refused room_closed
	// while the users already in stay and are served. Whole seconds.
	StartsAt, EndsAt time.Time
}

// Room phases (RoomConfig.PhaseAt).
const (
	PhaseScheduled = "scheduled"
	PhaseOpen      = "open"
	PhaseEnded     = "ended"
)

// StartS is StartsAt in Unix seconds, rounded up (0 = none).
func (c *RoomConfig) StartS() int64 { return ceilSec(c.StartsAt) }

// EndS is EndsAt in Unix seconds, rounded up (0 = none).
func (c *RoomConfig) EndS() int64 { return ceilSec(c.EndsAt) }

func ceilSec(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// PhaseAt is the room's phase at now (Unix seconds of the backend clock).
func (c *RoomConfig) PhaseAt(now int64) string {
	if e := c.EndS(); e > 0 && now >= e {
		return PhaseEnded
	}
	if s := c.StartS(); s > 0 && now < s {
		return PhaseScheduled
	}
	return PhaseOpen
}

// QuotaOn reports whether the tier-weighted admission quota applies.
func (c *RoomConfig) QuotaOn() bool { return c.VIPAdmitShare > 0 && c.VIPAdmitShare < 1 }

// WithDefaults returns a copy of c with every zero field set to its default.
// The VIPBias map is copied, never shared.
func (c RoomConfig) WithDefaults() RoomConfig {
	if c.State == "" {
		c.State = StateOpen
	}
	if c.MaxActive == 0 {
		c.MaxActive = DefaultMaxActive
	}
	if c.AdmitRate == 0 {
		c.AdmitRate = DefaultAdmitRate
	}
	if c.AdmitBurst == 0 {
		c.AdmitBurst = math.Max(1, c.AdmitRate)
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.HardTimeout == 0 {
		c.HardTimeout = max(DefaultHardTimeout, c.Grace)
	}
	if c.DecayRate == 0 {
		c.DecayRate = DefaultDecayRate
	}
	bias := make(map[int]time.Duration, MaxTier)
	src := c.VIPBias
	if src == nil {
		src = DefaultVIPBias
	}
	for k, v := range src {
		bias[k] = v
	}
	c.VIPBias = bias
	if c.VIPShareCap == 0 {
		c.VIPShareCap = DefaultVIPShareCap
	}
	if c.Smoothing == 0 {
		c.Smoothing = DefaultSmoothing
	}
	if c.TargetWait == 0 {
		c.TargetWait = c.MaxWait
	}
	if c.SafetyFactor == 0 {
		c.SafetyFactor = DefaultSafetyFactor
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.AccessTokenTTL == 0 {
		c.AccessTokenTTL = DefaultAccessTokenTTL
	}
	return c
}

// Validate reports every problem with c (after defaults) at once.
func (c RoomConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("waitroom: "+format, a...)) }
	if !roomNameRE.MatchString(c.Name) {
		bad("room name %q must be 1-64 characters of [A-Za-z0-9_.-]", c.Name)
	}
	if c.State != StateOpen && c.State != StateClosed {
		bad("state %q must be open or closed", c.State)
	}
	if err := c.Site.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MaxActive < 1 || c.MaxActive > 10_000_000 {
		bad("max_active %d out of range 1..10000000", c.MaxActive)
	}
	if !(c.AdmitRate > 0 && c.AdmitRate <= 1e6) {
		bad("admit_rate %v out of range (0, 1e6]", c.AdmitRate)
	}
	if !(c.AdmitBurst >= 1 && c.AdmitBurst <= 1e7) {
		bad("admit_burst %v out of range [1, 1e7]", c.AdmitBurst)
	}
	if c.MaxWait < time.Second || c.MaxWait > 7*24*time.Hour {
		bad("max_wait %v out of range 1s..168h", c.MaxWait)
	}
	if c.Grace < 0 || c.Grace > 24*time.Hour {
		bad("grace %v out of range 0..24h", c.Grace)
	}
	if c.HardTimeout < c.Grace || c.HardTimeout > 7*24*time.Hour {
		bad("hard_timeout %v must be between grace (%v) and 168h", c.HardTimeout, c.Grace)
	}
	if !(c.DecayRate > 0 && c.DecayRate <= 100) {
		bad("decay_rate %v out of range (0, 100]", c.DecayRate)
	}
	for lvl, b := range c.VIPBias {
		if lvl < 1 || lvl > MaxTier {
			bad("vip_bias tier %d out of range 1..%d", lvl, MaxTier)
		}
		if b < 0 || b > 7*24*time.Hour {
			bad("vip_bias for level %d %v out of range 0..168h", lvl, b)
		}
	}
	if !(c.VIPShareCap > 0 && c.VIPShareCap <= 1) {
		bad("vip_share_cap %v out of range (0, 1]", c.VIPShareCap)
	}
	if c.Smoothing > time.Hour {
		bad("smoothing %v longer than 1h", c.Smoothing)
	}
	if c.TargetWait < time.Second || c.TargetWait > 7*24*time.Hour {
		bad("target_wait %v out of range 1s..168h", c.TargetWait)
	}
	if !(c.SafetyFactor > 0 && c.SafetyFactor <= 1) {
		bad("safety_factor %v out of range (0, 1]", c.SafetyFactor)
	}
	if c.Shards < 1 || c.Shards > MaxShards {
		bad("shards %d out of range 1..%d", c.Shards, MaxShards)
	}
	if c.AccessTokenTTL < time.Second || c.AccessTokenTTL > 24*time.Hour {
		bad("access_token_ttl %v out of range 1s..24h", c.AccessTokenTTL)
	}
	if !c.StartsAt.IsZero() && !c.EndsAt.IsZero() && !c.EndsAt.After(c.StartsAt) {
		bad("ends_at %v must be after starts_at %v", c.EndsAt, c.StartsAt)
	}
	for _, t := range []time.Time{c.StartsAt, c.EndsAt} {
		if !t.IsZero() && (t.Year() < 2000 || t.Year() > 9999) {
			bad("schedule time %v out of range 2000..9999", t)
		}
	}
	if c.VIPAdmitShare > 1 || math.IsNaN(c.VIPAdmitShare) {
		bad("vip_admit_share %v above 1 (negative turns the quota off)", c.VIPAdmitShare)
	}
	return errors.Join(errs...)
}

// Bias is the stored-score bias of a level in seconds: 0 for normal users,
// -VIPBias[level] for VIPs, rounded to milliseconds.
func (c *RoomConfig) Bias(level int) float64 {
	if level < 1 || level > MaxTier {
		return 0
	}
	return -roundMilli(c.VIPBias[level].Seconds())
}

// ImmediateInsertion reports whether VIPs are placed at their target score
// at once rather than smoothed.
func (c *RoomConfig) ImmediateInsertion() bool { return c.Smoothing < 0 }

// roundMilli rounds to three decimals the same way the Lua scripts do
// (floor(x*1000+0.5)/1000), so both backends store identical doubles.
// The explicit float64 conversions forbid fused multiply-add, which would
// round differently from Lua.
func roundMilli(x float64) float64 { return math.Floor(float64(x*1000)+0.5) / 1000 }

// Score is the time-invariant key 1.3*join + bias for a join time in whole
// seconds, rounded like the Lua scripts round it.
func Score(join int64, bias float64) float64 {
	return roundMilli(float64(ScoreFactor*float64(join)) + bias)
}
