package presence

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for Config.
const (
	// DefaultTTL is 2.5 client heartbeats (30 s): one lost heartbeat does not
	// expire a connection, two do.
	DefaultTTL             = 75 * time.Second
	DefaultMaxOrdinal      = 1<<24 - 1 // 2 MiB per group bitmap in Redis
	DefaultMaxConnsPerUser = 16
	DefaultShards          = 64
)

// Config configures a Local. The zero value works.
type Config struct {
	// TTL is how long a connection stays online without Touch; 0 means
	// DefaultTTL.
	TTL time.Duration
	// Now is the clock for Connect and Touch; nil means time.Now.
	Now func() time.Time
	// MaxOrdinal is the largest accepted member ordinal; 0 means
	// DefaultMaxOrdinal.
	MaxOrdinal uint32
	// MaxConnsPerUser bounds one user's connections on this node (devices);
	// 0 means DefaultMaxConnsPerUser.
	MaxConnsPerUser int
	// Shards is the number of lock shards for users, groups and connections,
	// a power of two; 0 means DefaultShards.
	Shards int
	// NoHeartbeats is for a caller that never calls Touch or Expire (its
	// transport closes silent connections itself): connections are then
	// not indexed by handle nor kept in heartbeat order, about 90 bytes
	// less per connection. Touch reports false and Expire returns nothing,
	// and a handle registered under another uid is not detected (Connect
	// fails with ErrConnExists only for a handle among the uid's own
	// connections). false (default) tracks heartbeats.
	NoHeartbeats bool
}

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	if c.TTL < 0 {
		errs = append(errs, fmt.Errorf("presence: TTL %v is negative", c.TTL))
	}
	if c.MaxConnsPerUser < 0 {
		errs = append(errs, fmt.Errorf("presence: MaxConnsPerUser %d is negative", c.MaxConnsPerUser))
	}
	if c.Shards < 0 || c.Shards&(c.Shards-1) != 0 || c.Shards > 1<<16 {
		errs = append(errs, fmt.Errorf("presence: Shards %d is not a power of two in [1, 65536]", c.Shards))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxOrdinal == 0 {
		c.MaxOrdinal = DefaultMaxOrdinal
	}
	if c.MaxConnsPerUser == 0 {
		c.MaxConnsPerUser = DefaultMaxConnsPerUser
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	return c
}

// Stats is a snapshot of a Local's size.
type Stats struct {
	Users  int64 // distinct uids online
	Conns  int64 // connections registered
	Groups int64 // groups with at least one member online
	// Compactions counts slot-array compactions (after many members of a
	// group went offline) since New.
	Compactions int64
}

// Local is one node's presence index: for each group with members online
// here, a roaring bitmap of their ordinals and ordinal -> user; for each
// online user its connections (one per device) and memberships; for each
// connection its last heartbeat. C is the caller's connection handle; Local
// only compares and hashes it. All methods are safe for concurrent use.
type Local[C comparable] struct {
	ttl      int64 // ns
	now      func() time.Time
	maxOrd   uint32
	maxConns int
	mask     uint64
	seed     maphash.Seed
	track    atomic.Bool // dirty tracking, on after the first DrainDirty
	beats    bool        // heartbeats tracked: conns shards in use (!Config.NoHeartbeats)

	users  []userShard[C]
	groups []groupShard[C]
	conns  []connShard[C]

	nUsers, nConns, nGroups, nCompactions atomic.Int64
}

type userShard[C comparable] struct {
	mu sync.RWMutex
	m  map[string]*user[C]
	_  [40]byte // keep shards on separate cache lines
}

type groupShard[C comparable] struct {
	mu      sync.RWMutex
	m       map[int64]*group[C]
	dirtyMu sync.Mutex
	dirty   map[int64]struct{}
	_       [16]byte
}

type connShard[C comparable] struct {
	mu         sync.Mutex
	m          map[C]*connState[C]
	head, tail *connState[C] // ordered by lastSeen, oldest first
	_          [24]byte
}

// user is one online uid. It exists only while it has a connection.
type user[C comparable] struct {
	uid   string
	mu    sync.Mutex // guards ms and writes of conns and dead
	dead  atomic.Bool
	conns atomic.Pointer[connList[C]] // immutable once stored
	ms    memberSet
	// first is the connection list of the connection that brought the
	// user online, stored in conns by that Connect and never written
	// after: a single-device user costs one allocation fewer (112 bytes
	// with it against 80 + 48 apart).
	first connList[C]
}

// connList is an immutable list of a user's connections; the common single
// connection lives inline, so it costs one allocation.
type connList[C comparable] struct {
	s   []C
	one [1]C
}

type connState[C comparable] struct {
	conn       C
	u          *user[C]
	lastSeen   int64 // unix ns, guarded by the conn shard
	prev, next *connState[C]
}

// New returns an empty Local.
func New[C comparable](cfg Config) (*Local[C], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	l := &Local[C]{
		ttl:      int64(cfg.TTL),
		now:      cfg.Now,
		maxOrd:   cfg.MaxOrdinal,
		maxConns: cfg.MaxConnsPerUser,
		beats:    !cfg.NoHeartbeats,
		mask:     uint64(cfg.Shards - 1),
		seed:     maphash.MakeSeed(),
		users:    make([]userShard[C], cfg.Shards),
		groups:   make([]groupShard[C], cfg.Shards),
		conns:    make([]connShard[C], cfg.Shards),
	}
	for i := range cfg.Shards {
		l.users[i].m = make(map[string]*user[C])
		l.groups[i].m = make(map[int64]*group[C])
		l.groups[i].dirty = make(map[int64]struct{})
		l.conns[i].m = make(map[C]*connState[C])
	}
	return l, nil
}

func (l *Local[C]) userShard(uid string) *userShard[C] {
	return &l.users[maphash.String(l.seed, uid)&l.mask]
}

func (l *Local[C]) groupShard(gid int64) *groupShard[C] {
	// Fibonacci hashing spreads sequential gids across shards.
	h := uint64(gid) * 0x9e3779b97f4a7c15
	return &l.groups[bits.RotateLeft64(h, 32)&l.mask]
}

func (l *Local[C]) connShard(c C) *connShard[C] {
	return &l.conns[maphash.Comparable(l.seed, c)&l.mask]
}

// ---- users ----

// lookupUser returns the live user for uid, or nil.
func (l *Local[C]) lookupUser(uid string) *user[C] {
	s := l.userShard(uid)
	s.mu.RLock()
	u := s.m[uid]
	s.mu.RUnlock()
	if u == nil || u.dead.Load() {
		return nil
	}
	return u
}

// lockUser returns uid's live user with u.mu held, creating it if create.
// It returns nil when the user is offline and !create.
func (l *Local[C]) lockUser(uid string, create bool) *user[C] {
	for {
		u := l.lookupUser(uid)
		if u == nil {
			if !create {
				return nil
			}
			s := l.userShard(uid)
			s.mu.Lock()
			u = s.m[uid]
			if u == nil || u.dead.Load() {
				u = &user[C]{uid: uid}
				s.m[uid] = u
			}
			s.mu.Unlock()
		}
		u.mu.Lock()
		if !u.dead.Load() {
			return u
		}
		u.mu.Unlock()
	}
}

// retireUserLocked marks u dead; the caller then releases u.mu and calls
// removeUser.
func (l *Local[C]) retireUserLocked(u *user[C]) {
	u.dead.Store(true)
	u.conns.Store(nil)
	u.ms = memberSet{}
}

func (l *Local[C]) removeUser(u *user[C]) {
	s := l.userShard(u.uid)
	s.mu.Lock()
	if s.m[u.uid] == u {
		delete(s.m, u.uid)
	}
	s.mu.Unlock()
}

// joinLocked records membership (gid, ord) for u and sets its bit. With
// force (Join), the bit is taken from another holder of ord and an existing
// identical record re-asserts it; without (Connect), another holder keeps
// the bit and an identical record is left alone. u.mu is held.
func (l *Local[C]) joinLocked(u *user[C], gid int64, ord uint32, force bool) {
	if old, ok := u.ms.get(gid); ok {
		if old == ord && !force {
			return
		}
		if old != ord {
			l.clearBit(gid, old, u)
		}
	}
	u.ms.set(gid, ord)
	// Only Join (force) is authoritative: a membership brought by Connect
	// may be stale (read before a leave), so it never takes the bit from
	// another user holding the ordinal now.
	l.addBit(gid, ord, u, force)
}

// ---- connections ----

func (s *connShard[C]) unlinkLocked(cs *connState[C]) {
	if cs.prev != nil {
		cs.prev.next = cs.next
	} else {
		s.head = cs.next
	}
	if cs.next != nil {
		cs.next.prev = cs.prev
	} else {
		s.tail = cs.prev
	}
	cs.prev, cs.next = nil, nil
}

// pushLocked appends cs at the tail, keeping the list ordered by lastSeen
// even if the clock steps back.
func (s *connShard[C]) pushLocked(cs *connState[C]) {
	if s.tail != nil && cs.lastSeen < s.tail.lastSeen {
		cs.lastSeen = s.tail.lastSeen
	}
	cs.prev = s.tail
	if s.tail != nil {
		s.tail.next = cs
	} else {
		s.head = cs
	}
	s.tail = cs
}

// Connect registers conn as one of uid's connections and marks uid online in
// each of memberships (joined to what the user already has if another of its
// connections is online here; an identical existing membership is left as
// is). A membership whose ordinal another user holds here does not take its
// bit: it may have been read before a leave (Join is authoritative). It
// fails with ErrConnExists if conn is registered, ErrTooManyConns past
// MaxConnsPerUser, ErrOrdinalRange for a bad ordinal; on error nothing changed.
func (l *Local[C]) Connect(uid string, conn C, memberships []Membership) error {
	for _, m := range memberships {
		if m.Ordinal > l.maxOrd {
			return fmt.Errorf("%w: gid %d ordinal %d > %d", ErrOrdinalRange, m.GID, m.Ordinal, l.maxOrd)
		}
	}
	u := l.lockUser(uid, true)
	cur := u.conns.Load()
	fail := func(err error) error {
		if cur == nil { // u was created for this call
			l.retireUserLocked(u)
			u.mu.Unlock()
			l.removeUser(u)
			return err
		}
		u.mu.Unlock()
		return err
	}
	n := 0
	if cur != nil {
		n = len(cur.s)
		for _, c := range cur.s {
			if c == conn {
				return fail(ErrConnExists)
			}
		}
	}
	if n >= l.maxConns {
		return fail(fmt.Errorf("%w: uid %q has %d", ErrTooManyConns, uid, n))
	}
	if l.beats {
		cs := &connState[C]{conn: conn, u: u, lastSeen: l.now().UnixNano()}
		s := l.connShard(conn)
		s.mu.Lock()
		if _, ok := s.m[conn]; ok {
			s.mu.Unlock()
			return fail(ErrConnExists)
		}
		s.m[conn] = cs
		s.pushLocked(cs)
		s.mu.Unlock()
	}

	// Publish the connection before any bit, so a pusher that sees the bit
	// finds the connection.
	var next *connList[C]
	if n == 0 {
		// cur == nil: u was created by this call (a live user has a
		// connection), so its first list is unused.
		next = &u.first
		next.one[0] = conn
		next.s = next.one[:]
		l.nUsers.Add(1)
	} else {
		next = &connList[C]{}
		next.s = make([]C, n+1)
		copy(next.s, cur.s)
		next.s[n] = conn
	}
	u.conns.Store(next)
	l.nConns.Add(1)
	if n == 1 {
		l.refreshSlotsLocked(u) // one connection -> several
	}
	for _, m := range memberships {
		l.joinLocked(u, m.GID, m.Ordinal, false)
	}
	u.mu.Unlock()
	return nil
}

// Disconnect unregisters conn of uid. When it was uid's last connection
// here, uid goes offline in all its groups at once. It reports whether conn
// was registered.
func (l *Local[C]) Disconnect(uid string, conn C) bool {
	u := l.lockUser(uid, false)
	if u == nil {
		return false
	}
	if l.beats {
		s := l.connShard(conn)
		s.mu.Lock()
		if cs, ok := s.m[conn]; ok && cs.u == u {
			delete(s.m, conn)
			s.unlinkLocked(cs)
		}
		s.mu.Unlock()
	}
	return l.dropLocked(u, conn)
}

// dropLocked removes conn from u's list (taking u offline if it was the
// last) and unlocks u.mu. It reports whether conn was in the list.
func (l *Local[C]) dropLocked(u *user[C], conn C) bool {
	cur := u.conns.Load()
	i := -1
	if cur != nil {
		for j, c := range cur.s {
			if c == conn {
				i = j
				break
			}
		}
	}
	if i < 0 {
		u.mu.Unlock()
		return false
	}
	l.nConns.Add(-1)
	if len(cur.s) > 1 {
		next := &connList[C]{}
		if len(cur.s) == 2 {
			next.one[0] = cur.s[1-i]
			next.s = next.one[:]
		} else {
			next.s = make([]C, 0, len(cur.s)-1)
			next.s = append(next.s, cur.s[:i]...)
			next.s = append(next.s, cur.s[i+1:]...)
		}
		u.conns.Store(next)
		if len(next.s) == 1 {
			l.refreshSlotsLocked(u) // several connections -> one
		}
		u.mu.Unlock()
		return true
	}
	// Last connection: clear every bit first, then retire the user.
	u.ms.each(func(gid int64, ord uint32) { l.clearBit(gid, ord, u) })
	l.retireUserLocked(u)
	l.nUsers.Add(-1)
	u.mu.Unlock()
	l.removeUser(u)
	return true
}

// Touch records a heartbeat for conn at Config.Now. It reports whether conn
// is registered (false: it expired or was never connected, or
// Config.NoHeartbeats).
func (l *Local[C]) Touch(conn C) bool {
	if !l.beats {
		return false
	}
	now := l.now().UnixNano()
	s := l.connShard(conn)
	s.mu.Lock()
	cs, ok := s.m[conn]
	if ok {
		cs.lastSeen = max(cs.lastSeen, now)
		if s.tail != cs {
			s.unlinkLocked(cs)
			s.pushLocked(cs)
		} else if cs.prev != nil && cs.lastSeen < cs.prev.lastSeen {
			cs.lastSeen = cs.prev.lastSeen
		}
	}
	s.mu.Unlock()
	return ok
}

// Expire unregisters every connection not seen (Connect or Touch) for TTL
// or more before now, exactly as Disconnect would, and returns them so the
// caller can close them. Cost is proportional to the number expired.
// With Config.NoHeartbeats nothing expires.
func (l *Local[C]) Expire(now time.Time) []C {
	if !l.beats {
		return nil
	}
	limit := now.UnixNano() - l.ttl
	var expired []*connState[C]
	for i := range l.conns {
		s := &l.conns[i]
		s.mu.Lock()
		for s.head != nil && s.head.lastSeen <= limit {
			cs := s.head
			s.unlinkLocked(cs)
			delete(s.m, cs.conn)
			expired = append(expired, cs)
		}
		s.mu.Unlock()
	}
	var out []C
	for _, cs := range expired {
		u := cs.u
		u.mu.Lock()
		if u.dead.Load() || l.registered(cs.conn) {
			// Gone already, or disconnected and connected again with the
			// same handle since we took it off the list: not ours to drop.
			u.mu.Unlock()
			continue
		}
		if l.dropLocked(u, cs.conn) {
			out = append(out, cs.conn)
		}
	}
	return out
}

func (l *Local[C]) registered(conn C) bool {
	s := l.connShard(conn)
	s.mu.Lock()
	_, ok := s.m[conn]
	s.mu.Unlock()
	return ok
}

// RunExpiry calls Expire every interval (0 means TTL/4) until ctx is done,
// handing each expired connection to expired (which typically closes it).
func (l *Local[C]) RunExpiry(ctx context.Context, interval time.Duration, expired func(C)) error {
	if interval <= 0 {
		interval = time.Duration(l.ttl / 4)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			for _, c := range l.Expire(l.now()) {
				expired(c)
			}
		}
	}
}

