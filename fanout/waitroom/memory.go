package waitroom

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"
)

// MemoryConfig configures the in-process backend.
type MemoryConfig struct {
	// Clock is the backend's only clock (nil = time.Now). Tests and the
	// simulation inject a virtual one.
	Clock func() time.Time
}

// Memory is the in-process Backend: embedded mode and the Redis-down
// fallback. It implements the same semantics as the Redis scripts, with
// one mutex per backend (every operation is atomic, as a script is).
// Opened on a Journal (OpenMemory) it is durable: every operation writes
// what it changed before it returns.
type Memory struct {
	clock func() time.Time
	j     Journal // nil = not durable

	mu      sync.Mutex
	rooms   map[string]*memRoom
	configs map[string]RoomConfig
}

var _ Backend = (*Memory)(nil)

// NewMemory returns an empty in-process backend that keeps nothing across
// restarts (the Redis-down fallback, tests); see OpenMemory for a durable one.
func NewMemory(cfg MemoryConfig) *Memory {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return &Memory{clock: cfg.Clock, rooms: make(map[string]*memRoom), configs: make(map[string]RoomConfig)}
}

type memEntry struct {
	level    int
	state    EntryState
	join     int64
	first    int64
	bias     float64
	score    float64
	away     int64
	admitted int64
	expires  int64
	// node lists the nodes holding the user (holders.go), the one that
	// entered it last first; "" = none.
	node string
	// seq orders the promises of the max-wait guarantee (doc.go): for a
	// normal user, when it became owed an admission (entry); for a VIP,
	// when its slack was last set (entry, decayed return, the start).
	seq int64
	// slack is the entry's key in the slack index (waiting, away and
	// pre-queue entries): its promised spare admissions plus the room's pass
	// count when the promise was made (doc.go, "Max-wait guarantee").
	slack int64
}

type memRoom struct {
	entries map[string]*memEntry
	q       *ostree // waiting: score
	j       *ostree // waiting: join
	away    *ostree // away: away since
	active  *ostree // active: expires
	smooth  *ostree // smoothing VIPs: join
	qv      *ostree // waiting VIPs: score
	qn      *ostree // waiting normal users: score (the quota's best normal)
	jv      *ostree // waiting VIPs: seq (the quota's oldest VIP promise)
	sl      *ostree // waiting, away and pre-queue users: slack key
	pre     *ostree // pre-queue of a scheduled room: shuffle key
	// byTier counts the waiting users of each tier; kept with q by
	// insertWaiting, unqueue and restore, the only places q gains or
	// loses a member.
	byTier [MaxTier + 1]int64

	// The admission quota's counts of VIP and normal admissions in the
	// current contention (see RoomConfig.VIPAdmitShare).
	shareV, shareN float64

	tokens   float64
	tokenTS  int64 // µs; 0 = bucket never used
	adm      map[int64]int64
	rate     float64
	lmax     int64
	lmaxSet  bool
	placeSeq int64
	places   []Placement
	// passes counts the VIP entries given a bias while others were owed
	// admissions; viol the admissions that broke the max-wait promise;
	// preN and preAt the pre-queue's size and the room clock when the
	// start moved it into the queue (0 = not started).
	passes, viol int64
	preN, preAt  int64
	// oseq is the last entry seq handed out (memEntry.seq).
	oseq  int64
	nodes map[string]int64               // node -> last heartbeat
	owned map[string]map[string]struct{} // node -> uids whose socket it holds

	// dirty are the uids whose entries changed since the last journal
	// write, metaDirty whether the fields above did; nil / unused when the
	// backend has no Journal.
	dirty     map[string]struct{}
	metaDirty bool
}

func newMemRoom() *memRoom {
	return &memRoom{
		entries: make(map[string]*memEntry),
		q:       newOSTree(), j: newOSTree(), away: newOSTree(), active: newOSTree(), smooth: newOSTree(), qv: newOSTree(),
		qn: newOSTree(), jv: newOSTree(), sl: newOSTree(), pre: newOSTree(),
		adm: make(map[int64]int64), nodes: make(map[string]int64), owned: make(map[string]map[string]struct{}),
	}
}

func (m *Memory) roomLocked(name string) *memRoom {
	r := m.rooms[name]
	if r == nil {
		r = newMemRoom()
		if m.j != nil {
			r.dirty = make(map[string]struct{})
		}
		m.rooms[name] = r
	}
	return r
}

// touch records that uid's entry changed (or went). Every change of an
// entry passes through own, insertWaiting, unqueue, rescore or remove,
// which call it.
func (r *memRoom) touch(uid string) {
	if r.dirty != nil {
		r.dirty[uid] = struct{}{}
	}
}

func (m *Memory) now() (sec, usec int64) {
	t := m.clock()
	return t.Unix(), t.UnixMicro()
}

// secOf is t in Unix seconds, or def for the zero time.
func secOf(t time.Time, def int64) int64 {
	if t.IsZero() {
		return def
	}
	return t.Unix()
}

func unix(s int64) time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(s, 0)
}

