package redislimit

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/limiter"
)

var (
	//go:embed lease.lua
	leaseSrc    string
	leaseScript = redis.NewScript(preludeSrc + leaseSrc)
)

// Lease settings: defaults and bounds (Config.LeaseTTL, LeaseMax,
// LeaseMinHits).
const (
	DefaultLeaseTTL     = 100 * time.Millisecond
	DefaultLeaseMax     = 1024
	DefaultLeaseMinHits = 16
	MaxLeaseTTL         = 10 * time.Second
	MaxLeaseUnits       = 10_000
	MaxLeaseMinHits     = 1_000_000
	// maxLeaseKeys bounds the counters one node tracks for leasing: a
	// client naming ever new counters fills it, and the rest go the
	// exact way (batched script calls) until the sweep frees entries.
	maxLeaseKeys = 1 << 16
)

// leases is a node's table of sliding-window counters it decides locally
// from leases (see doc.go, "Leases"). One mutex guards the table and every
// entry; a renewal's script call runs outside it.
type leases struct {
	l       *Limiter
	ttl     time.Duration
	ttlArg  any // ttl in µs, boxed once
	max     int64
	minHits int64
	// mono is the node's monotonic clock; tests put the manual clock here,
	// the one Limiter.clock gives the scripts.
	mono func() time.Duration

	mu   sync.Mutex
	m    map[counter]*lease
	seed maphash.Seed
	// heat counts, per hash of a counter, the units asked for in the
	// current period (epoch: its number): a counter enters m only once
	// its slot reaches minHits, so cold counters cost a hash and no map
	// entry or key string.
	heat    [heatSlots]uint32
	epoch   [heatSlots]uint32
	entries [heatSlots]uint32 // entries of m whose counter hashes here

	// checks of hot counters decided from a lease, and not (exact way)
	covered, missed atomic.Int64
}

// LeaseStats reports how many checks of counters hot on this node were
// covered by a lease (units reserved from it: a request that another check
// then denies, or that fails, gives them back but is counted here), and
// how many went the exact way (callers a renewal did not cover, a full
// window, a failed renewal). Zero without leases.
func (l *Limiter) LeaseStats() (covered, missed int64) {
	if l.leases == nil {
		return 0, 0
	}
	return l.leases.covered.Load(), l.leases.missed.Load()
}

const heatSlots = 4096

// counter names a sliding-window counter as its check does: the table's
// key, so that looking a hot counter up builds no string.
type counter struct {
	rule, key string
	id        int64
}

// lease is one counter's entry: the lease this node holds of it (if any)
// and the demand it saw, per period of one lease TTL.
type lease struct {
	key      string
	slot     uint64 // its heat slot
	r        *rule  // the rule the lease was taken under: a reload makes it stale
	id       string
	size     int64         // units of the lease
	left     int64         // of which not spent
	deadline time.Duration // mono time from which none may be spent
	gen      uint64        // changes when the lease is given back or replaced

	period           time.Duration // start of the current demand period
	hits, prevHits   int64         // units asked, this period and the last
	spent, prevSpent int64         // units admitted from leases, idem
	noRenew          time.Duration // the window was full: no renewal before this
	renewing         chan struct{} // closed when the renewal in flight ends
	waitUnits        int64         // units of the callers waiting for it
}

// hold is units of a request reserved from a lease: kept if the request is
// admitted, given back if not.
type hold struct {
	e   *lease
	gen uint64
	n   int64
	idx int   // the check's position
	rem int64 // units the lease had left after it
}

func newLeases(l *Limiter, cfg Config) *leases {
	ls := &leases{
		l: l, ttl: cfg.LeaseTTL, max: cfg.LeaseMax, minHits: cfg.LeaseMinHits,
		m: make(map[counter]*lease), seed: maphash.MakeSeed(),
	}
	if ls.max == 0 {
		ls.max = DefaultLeaseMax
	}
	if ls.minHits == 0 {
		ls.minHits = DefaultLeaseMinHits
	}
	ls.ttlArg = strconv.FormatInt(ls.ttl.Microseconds(), 10)
	born := time.Now()
	ls.mono = func() time.Duration { return time.Since(born) }
	return ls
}

