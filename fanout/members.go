// This file holds membership: changes made through this node (AddMembers,
// RemoveMember) run on the group's worker (onWorker) and are applied to
// presence (joined, left); in cluster mode the views repair what the bus
// lost (below). Connects are in connect.go.

package fanout

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/store"
)

// Membership repair in cluster mode.
//
// A membership change committed on one node reaches the others as a hint
// on the bus, which may lose it: the publisher's outbox full or Redis
// down there, the subscriber cut here (Engine.BusReconnected), this
// node's worker queue full (RemoteMembers), the node dying between
// commit and publish. A lost removal would let the removed member, online
// on another node, receive what the group says next; a lost addition
// leaves the new member, online on another node, without the group's
// pushes for as long as that connection lives. Each is repaired from the
// store, the two in different ways.
//
// Removals, by version, at the cost of one atomic load per batch:
//
//   - The store counts each group's membership changes (MemberVersion)
//     under the lock Append takes, and returns the version with every
//     stored message: a message stored after a change carries a version
//     at least that change's.
//   - Each node keeps, per group it pushes to, the version its presence
//     bits are known to reflect (memberView). A change applied here (local
//     or from the bus) advances it when it is the next one; a skipped one
//     (a hole) leaves it behind.
//   - Before pushing a batch (a local commit, or a remote batch, whose
//     payload carries the version of its last message), the group's
//     worker compares: a view at or above the batch's version pushes at
//     once; a view behind it or absent (first batch after start or after
//     eviction) makes the worker re-read the members it has online from
//     the store (Store.MembersOf, in chunks) and fix the bits first:
//     non-members are dropped, members re-joined with their current
//     ordinal and join_seq. If that read fails, the batch is not pushed
//     here (clients pull; a pull checks membership in the store).
//
// That re-read can only find members whose bits are set here: it repairs
// a lost removal, never a lost addition (the new member's bit is not
// set, and when no other member of the group is online here the node
// does not even receive the group's batches). Additions are repaired by
// the store's feed of additions (Store.MembersAdded):
//
//   - Every MemberFeedInterval (sooner when a version hole, a dropped
//     remote change or a bus reconnect says something was lost) the
//     node's feed goroutine reads the additions committed since its last
//     read, in pages of MemberFeedPage, and keeps those of users online
//     here whose bit in the group is not theirs (for the others a hint
//     applied the change already, or their connect read the membership).
//   - A candidate waits MemberFeedGrace first (the feed often reads a row
//     between its commit and its hint's apply here) and is repaired only
//     if still missing then, so that an addition only slow on the bus is
//     neither repaired nor counted and logged as lost; a group whose
//     repair fails is tried again after reconcileRetry without holding
//     back the cursor or the other groups.
//   - Each group's candidates are applied on its worker as a remote
//     addition is: re-read from the store there first (Store.MembersOf:
//     a removal committed since wins, so a late addition never revives a
//     removed member), then joined (bit, recent joiner at join_seq,
//     subscription). The repaired connections get a resync up to the
//     group's last seq: what was pushed here between the join and the
//     repair did not reach them.
//   - A page whose reads or applies fail is read again next round (the
//     cursor advances only past pages applied); the first cursor is taken
//     before the first connect reads its memberships (startFeed), so no
//     addition falls between a connect's read and the feed.
//
// Cost: one indexed store read per node per interval, plus the rows of
// the additions made in the cluster meanwhile (each node reads each
// addition once, a page again after a failure), filtered with two
// presence lookups each; store and worker work only for additions whose
// hint was lost. It scales with the changes, not with the users online
// here times their groups (re-reading every online user's memberships
// would). The version-driven alternative, asking the store per group for
// the members added above the view's version, was weighed and not taken:
// it sees only groups whose batches reach this node, which excludes every
// group whose only member online here is the one just added, and it needs
// a view kept for every such group.
//
// A view with no member online here is set without reading (nothing to
// fix; a member connecting later reads its memberships itself). Views
// unused for viewIdle are forgotten (the next batch re-reads once).

// viewIdle is how long an unused membership view is kept.
const viewIdle = 10 * time.Minute

// reconcileRetry is how long a group whose re-read failed pushes nothing
// before it tries again: a slow or unreachable store must not stall the
// group's shard for a CommitTimeout on every batch.
const reconcileRetry = time.Second