func (r *memRoom) entryOf(uid string, e *memEntry) Entry {
	out := Entry{
		UID: uid, Tier: e.level, State: e.state,
		Join: unix(e.join), First: unix(e.first), Bias: e.bias, Score: e.score,
		Admitted: unix(e.admitted), Expires: unix(e.expires), Node: firstHolder(e.node),
	}
	switch e.state {
	case EntryAway:
		out.AwaySince = unix(e.away)
	case EntryWaiting, EntryActive:
		out.Back = unix(e.away)
	case EntryScheduled:
		out.Score = 0 // the shuffle key is never shown
	}
	return out
}

// own records that node holds uid's socket, besides the nodes already
// holding it, as the one that entered it last ("" = none tracked: no
// change).
func (r *memRoom) own(uid string, e *memEntry, node string, now int64) {
	r.touch(uid)
	if node == "" {
		return
	}
	e.node = withHolder(e.node, node)
	set := r.owned[node]
	if set == nil {
		set = make(map[string]struct{})
		r.owned[node] = set
	}
	set[uid] = struct{}{}
	if _, ok := r.nodes[node]; !ok {
		r.nodes[node] = now // a node that dies before its first heartbeat is still swept
	}
}

// disown records that node no longer holds uid; false when it did not.
func (r *memRoom) disown(uid string, e *memEntry, node string) bool {
	rest, ok := withoutHolder(e.node, node)
	if !ok {
		return false
	}
	r.touch(uid)
	e.node = rest
	delete(r.owned[node], uid)
	return true
}

// disownAll records that no node holds uid.
func (r *memRoom) disownAll(uid string, e *memEntry) {
	if e.node == "" {
		return
	}
	r.touch(uid)
	eachHolder(e.node, func(n string) { delete(r.owned[n], uid) })
	e.node = ""
}

// nextSeq hands out the next entry seq (memEntry.seq).
func (r *memRoom) nextSeq() int64 {
	r.oseq++
	r.metaDirty = true
	return r.oseq
}

func (r *memRoom) place(now int64, lo, hi float64) {
	r.metaDirty = true
	r.placeSeq++
	r.places = append(r.places, Placement{Seq: r.placeSeq, At: unix(now), Lo: lo, Hi: hi})
	if len(r.places) > PlacementLog {
		n := copy(r.places, r.places[len(r.places)-PlacementLog:])
		r.places = r.places[:n]
	}
}

// removeLocked deletes uid from every index and the entry table.
func (r *memRoom) remove(uid string, e *memEntry) {
	r.touch(uid)
	switch e.state {
	case EntryWaiting:
		r.unqueue(uid, e)
	case EntryAway:
		r.away.Delete(float64(e.away), uid)
	case EntryActive:
		r.active.Delete(float64(e.expires), uid)
	case EntryScheduled:
		r.pre.Delete(e.score, uid)
	}
	if e.state != EntryActive && e.state != EntryScheduled {
		r.sl.Delete(float64(e.slack), uid)
	}
	r.smooth.Delete(float64(e.join), uid)
	eachHolder(e.node, func(n string) { delete(r.owned[n], uid) })
	delete(r.entries, uid)
}

func (r *memRoom) endSession(room, uid string, e *memEntry, reason EndReason, now int64) *SessionEnd {
	end := &SessionEnd{Room: room, UID: uid, Tier: e.level, Reason: reason,
		First: unix(e.first), Admitted: unix(e.admitted), Ended: unix(now)}
	r.remove(uid, e)
	return end
}

func (r *memRoom) insertWaiting(uid string, e *memEntry) {
	r.touch(uid)
	e.state = EntryWaiting
	r.q.Insert(e.score, uid)
	r.j.Insert(float64(e.join), uid)
	r.byTier[e.level]++
	if e.level > 0 {
		r.qv.Insert(e.score, uid)
		r.jv.Insert(float64(e.seq), uid)
	} else {
		r.qn.Insert(e.score, uid)
	}
}

// unqueue takes a waiting user out of the queue indexes. When that leaves
// a class with nobody waiting, the contention is over: the quota's counts
// start from zero.
func (r *memRoom) unqueue(uid string, e *memEntry) {
	r.touch(uid)
	r.metaDirty = true // the quota's counts may start over
	r.q.Delete(e.score, uid)
	r.j.Delete(float64(e.join), uid)
	r.byTier[e.level]--
	if e.level > 0 {
		r.qv.Delete(e.score, uid)
		r.jv.Delete(float64(e.seq), uid)
	} else {
		r.qn.Delete(e.score, uid)
	}
	if nv := r.qv.Len(); nv == 0 || nv == r.q.Len() {
		r.shareV, r.shareN = 0, 0
	}
}

// rescore moves a waiting user to score ns.
func (r *memRoom) rescore(uid string, e *memEntry, ns float64) {
	r.touch(uid)
	r.q.Delete(e.score, uid)
	if e.level > 0 {
		r.qv.Delete(e.score, uid)
		r.qv.Insert(ns, uid)
	} else {
		r.qn.Delete(e.score, uid)
		r.qn.Insert(ns, uid)
	}
	e.score = ns
	r.q.Insert(ns, uid)
}

// smoothScore is the score of a VIP fraction frac of the way to its target.
func smoothScore(join int64, bias, frac float64) float64 {
	return roundMilli(float64(ScoreFactor*float64(join)) + float64(bias*frac))
}

