package redislimit

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/limiter"
)

// batcher coalesces concurrent Allow calls into shared script calls without
// a goroutine or timer of its own (group commit): a caller that finds fewer
// than inflight batches running becomes a leader and sends its request
// together with whatever is queued (up to max); callers arriving meanwhile
// queue. A finishing leader wakes the requests it carried and hands the rest
// of the queue to the oldest queued caller, which leads the next batch. No
// request waits for a timer, and an idle limiter adds no latency: batches
// grow exactly as far as Redis is slower than the callers.
//
// A queued caller whose context ends leaves the queue and returns at once;
// one already in a batch in flight returns at once too (its request may
// still be admitted and charged: under-admission, as for a lone call cut off
// mid round trip); one handed the lead leads regardless, since the queue
// behind it depends on that.
type batcher struct {
	l        *Limiter
	max      int
	inflight int

	mu      sync.Mutex
	queue   []*request
	running int // leaders with a batch in flight

	observe func(n int) // tests: called with each batch's size before it is sent
}

// do decides r, leading a batch or riding in one. It returns an error only
// when ctx ended while r waited.
func (b *batcher) do(ctx context.Context, r *request) error {
	b.mu.Lock()
	if b.running < b.inflight {
		b.running++
		b.mu.Unlock()
		b.lead(ctx, r)
		return nil
	}
	r.done = make(chan struct{}, 1)
	r.queued = true
	b.queue = append(b.queue, r)
	b.mu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
		b.mu.Lock()
		switch {
		case r.queued:
			b.removeLocked(r)
			b.mu.Unlock()
			return fmt.Errorf("%w: %w", limiter.ErrUnavailable, ctx.Err())
		case !r.lead:
			b.mu.Unlock()
			return fmt.Errorf("%w: %w", limiter.ErrUnavailable, ctx.Err())
		}
		b.mu.Unlock()
		<-r.done
	}
	if r.lead {
		b.lead(ctx, r)
	}
	return nil
}

func (b *batcher) removeLocked(r *request) {
	for i, x := range b.queue {
		if x == r {
			k := copy(b.queue[i:], b.queue[i+1:])
			b.queue[i+k] = nil
			b.queue = b.queue[:i+k]
			break
		}
	}
	r.queued = false
}

// lead sends r and up to max-1 queued requests as one batch. The batch runs
// under r's values but not its cancellation: the others did not agree to it
// (the client's timeouts bound it).
func (b *batcher) lead(ctx context.Context, r *request) {
	b.mu.Lock()
	n := min(len(b.queue), b.max-1)
	batch := make([]*request, 1, 1+n)
	batch[0] = r
	for _, x := range b.queue[:n] {
		x.queued = false
	}
	batch = append(batch, b.queue[:n]...)
	k := copy(b.queue, b.queue[n:])
	clear(b.queue[k:])
	b.queue = b.queue[:k]
	b.mu.Unlock()

	if b.observe != nil {
		b.observe(len(batch))
	}
	b.l.execBatch(context.WithoutCancel(ctx), batch)
	for _, x := range batch[1:] {
		x.done <- struct{}{}
	}

	b.mu.Lock()
	if len(b.queue) == 0 {
		b.running--
		b.mu.Unlock()
		return
	}
	next := b.queue[0]
	k = copy(b.queue, b.queue[1:])
	b.queue[k] = nil
	b.queue = b.queue[:k]
	next.queued, next.lead = false, true
	b.mu.Unlock()
	next.done <- struct{}{}
}

// call is one batch.lua call (or allow.lua for a single group): the groups
// it decides, in reply order.
type call struct {
	script *redis.Script
	groups []*group
	keys   []string
	args   []any
	cmd    *redis.Cmd
}

// execBatch decides reqs with batch.lua: one call for the whole batch, or in
// cluster mode one per hash slot (pipelined; Redis Cluster routes each to
// the slot's master), then refunds split decisions as exec does. A failed
// call fails every request it carried.
func (l *Limiter) execBatch(ctx context.Context, reqs []*request) {
	calls := l.calls(reqs)
	if err := l.runCalls(ctx, calls); err != nil {
		for _, r := range reqs {
			r.err = err
		}
		return
	}
	for _, c := range calls {
		vals, err := c.cmd.Int64Slice()
		if err == nil && len(vals) != 5*len(c.groups) {
			err = fmt.Errorf("unexpected batch reply of %d values for %d groups", len(vals), len(c.groups))
		}
		for i, g := range c.groups {
			if err == nil {
				err = parseVals(g, vals[5*i:5*i+5])
			}
			if err != nil {
				g.allowed = false
				g.err = fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
			}
		}
	}
	for _, r := range reqs {
		for _, g := range r.groups {
			if g.err != nil {
				r.err = g.err
				break
			}
		}
	}
	l.refund(ctx, reqs)
}