// capOf is the most units one lease of r may hold: what r admits in one
// lease TTL (Limit x TTL / Window), at most Config.LeaseMax. A rule whose
// cap is below 2 is not leased: a lease would hold its whole rate.
func (ls *leases) capOf(r *rule) int64 {
	if r.alg != algSliding || r.disabled {
		return 0
	}
	return min(ls.max, mulDiv(r.limit, int64(ls.ttl), int64(r.window)))
}

// warmLocked counts c's units in its heat slot and reports whether the
// counter may be hot: its slot reached minHits this period, or it has an
// entry already.
func (ls *leases) warmLocked(c *limiter.Check, now time.Duration) (bool, uint64) {
	var h maphash.Hash
	h.SetSeed(ls.seed)
	h.WriteString(c.Rule)
	h.WriteByte(0)
	h.WriteString(c.Key)
	var id [8]byte
	binary.LittleEndian.PutUint64(id[:], uint64(c.ID))
	h.Write(id[:])
	i := h.Sum64() % heatSlots
	ep := uint32(now/ls.ttl) + 1
	if ls.epoch[i] != ep {
		ls.epoch[i], ls.heat[i] = ep, 0
	}
	ls.heat[i] += uint32(min(c.Cost(), 1<<20))
	return int64(ls.heat[i]) >= ls.minHits || ls.entries[i] > 0, i
}

// roll starts a new demand period when the current one is a TTL old.
func (e *lease) roll(now, ttl time.Duration) {
	switch d := now - e.period; {
	case d < ttl:
		return
	case d < 2*ttl:
		e.prevHits, e.prevSpent = e.hits, e.spent
	default:
		e.prevHits, e.prevSpent = 0, 0
	}
	e.hits, e.spent, e.period = 0, 0, now
}

// takeLocked reserves n units of the lease when it is current (same rule,
// before its deadline) and holds them.
func (e *lease) takeLocked(r *rule, n int64, now time.Duration) bool {
	if e.r != r || e.left < n || now >= e.deadline {
		return false
	}
	e.left -= n
	e.spent += n
	return true
}

type renewal struct {
	e       *lease
	r       *rule
	want    int64
	id      string
	oldID   string
	oldSize int64
	oldLeft int64
	done    chan struct{}
	c       call
}

type pending struct {
	i     int
	e     *lease
	r     *rule
	n     int64
	limit int64
	done  chan struct{} // the renewal it waits for; nil when none
}

// leaseRounds bounds how often one check waits for a renewal (its own or
// another caller's) before it goes the exact way: under a burst the units
// of one renewal go to the callers that waited first, and the others
// renew again, each renewal sized by the callers still waiting.
const leaseRounds = 4