func smoothFrac(cfg *RoomConfig, join, now int64) float64 {
	if cfg.ImmediateInsertion() {
		return 1
	}
	s := math.Floor(cfg.Smoothing.Seconds())
	if s <= 0 {
		return 1
	}
	return math.Min(1, float64(now-join)/s)
}

func maxWaitS(cfg *RoomConfig) int64 { return int64(cfg.MaxWait / time.Second) }

// ahead counts the users that will be admitted before uid: every overdue
// user older than it when it is overdue itself; otherwise every user with
// a lower key plus every overdue user with a higher key.
//
// od is the overdue users' keys sorted ascending (overdueKeys), built once
// per call and shared by every user of a snapshot.
func (r *memRoom) ahead(cfg *RoomConfig, uid string, e *memEntry, now int64, od *[]osKey) int64 {
	cutoff := now - maxWaitS(cfg)
	if e.join <= cutoff {
		return int64(r.j.CountBelow(float64(e.join), uid))
	}
	n := r.q.CountBelow(e.score, uid)
	if cfg.QuotaOn() {
		v, nv := r.qv.CountBelow(e.score, uid), r.qv.Len()
		n = int(QuotaAhead(e.level > 0, int64(v), int64(n-v), int64(r.q.Len()-nv), cfg.VIPAdmitShare))
	}
	if *od == nil {
		*od = r.overdueKeys(cutoff)
	}
	keys := *od
	i := sort.Search(len(keys), func(i int) bool { return less(e.score, uid, keys[i].score, keys[i].uid) })
	return int64(n + len(keys) - i)
}

type osKey struct {
	score float64
	uid   string
}

// overdueKeys returns the overdue users' queue keys, sorted; non-nil.
func (r *memRoom) overdueKeys(cutoff int64) []osKey {
	keys := make([]osKey, 0, 8)
	r.j.Ascend(func(js float64, u string) bool {
		if int64(js) > cutoff {
			return false
		}
		keys = append(keys, osKey{r.entries[u].score, u})
		return true
	})
	sort.Slice(keys, func(i, j int) bool { return less(keys[i].score, keys[i].uid, keys[j].score, keys[j].uid) })
	return keys
}

func (r *memRoom) oldestWait(now int64) int64 {
	if js, _, ok := r.j.Min(); ok {
		return now - int64(js)
	}
	return 0
}

func (r *memRoom) window(now int64) (count, oldest int64) {
	oldest = now
	for s, c := range r.adm {
		if s <= now-RateWindow {
			continue
		}
		count += c
		oldest = min(oldest, s)
	}
	return count, oldest
}

func (r *memRoom) currentLMax(cfg *RoomConfig, now int64) int64 {
	if r.lmaxSet {
		return r.lmax
	}
	return lmax(cfg, 0, 0, 0, 0)
}

