package redislimit

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/limiter"
)

var (
	// prelude.lua is what allow.lua, batch.lua and lease.lua share: the
	// clock, and the helpers that add units and keep expiries.
	//go:embed prelude.lua
	preludeSrc string
	//go:embed allow.lua
	allowSrc string
	//go:embed refund.lua
	refundSrc string
	//go:embed batch.lua
	batchSrc string

	allowScript  = redis.NewScript(preludeSrc + allowSrc)
	refundScript = redis.NewScript(refundSrc)
	batchScript  = redis.NewScript(preludeSrc + batchSrc)
)

// Config configures a Limiter. Client is required; the rest has defaults.
type Config struct {
	// Client is the Redis connection: *redis.Client, *redis.ClusterClient or
	// a failover client. Give it short timeouts (e.g. DialTimeout 200ms,
	// ReadTimeout/WriteTimeout 100ms): a slow Redis delays every decision
	// until Failover takes over. Set MaxRetries to -1: a script retried after
	// a lost reply would be charged twice (under-admission, but needless).
	Client redis.UniversalClient
	// Prefix starts every key; "" means "fanfare:lim:". It must not contain
	// '{' or '}' (hash tags follow it).
	Prefix string
	// Cluster decides each hash-tag group of a request with its own script,
	// pipelined, and refunds the admitted groups when another denies (a
	// second round trip on that path only). Without it one script decides
	// the whole request. It is forced on for a *redis.ClusterClient.
	Cluster bool
	// Batch coalesces concurrent Allow calls into shared script calls
	// (batch.lua): a caller that finds fewer than MaxInflight batches in
	// flight sends its own request at once, with whatever is queued; callers
	// arriving meanwhile queue and go in the next batch. One script decides
	// the whole batch (on Redis Cluster, one per hash slot of the batch,
	// pipelined), each request exactly as if sent alone in queue order.
	// No timer: an idle limiter adds no latency.
	Batch bool
	// MaxBatch bounds the requests in one batch; 0 means 256, at most
	// MaxBatchLimit. A batch holds Redis for its whole script (about 25-30
	// µs per 4-check request here), so it also bounds how long other
	// commands on that Redis wait behind one.
	MaxBatch int
	// MaxInflight bounds the batches in flight at once; 0 means 2.
	MaxInflight int
	// LeaseTTL, when positive, lets this node decide the sliding-window
	// counters that are hot on it from leases: units taken from Redis in
	// one script call and spent locally until LeaseTTL has passed (doc.go,
	// "Leases"); 0 means no leases. At most MaxLeaseTTL.
	LeaseTTL time.Duration
	// LeaseMax bounds the units of one lease (a lease also never holds
	// more than its rule admits in one LeaseTTL); 0 means DefaultLeaseMax,
	// at most MaxLeaseUnits. It bounds what one node may hold unspent of
	// a counter, which other nodes cannot use meanwhile.
	LeaseMax int64
	// LeaseMinHits is how many units a counter must be asked for on this
	// node within one LeaseTTL (this period or the last) before it is
	// leased; 0 means DefaultLeaseMinHits. Colder counters go the exact
	// way: a lease taken and given back per request would cost more.
	LeaseMinHits int64
	// Limits in force at start; the zero value means limiter.Default().
	Limits limiter.Limits
	// Metrics records decisions; nil records nothing. Leave it nil when the
	// limiter is wrapped in a limiter.Failover that has them.
	Metrics *limiter.Metrics
	// Logger; nil discards.
	Logger *slog.Logger
}

