package main

import (
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// The soak's ledger: what the workload did (every send's outcome, every
// membership change) and what every user's clients delivered, checked at
// the end against the store as a member that never leaves reads it.

// seqSet is a set of seqs >= 1 as a bitmap (seq s is bit s-1).
type seqSet struct{ w []uint64 }

// add sets s and says whether it was new.
func (b *seqSet) add(s int64) bool {
	i := int((s - 1) / 64)
	for i >= len(b.w) {
		b.w = append(b.w, 0)
	}
	bit := uint64(1) << ((s - 1) % 64)
	if b.w[i]&bit != 0 {
		return false
	}
	b.w[i] |= bit
	return true
}

func (b *seqSet) has(s int64) bool {
	if s < 1 {
		return false
	}
	i := int((s - 1) / 64)
	return i < len(b.w) && b.w[i]&(uint64(1)<<((s-1)%64)) != 0
}

// missing counts the seqs of [lo, hi] not in b, and returns the first.
func (b *seqSet) missing(lo, hi int64) (n, first int64) {
	lo = max(lo, 1)
	for s := lo; s <= hi; {
		off := s - 1
		i := int(off / 64)
		var word uint64
		if i < len(b.w) {
			word = b.w[i]
		}
		from := uint(off % 64)
		to := uint(min(63, int64(from)+hi-s))
		mask := (^uint64(0) >> (63 - to)) &^ ((uint64(1) << from) - 1)
		if gap := mask &^ word; gap != 0 {
			if first == 0 {
				first = int64(i)*64 + int64(bits.TrailingZeros64(gap)) + 1
			}
			n += int64(bits.OnesCount64(gap))
		}
		s += int64(to-from) + 1
	}
	return n, first
}

// min returns the lowest seq in b (0 when empty); max the highest.
func (b *seqSet) min() int64 {
	for i, w := range b.w {
		if w != 0 {
			return int64(i)*64 + int64(bits.TrailingZeros64(w)) + 1
		}
	}
	return 0
}

func (b *seqSet) max() int64 {
	for i := len(b.w) - 1; i >= 0; i-- {
		if w := b.w[i]; w != 0 {
			return int64(i)*64 + 64 - int64(bits.LeadingZeros64(w))
		}
	}
	return 0
}

// countAbove counts the seqs of b above s.
func (b *seqSet) countAbove(s int64) int64 {
	var n int64
	for i, w := range b.w {
		base := int64(i) * 64 // bit k is seq base+k+1
		if base+64 <= s {
			continue
		}
		if s > base {
			w &^= (uint64(1) << (s - base)) - 1
		}
		n += int64(bits.OnesCount64(w))
	}
	return n
}

// membership is one user's time in one group. The soak never adds a
// removed member back, so there is one per (user, group).
type membership struct {
	joinSeq int64 // from the add's answer: the first seq it may see
	// removing is set before the removal is asked for: a request refused
	// from then on (forbidden) is the removal's doing, not a fault.
	removing bool
	removed  bool
	// removedBound is the group's last_seq read after the removal was
	// answered: a message above it was committed after the removal and must
	// not reach the user. (Seqs between the last_seq read before the
	// removal and this one may or may not have reached it.)
	removedBound int64
}

// sendRec is one send's outcome.
type sendRec struct {
	uid   string
	seq   int64  // acked seq; 0 = no ack
	err   string // why there was no ack
	https bool   // sent over HTTP, not the socket
}

// groupLedger is what the workload did to one group.
type groupLedger struct {
	gid     int64
	large   bool
	sends   map[string]*sendRec // by client_msg_id
	members map[string]*membership
}

// userView is what one user's clients (one at a time, across reconnects
// and restarts) delivered.
type userView struct {
	mu       sync.Mutex
	seen     map[int64]*seqSet
	last     map[int64]int64 // highest delivered per group
	dups     int64           // a (gid, seq) delivered twice
	reorders int64           // a seq delivered below a higher one
	samples  []deliverySample
}

// deliverySample is one delivered message's identity, checked against the
// store at the end (the body's send id must be the one stored at the seq).
type deliverySample struct {
	gid, seq int64
	id       string
}

func newUserView() *userView {
	return &userView{seen: map[int64]*seqSet{}, last: map[int64]int64{}}
}

// deliver records one delivery.
func (v *userView) deliver(gid, seq int64, id string, sample bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	set := v.seen[gid]
	if set == nil {
		set = &seqSet{}
		v.seen[gid] = set
	}
	if !set.add(seq) {
		v.dups++
		return
	}
	if seq < v.last[gid] {
		v.reorders++
	} else {
		v.last[gid] = seq
	}
	if sample && len(v.samples) < 4096 {
		v.samples = append(v.samples, deliverySample{gid, seq, id})
	}
}

// ledger is the whole soak's record. Its maps are guarded by mu; a
// userView has its own lock (deliveries come from many connections).
type ledger struct {
	mu     sync.Mutex
	groups map[int64]*groupLedger
	users  map[string]*userView
	events map[string]int64 // client events and workload counters
	// trail keeps, per "uid gid", the last few SDK events and workload
	// steps of that pair (a join, a Track, a group_lost with its error, a
	// resync), printed beside an incomplete pair to tell its causes apart.
	trail map[string][]string
}

// maxTrail bounds the steps kept per (user, group).
const maxTrail = 8

func newLedger() *ledger {
	return &ledger{groups: map[int64]*groupLedger{}, users: map[string]*userView{}, events: map[string]int64{},
		trail: map[string][]string{}}
}

// note records a step of (uid, gid) at t seconds into the run.
func (l *ledger) note(uid string, gid int64, t float64, what string) {
	k := uid + " " + strconv.FormatInt(gid, 10)
	l.mu.Lock()
	tr := append(l.trail[k], fmt.Sprintf("%.1fs %s", t, what))
	if len(tr) > maxTrail {
		tr = tr[len(tr)-maxTrail:]
	}
	l.trail[k] = tr
	l.mu.Unlock()
}

func (l *ledger) addGroup(gid int64, large bool) *groupLedger {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := &groupLedger{gid: gid, large: large, sends: map[string]*sendRec{}, members: map[string]*membership{}}
	l.groups[gid] = g
	return g
}

func (l *ledger) user(uid string) *userView {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.users[uid]
	if v == nil {
		v = newUserView()
		l.users[uid] = v
	}
	return v
}

func (l *ledger) count(name string, n int64) {
	l.mu.Lock()
	l.events[name] += n
	l.mu.Unlock()
}

func (l *ledger) joined(gid int64, uid string, joinSeq int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.groups[gid]; g != nil && g.members[uid] == nil {
		g.members[uid] = &membership{joinSeq: joinSeq}
	}
}

func (l *ledger) removing(gid int64, uid string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.groups[gid].members[uid]; m != nil {
		m.removing = true
	}
}

func (l *ledger) removed(gid int64, uid string, bound int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.groups[gid].members[uid]; m != nil {
		m.removed, m.removedBound = true, bound
	}
}

// member returns uid's membership of gid, nil when it never joined.
func (l *ledger) member(gid int64, uid string) *membership {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.groups[gid]; g != nil {
		if m := g.members[uid]; m != nil {
			c := *m
			return &c
		}
	}
	return nil
}

// sending registers a send before it goes out; sent records its outcome.
func (l *ledger) sending(gid int64, id, uid string, http bool) {
	l.mu.Lock()
	l.groups[gid].sends[id] = &sendRec{uid: uid, https: http}
	l.mu.Unlock()
}

func (l *ledger) sent(gid int64, id string, seq int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.groups[gid].sends[id]
	if err != nil {
		r.err = err.Error()
		l.events["send errors"]++
		return
	}
	r.seq = seq
	l.events["acked"]++
}

// storedMsg is one message of a group as the store returns it.
type storedMsg struct {
	seq  int64
	from string
	id   string // the send id from the body; empty if unreadable
}

// verdict is the outcome of the ledger check.
type verdict struct {
	Groups           int      `json:"groups"`
	Stored           int64    `json:"stored"`
	Acked            int64    `json:"acked"`
	Unacked          int64    `json:"unacked"`          // sends without an ack (errors)
	UnackedStored    int64    `json:"unacked_stored"`   // of which the store holds one: allowed (a timeout after commit)
	Lost             int64    `json:"lost"`             // acked, not stored at the acked seq
	Duplicated       int64    `json:"duplicated"`       // one send id stored more than once
	Foreign          int64    `json:"foreign"`          // stored messages the ledger never sent
	Holes            int64    `json:"holes"`            // seqs in 1..last_seq that are not stored
	Joins            int64    `json:"joins"`            // membership records
	Removals         int64    `json:"removals"`         // of which removed
	BeforeJoin       int64    `json:"before_join"`      // deliveries below the member's join_seq
	AfterRemoval     int64    `json:"after_removal"`    // deliveries above the removal bound
	NotMember        int64    `json:"not_member"`       // deliveries of a group the user never joined
	DeliveryDups     int64    `json:"delivery_dups"`    // (user, gid, seq) delivered twice
	Reorders         int64    `json:"reorders"`         // delivered below a higher seq
	WrongContent     int64    `json:"wrong_content"`    // a sampled delivery whose id is not the stored one
	OnlineChecked    int      `json:"online_checked"`   // users online at the end
	Incomplete       int64    `json:"incomplete"`       // (user, group) pairs missing something at the end
	MissingMessages  int64    `json:"missing_messages"` // messages they miss in total
	Deliveries       int64    `json:"deliveries"`
	Problems         []string `json:"problems,omitempty"` // the first few, spelled out
	problemsTruncate int
}

func (v *verdict) problem(format string, a ...any) {
	if len(v.Problems) < 20 {
		v.Problems = append(v.Problems, fmt.Sprintf(format, a...))
	} else {
		v.problemsTruncate++
	}
}

// Failed reports whether the ledger found anything wrong.
func (v *verdict) Failed() bool {
	return v.Lost+v.Duplicated+v.Foreign+v.Holes+v.BeforeJoin+v.AfterRemoval+v.NotMember+
		v.DeliveryDups+v.Reorders+v.WrongContent+v.Incomplete > 0
}

// checkStore compares each group's stored messages (every seq from 1 to
// last_seq, as a member from seq 1 reads them) with the sends.
func (l *ledger) checkStore(v *verdict, stored map[int64][]storedMsg, lastSeq map[int64]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	gids := make([]int64, 0, len(l.groups))
	for gid := range l.groups {
		gids = append(gids, gid)
	}
	sort.Slice(gids, func(i, j int) bool { return gids[i] < gids[j] })
	for _, gid := range gids {
		g := l.groups[gid]
		v.Groups++
		msgs := stored[gid]
		v.Stored += int64(len(msgs))
		// Dense: message i has seq i+1 up to last_seq.
		at := map[int64]storedMsg{}
		for _, m := range msgs {
			at[m.seq] = m
		}
		for s := int64(1); s <= lastSeq[gid]; s++ {
			if _, ok := at[s]; !ok {
				v.Holes++
				v.problem("group %d: seq %d missing from the store (last_seq %d)", gid, s, lastSeq[gid])
			}
		}
		byID := map[string][]int64{}
		for _, m := range msgs {
			byID[m.id] = append(byID[m.id], m.seq)
		}
		for id, seqs := range byID {
			r := g.sends[id]
			if r == nil {
				v.Foreign += int64(len(seqs))
				v.problem("group %d: stored seq %v with id %q that no send used", gid, seqs, id)
				continue
			}
			if len(seqs) > 1 {
				v.Duplicated += int64(len(seqs) - 1)
				v.problem("group %d: send %s stored %d times (seqs %v)", gid, id, len(seqs), seqs)
			}
			if m := at[seqs[0]]; m.from != r.uid {
				v.problem("group %d: seq %d from %q, the send was %q's", gid, seqs[0], m.from, r.uid)
				v.Foreign++
			}
		}
		for id, r := range g.sends {
			if r.seq == 0 {
				v.Unacked++
				if len(byID[id]) > 0 {
					v.UnackedStored++
				}
				continue
			}
			v.Acked++
			if m, ok := at[r.seq]; !ok || m.id != id {
				v.Lost++
				v.problem("group %d: send %s acked as seq %d, the store has %q there", gid, id, r.seq, m.id)
			}
		}
	}
}

// checkDeliveries checks what every user saw against its memberships and
// the store, and returns the (user, group) pairs of online users that
// still miss messages (empty when complete).
func (l *ledger) checkDeliveries(v *verdict, stored map[int64][]storedMsg, lastSeq map[int64]int64, online map[string]bool, final bool) (incomplete []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	idAt := func(gid, seq int64) string {
		msgs := stored[gid]
		i := sort.Search(len(msgs), func(i int) bool { return msgs[i].seq >= seq })
		if i < len(msgs) && msgs[i].seq == seq {
			return msgs[i].id
		}
		return ""
	}
	uids := make([]string, 0, len(l.users))
	for uid := range l.users {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	var missingTotal int64
	for _, uid := range uids {
		u := l.users[uid]
		u.mu.Lock()
		if final {
			v.DeliveryDups += u.dups
			v.Reorders += u.reorders
			if u.dups+u.reorders > 0 {
				v.problem("user %s: %d duplicate and %d out-of-order deliveries", uid, u.dups, u.reorders)
			}
			for _, s := range u.samples {
				if got := idAt(s.gid, s.seq); got != s.id {
					v.WrongContent++
					v.problem("user %s: group %d seq %d delivered with id %q, stored %q", uid, s.gid, s.seq, s.id, got)
				}
			}
		}
		for gid, set := range u.seen {
			g := l.groups[gid]
			if g == nil {
				continue // the auditor's own and other groups outside the soak
			}
			m := g.members[uid]
			if final {
				if m == nil {
					v.NotMember++
					v.problem("user %s: got group %d, never a member", uid, gid)
					continue
				}
				if lo := set.min(); lo > 0 && lo < m.joinSeq {
					n := int64(0)
					for s := lo; s < m.joinSeq; s++ {
						if set.has(s) {
							n++
						}
					}
					v.BeforeJoin += n
					v.problem("user %s: group %d seq %d delivered, joined at %d", uid, gid, lo, m.joinSeq)
				}
				if m.removed {
					if n := set.countAbove(m.removedBound); n > 0 {
						v.AfterRemoval += n
						v.problem("user %s: group %d: %d messages above seq %d, removed before it was committed (highest %d)", uid, gid, n, m.removedBound, set.max())
					}
				}
			}
		}
		if online[uid] {
			if final {
				v.OnlineChecked++
			}
			for gid, g := range l.groups {
				m := g.members[uid]
				if m == nil || m.removed || m.joinSeq > lastSeq[gid] {
					continue
				}
				set := u.seen[gid]
				if set == nil {
					set = &seqSet{}
				}
				if n, first := set.missing(m.joinSeq, lastSeq[gid]); n > 0 {
					missingTotal += n
					line := fmt.Sprintf("user %s: group %d misses %d of seqs %d..%d (first %d)", uid, gid, n, m.joinSeq, lastSeq[gid], first)
					if tr := l.trail[uid+" "+strconv.FormatInt(gid, 10)]; len(tr) > 0 {
						line += "; its steps: " + strings.Join(tr, ", ")
					}
					incomplete = append(incomplete, line)
				}
			}
		}
		if final {
			for _, set := range u.seen {
				for _, w := range set.w {
					v.Deliveries += int64(bits.OnesCount64(w))
				}
			}
		}
		u.mu.Unlock()
	}
	if final {
		v.Incomplete = int64(len(incomplete))
		v.MissingMessages = missingTotal
		sort.Strings(incomplete)
		for _, s := range incomplete {
			v.problem("%s", s)
		}
		for gid, g := range l.groups {
			for _, m := range g.members {
				v.Joins++
				if m.removed {
					v.Removals++
				}
			}
			_ = gid
		}
	}
	return incomplete
}

// summary is one line per finding for the log.
func (v *verdict) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d groups, %d stored, %d acked (%d sends without an ack, %d of them stored), %d deliveries; "+
		"lost %d, duplicated %d, foreign %d, holes %d; before join %d, after removal %d, not a member %d; "+
		"delivered twice %d, out of order %d, wrong content %d; %d users online at the end, %d (user, group) incomplete (%d messages)",
		v.Groups, v.Stored, v.Acked, v.Unacked, v.UnackedStored, v.Deliveries,
		v.Lost, v.Duplicated, v.Foreign, v.Holes, v.BeforeJoin, v.AfterRemoval, v.NotMember,
		v.DeliveryDups, v.Reorders, v.WrongContent, v.OnlineChecked, v.Incomplete, v.MissingMessages)
	return b.String()
}