// reconcileChunk bounds the uids of one MembersOf call (within the
// store's default Limits.MaxAddMembers).
const reconcileChunk = 1000

type memberView struct {
	version atomic.Int64
	used    atomic.Int64 // unix nanoseconds
	retryAt atomic.Int64 // unix nanoseconds: no re-read before it (the last one failed)
}

// membershipViews is the engine's per-group membership views; the
// sync.Map holds gid -> *memberView. A view is only raised (applied,
// reconcile) except by the sweep, which deletes: an absent view costs one
// re-read, never a wrong push.
type membershipViews struct {
	m         sync.Map
	lastSweep atomic.Int64 // unix nanoseconds
	lastFail  atomic.Int64 // unix nanoseconds of the last failure logged
}

// applied records that the change of gid that made version is applied to
// this node's presence. It advances the view only from the version just
// before (a hole stays a hole until a re-read). Any goroutine.
func (e *Engine) applied(gid, version int64) {
	if e.bus == nil || version <= 0 {
		return
	}
	v, ok := e.views.m.Load(gid)
	if !ok {
		return
	}
	v.(*memberView).version.CompareAndSwap(version-1, version)
}

// viewCurrent reports whether gid's presence bits are known to reflect
// every membership change up to version.
func (e *Engine) viewCurrent(gid, version int64) bool {
	v, ok := e.views.m.Load(gid)
	if !ok {
		return false
	}
	mv := v.(*memberView)
	if mv.version.Load() < version {
		return false
	}
	if now := e.now().UnixNano(); now-mv.used.Load() > int64(time.Second) {
		mv.used.Store(now)
	}
	return true
}

// membersCurrent makes sure the presence bits of gid reflect every
// membership change up to version before a batch stored at version is
// pushed: at once when the view says so, else by re-reading the online
// members from the store. False: the read failed and the batch must not
// be pushed. It runs on gid's worker (it may block on the store).
func (e *Engine) membersCurrent(gid, version int64) bool {
	if e.bus == nil || e.pres == nil || e.viewCurrent(gid, version) {
		return true
	}
	now := e.now().UnixNano()
	if v, ok := e.views.m.Load(gid); ok && now < v.(*memberView).retryAt.Load() {
		e.cfg.Metrics.memberReconcile("deferred", 0)
		return false
	}
	// A hole may be a lost addition too, which the re-read below cannot
	// see: the feed finds it. Only a re-read that runs kicks: a deferred
	// batch (the store failing) must not make the feed read once per batch.
	e.kickFeed()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.CommitTimeout)
	defer cancel()
	if e.reconcile(ctx, gid, version) {
		return true
	}
	v, _ := e.views.m.LoadOrStore(gid, new(memberView))
	v.(*memberView).retryAt.Store(now + int64(reconcileRetry))
	return false
}

// reconcile re-reads gid's members online here from the store and fixes
// their presence bits; on success the view is at least version.
func (e *Engine) reconcile(ctx context.Context, gid, version int64) bool {
	conns := e.pres.AppendConns(nil, gid)
	if len(conns) == 0 {
		e.raiseView(gid, version)
		return true
	}
	seen := make(map[string]struct{}, len(conns))
	uids := make([]string, 0, len(conns))
	for _, c := range conns {
		if _, dup := seen[c.UID()]; !dup {
			seen[c.UID()] = struct{}{}
			uids = append(uids, c.UID())
		}
	}
	gens := e.leaveGens()
	read := int64(-1)
	var members []store.Member
	for rest := uids; len(rest) > 0; {
		k := min(len(rest), reconcileChunk)
		ms, v, err := e.st.MembersOf(ctx, gid, rest[:k])
		if err != nil {
			e.cfg.Metrics.memberReconcile("failed", 0)
			e.logReconcileFailure(gid, err)
			return false
		}
		// Chunks are read one after another: the oldest version read is
		// the one every chunk reflects.
		if read < 0 || v < read {
			read = v
		}
		members = append(members, ms...)
		rest = rest[k:]
	}
	removed := 0
	for _, m := range members {
		delete(seen, m.UID)
	}
	for uid := range seen {
		e.pres.Leave(gid, uid)
		removed++
	}
	// Members re-joined as the store has them now: a member removed and
	// added again while the bus lost both has a new ordinal and join_seq
	// (joined makes them recent joiners at it).
	if err := e.joined(ctx, gid, members, &gens); err != nil {
		e.cfg.Metrics.memberReconcile("failed", removed)
		e.logReconcileFailure(gid, err)
		return false
	}
	e.cfg.Metrics.memberReconcile("ok", removed)
	if removed > 0 {
		e.cfg.Logger.Warn("membership repaired from the store: members removed on another node were still online here (the change was lost on the bus)",
			"gid", gid, "removed", removed, "member_version", read)
	}
	e.raiseView(gid, read)
	return read >= version
}