// Validate reports configuration errors, joined.
func (c Config) Validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("redislimit: Client is required"))
	}
	for _, ch := range c.Prefix {
		if ch == '{' || ch == '}' {
			errs = append(errs, fmt.Errorf("redislimit: prefix %q must not contain braces", c.Prefix))
			break
		}
	}
	if c.MaxBatch < 0 || c.MaxBatch > MaxBatchLimit {
		errs = append(errs, fmt.Errorf("redislimit: MaxBatch %d outside 0..%d", c.MaxBatch, MaxBatchLimit))
	}
	if c.MaxInflight < 0 || c.MaxInflight > MaxInflightLimit {
		errs = append(errs, fmt.Errorf("redislimit: MaxInflight %d outside 0..%d", c.MaxInflight, MaxInflightLimit))
	}
	if c.LeaseTTL < 0 || c.LeaseTTL > MaxLeaseTTL || c.LeaseTTL > 0 && c.LeaseTTL < time.Millisecond {
		errs = append(errs, fmt.Errorf("redislimit: LeaseTTL %v outside 0 or 1ms..%v", c.LeaseTTL, MaxLeaseTTL))
	}
	if c.LeaseMax < 0 || c.LeaseMax > MaxLeaseUnits {
		errs = append(errs, fmt.Errorf("redislimit: LeaseMax %d outside 0..%d", c.LeaseMax, MaxLeaseUnits))
	}
	if c.LeaseMinHits < 0 || c.LeaseMinHits > MaxLeaseMinHits {
		errs = append(errs, fmt.Errorf("redislimit: LeaseMinHits %d outside 0..%d", c.LeaseMinHits, MaxLeaseMinHits))
	}
	if err := c.Limits.Normalize().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Bounds of Config.MaxBatch and Config.MaxInflight.
const (
	MaxBatchLimit    = 4096
	MaxInflightLimit = 64
)

// Limiter decides limits with Lua scripts on Redis; Redis TIME is its only
// clock, so any number of nodes share exact windows and buckets.
type Limiter struct {
	client  redis.UniversalClient
	prefix  string
	cluster bool
	metrics *limiter.Metrics
	log     *slog.Logger

	node  string        // random per instance: member prefixes stay unique across nodes
	seq   atomic.Uint64 // per-request member prefix counter
	table atomic.Pointer[table]
	setMu sync.Mutex

	batch  *batcher // nil unless Config.Batch
	leases *leases  // nil unless Config.LeaseTTL

	// clock, in tests only, replaces Redis TIME (microseconds since
	// scriptEpoch) so the conformance suite can drive time; nil in
	// production.
	clock func() int64
}

var _ limiter.Pinger = (*Limiter)(nil)

// New returns a Redis limiter. It does not contact Redis; scripts are loaded
// on first use (EVALSHA, falling back to EVAL).
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{
		client:  cfg.Client,
		prefix:  cfg.Prefix,
		cluster: cfg.Cluster,
		metrics: cfg.Metrics,
		log:     cfg.Logger,
	}
	if l.prefix == "" {
		l.prefix = "fanfare:lim:"
	}
	if _, ok := cfg.Client.(*redis.ClusterClient); ok {
		l.cluster = true
	}
	if l.log == nil {
		l.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var id [6]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	l.node = hex.EncodeToString(id[:])
	if cfg.Batch {
		l.batch = &batcher{l: l, max: cfg.MaxBatch, inflight: cfg.MaxInflight}
		if l.batch.max == 0 {
			l.batch.max = 256
		}
		if l.batch.inflight == 0 {
			l.batch.inflight = 2
		}
	}
	if cfg.LeaseTTL > 0 {
		l.leases = newLeases(l, cfg)
	}
	if err := l.SetLimits(cfg.Limits); err != nil {
		return nil, err
	}
	return l, nil
}

// Limits returns the limits in force.
func (l *Limiter) Limits() limiter.Limits { return l.table.Load().limits.Clone() }

// SetLimits swaps in new limits atomically. It only changes this instance:
// every node of a cluster must be given the same limits.
func (l *Limiter) SetLimits(lim limiter.Limits) error {
	t, err := compile(lim)
	if err != nil {
		return err
	}
	l.setMu.Lock()
	l.table.Store(t)
	l.setMu.Unlock()
	return nil
}

// Ping checks that Redis answers and that the scripts are loaded.
func (l *Limiter) Ping(ctx context.Context) error {
	if err := l.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	for _, s := range []*redis.Script{allowScript, refundScript, batchScript, leaseScript} {
		if err := s.Load(ctx, l.client).Err(); err != nil {
			return fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
		}
	}
	return nil
}

