package local

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/limiter"
)

// Config configures a Limiter. The zero value works (default limits, wall
// clock).
type Config struct {
	// Limits in force at start; the zero value means limiter.Default().
	Limits limiter.Limits
	// Now is the clock; nil means time.Now. Tests inject a fake one.
	Now func() time.Time
	// Shards is the number of lock shards, rounded up to a power of two;
	// 0 means 256.
	Shards int
	// SweepInterval is how often Run drops idle counters; 0 means 10s.
	SweepInterval time.Duration
	// Metrics records decisions; nil records nothing.
	Metrics *limiter.Metrics
	// Logger; nil discards.
	Logger *slog.Logger
}

// Validate reports configuration errors, joined.
func (c Config) Validate() error {
	var errs []error
	if c.Shards < 0 || c.Shards > 1<<16 {
		errs = append(errs, fmt.Errorf("local: shards %d outside [0, 65536]", c.Shards))
	}
	if c.SweepInterval < 0 {
		errs = append(errs, fmt.Errorf("local: negative sweep interval %v", c.SweepInterval))
	}
	if err := c.Limits.Normalize().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Limiter is the in-process limiter: the same semantics as the Redis one,
// for one node.
type Limiter struct {
	now     func() time.Time
	base    time.Time // all times are ns since base (monotonic when Now is time.Now)
	sweep   time.Duration
	metrics *limiter.Metrics
	log     *slog.Logger

	seed   maphash.Seed
	mask   uint64
	shards []shard
	table  atomic.Pointer[table]
	setMu  sync.Mutex        // serializes SetLimits
	ids    map[string]uint32 // rule name -> id, never reused; guarded by setMu
}

var _ limiter.Limiter = (*Limiter)(nil)

type shard struct {
	mu   sync.Mutex
	gcra map[ckey]*gcraState
	win  map[ckey]*window
	wq   map[ckey]*shared
	_    [64]byte // keep neighbouring shards' locks on separate cache lines
}

// ckey names a counter. rule (a stable id per rule name, see ruleIDs) is
// part of it so that rules never share state.
type ckey struct {
	rule uint32
	key  string
	id   int64
}

type gcraState struct{ tat int64 }

// shared is the state of one level-weighted capacity.
type shared struct {
	total  window
	class  [limiter.NumClasses]window
	users  map[string]*window
	demand demand
}

// demand estimates the units each class asked for (admitted or not)
// recently: a sum of requests decayed by exp(-age/window), which for a steady
// rate r approaches r x window, like a sliding count but without buckets (so
// two clocks with different origins agree). It only decides how much of a
// busy class's share stays held for it, never the hard guarantees
// (capacity, reserves, caps).
type demand struct {
	at int64 // ns of the last update
	d  [limiter.NumClasses]float64
}

func (d *demand) add(c limiter.Class, n, now, span int64) {
	if dt := now - d.at; dt > 0 {
		f := math.Exp(-float64(dt) / float64(span))
		for i := range d.d {
			d.d[i] *= f
		}
		d.at = now
	}
	d.d[c] += float64(n)
}

// table is one immutable compiled snapshot of the limits.
type table struct {
	limits limiter.Limits
	rules  map[string]*rule
}

type algo uint8

const (
	algSliding algo = iota + 1
	algGCRA
	algWeighted
)

type rule struct {
	id       uint32
	name     string
	alg      algo
	disabled bool
	limit    int64 // sliding, weighted: units per window; gcra: units per window (rate)
	window   int64 // ns
	burst    int64 // gcra
	burstOff int64 // gcra: burst x emission interval, ns
	userCap  int64
	reserves [limiter.NumClasses]int64
	shares   [limiter.NumClasses]int64
}

func compile(l limiter.Limits, ids map[string]uint32) (*table, error) {
	n := l.Normalize()
	if err := n.Validate(); err != nil {
		return nil, err
	}
	t := &table{limits: n, rules: make(map[string]*rule, len(n.Rules))}
	for name, r := range n.Rules {
		id, ok := ids[name]
		if !ok {
			id = uint32(len(ids) + 1)
			ids[name] = id
		}
		c := &rule{id: id, name: name, limit: r.Limit, window: int64(r.Window), disabled: r.Limit == 0}
		switch {
		case r.Algorithm == limiter.GCRA:
			c.alg = algGCRA
			c.burst = r.Burst
			if r.Limit > 0 {
				c.burstOff = mulDiv(r.Burst, c.window, r.Limit)
			}
		case r.Weighted != nil:
			c.alg = algWeighted
			c.userCap = r.Weighted.UserCap
			c.reserves = r.Reserves()
			c.shares = r.Shares()
		default:
			c.alg = algSliding
		}
		t.rules[name] = c
	}
	return t, nil
}

// New returns an in-process limiter.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := cfg.Shards
	if n == 0 {
		n = 256
	}
	size := 1
	for size < n {
		size <<= 1
	}
	l := &Limiter{
		now:     cfg.Now,
		sweep:   cfg.SweepInterval,
		metrics: cfg.Metrics,
		log:     cfg.Logger,
		seed:    maphash.MakeSeed(),
		mask:    uint64(size - 1),
		shards:  make([]shard, size),
		ids:     make(map[string]uint32),
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.sweep == 0 {
		l.sweep = 10 * time.Second
	}
	if l.log == nil {
		l.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	l.base = l.now()
	for i := range l.shards {
		s := &l.shards[i]
		s.gcra = make(map[ckey]*gcraState)
		s.win = make(map[ckey]*window)
		s.wq = make(map[ckey]*shared)
	}
	if err := l.SetLimits(cfg.Limits); err != nil {
		return nil, err
	}
	return l, nil
}

// Limits returns the limits in force.
func (l *Limiter) Limits() limiter.Limits { return l.table.Load().limits.Clone() }

// SetLimits swaps in new limits atomically.
func (l *Limiter) SetLimits(lim limiter.Limits) error {
	l.setMu.Lock()
	defer l.setMu.Unlock()
	t, err := compile(lim, l.ids)
	if err != nil {
		return err
	}
	l.table.Store(t)
	return nil
}

func (l *Limiter) nowNs() int64 { return int64(l.now().Sub(l.base)) }

func (l *Limiter) shardOf(rule uint32, c *limiter.Check) uint32 {
	h := maphash.String(l.seed, c.Key) ^ (uint64(c.ID)+uint64(rule)<<40)*0x9E3779B97F4A7C15
	h ^= h >> 29
	return uint32(h & l.mask)
}

// pending is what phase one of Allow found for one check and phase two
// commits.
type pending struct {
	r      *rule
	n      int64
	shard  uint32
	g      *gcraState
	newTat int64
	w      *window
	s      *shared
	u      *window
	cls    limiter.Class
}

// Allow decides all checks together under the locks of every shard they
// touch (taken in ascending shard order), so concurrent requests see each
// other's effects in full or not at all.
func (l *Limiter) Allow(ctx context.Context, checks ...limiter.Check) (limiter.Decision, error) {
	if err := limiter.ValidateChecks(checks); err != nil {
		return limiter.Decision{Index: -1}, err
	}
	t := l.table.Load()
	var (
		pbuf   [limiter.MaxChecks]pending
		sbuf   [limiter.MaxChecks]uint32
		nshard int
	)
	for i := range checks {
		c := &checks[i]
		r := t.rules[c.Rule]
		if r == nil {
			return limiter.Decision{Index: -1}, fmt.Errorf("%w: %q", limiter.ErrUnknownRule, c.Rule)
		}
		pbuf[i] = pending{r: r, n: c.Cost()}
		if r.disabled {
			continue
		}
		// Insert the shard into sbuf, kept sorted and unique.
		s := l.shardOf(r.id, c)
		pbuf[i].shard = s
		j := 0
		for j < nshard && sbuf[j] < s {
			j++
		}
		if j < nshard && sbuf[j] == s {
			continue
		}
		copy(sbuf[j+1:nshard+1], sbuf[j:nshard])
		sbuf[j] = s
		nshard++
	}
	for _, s := range sbuf[:nshard] {
		l.shards[s].mu.Lock()
	}
	now := l.nowNs()
	d := l.decideLocked(t, now, checks, pbuf[:len(checks)])
	for _, s := range sbuf[:nshard] {
		l.shards[s].mu.Unlock()
	}
	l.metrics.Observe(&t.limits, checks, d)
	return d, nil
}

func (l *Limiter) decideLocked(t *table, now int64, checks []limiter.Check, ps []pending) limiter.Decision {
	best := limiter.Decision{Allowed: true, Index: -1}
	bestRem := int64(-1)
	for i := range checks {
		c := &checks[i]
		p := &ps[i]
		r := p.r
		if r.disabled {
			continue
		}
		sh := &l.shards[p.shard]
		k := ckey{r.id, c.Key, c.ID}
		var (
			rem    int64
			reason limiter.Reason
			retry  int64
		)
		switch r.alg {
		case algSliding:
			w := sh.win[k]
			if w == nil {
				w = &window{}
				sh.win[k] = w
			}
			w.expire(now - r.window)
			p.w = w
			switch {
			case p.n > r.limit:
				reason, retry = limiter.ReasonCost, r.window
			case w.sum+p.n > r.limit:
				reason, retry = limiter.ReasonLimit, w.freeAfter(w.sum+p.n-r.limit, now, r.window)
			default:
				rem = r.limit - w.sum - p.n
			}
		case algGCRA:
			g := sh.gcra[k]
			if g == nil {
				g = &gcraState{}
				sh.gcra[k] = g
			}
			p.g = g
			tat := max(g.tat, now)
			newTat := tat + mulDiv(p.n, r.window, r.limit)
			allowAt := newTat - r.burstOff
			switch {
			case p.n > r.burst:
				reason, retry = limiter.ReasonCost, r.burstOff
			case allowAt > now:
				reason, retry = limiter.ReasonLimit, allowAt-now
			default:
				p.newTat = newTat
				rem = mulDiv(now-allowAt, r.limit, r.window)
			}
		case algWeighted:
			s := sh.wq[k]
			if s == nil {
				s = &shared{}
				sh.wq[k] = s
			}
			p.s = s
			p.cls = t.limits.ClassOf(c.Tier)
			rem, reason, retry = l.weightedLocked(r, s, p, c.User, now)
		}
		if reason != limiter.ReasonNone {
			return limiter.Decision{
				Reason:     reason,
				Index:      i,
				Rule:       c.Rule,
				RetryAfter: time.Duration(retry),
				Limit:      limitOf(r),
				Window:     windowOf(r),
			}
		}
		if bestRem < 0 || rem < bestRem {
			bestRem = rem
			best.Index, best.Rule, best.Remaining = i, c.Rule, rem
			best.Limit, best.Window = limitOf(r), windowOf(r)
		}
	}
	// Every check admits the request: commit all of them.
	for i := range ps {
		p := &ps[i]
		switch {
		case p.r.disabled:
		case p.w != nil:
			p.w.add(now, p.n)
		case p.g != nil:
			p.g.tat = p.newTat
		case p.s != nil:
			p.s.total.add(now, p.n)
			p.s.class[p.cls].add(now, p.n)
			if p.u != nil {
				p.u.add(now, p.n)
			}
		}
	}
	return best
}

// weightedLocked judges one check of a level-weighted rule (see
// limiter.Weighted): the user's cap, the capacity, then what is held for
// the other classes. The attempt counts as demand even when denied.
func (l *Limiter) weightedLocked(r *rule, s *shared, p *pending, user string, now int64) (rem int64, reason limiter.Reason, retry int64) {
	cut := now - r.window
	s.total.expire(cut)
	for c := range s.class {
		s.class[c].expire(cut)
	}
	s.demand.add(p.cls, p.n, now, r.window)
	capLeft := int64(-1)
	if r.userCap > 0 && user != "" {
		if s.users == nil {
			s.users = make(map[string]*window)
		}
		u := s.users[user]
		if u == nil {
			u = &window{}
			s.users[user] = u
		}
		u.expire(cut)
		p.u = u
		if p.n > r.userCap {
			return 0, limiter.ReasonCost, r.window
		}
		if u.sum+p.n > r.userCap {
			return 0, limiter.ReasonUserCap, u.freeAfter(u.sum+p.n-r.userCap, now, r.window)
		}
		capLeft = r.userCap - u.sum - p.n
	}
	if p.n > r.limit {
		return 0, limiter.ReasonCost, r.window
	}
	tot := s.total.sum
	if tot+p.n > r.limit {
		return 0, limiter.ReasonLimit, s.total.freeAfter(tot+p.n-r.limit, now, r.window)
	}
	// Within its own reserve a class only respects the other reserves; that
	// keeps C - total >= the sum of unused reserves at all times, so a
	// reserve is always available. Beyond it, the shares held for busy
	// classes count too.
	own := s.class[p.cls].sum+p.n <= r.reserves[p.cls]
	var hold int64
	for c := range s.class {
		if limiter.Class(c) == p.cls {
			continue
		}
		want := r.reserves[c]
		if !own {
			want = max(want, min(r.shares[c], int64(s.demand.d[c])))
		}
		hold += max(0, want-s.class[c].sum)
	}
	if tot+p.n+hold > r.limit {
		return 0, limiter.ReasonReserve, s.total.freeAfter(tot+p.n+hold-r.limit, now, r.window)
	}
	rem = r.limit - tot - p.n - hold
	if capLeft >= 0 && capLeft < rem {
		rem = capLeft
	}
	return rem, limiter.ReasonNone, 0
}

func limitOf(r *rule) int64 {
	if r.alg == algGCRA {
		return r.burst
	}
	return r.limit
}

func windowOf(r *rule) time.Duration {
	if r.alg == algGCRA {
		return time.Duration(r.burstOff)
	}
	return time.Duration(r.window)
}

// Run drops idle counters every SweepInterval until ctx ends, then returns
// nil. Without it, memory grows with the number of distinct counters ever
// used.
func (l *Limiter) Run(ctx context.Context) error {
	tk := time.NewTicker(l.sweep)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
			l.Sweep()
		}
	}
}