// Enter implements Backend.
func (m *Memory) Enter(ctx context.Context, cfg *RoomConfig, req EnterRequest) (_ EnterResult, err error) {
	if err := ctx.Err(); err != nil {
		return EnterResult{}, err
	}
	if !ValidNode(req.Node) {
		return EnterResult{}, fmt.Errorf("waitroom: bad node name %q", req.Node)
	}
	now, _ := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.roomLocked(cfg.Name)
	defer m.persistLocked(cfg.Name, r, &err)
	r.startIfDue(cfg, now)
	res := EnterResult{Now: unix(now)}
	uid := req.UID
	if e := r.entries[uid]; e != nil && req.Restore != nil && req.Restore.Active && e.state != EntryActive {
		r.remove(uid, e) // admitted elsewhere (on a fallback): no longer queued
	}
	if e := r.entries[uid]; e != nil {
		switch e.state {
		case EntryActive:
			if e.expires > now {
				if req.Node != "" && req.Node != firstHolder(e.node) {
					r.own(uid, e, req.Node, now)
				}
				res.Status = EnterActive
				res.Entry = r.entryOf(uid, e)
				res.Waiting = int64(r.q.Len())
				res.PlacementSeq = r.placeSeq
				return res, nil
			}
			res.Ended = r.endSession(cfg.Name, uid, e, EndExpired, now)
		case EntryScheduled:
			if req.Node != "" && req.Node != firstHolder(e.node) {
				r.own(uid, e, req.Node, now)
			}
			if e.away != 0 { // back before the start
				e.away = 0
				r.touch(uid)
			}
			res.Status = EnterExisting
			res.Entry = r.entryOf(uid, e)
			res.Waiting, res.PreQueue = int64(r.q.Len()), int64(r.pre.Len())
			res.PlacementSeq = r.placeSeq
			return res, nil
		case EntryWaiting:
			if req.Node != "" && req.Node != firstHolder(e.node) {
				r.own(uid, e, req.Node, now)
			}
			res.Status = EnterExisting
			res.Entry = r.entryOf(uid, e)
			res.Ahead = r.ahead(cfg, uid, e, now, new([]osKey))
			res.Waiting = int64(r.q.Len())
			res.PlacementSeq = r.placeSeq
			return res, nil
		case EntryAway:
			away := now - e.away
			if away <= int64(cfg.HardTimeout/time.Second) {
				r.away.Delete(float64(e.away), uid)
				res.Status = EnterRestored
				if g := int64(cfg.Grace / time.Second); away > g {
					delta := int64(math.Floor(float64(away-g) * cfg.DecayRate))
					// The max-wait promise: a decayed join is never so early
					// that its deadline leaves no room for everyone owed.
					ow := r.owed()
					fit := min(now-maxWaitS(cfg)+1+int64(math.Ceil(float64(ow+1)/GuaranteeRate(cfg))), now)
					if delta > 0 && fit-e.join > delta {
						delta = fit - e.join
					}
					if delta > 0 {
						smoothing := r.smooth.Delete(float64(e.join), uid)
						e.join += delta
						e.score = roundMilli(e.score + float64(ScoreFactor*float64(delta)))
						if smoothing {
							r.smooth.Insert(float64(e.join), uid)
						}
						// A new deadline, with everyone now owed ahead of it
						// (for a VIP, a new promise: doc.go).
						if e.level > 0 {
							e.seq = r.nextSeq()
						}
						r.sl.Delete(float64(e.slack), uid)
						e.slack = slackAt(cfg, e.join+maxWaitS(cfg)-1-now, ow) + r.passes
						r.sl.Insert(float64(e.slack), uid)
					}
					res.Status = EnterDecayed
				}
				e.away = now // in a waiting entry: back since
				r.own(uid, e, req.Node, now)
				r.insertWaiting(uid, e)
				res.Entry = r.entryOf(uid, e)
				res.Ahead = r.ahead(cfg, uid, e, now, new([]osKey))
				res.Waiting = int64(r.q.Len())
				res.PlacementSeq = r.placeSeq
				return res, nil
			}
			r.remove(uid, e) // past the hard timeout: start over
		}
	}

	level := clampTier(req.Tier)
	if rs := req.Restore; rs != nil {
		e := &memEntry{level: level, join: min(secOf(rs.Join, now), now), first: min(secOf(rs.First, 0), now), bias: rs.Bias}
		if e.first == 0 || e.first > e.join {
			e.first = e.join
		}
		if rs.Active {
			e.state = EntryActive
			e.admitted, e.expires = secOf(rs.Admitted, now), secOf(rs.Expires, now)
			e.score = Score(e.join, e.bias)
			r.entries[uid] = e
			r.own(uid, e, req.Node, now)
			r.active.Insert(float64(e.expires), uid)
			res.Status = EnterActive
			res.Entry = r.entryOf(uid, e)
			res.Waiting = int64(r.q.Len())
			res.PlacementSeq = r.placeSeq
			return res, nil
		}
		frac := 1.0
		if e.bias < 0 {
			frac = smoothFrac(cfg, e.join, now)
		}
		e.score = smoothScore(e.join, e.bias, frac)
		e.slack = slackAt(cfg, e.join+maxWaitS(cfg)-1-now, r.owed()) + r.passes
		e.seq = r.nextSeq()
		r.entries[uid] = e
		r.own(uid, e, req.Node, now)
		r.insertWaiting(uid, e)
		r.sl.Insert(float64(e.slack), uid)
		if frac < 1 {
			r.smooth.Insert(float64(e.join), uid)
		}
		res.Status = EnterQueued
		res.Entry = r.entryOf(uid, e)
		res.Ahead = r.ahead(cfg, uid, e, now, new([]osKey))
		res.Waiting = int64(r.q.Len())
		res.PlacementSeq = r.placeSeq
		return res, nil
	}

	waiting := int64(r.q.Len())
	res.Waiting, res.PreQueue = waiting, int64(r.pre.Len())
	phase := cfg.PhaseAt(now)
	if cfg.State == StateClosed || phase == PhaseEnded {
		res.Status, res.Reject = EnterRejected, RejectRoomClosed
		return res, nil
	}
	if lm := r.currentLMax(cfg, now); waiting >= lm && phase != PhaseScheduled {
		res.Status, res.Reject = EnterRejected, RejectRoomFull
		res.RetryAfter = RetryAfter(cfg, waiting, lm, r.rate)
		return res, nil
	}
	// The max-wait guarantee: everyone owed an admission may be admitted
	// before this entrant; a normal entrant leaves VIPReserve for VIPs who
	// may still pass it.
	owed := r.owed()
	slack := slackAt(cfg, maxWaitS(cfg)-1, owed)
	if need := entryReserve(cfg, level); slack < need {
		res.Status, res.Reject = EnterRejected, RejectRoomFull
		res.RetryAfter = FullRetry(cfg, need-slack)
		return res, nil
	}
	if phase == PhaseScheduled {
		e := &memEntry{level: level, state: EntryScheduled, join: cfg.StartS(), first: now, score: ShuffleKey(), seq: r.nextSeq()}
		r.entries[uid] = e
		r.touch(uid)
		r.own(uid, e, req.Node, now)
		r.pre.Insert(e.score, uid)
		res.Status = EnterQueued
		res.Entry = r.entryOf(uid, e)
		res.PreQueue = int64(r.pre.Len())
		res.PlacementSeq = r.placeSeq
		return res, nil
	}
	e := &memEntry{level: level, join: now, first: now}
	if level > 0 {
		e.bias = cfg.Bias(level)
		if waiting > 0 && e.bias < 0 {
			if share := float64(r.qv.Len()) / float64(waiting); share > cfg.VIPShareCap {
				e.bias = roundMilli(float64(e.bias*cfg.VIPShareCap) / share)
			}
		}
		// A VIP passes the users owed admissions only while every one of
		// them can spare one more; otherwise it queues without a head start.
		if e.bias < 0 && owed > 0 {
			if r.minSlack() < 1 {
				e.bias = 0
			} else {
				r.passes++
				r.metaDirty = true
			}
		}
	}
	e.slack = slack + r.passes
	e.seq = r.nextSeq()
	frac := 1.0
	if e.bias < 0 {
		frac = smoothFrac(cfg, now, now)
	}
	e.score = smoothScore(now, e.bias, frac)
	r.entries[uid] = e
	r.own(uid, e, req.Node, now)
	r.insertWaiting(uid, e)
	r.sl.Insert(float64(e.slack), uid)
	if frac < 1 {
		r.smooth.Insert(float64(now), uid)
	}
	if e.bias < 0 {
		r.place(now, e.score, math.Inf(1))
	}
	res.Status = EnterQueued
	res.Entry = r.entryOf(uid, e)
	res.Ahead = r.ahead(cfg, uid, e, now, new([]osKey))
	res.Waiting = int64(r.q.Len())
	res.PlacementSeq = r.placeSeq
	return res, nil
}