func (e *Engine) logReconcileFailure(gid int64, err error) {
	now := e.now().UnixNano()
	last := e.views.lastFail.Load()
	if now-last > int64(10*time.Second) && e.views.lastFail.CompareAndSwap(last, now) {
		e.cfg.Logger.Warn("membership re-read failed: the group's batches are not pushed here until it succeeds (clients pull)",
			"gid", gid, "err", err)
	}
}

// raiseView sets gid's view to at least version, creating it.
func (e *Engine) raiseView(gid, version int64) {
	v, _ := e.views.m.LoadOrStore(gid, new(memberView))
	mv := v.(*memberView)
	mv.used.Store(e.now().UnixNano())
	for {
		cur := mv.version.Load()
		if cur >= version || mv.version.CompareAndSwap(cur, version) {
			return
		}
	}
}

// sweepViews forgets the views unused for viewIdle; the controller calls
// it every tick, it works at most once a minute.
func (e *Engine) sweepViews(now time.Time) {
	last := e.views.lastSweep.Load()
	if now.UnixNano()-last < int64(time.Minute) || !e.views.lastSweep.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	cut := now.Add(-viewIdle).UnixNano()
	e.views.m.Range(func(k, v any) bool {
		if v.(*memberView).used.Load() < cut {
			e.views.m.Delete(k)
		}
		return true
	})
}

type addedKey struct {
	gid int64
	uid string
}

type pendingAdd struct {
	m   store.Member
	due time.Time
}

// memberFeed is the engine's reader of the store's feed of additions
// (cluster mode). cur and pending belong to the feed goroutine once ready
// is set; startMu orders the taking of the first cursor (startFeed).
type memberFeed struct {
	startMu  sync.Mutex
	ready    atomic.Bool
	cur      store.AddedCursor
	pending  map[addedKey]pendingAdd // found missing, repaired at due if still missing
	kick     chan struct{}           // cap 1: a read is due at once
	lastFail atomic.Int64            // unix nanoseconds of the last failure logged
}

// feedOn reports whether the engine follows the feed of additions: in
// cluster mode, with a presence index to repair.
func (e *Engine) feedOn() bool { return e.bus != nil && e.pres != nil }

// startFeed takes the feed's first cursor, once: before the first
// connect reads its memberships, so that every addition is either seen by
// a connect's read or by the feed. Any goroutine.
func (e *Engine) startFeed(ctx context.Context) error {
	if !e.feedOn() || e.feed.ready.Load() {
		return nil
	}
	e.feed.startMu.Lock()
	defer e.feed.startMu.Unlock()
	if e.feed.ready.Load() {
		return nil
	}
	_, c, err := e.st.MembersAdded(ctx, store.AddedCursor{}, 1)
	if err != nil {
		return err
	}
	e.feed.cur = c
	e.feed.ready.Store(true)
	return nil
}

// kickFeed asks for a read of the feed at once (something was lost).
// Never blocks.
func (e *Engine) kickFeed() {
	if e.feedOn() {
		select {
		case e.feed.kick <- struct{}{}:
		default:
		}
	}
}

// runFeed is the feed goroutine: it reads the feed every
// MemberFeedInterval or when kicked (no sooner than MemberFeedKickGap after the
// last read began), until stop.
func (e *Engine) runFeed(stop <-chan struct{}) {
	t := time.NewTicker(e.cfg.MemberFeedInterval)
	defer t.Stop()
	var last time.Time
	due := time.NewTimer(time.Hour)
	defer due.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		case <-due.C:
		case <-e.feed.kick:
			if wait := e.cfg.MemberFeedKickGap - time.Since(last); wait > 0 {
				w := time.NewTimer(wait)
				select {
				case <-stop:
					w.Stop()
					return
				case <-w.C:
				}
			}
		}
		last = time.Now()
		e.readFeed()
		e.repairDue(time.Now())
		due.Reset(e.nextDue(time.Now()))
	}
}