// calls lays the groups of reqs out as batch.lua calls: all in one call, or
// in cluster mode one call per hash slot.
func (l *Limiter) calls(reqs []*request) []*call {
	now := zeroArg
	if l.clock != nil {
		// tests: the latest of the requests' clocks (built in turn)
		var latest int64
		for _, r := range reqs {
			v, _ := strconv.ParseInt(r.groups[0].now.(string), 10, 64)
			latest = max(latest, v)
		}
		now = strconv.FormatInt(latest, 10)
	}
	if !l.cluster && len(reqs) == 1 {
		g := reqs[0].groups[0]
		return []*call{{script: allowScript, groups: reqs[0].groups, keys: g.keys, args: g.scriptArgs()}}
	}
	if !l.cluster {
		c := &call{groups: make([]*group, 0, len(reqs))}
		nk, nc := 0, 0
		for _, r := range reqs {
			nk += len(r.groups[0].keys)
			nc += len(r.groups[0].pc)
		}
		c.keys = make([]string, 0, nk)
		c.args = make([]any, 0, 3+2*len(reqs)+3*nc)
		for _, r := range reqs {
			c.groups = append(c.groups, r.groups[0])
		}
		c.layout(now)
		return []*call{c}
	}
	bySlot := make(map[uint16]*call)
	var calls []*call
	for _, r := range reqs {
		for _, g := range r.groups {
			s := tagSlot(g.tag)
			c := bySlot[s]
			if c == nil {
				c = &call{}
				bySlot[s] = c
				calls = append(calls, c)
			}
			c.groups = append(c.groups, g)
		}
	}
	for _, c := range calls {
		if len(c.groups) == 1 {
			// alone in its slot (the usual case: a batch's groups spread
			// over 16384 slots): allow.lua costs Redis less than a batch
			// of one
			g := c.groups[0]
			c.script, c.keys, c.args = allowScript, g.keys, g.scriptArgs()
			continue
		}
		c.layout(now)
	}
	return calls
}

// param is one set of rule values batch.lua reads once per call.
type param struct {
	r      *rule
	noUser bool
}

// layout fills c's keys and arguments from its groups: the clock, the
// number of groups, the distinct rule values (10 each: alg, limit, span,
// user cap, reserves, shares), then per group its member prefix, its
// number of checks and 3 values per check (rule values index, cost, class).
func (c *call) layout(now any) {
	c.script = batchScript
	var params []param
	c.args = append(c.args[:0], now, strconv.Itoa(len(c.groups)), nil)
	for _, g := range c.groups {
		for i := range g.pc {
			p := param{g.pc[i].r, g.pc[i].noUser && g.pc[i].r.userCap > 0}
			if !slices.Contains(params, p) {
				params = append(params, p)
				a := &p.r.args
				user := a[5]
				if p.noUser {
					user = zeroArg
				}
				c.args = append(c.args, a[0], a[2], a[3], user, a[6], a[7], a[8], a[9], a[10], a[11])
			}
		}
	}
	c.args[2] = smallInt(len(params))
	for _, g := range c.groups {
		c.keys = append(c.keys, g.keys...)
		c.args = append(c.args, g.member, smallInt(len(g.pc)))
		for i := range g.pc {
			p := &g.pc[i]
			k := slices.Index(params, param{p.r, p.noUser && p.r.userCap > 0})
			c.args = append(c.args, smallInt(k+1), p.n, p.cls)
		}
	}
}

// smallInts are the decimal strings of small numbers, boxed once.
var smallInts = func() (s [256]any) {
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

func smallInt(n int) any {
	if n < len(smallInts) {
		return smallInts[n]
	}
	return strconv.Itoa(n)
}

// runCalls sends calls in one pipeline (a single call without one), EVALSHA
// first and EVAL for calls that found the script missing.
func (l *Limiter) runCalls(ctx context.Context, calls []*call) error {
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = c.script.Run(ctx, l.client, c.keys, c.args...)
		if err := c.cmd.Err(); err != nil {
			return fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
		}
		return nil
	}
	pipe := l.client.Pipeline()
	for _, c := range calls {
		c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, err := pipe.Exec(ctx)
	if err == nil {
		return nil
	}
	var retry []*call
	for _, c := range calls {
		switch e := c.cmd.Err(); {
		case e == nil:
		case redis.HasErrorPrefix(e, "NOSCRIPT"):
			retry = append(retry, c)
		default:
			return fmt.Errorf("%w: %w", limiter.ErrUnavailable, e)
		}
	}
	if len(retry) == 0 {
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	pipe = l.client.Pipeline()
	for _, c := range retry {
		c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	return nil
}

// tagSlot is Redis Cluster's key slot of a hash tag: CRC16/XMODEM modulo
// 16384. Hand-written because go-redis keeps its own in an internal
// package.
func tagSlot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc = crc<<8 ^ crc16tab[byte(crc>>8)^tag[i]]
	}
	return crc % 16384
}

var crc16tab = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
