package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Limiter decides whether a request may proceed under the configured limits.
//
// Allow checks every dimension of one request together: either all of them
// admit it and each consumes its cost, or the request is denied and nothing
// is consumed in any dimension. A denial is a Decision, not an error; the
// error only means the limiter could not decide (backend unreachable, unknown
// rule, malformed checks).
//
// Callers on hot paths keep a []Check per connection or worker, refill it per
// request and pass it as Allow(ctx, checks...): that allocates nothing.
type Limiter interface {
	Allow(ctx context.Context, checks ...Check) (Decision, error)
	// Limits returns the limits in force (a deep copy).
	Limits() Limits
	// SetLimits validates l and swaps it in atomically; requests already
	// deciding finish under the old limits. State (windows, buckets) is kept
	// per rule name across reloads.
	SetLimits(l Limits) error
}

// Pinger is a Limiter whose shared backend can be probed for reachability;
// Failover uses Ping to decide when to switch back to it.
type Pinger interface {
	Limiter
	Ping(ctx context.Context) error
}

// MaxChecks bounds the number of checks in one Allow call.
const MaxChecks = 16

// Check is one dimension of a request: which rule, whose counter, how much.
//
// The counter is identified by (Rule, Key, ID): Key is the string subject
// (uid, room name, node id) and ID the numeric one (gid), so "user u in group
// g" is Key=u, ID=g without building a string per message. For a
// tier-weighted rule, (Key, ID) names the shared capacity (e.g. ID=0 for the
// whole cluster, Key=room) and User is whose per-user cap is charged.
type Check struct {
	Rule string // rule name, e.g. UserGroup
	Key  string // string subject; "" when unused
	ID   int64  // numeric subject (gid); 0 when unused
	User string // weighted rules: the uid charged against the per-user cap
	Tier int    // user VIP tier: <0 low, 0 normal, >= Limits.VIPFromTier VIP; selects the class of weighted rules and the metric label
	N    int64  // cost in the rule's units (messages, bytes); 0 means 1
}

// Reason says why a request was denied.
type Reason uint8

// Denial reasons.
const (
	ReasonNone    Reason = iota // allowed
	ReasonLimit                 // the rule's limit (or a weighted rule's capacity) is used up
	ReasonReserve               // a weighted rule: admitting would eat another class's reserve
	ReasonUserCap               // a weighted rule: the user's own cap is used up
	ReasonCost                  // the cost exceeds what the rule could ever admit at once
)

var reasonNames = [...]string{"none", "limit", "reserve", "user_cap", "cost"}

// String returns the snake_case name used in metrics and logs.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", r)
}

// Decision is the outcome of Allow. It is a small value type: no allocation.
type Decision struct {
	// Allowed reports whether every check admitted the request.
	Allowed bool
	// Reason is ReasonNone when allowed.
	Reason Reason
	// Index is the position in checks of the denying check; when allowed, of
	// the tightest check (least Remaining). -1 when there were no checks.
	Index int
	// Rule is checks[Index].Rule ("" when Index is -1).
	Rule string
	// RetryAfter is, when denied, how long until the same request could be
	// admitted if nothing else happened meanwhile: exact for ReasonLimit and
	// ReasonUserCap, a lower bound for ReasonReserve, the rule's window for
	// ReasonCost. Zero when allowed.
	RetryAfter time.Duration
	// Limit and Window describe the rule of checks[Index] (the capacity of a
	// weighted rule; the burst of a GCRA rule, whose Window is the time to
	// refill it). They feed RateLimit-Policy headers.
	Limit  int64
	Window time.Duration
	// Remaining is, when allowed, how many more units checks[Index] would
	// admit right now; 0 when denied.
	Remaining int64
}

// Errors. Wrapped errors carry details; test with errors.Is.
var (
	// ErrUnavailable means the shared backend (Redis) could not be reached or
	// answered with an error: the request was not decided.
	ErrUnavailable = errors.New("limiter: backend unavailable")
	// ErrUnknownRule means a Check names a rule that is not configured.
	ErrUnknownRule = errors.New("limiter: unknown rule")
	// ErrInvalidCheck means a Check is malformed (negative cost, duplicate
	// counter in one request, too many checks).
	ErrInvalidCheck = errors.New("limiter: invalid check")
	// ErrInvalidLimits means a Limits document failed validation.
	ErrInvalidLimits = errors.New("limiter: invalid limits")
)

// ValidateChecks reports malformed requests: more than MaxChecks checks, a
// negative cost, or two checks on the same counter (Rule, Key, ID): both
// would be judged against the state before the request and could over-admit
// together. Backends call it before deciding.
func ValidateChecks(checks []Check) error {
	if len(checks) > MaxChecks {
		return fmt.Errorf("%w: %d checks, at most %d", ErrInvalidCheck, len(checks), MaxChecks)
	}
	for i := range checks {
		c := &checks[i]
		if c.N < 0 {
			return fmt.Errorf("%w: rule %q: negative cost %d", ErrInvalidCheck, c.Rule, c.N)
		}
		for j := 0; j < i; j++ {
			d := &checks[j]
			if d.Rule == c.Rule && d.Key == c.Key && d.ID == c.ID {
				return fmt.Errorf("%w: rule %q key %q id %d checked twice", ErrInvalidCheck, c.Rule, c.Key, c.ID)
			}
		}
	}
	return nil
}

// Cost returns c.N, or 1 when it is 0.
func (c *Check) Cost() int64 {
	if c.N == 0 {
		return 1
	}
	return c.N
}
