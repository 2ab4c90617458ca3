package presence

import (
	"sync"
	"sync/atomic"

	"github.com/RoaringBitmap/roaring/v2"
)

// pushChunk bounds how many slots the push path visits per read lock, so a
// push to a huge group never holds the group lock for long.
const pushChunk = 512

// compactMin is the fewest free slots worth compacting.
const compactMin = 64

// group is the online set of one gid on this node. It exists only while it
// has an online member; once dead it is never revived (a new one replaces it).
//
// The online members live in a dense slot array that the push path scans
// sequentially: the common single-device member's connection is inline, so
// collecting it touches no other memory. A slot never moves while it is live
// except in compaction, which waits until no push is iterating; so a member
// online for a whole push is visited exactly once even though the push drops
// the lock between chunks. bm mirrors the ordinals for counting, snapshots
// (the cluster view) and ordinal lookups without the map.
type group[C comparable] struct {
	gid    int64
	mu     sync.RWMutex // guards bm, idx, slots, free
	dead   atomic.Bool  // written under mu
	queued atomic.Bool  // in the shard's dirty set
	iters  atomic.Int32 // pushes in progress; compaction waits for zero
	bm     *roaring.Bitmap
	idx    map[uint32]int32 // ordinal -> slot
	slots  []slot[C]
	free   []int32 // free slot indexes, reused first
}

// slot is one online member of a group.
type slot[C comparable] struct {
	u     *user[C] // nil: free slot
	c     C        // the user's only connection, when !multi
	ord   uint32
	multi bool // several connections: read u.conns
}

func newGroup[C comparable](gid int64) *group[C] {
	return &group[C]{gid: gid, bm: roaring.New(), idx: make(map[uint32]int32)}
}

// fill sets s's connection fields from u's current connection list.
func (s *slot[C]) fill(u *user[C]) {
	var zero C
	cl := u.conns.Load()
	if cl != nil && len(cl.s) == 1 {
		s.c, s.multi = cl.s[0], false
	} else {
		s.c, s.multi = zero, true
	}
}

// ---- group lookup and lifecycle ----

func (l *Local[C]) lookupGroup(gid int64) *group[C] {
	s := l.groupShard(gid)
	s.mu.RLock()
	g := s.m[gid]
	s.mu.RUnlock()
	if g == nil || g.dead.Load() {
		return nil
	}
	return g
}

// lockGroup returns gid's live group with g.mu write-locked, creating it.
func (l *Local[C]) lockGroup(gid int64) *group[C] {
	for {
		g := l.lookupGroup(gid)
		if g == nil {
			s := l.groupShard(gid)
			s.mu.Lock()
			g = s.m[gid]
			if g == nil || g.dead.Load() {
				g = newGroup[C](gid)
				s.m[gid] = g
				l.nGroups.Add(1)
			}
			s.mu.Unlock()
		}
		g.mu.Lock()
		if !g.dead.Load() {
			return g
		}
		g.mu.Unlock()
	}
}

// retireGroupLocked marks an empty g dead; the caller then releases g.mu and
// calls removeGroup.
func (l *Local[C]) retireGroupLocked(g *group[C]) {
	g.dead.Store(true)
	l.nGroups.Add(-1)
}

func (l *Local[C]) removeGroup(g *group[C]) {
	s := l.groupShard(g.gid)
	s.mu.Lock()
	if s.m[g.gid] == g {
		delete(s.m, g.gid)
	}
	s.mu.Unlock()
}

// markDirtyLocked records that g's online set changed. g.mu is held.
func (l *Local[C]) markDirtyLocked(g *group[C]) {
	if !l.track.Load() || g.queued.Load() || !g.queued.CompareAndSwap(false, true) {
		return
	}
	s := l.groupShard(g.gid)
	s.dirtyMu.Lock()
	s.dirty[g.gid] = struct{}{}
	s.dirtyMu.Unlock()
}

// ---- bit changes (callers hold u.mu) ----

// addBit makes u the online member with ordinal ord in gid, evicting any
// other user holding that ordinal (ordinals are reused after leave: the
// latest Join wins).
func (l *Local[C]) addBit(gid int64, ord uint32, u *user[C], evict bool) {
	g := l.lockGroup(gid)
	if i, ok := g.idx[ord]; ok {
		if s := &g.slots[i]; s.u != u && evict {
			s.u = u
			s.fill(u)
			l.markDirtyLocked(g)
		}
		g.mu.Unlock()
		return
	}
	var i int32
	if n := len(g.free); n > 0 {
		i = g.free[n-1]
		g.free = g.free[:n-1]
	} else {
		i = int32(len(g.slots))
		g.slots = append(g.slots, slot[C]{})
	}
	s := &g.slots[i]
	s.u, s.ord = u, ord
	s.fill(u)
	g.idx[ord] = i
	g.bm.Add(ord)
	l.markDirtyLocked(g)
	g.mu.Unlock()
}