// Disconnect implements Backend.
func (m *Memory) Disconnect(ctx context.Context, cfg *RoomConfig, uid, node string) (Departure, error) {
	return m.depart(ctx, cfg, uid, func(r *memRoom, e *memEntry, d *Departure, now int64) {
		if node != "" && e.node != "" {
			r.disown(uid, e, node)
			if e.node != "" { // another node holds the user
				d.Held = true
				return
			}
		}
		r.disownAll(uid, e)
		switch e.state {
		case EntryWaiting:
			r.unqueue(uid, e)
			e.state, e.away = EntryAway, now
			r.away.Insert(float64(now), uid)
		case EntryScheduled: // stays in the pre-queue; away from the start if not back by then
			r.touch(uid)
			e.away = now
		case EntryActive:
			d.Ended = r.endSession(cfg.Name, uid, e, EndDisconnect, now)
		}
	})
}

// Holds implements Backend.
func (m *Memory) Holds(ctx context.Context, cfg *RoomConfig, node string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.roomLocked(cfg.Name)
	uids := make([]string, 0, len(r.owned[node]))
	for u := range r.owned[node] {
		uids = append(uids, u)
	}
	sort.Strings(uids)
	return uids, nil
}

// Leave implements Backend.
func (m *Memory) Leave(ctx context.Context, cfg *RoomConfig, uid string) (Departure, error) {
	return m.depart(ctx, cfg, uid, func(r *memRoom, e *memEntry, d *Departure, now int64) {
		if e.state == EntryActive {
			d.Ended = r.endSession(cfg.Name, uid, e, EndLeave, now)
		} else {
			r.remove(uid, e)
		}
	})
}

// depart is the frame Disconnect and Leave share: under the lock, with
// what fn changes persisted, fn runs on uid's entry (nothing happens when
// uid has none); d.Prev is the entry's state before fn.
func (m *Memory) depart(ctx context.Context, cfg *RoomConfig, uid string, fn func(r *memRoom, e *memEntry, d *Departure, now int64)) (_ Departure, err error) {
	if err := ctx.Err(); err != nil {
		return Departure{}, err
	}
	now, _ := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.roomLocked(cfg.Name)
	defer m.persistLocked(cfg.Name, r, &err)
	d := Departure{Now: unix(now)}
	e := r.entries[uid]
	if e == nil {
		return d, nil
	}
	d.Prev = e.state
	fn(r, e, &d, now)
	return d, nil
}