type algo int

const (
	algSliding algo = iota + 1
	algGCRA
	algWeighted
)

// table is one immutable compiled snapshot of the limits; argument values
// are boxed once here so that building a script call boxes almost nothing.
type table struct {
	limits limiter.Limits
	rules  map[string]*rule
}

type rule struct {
	alg      algo
	disabled bool
	userCap  int64
	limit    int64         // Decision.Limit
	window   time.Duration // Decision.Window
	args     [argWidth]any // per-check arguments; n and class filled per call
}

const argWidth = 12

// scriptEpoch is where the scripts' microsecond clock starts (Redis TIME
// minus this), so that doubles keep sub-microsecond precision.
const scriptEpoch = 1_700_000_000

var (
	zeroArg  any = "0"
	oneArg   any = "1"
	classArg     = [limiter.NumClasses]any{"0", "1", "2"}
)

func compile(lim limiter.Limits) (*table, error) {
	n := lim.Normalize()
	if err := n.Validate(); err != nil {
		return nil, err
	}
	t := &table{limits: n, rules: make(map[string]*rule, len(n.Rules))}
	for name, r := range n.Rules {
		c := &rule{disabled: r.Limit == 0, limit: r.Limit, window: r.Window.D()}
		for i := range c.args {
			c.args[i] = zeroArg
		}
		winUS := float64(r.Window.D()) / float64(time.Microsecond)
		switch {
		case r.Algorithm == limiter.GCRA:
			c.alg = algGCRA
			c.limit = r.Burst
			if r.Limit > 0 {
				c.window = time.Duration(mulDiv(r.Burst, int64(r.Window), r.Limit))
				c.args[3] = strconv.FormatFloat(winUS/float64(r.Limit), 'g', 17, 64)
			}
			c.args[2] = strconv.FormatInt(r.Burst, 10)
		case r.Weighted != nil:
			c.alg = algWeighted
			c.userCap = r.Weighted.UserCap
			c.args[2] = strconv.FormatInt(r.Limit, 10)
			c.args[3] = strconv.FormatFloat(winUS, 'g', 17, 64)
			c.args[5] = strconv.FormatInt(r.Weighted.UserCap, 10)
			res, shares := r.Reserves(), r.Shares()
			for k := range limiter.NumClasses {
				c.args[6+k] = strconv.FormatInt(res[k], 10)
				c.args[9+k] = strconv.FormatInt(shares[k], 10)
			}
		default:
			c.alg = algSliding
			c.args[2] = strconv.FormatInt(r.Limit, 10)
			c.args[3] = strconv.FormatFloat(winUS, 'g', 17, 64)
		}
		c.args[0] = strconv.Itoa(int(c.alg))
		t.rules[name] = c
	}
	return t, nil
}

// group is the part of a request sent as one script call: in cluster mode
// the checks sharing a hash tag, otherwise the whole request.
type group struct {
	tag  string
	idx  []int // positions in the caller's checks
	keys []string
	args []any
	cmd  *redis.Cmd
	err  error // batch mode: this group's reply was unreadable

	// batch mode: the checks in batch.lua's compact form (args is built
	// from them only for a refund)
	pc     []pcheck
	now    any
	member string

	allowed bool
	index   int // position in checks (denying, or tightest when allowed)
	reason  limiter.Reason
	retryUS int64
	rem     int64
}

// request is one Allow call being decided.
type request struct {
	checks []limiter.Check
	t      *table
	groups []*group
	err    error

	// batch mode, guarded by batcher.mu until done is signalled
	done   chan struct{} // buffered: the sender never blocks
	queued bool          // in batcher.queue
	lead   bool          // handed the next batch
}