// Sweep drops every counter that holds nothing any more: empty windows,
// buckets that have refilled, and counters of rules no longer configured.
// It locks one shard at a time.
func (l *Limiter) Sweep() (dropped int) {
	t := l.table.Load()
	byID := make(map[uint32]*rule, len(t.rules))
	for _, r := range t.rules {
		byID[r.id] = r
	}
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		now := l.nowNs()
		for k, g := range s.gcra {
			r := byID[k.rule]
			if r == nil || r.alg != algGCRA || g.tat <= now {
				delete(s.gcra, k)
				dropped++
			}
		}
		for k, w := range s.win {
			r := byID[k.rule]
			if r != nil && r.alg == algSliding {
				w.expire(now - r.window)
			}
			if r == nil || r.alg != algSliding || w.sum == 0 {
				delete(s.win, k)
				dropped++
			}
		}
		for k, q := range s.wq {
			r := byID[k.rule]
			if r == nil || r.alg != algWeighted {
				delete(s.wq, k)
				dropped++
				continue
			}
			cut := now - r.window
			q.total.expire(cut)
			busy := q.total.sum > 0
			for c := range q.class {
				q.class[c].expire(cut)
			}
			for u, w := range q.users {
				w.expire(cut)
				if w.sum == 0 {
					delete(q.users, u)
				} else {
					busy = true
				}
			}
			if !busy {
				delete(s.wq, k)
				dropped++
			}
		}
		s.mu.Unlock()
	}
	return dropped
}

// Counters returns the number of counters held (for tests and metrics).
func (l *Limiter) Counters() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.gcra) + len(s.win) + len(s.wq)
		s.mu.Unlock()
	}
	return n
}
