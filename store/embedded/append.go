package embedded

import (
	"bytes"
	"context"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/fanfare-im/fanfare/store"
)

// appendCall is one Append call waiting for the committer.
type appendCall struct {
	reqs []store.AppendRequest
	res  []store.AppendResult
	err  error
	done chan struct{} // receives once the call's round is decided
}

var callPool = sync.Pool{New: func() any { return &appendCall{done: make(chan struct{}, 1)} }}

// Append implements store.Store. Calls are handed to one committer
// goroutine, which merges the calls waiting at that moment (group commit)
// into one batch and one fsync, so concurrent shard workers share the cost
// of a sync instead of queueing behind each other's. Results are the same
// as if the calls had committed one after another in arrival order. Once
// handed over, a call waits for its commit even if ctx ends: its results
// are being written.
func (s *Store) Append(ctx context.Context, reqs []store.AppendRequest, res []store.AppendResult) error {
	if err := s.lim.CheckBatch(len(reqs), len(res)); err != nil {
		return err
	}
	clear(res)
	if len(reqs) == 0 {
		return nil
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave()
	c := callPool.Get().(*appendCall)
	c.reqs, c.res, c.err = reqs, res, nil
	select {
	case s.calls <- c:
	case <-ctx.Done():
		c.reqs, c.res = nil, nil
		callPool.Put(c)
		return ctx.Err()
	}
	<-c.done
	err := c.err
	c.reqs, c.res, c.err = nil, nil, nil
	callPool.Put(c)
	return err
}

// commitLoop is the committer goroutine, owned by the Store: started by
// Open, stopped by Close once no Append is in flight.
func (s *Store) commitLoop() {
	defer close(s.loopDone)
	var round []*appendCall
	for {
		select {
		case <-s.stop:
			return
		case c := <-s.calls:
			round = append(round[:0], c)
			n, size := len(c.reqs), bodyBytes(c.reqs)
		gather:
			for n < s.lim.MaxBatch && size < s.maxB {
				select {
				case c := <-s.calls:
					round = append(round, c)
					n += len(c.reqs)
					size += bodyBytes(c.reqs)
				default:
					break gather
				}
			}
			err := s.commitRound(round)
			for _, c := range round {
				if err != nil {
					clear(c.res)
					c.err = err
				}
				c.done <- struct{}{}
			}
			clear(round)
		}
	}
}

func bodyBytes(reqs []store.AppendRequest) int {
	n := 0
	for i := range reqs {
		n += len(reqs[i].Body)
	}
	return n
}

// dupKey identifies a message for idempotency within a round.
type dupKey struct {
	gid         int64
	sender, cid string
}

type memberRef struct {
	gid int64
	uid string
}

// Membership states cached per round.
const (
	notMember int8 = iota
	member
	mutedMember
)

// reqRef points at one request of a round: call c, request i.
type reqRef struct{ c, i int32 }

// roundGroup is a group touched by the round.
type roundGroup struct {
	gid     int64
	found   bool
	state   byte
	base    int64  // last_seq before the round
	last    int64  // last_seq after the requests seen so far
	version int64  // membership version
	rec     []byte // the encoded record, rewritten in place at the end
	keyBuf  []byte
	touched bool
}

// roundScratch is the committer's reusable working memory.
type roundScratch struct {
	first  map[dupKey]reqRef
	groups map[int64]int32 // gid -> index in gs
	gs     []roundGroup
	kb, vb []byte
	it     *pebble.Iterator // lookups of this round, opened on first use
}

// get is a point lookup for the round. It goes through one iterator per
// round with bloom filters enabled on every level: pebble's DB.Get skips
// the filters of the last level, where most keys live, so each
// idempotency miss would read a data block. Under wmu nothing else
// commits, so the iterator's point-in-time view is the committed state.
func (sc *roundScratch) get(db *pebble.DB, key []byte, fn func(v []byte) error) (bool, error) {
	if sc.it == nil {
		it, err := db.NewIter(&pebble.IterOptions{UseL6Filters: true})
		if err != nil {
			return false, err
		}
		sc.it = it
	}
	if !sc.it.SeekPrefixGE(key) {
		return false, sc.it.Error()
	}
	if !bytes.Equal(sc.it.Key(), key) {
		return false, nil
	}
	v, err := sc.it.ValueAndErr()
	if err != nil {
		return false, err
	}
	return true, fn(v)
}

// closeIter ends the round's lookups; the next round sees its commit.
func (sc *roundScratch) closeIter() error {
	if sc.it == nil {
		return nil
	}
	err := sc.it.Close()
	sc.it = nil
	return err
}

func (sc *roundScratch) init() {
	sc.first = make(map[dupKey]reqRef)
	sc.groups = make(map[int64]int32)
}

func (sc *roundScratch) reset() {
	clear(sc.first)
	clear(sc.groups)
	sc.gs = sc.gs[:0]
}

// Bounds of metaCache (about 20 MiB each when full): past them a map is
// cleared and refilled on demand.
const (
	maxCachedGroups  = 1 << 17
	maxCachedMembers = 1 << 18
)

// metaCache keeps what Append reads for every request besides the
// idempotency key: group records and (gid, uid) membership states. Point
// lookups in the engine cost microseconds each (memtable skiplists, then
// sstables); these rows change rarely. It is used only under wmu; every
// writer that changes a cached row forgets it under wmu, and Append
// updates last_seq after its commit, so the cache always equals the
// committed state.
type metaCache struct {
	groups  map[int64]*cachedGroup // found groups only
	members map[memberRef]int8     // includes notMember
}

type cachedGroup struct {
	rec []byte // encoded group record
}

func (c *metaCache) init() {
	c.groups = make(map[int64]*cachedGroup)
	c.members = make(map[memberRef]int8)
}

// forgetGroup and forgetMember are called under wmu by writers of the row.
func (c *metaCache) forgetGroup(gid int64)              { delete(c.groups, gid) }
func (c *metaCache) forgetMember(gid int64, uid string) { delete(c.members, memberRef{gid, uid}) }

// roundGroup returns the round's entry for gid, loading it on first use.
func (s *Store) roundGroup(sc *roundScratch, gid int64) (*roundGroup, error) {
	if gi, ok := sc.groups[gid]; ok {
		return &sc.gs[gi], nil
	}
	var g *roundGroup
	if len(sc.gs) < cap(sc.gs) {
		sc.gs = sc.gs[:len(sc.gs)+1]
		g = &sc.gs[len(sc.gs)-1]
		g.rec = g.rec[:0]
	} else {
		sc.gs = append(sc.gs, roundGroup{})
		g = &sc.gs[len(sc.gs)-1]
	}
	sc.groups[gid] = int32(len(sc.gs) - 1)
	g.gid, g.found, g.touched = gid, false, false
	g.keyBuf = groupKey(g.keyBuf[:0], gid)
	if c, ok := s.meta.groups[gid]; ok {
		g.rec = append(g.rec[:0], c.rec...)
		g.found = true
	} else {
		found, err := sc.get(s.db, g.keyBuf, func(v []byte) error {
			g.rec = append(g.rec[:0], v...)
			return nil
		})
		if err != nil {
			return g, err
		}
		g.found = found
		if found {
			if len(s.meta.groups) >= maxCachedGroups {
				clear(s.meta.groups)
			}
			s.meta.groups[gid] = &cachedGroup{rec: append([]byte(nil), g.rec...)}
		}
	}
	if !g.found {
		return g, nil
	}
	var err error
	g.state, g.base, err = groupHead(g.rec)
	g.last = g.base
	if err == nil {
		g.version, err = groupMemberVersion(g.rec)
	}
	return g, err
}

// memberState returns sender's membership state in gid.
func (s *Store) memberState(sc *roundScratch, gid int64, uid string) (int8, error) {
	if st, ok := s.meta.members[memberRef{gid, uid}]; ok {
		return st, nil
	}
	st := notMember
	sc.kb = memberKey(sc.kb[:0], gid, uid)
	_, err := sc.get(s.db, sc.kb, func(v []byte) error {
		muted, err := memberMuted(v)
		st = member
		if muted {
			st = mutedMember
		}
		return err
	})
	if err != nil {
		return notMember, err
	}
	if len(s.meta.members) >= maxCachedMembers {
		clear(s.meta.members)
	}
	s.meta.members[memberRef{gid, strings.Clone(uid)}] = st
	return st, nil
}

// commitRound stores the requests of round in one batch and one fsync. A
// non-nil error means nothing of the round was stored.
func (s *Store) commitRound(round []*appendCall) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	sc := &s.round
	sc.reset()
	defer sc.reset() // drop references to the callers' strings
	defer sc.closeIter()
	nowT := s.nowMicro()
	now := encTime(nowT)
	b := s.db.NewBatch()
	defer b.Close()
	for ci, c := range round {
		for i := range c.reqs {
			r, res := &c.reqs[i], &c.res[i]
			if err := store.ValidateAppend(r, s.lim); err != nil {
				res.Err = err
				continue
			}
			dk := dupKey{r.GID, r.Sender, r.ClientMsgID}
			if ref, ok := sc.first[dk]; ok {
				// A repeat shares its first occurrence's outcome.
				*res = round[ref.c].res[ref.i]
				res.Duplicate = res.Err == nil
				continue
			}
			sc.first[dk] = reqRef{int32(ci), int32(i)}
			g, err := s.roundGroup(sc, r.GID)
			if err != nil {
				return dbErr("append: group", err)
			}
			if !g.found {
				res.Err = store.ErrGroupNotFound
				continue
			}
			sc.kb = idemKey(sc.kb[:0], r.GID, r.Sender, r.ClientMsgID)
			dup, err := sc.get(s.db, sc.kb, func(v []byte) (err error) {
				res.Seq, res.CreatedAt, err = decIdem(v)
				return err
			})
			if err != nil {
				return dbErr("append: idempotency", err)
			}
			if dup {
				res.Duplicate = true
				continue
			}
			if g.state != stActive {
				res.Err = store.ErrGroupClosed
				continue
			}
			st, err := s.memberState(sc, r.GID, r.Sender)
			if err != nil {
				return dbErr("append: member", err)
			}
			switch st {
			case notMember:
				res.Err = store.ErrNotMember
				continue
			case mutedMember:
				res.Err = store.ErrMuted
				continue
			}
			g.last++
			g.touched = true
			sc.kb = idemKey(sc.kb[:0], r.GID, r.Sender, r.ClientMsgID)
			sc.vb = encIdem(sc.vb[:0], g.last, now)
			if err := b.Set(sc.kb, sc.vb, nil); err != nil {
				return dbErr("append", err)
			}
			sc.kb = msgKey(sc.kb[:0], r.GID, g.last)
			sc.vb = encMsg(sc.vb[:0], now, r)
			if err := b.Set(sc.kb, sc.vb, nil); err != nil {
				return dbErr("append", err)
			}
			res.Seq, res.CreatedAt, res.MemberVersion = g.last, nowT, g.version
		}
	}
	for i := range sc.gs {
		g := &sc.gs[i]
		if !g.touched {
			continue
		}
		setGroupLastSeq(g.rec, g.last)
		if err := b.Set(g.keyBuf, g.rec, nil); err != nil {
			return dbErr("append", err)
		}
	}
	if b.Empty() {
		return nil // nothing new: rejections and duplicates only
	}
	if err := sc.closeIter(); err != nil {
		return dbErr("append: lookups", err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return dbErr("append: commit", err)
	}
	for i := range sc.gs {
		if g := &sc.gs[i]; g.touched {
			if c, ok := s.meta.groups[g.gid]; ok {
				c.rec = append(c.rec[:0], g.rec...)
			}
		}
	}
	s.publish()
	return nil
}