// nextDue is how long until the first pending addition is due (an hour
// when none is: the ticker reads before that).
func (e *Engine) nextDue(now time.Time) time.Duration {
	d := time.Hour
	for _, p := range e.feed.pending {
		d = min(d, max(p.due.Sub(now), time.Millisecond))
	}
	return d
}

// repairDue repairs the pending additions whose grace is over and that
// are still missing here; those of a group whose repair failed are tried
// again after reconcileRetry.
func (e *Engine) repairDue(now time.Time) {
	var ms []store.Member
	for k, p := range e.feed.pending {
		if now.Before(p.due) {
			continue
		}
		delete(e.feed.pending, k)
		if e.needsJoin(p.m) {
			ms = append(ms, p.m)
		}
	}
	for _, m := range e.repairAddedEach(ms) {
		e.feed.pending[addedKey{m.GID, m.UID}] = pendingAdd{m: m, due: now.Add(reconcileRetry)}
	}
}

// readFeed reads the feed up to now and repairs what it finds; a page
// whose read or repair failed is read again next time.
func (e *Engine) readFeed() {
	for !e.closing.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.CommitTimeout)
		if err := e.startFeed(ctx); err != nil {
			cancel()
			e.feedFailed(0, err)
			return
		}
		ms, next, err := e.st.MembersAdded(ctx, e.feed.cur, e.cfg.MemberFeedPage)
		cancel()
		if err != nil {
			e.feedFailed(0, err)
			return
		}
		if gid, err := e.repairAdded(e.deferAdded(ms, time.Now())); err != nil {
			e.feedFailed(gid, err)
			return
		}
		e.cfg.Metrics.memberFeed("ok", 0)
		e.feed.cur = next
		if len(ms) < e.cfg.MemberFeedPage {
			return
		}
	}
}

func (e *Engine) feedFailed(gid int64, err error) {
	e.cfg.Metrics.memberFeed("failed", 0)
	now := e.now().UnixNano()
	last := e.feed.lastFail.Load()
	if now-last > int64(10*time.Second) && e.feed.lastFail.CompareAndSwap(last, now) {
		e.cfg.Logger.Warn("membership feed read failed: additions lost on the bus are repaired once it succeeds",
			"gid", gid, "err", err)
	}
}

// deferAdded keeps the additions of ms missing here for their grace
// (MemberFeedGrace: their hint may be on its way) and returns those it has no
// room for, to be repaired at once.
func (e *Engine) deferAdded(ms []store.Member, now time.Time) []store.Member {
	var atOnce []store.Member
	if e.feed.pending == nil {
		e.feed.pending = map[addedKey]pendingAdd{}
	}
	for _, m := range ms {
		if !e.needsJoin(m) {
			continue
		}
		k := addedKey{m.GID, m.UID}
		if _, ok := e.feed.pending[k]; ok {
			e.feed.pending[k] = pendingAdd{m: m, due: e.feed.pending[k].due}
			continue
		}
		if len(e.feed.pending) >= e.cfg.MemberFeedPendingMax {
			atOnce = append(atOnce, m)
			continue
		}
		e.feed.pending[k] = pendingAdd{m: m, due: now.Add(e.cfg.MemberFeedGrace)}
	}
	return atOnce
}

// repairAddedEach is repairAdded of every group of ms, on past a group
// that fails; it returns the additions of the groups that failed.
func (e *Engine) repairAddedEach(ms []store.Member) []store.Member {
	byGID := map[int64][]store.Member{}
	for _, m := range ms {
		byGID[m.GID] = append(byGID[m.GID], m)
	}
	var failed []store.Member
	for _, cands := range byGID {
		if g, err := e.repairAdded(cands); err != nil {
			e.feedFailed(g, err)
			failed = append(failed, cands...)
		}
	}
	return failed
}

// repairAdded applies the additions of ms whose members are online here
// without their bit, group by group on the group's worker; it returns the
// first group that failed.
func (e *Engine) repairAdded(ms []store.Member) (int64, error) {
	var byGID map[int64][]store.Member
	for _, m := range ms {
		if e.needsJoin(m) {
			if byGID == nil {
				byGID = map[int64][]store.Member{}
			}
			byGID[m.GID] = append(byGID[m.GID], m)
		}
	}
	for gid, cands := range byGID {
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.CommitTimeout)
		err := e.onWorker(ctx, gid, func(ctx context.Context, _ int64) error { return e.repairGroup(ctx, gid, cands) })
		cancel()
		if err != nil {
			return gid, err
		}
	}
	return 0, nil
}