// Allow decides the checks in one round trip (two in cluster mode when one
// hash-tag group denies and another must be refunded).
func (l *Limiter) Allow(ctx context.Context, checks ...limiter.Check) (limiter.Decision, error) {
	if err := limiter.ValidateChecks(checks); err != nil {
		return limiter.Decision{Index: -1}, err
	}
	t := l.table.Load()
	var (
		buf   [limiter.MaxChecks]hold
		holds []hold
		mask  uint32
	)
	if l.leases != nil {
		holds, mask = l.leases.reserve(ctx, t, checks, buf[:0])
		if mask == 1<<len(checks)-1 { // every check leased: nothing for Redis
			d := limiter.Decision{Allowed: true, Index: -1}
			leased(&d, t, checks, holds)
			l.metrics.Observe(&t.limits, checks, d)
			return d, nil
		}
	}
	req, err := l.buildSkip(t, checks, mask)
	if err != nil {
		l.leases.giveBack(holds)
		return limiter.Decision{Index: -1}, err
	}
	if len(req.groups) == 0 {
		d := limiter.Decision{Allowed: true, Index: -1}
		leased(&d, t, checks, holds)
		l.metrics.Observe(&t.limits, checks, d)
		return d, nil
	}
	if l.batch != nil {
		if err := l.batch.do(ctx, req); err != nil {
			l.leases.giveBack(holds)
			return limiter.Decision{Index: -1}, err
		}
	} else {
		l.exec(ctx, []*request{req})
	}
	if req.err != nil {
		l.leases.giveBack(holds)
		return limiter.Decision{Index: -1}, req.err
	}
	d := l.decision(req)
	if d.Allowed {
		leased(&d, t, checks, holds)
	} else {
		l.leases.giveBack(holds) // all or nothing: a denied request spends no leased unit
	}
	l.metrics.Observe(&t.limits, checks, d)
	return d, nil
}

// leased makes an admitting decision name the tightest check among the
// ones Redis decided and the leased ones, whose Remaining is what this
// node's lease has left (a lower bound of what the counter has left).
func leased(d *limiter.Decision, t *table, checks []limiter.Check, holds []hold) {
	for _, h := range holds {
		if d.Index >= 0 && (h.rem > d.Remaining || h.rem == d.Remaining && h.idx > d.Index) {
			continue
		}
		r := t.rules[checks[h.idx].Rule]
		d.Index, d.Rule, d.Limit, d.Window, d.Remaining = h.idx, checks[h.idx].Rule, r.limit, r.window, h.rem
	}
}

// build resolves rules, skips disabled ones and lays out keys and arguments.
func (l *Limiter) build(t *table, checks []limiter.Check) (*request, error) {
	return l.buildSkip(t, checks, 0)
}

// buildSkip is build leaving out, besides disabled rules, the checks in
// skip (bit i: checks[i], decided from a lease).
func (l *Limiter) buildSkip(t *table, checks []limiter.Check, skip uint32) (*request, error) {
	req := &request{checks: checks, t: t}
	member := l.memberPrefix()
	now := zeroArg
	if l.clock != nil {
		now = strconv.FormatInt(l.clock(), 10)
	}
	for i := range checks {
		c := &checks[i]
		r := t.rules[c.Rule]
		if r == nil {
			return nil, fmt.Errorf("%w: %q", limiter.ErrUnknownRule, c.Rule)
		}
		if r.disabled || skip&(1<<i) != 0 {
			continue
		}
		tag := l.tagOf(r, c)
		var g *group
		if !l.cluster && len(req.groups) > 0 {
			g = req.groups[0]
		} else {
			for _, x := range req.groups {
				if x.tag == tag {
					g = x
					break
				}
			}
		}
		if g == nil {
			g = &group{tag: tag}
			if l.batch == nil {
				g.args = make([]any, 3, 3+argWidth*2)
				g.args[0], g.args[1] = now, member
			}
			req.groups = append(req.groups, g)
		}
		g.idx = append(g.idx, i)
		g.keys = l.appendKeys(g.keys, r, c, tag)
		p := pcheck{r: r, n: oneArg, cls: zeroArg}
		if n := c.Cost(); n != 1 {
			p.n = strconv.FormatInt(n, 10)
		}
		if r.alg == algWeighted {
			p.cls = classArg[t.limits.ClassOf(c.Tier)]
			p.noUser = c.User == "" // no user, no per-user cap
		}
		if l.batch != nil {
			g.pc = append(g.pc, p)
		} else {
			g.args = p.appendArgs(g.args)
		}
	}
	for _, g := range req.groups {
		if l.batch != nil {
			g.now, g.member, g.args = now, member, nil
		} else {
			g.args[2] = strconv.Itoa(len(g.idx))
		}
	}
	return req, nil
}