// reserve covers what it can of checks from leases: it returns the holds
// appended to holds and the mask of the checks they cover. A check whose
// counter is hot on this node and whose lease is spent or expired renews
// it (one script call, pipelined with the request's other renewals); a
// check whose lease another caller is renewing waits for that renewal.
// Whatever is not covered is decided the exact way.
func (ls *leases) reserve(ctx context.Context, t *table, checks []limiter.Check, holds []hold) ([]hold, uint32) {
	var (
		mask uint32
		buf  [limiter.MaxChecks]pending
		ps   = buf[:0]
	)
	ls.mu.Lock()
	now := ls.mono()
	for i := range checks {
		c := &checks[i]
		r := t.rules[c.Rule]
		if r == nil {
			continue
		}
		limit := ls.capOf(r)
		if limit < 2 {
			continue
		}
		warm, slot := ls.warmLocked(c, now)
		if !warm {
			continue
		}
		id := counter{c.Rule, c.Key, c.ID}
		e := ls.m[id]
		if e == nil {
			if len(ls.m) >= maxLeaseKeys {
				continue
			}
			// its units so far this period are those of its slot
			e = &lease{key: ls.l.slidingKey(c), period: now, slot: slot, hits: int64(ls.heat[slot]) - c.Cost()}
			ls.m[id] = e
			ls.entries[slot]++
		}
		e.roll(now, ls.ttl)
		n := c.Cost()
		e.hits += n
		ps = append(ps, pending{i: i, e: e, r: r, n: n, limit: limit})
	}
	hot := len(ps)
	defer func() {
		got := bits.OnesCount32(mask)
		ls.covered.Add(int64(got))
		ls.missed.Add(int64(hot - got))
	}()
	for round := 0; len(ps) > 0; round++ {
		// Under ls.mu: take what the leases cover; for the rest wait for a
		// renewal in flight or start one, or give up (exact way).
		var renew []*renewal
		now = ls.mono()
		k := 0
		for _, p := range ps {
			e := p.e
			if p.done != nil {
				e.waitUnits -= p.n
				p.done = nil
			}
			if e.takeLocked(p.r, p.n, now) {
				holds = append(holds, hold{e: e, gen: e.gen, n: p.n, idx: p.i, rem: e.left})
				mask |= 1 << p.i
				continue
			}
			if round == leaseRounds {
				continue
			}
			if e.renewing == nil {
				if e.hits+e.prevHits < ls.minHits || now < e.noRenew || p.n > p.limit {
					continue
				}
				// Size by what this node admitted (and the callers
				// waiting), not by what it was asked: denied requests
				// (a flood) do not grow the lease.
				want := min(p.limit, max(2*max(e.spent, e.prevSpent), ls.minHits, p.n+e.waitUnits))
				rn := &renewal{e: e, r: p.r, want: want, id: ls.l.memberPrefix(), oldID: e.id, oldSize: e.size, oldLeft: e.left}
				e.gen++
				e.id, e.size, e.left = "", 0, 0
				e.renewing = make(chan struct{})
				rn.done = e.renewing
				renew = append(renew, rn)
			}
			p.done = e.renewing
			e.waitUnits += p.n
			ps[k] = p
			k++
		}
		ps = ps[:k]
		ls.mu.Unlock()
		if len(renew) > 0 {
			ls.renew(ctx, renew)
		}
		for _, p := range ps {
			select {
			case <-p.done:
			case <-ctx.Done():
				ls.mu.Lock()
				for _, p := range ps {
					p.e.waitUnits -= p.n
				}
				ls.mu.Unlock()
				return holds, mask // the rest goes the exact way, and fails there
			}
		}
		ls.mu.Lock()
	}
	ls.mu.Unlock()
	return holds, mask
}