// Admit implements Backend.
func (m *Memory) Admit(ctx context.Context, cfg *RoomConfig, req AdmitRequest) (_ AdmitResult, err error) {
	if err := ctx.Err(); err != nil {
		return AdmitResult{}, err
	}
	now, nowUS := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.roomLocked(cfg.Name)
	defer m.persistLocked(cfg.Name, r, &err)
	res := AdmitResult{Now: unix(now)}
	if r.startIfDue(cfg, now); cfg.PhaseAt(now) == PhaseScheduled {
		return res, nil // nobody is admitted before the start
	}
	if r.tokenTS == 0 {
		r.tokens = cfg.AdmitBurst
	} else if nowUS > r.tokenTS {
		r.tokens = math.Min(cfg.AdmitBurst, r.tokens+float64(cfg.AdmitRate*float64(nowUS-r.tokenTS))/1e6)
	}
	r.tokens = math.Min(r.tokens, cfg.AdmitBurst)
	r.tokenTS = max(r.tokenTS, nowUS)
	budget := min(int(math.Floor(r.tokens)), cfg.MaxActive-r.active.Len())
	if req.Max > 0 {
		budget = min(budget, req.Max)
	}
	quota := cfg.QuotaOn()
	cutoff := now - maxWaitS(cfg)
	expires := now + int64(cfg.AccessTokenTTL/time.Second)
	for budget > 0 {
		var uid string
		overdue, yielded := false, false
		if js, u, ok := r.j.Min(); ok && int64(js) <= cutoff {
			uid, overdue = u, true
		} else if _, u, ok := r.q.Min(); ok {
			uid = u
			if quota && r.entries[u].level > 0 && !vipWithinShare(r.shareV, r.shareN, cfg.VIPAdmitShare) {
				if n := r.bestNormal(); n != "" {
					if r.quotaMay(n) {
						uid = n
					} else {
						yielded = true
					}
				}
			}
		} else {
			break
		}
		e := r.entries[uid]
		if quota {
			r.countShare(e.level > 0, overdue || yielded)
		}
		r.unqueue(uid, e)
		r.smooth.Delete(float64(e.join), uid)
		r.sl.Delete(float64(e.slack), uid)
		lateAdm := late(cfg, e.join, e.away, now)
		if lateAdm {
			r.viol++
		}
		e.state, e.admitted, e.expires = EntryActive, now, expires
		r.active.Insert(float64(expires), uid)
		r.adm[now]++
		r.tokens--
		budget--
		res.Admitted = append(res.Admitted, Admission{UID: uid, Tier: e.level, Join: unix(e.join),
			First: unix(e.first), Admitted: unix(now), Expires: unix(expires), Overdue: overdue, Late: lateAdm, Back: unix(e.away)})
	}
	res.Tokens = r.tokens
	return res, nil
}

// quotaMay reports whether the quota may admit the waiting normal user n
// in place of the best VIP: only if n was owed an admission before the
// oldest promise of any waiting VIP (its seq is below every waiting VIP's),
// so that every waiting VIP's slack counted n (doc.go, "Max-wait
// guarantee"). Otherwise the quota yields: the VIP is admitted.
func (r *memRoom) quotaMay(n string) bool {
	for {
		k, u, ok := r.jv.Min()
		if !ok {
			return true
		}
		if e := r.entries[u]; e != nil && e.state == EntryWaiting && e.level > 0 && e.seq == int64(k) {
			return r.entries[n].seq < int64(k)
		}
		// not a waiting VIP any more (Redis: left by an older release's
		// node): dropped, as redisroom's jvMin does
		r.jv.Delete(k, u)
		if e := r.entries[u]; e != nil && e.state == EntryWaiting && e.level > 0 {
			r.jv.Insert(float64(e.seq), u)
		}
	}
}

// countShare counts an admission by rank for the quota if both classes
// wait (a share lent out earns no credit, nor does an admission the quota
// yielded); it is called before the admitted user leaves the queue
// (unqueue resets the counts when a class empties).
func (r *memRoom) countShare(vip, skip bool) {
	if nv := r.qv.Len(); !skip && nv > 0 && nv < r.q.Len() {
		shareCount(&r.shareV, &r.shareN, vip)
	}
}

// bestNormal is the best-ranked waiting normal user (the normal-user
// score index); "" when none.
func (r *memRoom) bestNormal() string {
	if _, u, ok := r.qn.Min(); ok {
		return u
	}
	return ""
}

// maintainLimit bounds the expired sessions and timed-out entries one
// Maintain call removes, and the smoothing VIPs it steps.
const (
	maintainLimit = 1000
	smoothLimit   = 5000
)