// needsJoin reports whether m's user is online here and m's bit is not
// set for it: the addition did not reach this node.
func (e *Engine) needsJoin(m store.Member) bool {
	if !e.pres.UserOnline(m.UID) {
		return false
	}
	uid, ok := e.pres.UIDOf(m.GID, m.Ordinal)
	return !ok || uid != m.UID
}

// repairGroup joins the candidates of gid that still need it, as the
// store holds them now, and sends their connections a resync up to the
// group's last seq. It runs on gid's worker.
func (e *Engine) repairGroup(ctx context.Context, gid int64, cands []store.Member) error {
	uids := make([]string, 0, len(cands))
	for _, m := range cands {
		if e.needsJoin(m) { // a hint may have come first
			uids = append(uids, m.UID)
		}
	}
	if len(uids) == 0 {
		return nil
	}
	gens := e.leaveGens()
	ms, _, err := e.st.MembersOf(ctx, gid, uids)
	if err != nil {
		return err
	}
	if len(ms) == 0 {
		return nil // removed since
	}
	if err := e.joined(ctx, gid, ms, &gens); err != nil {
		return err
	}
	e.cfg.Metrics.memberFeed("", len(ms))
	e.cfg.Logger.Warn("membership repaired from the store: members added on another node were online here without the group (the change was lost on the bus)",
		"gid", gid, "added", len(ms))
	if e.push == nil || e.levels.Effective(gid) > L2Summary {
		return nil // at L3 and L4 the members poll
	}
	g, err := e.st.Group(ctx, gid)
	if err != nil {
		return nil // joined: the group's next push shows them the gap
	}
	e.resyncJoined(gid, ms, g.LastSeq)
	return nil
}

// resyncJoined sends the connections of members of gid just joined here a
// resync up to lastSeq, when lastSeq is at or above their join_seq:
// messages they are owed were stored, or pushed here to the members as they
// were, before the join reached this node, and no later push may come to
// show them the gap. It runs on gid's worker, after joined.
func (e *Engine) resyncJoined(gid int64, ms []store.Member, lastSeq int64) {
	if e.push == nil || e.pres == nil || e.levels.Effective(gid) > L2Summary {
		return // at L3 and L4 the members poll
	}
	var owed map[string]struct{}
	for _, m := range ms {
		if m.JoinSeq <= lastSeq {
			if owed == nil {
				owed = make(map[string]struct{}, len(ms))
			}
			owed[m.UID] = struct{}{}
		}
	}
	if owed == nil {
		return
	}
	var conns []Conn
	for _, c := range e.pres.AppendConns(nil, gid) {
		if _, ok := owed[c.UID()]; ok {
			conns = append(conns, c)
		}
	}
	if len(conns) > 0 {
		e.egress.Add(int64(e.push.Push(&Push{GID: gid, Kind: PushResync, LastSeq: lastSeq, Conns: conns})))
	}
}

// memberVersion is the version an AddMembers call made (0: it added
// nobody).
func memberVersion(ms []store.Member) int64 {
	if len(ms) == 0 {
		return 0
	}
	return ms[0].MemberVersion
}

// AddMembers adds uids to gid through the group's worker, so that the new
// members' presence bits are set between batches, and returns the members.
// With a bus, the other nodes apply the change too (RemoteMembers).
func (e *Engine) AddMembers(ctx context.Context, gid int64, uids []string) ([]store.Member, error) {
	var ms []store.Member
	err := e.onWorker(ctx, gid, func(ctx context.Context, _ int64) error {
		var err error
		gens := e.leaveGens()
		ms, err = e.st.AddMembers(ctx, gid, uids)
		if err != nil {
			return err
		}
		if e.bus != nil {
			// On the worker, before any later commit of gid publishes:
			// the other nodes get the change ahead of the batches that
			// follow it (a drop is counted by the bus; the other nodes'
			// feeds of additions repair it).
			_ = e.bus.PublishMembers(gid, memberVersion(ms), false, ms)
		}
		if err := e.joined(ctx, gid, ms, &gens); err != nil {
			return err
		}
		e.applied(gid, memberVersion(ms))
		return e.emitMembers(ctx, hooks.EventJoin, gid, ms)
	})
	return ms, err
}

