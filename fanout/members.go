package fanout

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// Membership repair in cluster mode.
//
// A membership change committed on one node reaches the others as a hint
// on the bus, which may lose it (Redis down, a full outbox or inbox, a
// node dying between commit and publish). A lost addition costs pushes;
// a lost removal would let the removed member, online on another node,
// receive what the group says next. So the store's truth is checked on
// every push path by version, at the cost of one atomic load per batch:
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
	if err := e.joined(gid, members); err != nil {
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

// memberVersion is the version an AddMembers call made (0: it added
// nobody).
func memberVersion(ms []store.Member) int64 {
	if len(ms) == 0 {
		return 0
	}
	return ms[0].MemberVersion
}