// Maintain implements Backend.
func (m *Memory) Maintain(ctx context.Context, cfg *RoomConfig, req MaintainRequest) (_ MaintainResult, err error) {
	if err := ctx.Err(); err != nil {
		return MaintainResult{}, err
	}
	now, _ := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.roomLocked(cfg.Name)
	defer m.persistLocked(cfg.Name, r, &err)
	r.startIfDue(cfg, now)
	res := MaintainResult{Now: unix(now)}

	var uids []string
	r.active.Ascend(func(s float64, u string) bool {
		if int64(s) > now || len(uids) >= maintainLimit {
			return false
		}
		uids = append(uids, u)
		return true
	})
	for _, u := range uids {
		res.Ended = append(res.Ended, *r.endSession(cfg.Name, u, r.entries[u], EndExpired, now))
	}

	r.metaDirty = true // heartbeat, rate, L_max, the admission window
	if req.Node != "" {
		r.nodes[req.Node] = now
	}
	if to := int64(req.NodeTimeout / time.Second); to > 0 {
		var dead []string
		for n, hb := range r.nodes {
			if now-hb > to {
				dead = append(dead, n)
			}
		}
		sort.Strings(dead)
		budget := maintainLimit
		for _, n := range dead {
			hb := r.nodes[n]
			lost := make([]string, 0, len(r.owned[n]))
			for u := range r.owned[n] {
				lost = append(lost, u)
			}
			sort.Strings(lost)
			if len(lost) > budget {
				lost = lost[:budget]
			}
			budget -= len(lost)
			for _, u := range lost {
				e := r.entries[u]
				if !r.disown(u, e, n) { // not on the entry's holders: nothing else changes
					delete(r.owned[n], u)
					continue
				}
				// the user is disconnected once no live node holds it,
				// away since the latest heartbeat of its holders (as
				// redisroom's sweep)
				hb, alive := hb, false
				eachHolder(e.node, func(o string) {
					if h, ok := r.nodes[o]; ok && now-h <= to {
						alive = true
					} else if ok && h > hb {
						hb = h
					}
				})
				if alive {
					continue
				}
				r.disownAll(u, e)
				switch e.state {
				case EntryWaiting:
					r.unqueue(u, e)
					e.state, e.away = EntryAway, hb
					r.away.Insert(float64(hb), u)
					res.Orphans++
				case EntryActive:
					res.Ended = append(res.Ended, *r.endSession(cfg.Name, u, e, EndDisconnect, now))
				case EntryScheduled:
					e.away = hb
					r.touch(u)
				}
			}
			if len(r.owned[n]) == 0 {
				delete(r.owned, n)
				delete(r.nodes, n)
			}
			if budget == 0 {
				break
			}
		}
	}

	hard := now - int64(cfg.HardTimeout/time.Second)
	uids = uids[:0]
	r.away.Ascend(func(s float64, u string) bool {
		if int64(s) > hard || len(uids) >= maintainLimit {
			return false
		}
		uids = append(uids, u)
		return true
	})
	for _, u := range uids {
		r.remove(u, r.entries[u])
		res.Dropped = append(res.Dropped, u)
	}

	uids = uids[:0]
	r.smooth.Ascend(func(_ float64, u string) bool {
		uids = append(uids, u)
		return len(uids) < smoothLimit
	})
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, u := range uids {
		e := r.entries[u]
		if e.state != EntryWaiting {
			continue
		}
		frac := smoothFrac(cfg, e.join, now)
		ns := smoothScore(e.join, e.bias, frac)
		if ns < e.score {
			lo, hi = math.Min(lo, ns), math.Max(hi, e.score)
			r.rescore(u, e, ns)
			res.Stepped++
		}
		if frac >= 1 {
			r.smooth.Delete(float64(e.join), u)
			r.touch(u)
		}
	}
	if res.Stepped > 0 {
		r.place(now, lo, hi)
	}

	for s := range r.adm {
		if s <= now-RateWindow {
			delete(r.adm, s)
		}
	}
	count, oldest := r.window(now)
	r.rate = RateOf(count, oldest, now)
	r.lmax = lmax(cfg, r.rate, count, int64(r.q.Len()), r.oldestWait(now))
	r.lmaxSet = true
	res.Rate, res.LMax = r.rate, r.lmax
	return res, nil
}

// Snapshot implements Backend.
func (m *Memory) Snapshot(ctx context.Context, cfg *RoomConfig, uids []string, since int64) (Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	now, _ := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.roomLocked(cfg.Name)
	s := Snapshot{Now: unix(now)}
	s.Waiting, s.Away, s.Active, s.VIPWaiting = int64(r.q.Len()), int64(r.away.Len()), int64(r.active.Len()), int64(r.qv.Len())
	s.WaitingByTier = r.byTier
	s.PreQueue, s.MaxWaitViolations, s.Owed = int64(r.pre.Len()), r.viol, r.owed()
	s.Capacity, s.MinSlack = Capacity(cfg), r.minSlack()
	s.Overdue = int64(r.j.CountScoreAtMost(float64(now - maxWaitS(cfg))))
	s.Admitted5m, _ = r.window(now)
	count, oldest := r.window(now)
	s.Rate = RateOf(count, oldest, now)
	s.LMax = r.currentLMax(cfg, now)
	s.Positions = make([]Position, len(uids))
	var od []osKey
	for i, u := range uids {
		e := r.entries[u]
		if e == nil {
			s.Positions[i] = Position{Entry: Entry{UID: u}}
			continue
		}
		s.Positions[i] = Position{Entry: r.entryOf(u, e)}
		if e.state == EntryWaiting {
			s.Positions[i].Ahead = r.ahead(cfg, u, e, now, &od)
		}
	}
	i := sort.Search(len(r.places), func(i int) bool { return r.places[i].Seq > since })
	s.Placements = append([]Placement(nil), r.places[i:]...)
	s.PlacementSeq = r.placeSeq
	return s, nil
}

// Trim implements Backend.
func (m *Memory) Trim(ctx context.Context, cfg *RoomConfig) (_ int, err error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	now, _ := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.roomLocked(cfg.Name)
	defer m.persistLocked(cfg.Name, r, &err)
	grace := now - int64(cfg.Grace/time.Second)
	var uids []string
	r.away.Ascend(func(s float64, u string) bool {
		if int64(s) >= grace || len(uids) >= maintainLimit {
			return false
		}
		uids = append(uids, u)
		return true
	})
	for _, u := range uids {
		r.remove(u, r.entries[u])
	}
	if len(r.places) > 64 {
		n := copy(r.places, r.places[len(r.places)-64:])
		r.places = r.places[:n]
	}
	return len(uids), nil
}

// SaveConfig implements Backend.
func (m *Memory) SaveConfig(ctx context.Context, cfg RoomConfig) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cfg = cfg.WithDefaults() // WithDefaults copies the bias map
	if m.j != nil {
		v, err := encConfig(&cfg)
		if err != nil {
			return err
		}
		if err := m.write([][]byte{configKey(cfg.Name)}, [][]byte{v}); err != nil {
			return err
		}
	}
	m.configs[cfg.Name] = cfg
	return nil
}