// pcheck is one check of a group as the scripts see it: the rule's
// arguments plus cost, class and whether a per-user cap applies.
type pcheck struct {
	r      *rule
	n, cls any
	noUser bool
}

// appendArgs appends allow.lua's 12 values of the check.
func (p *pcheck) appendArgs(args []any) []any {
	a := p.r.args
	a[1] = p.n
	if p.r.alg == algWeighted {
		a[4] = p.cls
		if p.noUser {
			a[5] = zeroArg
		}
	}
	return append(args, a[:]...)
}

// scriptArgs returns allow.lua's (and refund.lua's) arguments of g, built
// from its compact form in batch mode.
func (g *group) scriptArgs() []any {
	if g.args == nil {
		g.args = make([]any, 3, 3+argWidth*len(g.pc))
		g.args[0], g.args[1], g.args[2] = g.now, g.member, strconv.Itoa(len(g.pc))
		for i := range g.pc {
			g.args = g.pc[i].appendArgs(g.args)
		}
	}
	return g.args
}

// memberPrefix returns a prefix unique to this request across all nodes:
// sliding-window members are <prefix>.<check>[.<unit>], so same-microsecond
// requests never overwrite each other.
func (l *Limiter) memberPrefix() string {
	var b [32]byte
	s := append(b[:0], l.node...)
	s = append(s, '-')
	s = strconv.AppendUint(s, l.seq.Add(1), 36)
	return string(s)
}

// tagOf returns the hash tag of a check's keys: the string subject (a
// user's dimensions share a slot), else the numeric one (a group's), and
// for weighted rules the shared capacity (with its per-user keys).
func (l *Limiter) tagOf(r *rule, c *limiter.Check) string {
	switch {
	case r.alg == algWeighted:
		return "w:" + c.Rule + ":" + c.Key + ":" + strconv.FormatInt(c.ID, 10)
	case c.Key != "":
		return "k:" + c.Key
	default:
		return "i:" + strconv.FormatInt(c.ID, 10)
	}
}

func (l *Limiter) appendKeys(keys []string, r *rule, c *limiter.Check, tag string) []string {
	base := l.prefix + "{" + tag + "}:"
	switch r.alg {
	case algSliding: // the algorithm is in the key: a rule switched to GCRA
		// must not meet its old sorted sets (WRONGTYPE) while they expire
		return append(keys, base+c.Rule+":s:"+strconv.FormatInt(c.ID, 10))
	case algGCRA:
		return append(keys, base+c.Rule+":g:"+strconv.FormatInt(c.ID, 10))
	}
	return append(keys, base+"t", base+"c0", base+"c1", base+"c2", base+"u:"+c.User, base+"d")
}

// exec runs the script calls of reqs in one pipeline, then refunds, in a
// second pipeline, the admitted groups of requests that another group
// denied. It sets each request's groups or err.
func (l *Limiter) exec(ctx context.Context, reqs []*request) {
	if len(reqs) == 1 && len(reqs[0].groups) == 1 {
		g := reqs[0].groups[0]
		g.cmd = allowScript.Run(ctx, l.client, g.keys, g.args...)
		reqs[0].err = l.parse(reqs[0], g)
		return
	}
	if err := l.pipeline(ctx, allowScript, reqs, func(*group) bool { return true }); err != nil {
		for _, r := range reqs {
			r.err = err
		}
		return
	}
	for _, r := range reqs {
		for _, g := range r.groups {
			if err := l.parse(r, g); err != nil {
				r.err = err
				break
			}
		}
	}
	l.refund(ctx, reqs)
}

