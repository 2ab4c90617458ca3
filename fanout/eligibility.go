// This file holds who may receive a push and who may spend a group's
// limits: recent joiners (cut on every push path, deliver.go), the stripes
// ordering connects against removals (connect.go), and the sender check
// admission runs before counting a send (admission.go).

package fanout

import (
	"context"
	"errors"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// Who may receive a push and who may spend a group's limits: the recent
// joiners whose pushes are cut at their own join_seq on every push path,
// the stripes that order a connect's membership read against removals,
// and the senders' membership cache that refuses non-members before any
// group limit counts them.

// joinerGrace is how long a recent joiner stays in its group's set after
// this node pushed a seq at or above its join_seq: a batch committed
// before the join, on another node, may still be on its way here (the bus
// drops payloads queued past its MaxDelay, 5 s by default).
const joinerGrace = time.Minute

// joinerSweep is how often a group's pushes walk its whole set of recent
// joiners when none of them can be cut by the push (the common case): to
// note which ones a push reached and drop the expired. Between walks a
// push costs one comparison, however many joiners the set holds (a
// membership re-read makes every member online here one).
const joinerSweep = joinerGrace / 4

// joiner is a member of a group whose join_seq this node may still have to
// cut pushes at.
type joiner struct {
	uid    string
	seq    int64 // join_seq
	passed int64 // engine clock (unix ns) when a push first reached seq; 0 = not yet
}

// joiners is one group's recent joiners (Engine.joiners). Only the
// group's pushes (on its worker) drop entries; joined and connects add
// them from any goroutine.
type joiners struct {
	mu      sync.Mutex
	m       map[string]joiner // by uid
	maxSeq  int64             // the highest join_seq in m (a bound: may be stale-high between sweeps)
	sweptAt int64             // engine clock of the last walk of m
	dead    bool              // deleted from Engine.joiners: an add goes to a new set
}

// addJoiner records that uid, a member of gid since seq (its join_seq),
// may get gid's pushes from now on: every push of gid cuts what it sends
// to uid's connections at seq until a push reached seq joinerGrace ago.
// Any goroutine; call it before uid's presence bit is set.
func (e *Engine) addJoiner(gid int64, uid string, seq int64) {
	if seq <= 0 {
		return
	}
	for {
		v, ok := e.joiners.Load(gid)
		if !ok {
			v, _ = e.joiners.LoadOrStore(gid, &joiners{m: map[string]joiner{}})
		}
		js := v.(*joiners)
		js.mu.Lock()
		if js.dead {
			js.mu.Unlock()
			continue
		}
		if j, ok := js.m[uid]; !ok || j.seq < seq { // new, or removed and added again
			js.m[uid] = joiner{uid: uid, seq: seq}
			js.maxSeq = max(js.maxSeq, seq)
		}
		js.mu.Unlock()
		return
	}
}

// recent appends to dst the joiners of js above low (who must not get the
// push's messages below their join_seq), sorted by uid for joinSeqOf. When
// none can be above low it returns at once, but every joinerSweep it walks
// the set: it notes the joiners a push reached (lastSeq), drops those
// reached more than joinerGrace before now, and the set leaves
// Engine.joiners when it empties. It runs on gid's worker.
func (e *Engine) recent(dst []joiner, gid int64, js *joiners, low, lastSeq, now int64) []joiner {
	js.mu.Lock()
	defer js.mu.Unlock()
	if low >= js.maxSeq && now-js.sweptAt < int64(joinerSweep) {
		return dst
	}
	js.sweptAt = now
	js.maxSeq = 0
	for uid, j := range js.m {
		if j.passed == 0 && j.seq <= lastSeq {
			j.passed = now
			js.m[uid] = j
		}
		if j.passed != 0 && now-j.passed > int64(joinerGrace) {
			delete(js.m, uid)
			continue
		}
		js.maxSeq = max(js.maxSeq, j.seq)
		if j.seq > low {
			dst = append(dst, j)
		}
	}
	if len(js.m) == 0 {
		js.dead = true
		e.joiners.CompareAndDelete(gid, js)
	}
	slices.SortFunc(dst, func(a, b joiner) int { return strings.Compare(a.uid, b.uid) })
	return dst
}

// joinSeqOf is uid's join_seq among rel (sorted by uid, as recent returns
// it), 0 when uid is not in it.
func joinSeqOf(rel []joiner, uid string) int64 {
	if i, ok := slices.BinarySearchFunc(rel, uid, func(j joiner, uid string) int { return strings.Compare(j.uid, uid) }); ok {
		return rel[i].seq
	}
	return 0
}

// cutBelow returns msgs without the messages below floor. When those form
// a prefix (a commit's or a bus batch's messages, in seq order) it returns
// a subslice and leaves msgs as they are: the caller may still publish
// them. Otherwise (a merge window mixing several nodes' batches) it
// compacts msgs in place.
func cutBelow(msgs []store.Message, floor int64) []store.Message {
	i := 0
	for i < len(msgs) && msgs[i].Seq < floor {
		i++
	}
	rest := msgs[i:]
	for j := range rest {
		if rest[j].Seq < floor {
			n := j
			for _, m := range rest[j+1:] {
				if m.Seq >= floor {
					rest[n] = m
					n++
				}
			}
			clear(rest[n:]) // drop body references
			return rest[:n]
		}
	}
	return rest
}

// leaveStripes is the number of stripes ordering connects against
// removals (by uid).
const leaveStripes = 64

// leaveStripe orders the removals of its uids against their connects: a
// removal bumps gen and clears the member's bits under mu; a connect reads
// its memberships, then, holding mu for reading, reads them again if gen
// moved meanwhile, and registers its bits. So a membership read before a
// removal never sets a bit after the removal's Leave (it would receive the
// group's pushes until the connect's second read).
type leaveStripe struct {
	mu  sync.RWMutex
	gen atomic.Uint64
	_   [40]byte // keep stripes on separate cache lines
}

func (e *Engine) leaveStripe(uid string) *leaveStripe {
	return &e.leaves[maphash.String(e.seed, uid)%leaveStripes]
}

// connectMemberships reads uid's memberships for a connect and calls
// register (which sets the presence bits) so that no removal committed
// after the read has cleared its bits before register ran: the read is
// repeated under the stripe when a removal of a uid of the stripe ran
// during it.
func (e *Engine) connectMemberships(ctx context.Context, uid string, register func([]store.Member) error) ([]store.Member, error) {
	ls := e.leaveStripe(uid)
	gen := ls.gen.Load()
	ms, err := e.st.UserGroups(ctx, uid)
	if err != nil {
		return nil, err
	}
	ls.mu.RLock()
	defer ls.mu.RUnlock()
	if ls.gen.Load() != gen {
		if ms, err = e.st.UserGroups(ctx, uid); err != nil {
			return nil, err
		}
	}
	return ms, register(ms)
}

// senderState is what the store said of one sender of a group: nil (a
// member who may send), store.ErrNotMember or store.ErrMuted.
type senderState struct {
	err error
	at  time.Time // engine clock
}

// memberRetry is how long a worker admits sends unchecked (the store
// decides at commit) after a membership lookup failed.
const memberRetry = 5 * time.Second

// checkSender refuses a send from a non-member or a muted member of a
// group whose limits or triggers would count it (large and hot groups, and
// @all under a quota) before they do, with the store's own error. Other
// sends are checked by Append alone. Answers are cached per group
// (Config.MemberCache, for Config.MemberCacheTTL); a membership change on
// the group's worker clears the group's cache (runFunc), and a rejection
// by Append replaces a cached answer. While lookups fail the send passes:
// Append still refuses it, only the count is lost.
func (s *shard) checkSender(gs *gstate, t *task, now time.Time) error {
	cfg := &s.e.cfg
	if cfg.MemberCache < 0 {
		return nil
	}
	atAll := t.send.Kind == store.KindAtAll && s.tn.AtAllPerDay > 0
	if !gs.hot && !atAll && !s.large(gs) {
		return nil
	}
	uid := t.send.UID
	if v, ok := gs.senders[uid]; ok && now.Sub(v.at) < cfg.MemberCacheTTL {
		return v.err
	}
	if now.UnixNano() < s.e.memberDownUntil.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.CommitTimeout)
	m, err := s.e.st.Member(ctx, gs.gid, uid)
	cancel()
	switch {
	case err == nil && m.Muted:
		err = store.ErrMuted
	case err == nil, errors.Is(err, store.ErrNotMember):
	default:
		s.e.memberDownUntil.Store(now.Add(memberRetry).UnixNano())
		cfg.Logger.Warn("sender membership lookup failed: sends pass unchecked until the store answers (Append still checks them)",
			"gid", gs.gid, "err", err, "retry_in", memberRetry)
		return nil
	}
	s.noteSender(gs, uid, err, now)
	return err
}

// noteSender caches err (nil, store.ErrNotMember or store.ErrMuted) for
// uid in gs, evicting an arbitrary entry when the cache is full.
func (s *shard) noteSender(gs *gstate, uid string, err error, now time.Time) {
	if gs.senders == nil {
		gs.senders = make(map[string]senderState)
	}
	if _, ok := gs.senders[uid]; !ok && len(gs.senders) >= s.e.cfg.MemberCache {
		for k := range gs.senders {
			delete(gs.senders, k)
			break
		}
	}
	gs.senders[uid] = senderState{err: err, at: now}
}

// refuseSender answers a send checkSender refused.
func (s *shard) refuseSender(t *task, err error) {
	s.e.cfg.Metrics.sends(1, "forbidden")
	t.send.Done(SendResult{Err: err})
	releaseTask(t)
}