// LoadConfigs implements Backend.
func (m *Memory) LoadConfigs(ctx context.Context) ([]RoomConfig, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]RoomConfig, 0, len(m.configs))
	for _, c := range m.configs {
		out = append(out, c.WithDefaults())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// DeleteRoom implements Backend.
func (m *Memory) DeleteRoom(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.j != nil {
		keys := [][]byte{configKey(name), metaKey(name)}
		if r := m.rooms[name]; r != nil {
			for uid := range r.entries {
				keys = append(keys, entryKey(name, uid))
			}
			for uid := range r.dirty { // removed since the last write
				keys = append(keys, entryKey(name, uid))
			}
		}
		if err := m.write(keys, make([][]byte, len(keys))); err != nil {
			return err
		}
	}
	delete(m.rooms, name)
	delete(m.configs, name)
	return nil
}

// Health implements Backend. The in-process backend is bounded by the
// rooms' L_max, not by a memory limit of its own.
func (m *Memory) Health(ctx context.Context) (Health, error) {
	return Health{}, ctx.Err()
}

// owed is the number of users owed an admission: waiting, away (they may
// come back with their key, or decayed but still ahead of later entrants)
// and in the pre-queue.
func (r *memRoom) owed() int64 { return int64(r.q.Len() + r.away.Len() + r.pre.Len()) }

// slackAt is the spare admissions of a user whose deadline is remS whole
// seconds of admissions away, with others owed admissions that may all come
// first: floor(GuaranteeRate*remS) - 1 - others.
func slackAt(cfg *RoomConfig, remS, others int64) int64 {
	return int64(math.Floor(float64(GuaranteeRate(cfg)*float64(remS)))) - 1 - others
}

// entryReserve is the slack a new entrant of tier level must have to be
// queued: VIPReserve for normal users, 0 for VIPs.
func entryReserve(cfg *RoomConfig, level int) int64 {
	if level > 0 {
		return 0
	}
	return VIPReserve(cfg)
}

// minSlack is the smallest spare of everyone owed an admission: the lowest
// slack key less the passes since (MaxInt64 when nobody is owed).
func (r *memRoom) minSlack() int64 {
	k, _, ok := r.sl.Min()
	if !ok {
		return math.MaxInt64
	}
	return int64(k) - r.passes
}

// startIfDue moves the pre-queue of a scheduled room into the queue once
// the room clock reaches its start, exactly once (preAt records it): in
// the order of the entries' shuffle keys (a uniformly random order), each
// with join = the start, score 1.3*start + bias - 0.001*(n - rank) (so
// the shuffle decides among equal biases, within n ms of score, and
// everyone arriving after the start ranks behind), and every one of them
// the same slack: all n and everyone else owed may come first.
// Pre-queue users disconnected at the start (away set) become away since
// the start.
func (r *memRoom) startIfDue(cfg *RoomConfig, now int64) {
	if r.pre.Len() == 0 || cfg.PhaseAt(now) == PhaseScheduled {
		return
	}
	start := cfg.StartS()
	if r.preAt != start { // the first batch of this start
		r.preN, r.preAt = int64(r.pre.Len()), start
		r.metaDirty = true
	}
	owed := r.owed()
	slack := slackAt(cfg, start+maxWaitS(cfg)-1-now, owed-1) + r.passes
	seq := r.nextSeq() // the VIPs' promise: after every pre-queue entry, before any later one
	scale := 1.0
	var nv int64
	r.pre.Ascend(func(_ float64, u string) bool {
		if r.entries[u].level > 0 {
			nv++
		}
		return true
	})
	if share := float64(nv) / float64(r.pre.Len()); share > cfg.VIPShareCap {
		scale = cfg.VIPShareCap / share
	}
	uids := make([]string, 0, r.pre.Len())
	r.pre.Ascend(func(_ float64, u string) bool {
		uids = append(uids, u)
		return true
	})
	for _, u := range uids {
		e := r.entries[u]
		r.pre.Delete(e.score, u)
		rank := r.preN - int64(r.pre.Len()) - 1 // this batch continues the ranks of earlier ones
		if b := cfg.Bias(e.level); b < 0 {
			e.bias = roundMilli(float64(b * scale))
		}
		e.join = start
		e.score = preScore(start, e.bias, r.preN, rank)
		e.slack = slack
		if e.level > 0 {
			e.seq = seq
		}
		r.sl.Insert(float64(e.slack), u)
		if e.away != 0 { // disconnected before the start
			e.state, e.away = EntryAway, now
			r.away.Insert(float64(now), u)
			r.touch(u)
		} else {
			e.away = 0
			r.insertWaiting(u, e)
		}
	}
}

// preScore is the queue score of the pre-queue user of shuffled rank
// (0-based) among n: 1.3*start + bias - 0.001*(n - rank), rounded like the
// Lua scripts round it.
func preScore(start int64, bias float64, n, rank int64) float64 {
	return roundMilli(float64(float64(ScoreFactor*float64(start))+bias) - float64(0.001*float64(n-rank)))
}