// clearBit removes ordinal ord from gid if u still holds it.
func (l *Local[C]) clearBit(gid int64, ord uint32, u *user[C]) {
	g := l.lookupGroup(gid)
	if g == nil {
		return
	}
	g.mu.Lock()
	i, ok := g.idx[ord]
	if g.dead.Load() || !ok || g.slots[i].u != u {
		g.mu.Unlock()
		return
	}
	delete(g.idx, ord)
	g.bm.Remove(ord)
	g.slots[i] = slot[C]{}
	g.free = append(g.free, i)
	l.markDirtyLocked(g)
	empty := len(g.idx) == 0
	if empty {
		l.retireGroupLocked(g)
	} else if g.maybeCompactLocked() {
		l.nCompactions.Add(1)
	}
	g.mu.Unlock()
	if empty {
		l.removeGroup(g)
	}
}

// maybeCompactLocked packs the live slots once at least half are free and
// no push is iterating (a push between chunks holds iters, so a compaction
// never moves a slot under it). Amortized O(1) per removal. g.mu is held
// for writing.
func (g *group[C]) maybeCompactLocked() bool {
	if len(g.free) < compactMin || 2*len(g.free) < len(g.slots) || g.iters.Load() != 0 {
		return false
	}
	live := make([]slot[C], 0, len(g.idx)+len(g.idx)/4)
	for _, s := range g.slots {
		if s.u != nil {
			g.idx[s.ord] = int32(len(live))
			live = append(live, s)
		}
	}
	g.slots = live
	g.free = g.free[:0:0]
	return true
}

// refreshSlotsLocked re-reads u's connection list into its slots in every
// group, after it switched between one and several connections. u.mu is held.
func (l *Local[C]) refreshSlotsLocked(u *user[C]) {
	u.ms.each(func(gid int64, ord uint32) {
		g := l.lookupGroup(gid)
		if g == nil {
			return
		}
		g.mu.Lock()
		if i, ok := g.idx[ord]; ok && !g.dead.Load() && g.slots[i].u == u {
			g.slots[i].fill(u)
		}
		g.mu.Unlock()
	})
}

// RemoveGroup drops gid's whole online set (group dissolved).
func (l *Local[C]) RemoveGroup(gid int64) {
	g := l.lookupGroup(gid)
	if g == nil {
		return
	}
	g.mu.Lock()
	if g.dead.Load() {
		g.mu.Unlock()
		return
	}
	held := make([]slot[C], 0, len(g.idx))
	for _, s := range g.slots {
		if s.u != nil {
			held = append(held, s)
		}
	}
	clear(g.idx)
	g.slots, g.free = nil, nil
	g.bm.Clear()
	l.markDirtyLocked(g)
	l.retireGroupLocked(g)
	g.mu.Unlock()
	l.removeGroup(g)
	// Drop the now-dangling membership records (lock order: user before
	// group, so only after releasing g).
	for _, s := range held {
		s.u.mu.Lock()
		if o, ok := s.u.ms.get(gid); ok && o == s.ord {
			s.u.ms.del(gid)
		}
		s.u.mu.Unlock()
	}
}

// ---- push path ----

// beginPush looks up gid for a push and registers the push with the group,
// so that compaction waits for it. The caller must call g.iters.Add(-1).
func (l *Local[C]) beginPush(gid int64) *group[C] {
	g := l.lookupGroup(gid)
	if g != nil {
		g.iters.Add(1)
	}
	return g
}

// AppendConns appends to dst the connections of every member of gid online
// on this node: one entry per connection, so a member on two devices gets
// two. It allocates nothing beyond growing dst (reuse dst across calls).
// The group is read in chunks of 512 slots per read lock, so a push to a
// huge group holds back connects for one chunk at most; a member online for
// the whole call appears exactly once per connection, one that joins or
// leaves during the call may or may not.
func (l *Local[C]) AppendConns(dst []C, gid int64) []C {
	g := l.beginPush(gid)
	if g == nil {
		return dst
	}
	for i := 0; ; {
		g.mu.RLock()
		slots := g.slots
		end := min(i+pushChunk, len(slots))
		for ; i < end; i++ {
			s := &slots[i]
			if s.u == nil {
				continue
			}
			if !s.multi {
				dst = append(dst, s.c)
			} else if cl := s.u.conns.Load(); cl != nil {
				dst = append(dst, cl.s...)
			}
		}
		more := i < len(slots)
		g.mu.RUnlock()
		if !more {
			break
		}
	}
	g.iters.Add(-1)
	return dst
}

// Recipient is one connection of an online member, as the push path sees
// it: the ordinal lets the caller check the member's join_seq or skip the
// sender without any further lookup.
type Recipient[C comparable] struct {
	Ordinal uint32
	Conn    C
}