// renew gives back the old leases of rs and takes new ones, one script
// call each, pipelined. It runs without the caller's cancellation, as a
// batch does (the client's timeouts bound it): others wait for it.
func (ls *leases) renew(ctx context.Context, rs []*renewal) {
	ctx = context.WithoutCancel(ctx)
	now := zeroArg
	if ls.l.clock != nil {
		now = strconv.FormatInt(ls.l.clock(), 10)
	}
	start := ls.mono()
	calls := make([]*call, len(rs))
	for i, rn := range rs {
		rn.c = call{script: leaseScript, keys: []string{rn.e.key}, args: []any{
			now, rn.r.args[2], rn.r.args[3], ls.ttlArg, rn.id, strconv.FormatInt(rn.want, 10),
			rn.oldID, strconv.FormatInt(rn.oldSize, 10), strconv.FormatInt(rn.oldLeft, 10),
		}}
		calls[i] = &rn.c
	}
	err := ls.l.runCalls(ctx, calls)
	if err != nil {
		ls.l.log.Warn("redislimit: lease renewal failed", "err", err, "counters", len(rs))
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, rn := range rs {
		e := rn.e
		var grant int64
		vals, cerr := rn.c.cmd.Int64Slice()
		switch {
		case err != nil || cerr != nil || len(vals) != 2:
			// The old lease's unspent units may or may not be back: they
			// leave the window with its other units (under-admission).
			e.noRenew = start + ls.ttl
		default:
			grant = vals[0]
			if grant < rn.want {
				// The window is (nearly) full: the exact path decides and
				// denies with an honest RetryAfter until it empties.
				e.noRenew = start + ls.ttl/4
			}
		}
		if grant > 0 {
			e.id, e.size, e.left, e.r = rn.id, grant, grant, rn.r
			// start was read before the call: Redis stamped the units at
			// its now + ttl, later than start + ttl.
			e.deadline = start + ls.ttl
		}
		e.renewing = nil
		close(rn.done)
	}
}

// giveBack returns the units of a request that was denied or not decided
// to their leases. Units of a lease replaced meanwhile stay spent (its
// unspent units went back to Redis without them): under-admission of at
// most one request's cost.
func (ls *leases) giveBack(holds []hold) {
	if len(holds) == 0 {
		return
	}
	ls.mu.Lock()
	for _, h := range holds {
		if h.e.gen == h.gen {
			h.e.left += h.n
			h.e.spent = max(0, h.e.spent-h.n)
		}
	}
	ls.mu.Unlock()
}

// sweep gives back the unspent units of expired leases (all leases when
// all is set) and forgets counters that went cold.
func (ls *leases) sweep(ctx context.Context, all bool) error {
	var calls []*call
	now := zeroArg
	if ls.l.clock != nil {
		now = strconv.FormatInt(ls.l.clock(), 10)
	}
	ls.mu.Lock()
	t := ls.mono()
	for id, e := range ls.m {
		if e.renewing != nil {
			continue
		}
		e.roll(t, ls.ttl)
		if e.id != "" && (all || t >= e.deadline) {
			if e.left > 0 {
				calls = append(calls, &call{script: leaseScript, keys: []string{e.key}, args: []any{
					now, e.r.args[2], e.r.args[3], ls.ttlArg, "", zeroArg,
					e.id, strconv.FormatInt(e.size, 10), strconv.FormatInt(e.left, 10),
				}})
			}
			e.gen++
			e.id, e.size, e.left = "", 0, 0
		}
		if e.id == "" && e.hits == 0 && e.prevHits == 0 && t >= e.noRenew {
			delete(ls.m, id)
			ls.entries[e.slot]--
		}
	}
	ls.mu.Unlock()
	if len(calls) == 0 {
		return nil
	}
	if err := ls.l.runCalls(ctx, calls); err != nil {
		return fmt.Errorf("redislimit: give back %d leases: %w", len(calls), err)
	}
	return nil
}

// Run gives back, every lease TTL, the unspent units of leases that
// expired, and all of them when ctx ends (within one second). Without
// leases it only waits for ctx. Leases work without Run too: a renewal
// gives the old lease back, and an abandoned lease leaves the window a
// window after its TTL.
func (l *Limiter) Run(ctx context.Context) error {
	ls := l.leases
	if ls == nil {
		<-ctx.Done()
		return nil
	}
	tick := time.NewTicker(ls.ttl)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			if err := ls.sweep(sctx, true); err != nil {
				l.log.Warn("redislimit: leases not given back at shutdown (they leave the window a window after their TTL)", "err", err)
			}
			return nil
		case <-tick.C:
			if err := ls.sweep(ctx, false); err != nil {
				l.log.Warn("redislimit: expired leases not given back (they leave the window a window after their TTL)", "err", err)
			}
		}
	}
}

// slidingKey is the key of a sliding-window check, as appendKeys lays it.
func (l *Limiter) slidingKey(c *limiter.Check) string {
	var tag string
	if c.Key != "" {
		tag = "k:" + c.Key
	} else {
		tag = "i:" + strconv.FormatInt(c.ID, 10)
	}
	return l.prefix + "{" + tag + "}:" + c.Rule + ":s:" + strconv.FormatInt(c.ID, 10)
}