// ---- membership changes ----

// Join records that uid is a member of gid with ordinal. If uid is online
// here, its bit is set at once (evicting a stale holder of the same
// ordinal); if not, Join does nothing (Connect brings the memberships).
func (l *Local[C]) Join(gid int64, uid string, ordinal uint32) error {
	if ordinal > l.maxOrd {
		return fmt.Errorf("%w: gid %d ordinal %d > %d", ErrOrdinalRange, gid, ordinal, l.maxOrd)
	}
	u := l.lockUser(uid, false)
	if u == nil {
		return nil
	}
	l.joinLocked(u, gid, ordinal, true)
	u.mu.Unlock()
	return nil
}

// Leave records that uid is no longer a member of gid: its bit is cleared at
// once, so no push collected after Leave returns reaches it.
func (l *Local[C]) Leave(gid int64, uid string) {
	u := l.lockUser(uid, false)
	if u == nil {
		return
	}
	if ord, ok := u.ms.get(gid); ok {
		u.ms.del(gid)
		l.clearBit(gid, ord, u)
	}
	u.mu.Unlock()
}

// UserOnline reports whether uid has a connection on this node.
func (l *Local[C]) UserOnline(uid string) bool { return l.lookupUser(uid) != nil }

// AppendUserConns appends uid's connections on this node.
func (l *Local[C]) AppendUserConns(dst []C, uid string) []C {
	u := l.lookupUser(uid)
	if u == nil {
		return dst
	}
	if cl := u.conns.Load(); cl != nil {
		dst = append(dst, cl.s...)
	}
	return dst
}

// Memberships appends the memberships this node holds for online uid.
func (l *Local[C]) Memberships(dst []Membership, uid string) []Membership {
	u := l.lockUser(uid, false)
	if u == nil {
		return dst
	}
	u.ms.each(func(gid int64, ord uint32) { dst = append(dst, Membership{GID: gid, Ordinal: ord}) })
	u.mu.Unlock()
	return dst
}

// Stats returns current sizes.
func (l *Local[C]) Stats() Stats {
	return Stats{Users: l.nUsers.Load(), Conns: l.nConns.Load(), Groups: l.nGroups.Load(), Compactions: l.nCompactions.Load()}
}

var _ Source = (*Local[int])(nil)