// AppendRecipients is AppendConns with each connection's member ordinal.
func (l *Local[C]) AppendRecipients(dst []Recipient[C], gid int64) []Recipient[C] {
	g := l.beginPush(gid)
	if g == nil {
		return dst
	}
	for i := 0; ; {
		g.mu.RLock()
		slots := g.slots
		end := min(i+pushChunk, len(slots))
		for ; i < end; i++ {
			s := &slots[i]
			if s.u == nil {
				continue
			}
			if !s.multi {
				dst = append(dst, Recipient[C]{Ordinal: s.ord, Conn: s.c})
			} else if cl := s.u.conns.Load(); cl != nil {
				for _, c := range cl.s {
					dst = append(dst, Recipient[C]{Ordinal: s.ord, Conn: c})
				}
			}
		}
		more := i < len(slots)
		g.mu.RUnlock()
		if !more {
			break
		}
	}
	g.iters.Add(-1)
	return dst
}

// ForEachOnline calls fn for each connection of each member of gid online
// on this node until fn returns false. fn runs without any presence lock
// held, so it may block or call back into Local. Like AppendConns it
// allocates nothing and visits a member online for the whole call exactly
// once per connection.
func (l *Local[C]) ForEachOnline(gid int64, fn func(ordinal uint32, conn C) bool) {
	g := l.beginPush(gid)
	if g == nil {
		return
	}
	defer g.iters.Add(-1)
	var buf [pushChunk / 4]slot[C]
	for i := 0; ; {
		g.mu.RLock()
		slots := g.slots
		n := 0
		for ; i < len(slots) && n < len(buf); i++ {
			if slots[i].u != nil {
				buf[n] = slots[i]
				n++
			}
		}
		more := i < len(slots)
		g.mu.RUnlock()
		for j := range n {
			s := &buf[j]
			if !s.multi {
				if !fn(s.ord, s.c) {
					return
				}
				continue
			}
			if cl := s.u.conns.Load(); cl != nil {
				for _, c := range cl.s {
					if !fn(s.ord, c) {
						return
					}
				}
			}
		}
		if !more {
			return
		}
	}
}

// ---- group queries ----

// OnlineCount returns the number of members of gid online on this node.
func (l *Local[C]) OnlineCount(gid int64) int {
	g := l.lookupGroup(gid)
	if g == nil {
		return 0
	}
	g.mu.RLock()
	n := len(g.idx)
	g.mu.RUnlock()
	return n
}

// ContainsOrdinal reports whether the member of gid with ordinal is online
// on this node.
func (l *Local[C]) ContainsOrdinal(gid int64, ordinal uint32) bool {
	g := l.lookupGroup(gid)
	if g == nil {
		return false
	}
	g.mu.RLock()
	ok := g.bm.Contains(ordinal)
	g.mu.RUnlock()
	return ok
}

// UIDOf returns the uid of the member of gid with ordinal if it is online on
// this node.
func (l *Local[C]) UIDOf(gid int64, ordinal uint32) (string, bool) {
	g := l.lookupGroup(gid)
	if g == nil {
		return "", false
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	i, ok := g.idx[ordinal]
	if !ok {
		return "", false
	}
	return g.slots[i].u.uid, true
}

// CloneBitmap returns a copy of gid's online ordinals, nil when none.
func (l *Local[C]) CloneBitmap(gid int64) *roaring.Bitmap {
	g := l.lookupGroup(gid)
	if g == nil {
		return nil
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.dead.Load() {
		return nil
	}
	return g.bm.Clone()
}

// AppendGroups appends every gid with a member online on this node.
func (l *Local[C]) AppendGroups(dst []int64) []int64 {
	for i := range l.groups {
		s := &l.groups[i]
		s.mu.RLock()
		for gid, g := range s.m {
			if !g.dead.Load() {
				dst = append(dst, gid)
			}
		}
		s.mu.RUnlock()
	}
	return dst
}

// DrainDirty appends the gids whose online set changed since the previous
// call (each once) and starts a new change set. Tracking is off until the
// first call, so a Local without a cluster view pays nothing and holds no
// unbounded set; the first caller must follow with a full scan.
func (l *Local[C]) DrainDirty(dst []int64) []int64 {
	l.track.Store(true)
	start := len(dst)
	for i := range l.groups {
		s := &l.groups[i]
		s.dirtyMu.Lock()
		for gid := range s.dirty {
			dst = append(dst, gid)
		}
		clear(s.dirty)
		s.dirtyMu.Unlock()
	}
	// Re-arm after taking the set: a change racing with this call either
	// queues again or is already visible to the caller's snapshot.
	for _, gid := range dst[start:] {
		if g := l.lookupGroup(gid); g != nil {
			g.queued.Store(false)
		}
	}
	return dst
}