// leaveGens is a snapshot of every leave stripe's generation, taken
// before a store read whose members are then joined (joined).
type leaveGens [leaveStripes]uint64

// leaveGens returns the stripes' generations now.
func (e *Engine) leaveGens() (g leaveGens) {
	for i := range e.leaves {
		g[i] = e.leaves[i].gen.Load()
	}
	return g
}

// joined applies members just added to gid (on this node or another) to
// this node: their presence bits, gid's recent joiners (a batch committed
// before the join, still on its way, must not reach them) and the bus
// subscription. It runs on gid's worker. gens were taken before the store
// read that returned ms: a member whose stripe saw a removal since (one
// applied off the worker, RemoteMembers with a full queue, can run
// between that read and this join) is read again under the stripe, as a
// connect is (connectMemberships), so a removal is never undone by a
// join of what was read before it.
func (e *Engine) joined(ctx context.Context, gid int64, ms []store.Member, gens *leaveGens) error {
	online := false
	for _, m := range ms {
		if e.pres == nil {
			e.addJoiner(gid, m.UID, m.JoinSeq)
			continue
		}
		i := maphash.String(e.seed, m.UID) % leaveStripes
		ls := &e.leaves[i]
		ls.mu.RLock()
		if ls.gen.Load() != gens[i] {
			cur, err := e.st.Member(ctx, gid, m.UID)
			if errors.Is(err, store.ErrNotMember) {
				ls.mu.RUnlock()
				continue // removed since the read
			}
			if err != nil {
				ls.mu.RUnlock()
				return err
			}
			m = cur
		}
		e.addJoiner(gid, m.UID, m.JoinSeq)
		err := e.pres.Join(gid, m.UID, m.Ordinal)
		ls.mu.RUnlock()
		if err != nil {
			return err
		}
		online = online || e.pres.UserOnline(m.UID)
	}
	if e.bus != nil && online {
		_ = e.bus.Subscribe(gid)
	}
	return nil
}

// left applies members removed from gid (on this node or another) to this
// node: their presence bits are cleared, so no push collected afterwards
// reaches them. The bus drops gid at its next presence sweep if nobody is
// left online here.
func (e *Engine) left(gid int64, ms []store.Member) {
	if e.pres == nil {
		return
	}
	for _, m := range ms {
		ls := e.leaveStripe(m.UID)
		ls.mu.Lock()
		ls.gen.Add(1)
		e.pres.Leave(gid, m.UID)
		ls.mu.Unlock()
	}
}

// RemoveMember removes uid from gid through the group's worker: nothing
// committed after this returns is pushed to uid, on this node or (with a
// bus, once the change reached them) on the others.
func (e *Engine) RemoveMember(ctx context.Context, gid int64, uid string) error {
	return e.onWorker(ctx, gid, func(ctx context.Context, _ int64) error {
		m, err := e.st.RemoveMember(ctx, gid, uid)
		if err != nil {
			return err
		}
		ms := []store.Member{{GID: gid, UID: uid, Ordinal: m.Ordinal}}
		if e.bus != nil {
			_ = e.bus.PublishMembers(gid, m.MemberVersion, true, ms)
		}
		e.left(gid, ms)
		e.applied(gid, m.MemberVersion)
		return e.emitMembers(ctx, hooks.EventLeave, gid, ms)
	})
}

// onWorker runs fn on gid's worker between batches and waits for it.
func (e *Engine) onWorker(ctx context.Context, gid int64, fn func(ctx context.Context, seen int64) error) error {
	done := make(chan error, 1)
	t := taskPool.Get().(*task)
	t.kind = taskFunc
	t.gid = gid
	t.fn = fn
	t.fnDone = done
	t.enq = time.Now()
	// Membership changes are rare admin operations: they are not refused
	// by the send bound but wait for room, without holding routeMu while
	// waiting (a move needs it).
	for {
		e.routeMu.RLock()
		ok, err := e.route(gid).tryEnqueueControl(t)
		e.routeMu.RUnlock()
		if err != nil {
			t.reset()
			taskPool.Put(t)
			return err
		}
		if ok {
			break
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			t.reset()
			taskPool.Put(t)
			return ctx.Err()
		}
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