// refund undoes, in one pipeline, the admitted groups of requests that
// another of their groups denied (cluster mode: groups are decided apart).
func (l *Limiter) refund(ctx context.Context, reqs []*request) {
	var refund []*request
	for _, r := range reqs {
		if r.err != nil || len(r.groups) < 2 {
			continue
		}
		denied, admitted := false, false
		for _, g := range r.groups {
			if g.allowed {
				admitted = true
			} else {
				denied = true
			}
		}
		if denied && admitted {
			refund = append(refund, r)
		}
	}
	if len(refund) == 0 {
		return
	}
	err := l.pipeline(ctx, refundScript, refund, func(g *group) bool { return g.allowed })
	if err != nil {
		// The request is denied either way; units left behind expire with
		// their window. Under-admission, never over-admission.
		l.log.Warn("redislimit: refund failed", "err", err, "requests", len(refund))
	}
}

// pipeline runs script over the selected groups of reqs in one pipeline
// (EVALSHA); calls that found the script missing did not run and are sent
// again with EVAL, which also loads it. Any other error fails the batch:
// groups that did run keep their units until their window ends
// (under-admission, never over-admission).
func (l *Limiter) pipeline(ctx context.Context, script *redis.Script, reqs []*request, sel func(*group) bool) error {
	pipe := l.client.Pipeline()
	for _, r := range reqs {
		for _, g := range r.groups {
			if sel(g) {
				g.cmd = script.EvalSha(ctx, pipe, g.keys, g.scriptArgs()...)
			}
		}
	}
	_, err := pipe.Exec(ctx)
	if err == nil {
		return nil
	}
	var retry []*group
	for _, r := range reqs {
		for _, g := range r.groups {
			if !sel(g) {
				continue
			}
			switch e := g.cmd.Err(); {
			case e == nil:
			case redis.HasErrorPrefix(e, "NOSCRIPT"):
				retry = append(retry, g)
			default:
				return fmt.Errorf("%w: %w", limiter.ErrUnavailable, e)
			}
		}
	}
	if len(retry) == 0 {
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	pipe = l.client.Pipeline()
	for _, g := range retry {
		g.cmd = script.Eval(ctx, pipe, g.keys, g.scriptArgs()...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	return nil
}

// parse reads one group's script reply into it.
func (l *Limiter) parse(r *request, g *group) error {
	vals, err := g.cmd.Int64Slice()
	if err != nil {
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	return parseVals(g, vals)
}

// parseVals reads one group's five reply values into it.
func parseVals(g *group, vals []int64) error {
	if len(vals) != 5 || vals[1] < 1 || int(vals[1]) > len(g.idx) {
		return fmt.Errorf("%w: unexpected script reply %v", limiter.ErrUnavailable, vals)
	}
	g.allowed = vals[0] == 1
	g.index = g.idx[vals[1]-1]
	g.reason = limiter.Reason(vals[2])
	g.retryUS = vals[3]
	g.rem = vals[4]
	return nil
}

// decision merges the groups' answers: the first denying check in check
// order, or the tightest check when all admitted.
func (l *Limiter) decision(req *request) limiter.Decision {
	var deny, best *group
	for _, g := range req.groups {
		switch {
		case !g.allowed:
			if deny == nil || g.index < deny.index {
				deny = g
			}
		case best == nil || g.rem < best.rem || g.rem == best.rem && g.index < best.index:
			best = g
		}
	}
	if deny != nil {
		c := &req.checks[deny.index]
		r := req.t.rules[c.Rule]
		return limiter.Decision{
			Reason:     deny.reason,
			Index:      deny.index,
			Rule:       c.Rule,
			RetryAfter: time.Duration(deny.retryUS) * time.Microsecond,
			Limit:      r.limit,
			Window:     r.window,
		}
	}
	c := &req.checks[best.index]
	r := req.t.rules[c.Rule]
	return limiter.Decision{
		Allowed:   true,
		Index:     best.index,
		Rule:      c.Rule,
		Limit:     r.limit,
		Window:    r.window,
		Remaining: best.rem,
	}
}

// mulDiv returns a*b/c for non-negative a, b and positive c without
// overflowing in the product; the result saturates at MaxInt64.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}
