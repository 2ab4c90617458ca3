// This file holds delivery: the committed messages of a group go to its
// online members at the group's effective level (deliver): L0 at once
// (pushNow), L1 and L2 into the group's merge window (windows.go), cut
// for recent joiners (pushJoiners, eligibility.go), and counted as the
// bytes the Pusher reports (pushTo). The walk goes on in windows.go.

package fanout

import (
	"cmp"
	"slices"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// pushLevel is the level that decides how gs is pushed: hot groups always
// go through merge windows.
func (s *shard) pushLevel(gs *gstate) Level {
	lv := s.e.levels.Effective(gs.gid)
	if gs.hot && lv < L1Merge {
		lv = L1Merge
	}
	return lv
}

// deliver pushes one group's newly committed messages as its level says:
// at once (L0), into the merge window (L1, L2), or not at all.
func (s *shard) deliver(gs *gstate, msgs []store.Message) {
	gid := gs.gid
	gs.seenSeq = max(gs.seenSeq, msgs[len(msgs)-1].Seq)
	w := &gs.win
	switch lv := s.pushLevel(gs); {
	case lv == L0Normal:
		if w.count > 0 {
			s.flushWindow(gs) // keep order when a window is still open
		}
		s.pushNow(gid, PushMsgs, msgs, len(msgs), msgs[len(msgs)-1].Seq)
	case lv <= L2Summary:
		kind := PushBatch
		if lv == L2Summary {
			kind = PushSummary
		}
		if w.count > 0 && w.kind != kind {
			s.flushWindow(gs)
		}
		w.kind = kind
		for _, m := range msgs {
			if kind == PushSummary {
				if w.count == 0 {
					w.msgs = append(w.msgs[:0], m)
				}
			} else {
				if len(w.msgs) >= s.tn.MaxMerge {
					s.flushWindow(gs)
					w.kind = kind
				}
				w.msgs = append(w.msgs, m)
			}
			w.count++
			w.lastSeq = m.Seq
		}
		if !gs.open {
			gs.open = true
			s.open = append(s.open, gs)
		}
	default:
		// L3, L4: no pushes; clients were told by a degraded frame and
		// pull on demand. Drop what a window still held.
		resetWindow(w)
	}
}

func (s *shard) pushNow(gid int64, kind PushKind, msgs []store.Message, count int, lastSeq int64) {
	s.conns = s.e.pres.AppendConns(s.conns[:0], gid)
	if len(s.conns) > 0 {
		// Recent joiners are read after the recipients: a member among
		// them was added before its bit was set (joined, ConnectReady), so
		// no seq below its join_seq goes out, whatever the path (a window
		// still holding older commits, a late bus batch).
		if v, ok := s.e.joiners.Load(gid); ok {
			s.pushJoiners(v.(*joiners), gid, kind, msgs, count, lastSeq)
		} else {
			s.pushTo(gid, kind, msgs, count, lastSeq, s.conns)
		}
	}
	clear(s.conns)
}

// pushJoiners pushes to s.conns when gid has recent joiners: the
// connections of joiners whose join_seq is above some of msgs get the push
// cut at their join_seq (aboveFloor), every other connection gets it
// whole.
func (s *shard) pushJoiners(js *joiners, gid int64, kind PushKind, msgs []store.Message, count int, lastSeq int64) {
	low := int64(0)
	if len(msgs) > 0 {
		low = msgs[0].Seq
		if kind != PushSummary { // a window may mix several nodes' batches
			for i := range msgs {
				low = min(low, msgs[i].Seq)
			}
		}
	}
	s.rel = s.e.recent(s.rel[:0], gid, js, low, lastSeq, s.e.now().UnixNano())
	rel := s.rel
	if len(rel) == 0 {
		s.pushTo(gid, kind, msgs, count, lastSeq, s.conns)
		return
	}
	// Every other connection first, then the joiners' by join_seq: each
	// cut at a higher join_seq cuts the one before (cutBelow may compact
	// msgs in place).
	conns := s.conns
	k := 0
	for i, c := range conns {
		if joinSeqOf(rel, c.UID()) == 0 {
			conns[k], conns[i] = conns[i], conns[k]
			k++
		}
	}
	s.pushTo(gid, kind, msgs, count, lastSeq, conns[:k])
	tail := conns[k:]
	slices.SortFunc(tail, func(a, b Conn) int {
		return cmp.Compare(joinSeqOf(rel, a.UID()), joinSeqOf(rel, b.UID()))
	})
	for len(tail) > 0 {
		seq := joinSeqOf(rel, tail[0].UID())
		n := 1
		for n < len(tail) && joinSeqOf(rel, tail[n].UID()) == seq {
			n++
		}
		msgs, count, lastSeq = aboveFloor(kind, msgs, count, lastSeq, seq)
		if count == 0 {
			break // higher join_seqs cut everything too
		}
		s.pushTo(gid, kind, msgs, count, lastSeq, tail[:n])
		tail = tail[n:]
	}
	clear(rel)
}

// pushTo pushes to conns and counts it.
func (s *shard) pushTo(gid int64, kind PushKind, msgs []store.Message, count int, lastSeq int64, conns []Conn) {
	if len(conns) == 0 || count == 0 {
		return
	}
	origin := int64(0)
	if kind == PushMsgs {
		origin = s.origin
	}
	s.push = Push{GID: gid, Kind: kind, Msgs: msgs, Count: count, LastSeq: lastSeq, Conns: conns, Origin: origin}
	bytes := s.e.push.Push(&s.push)
	if origin != 0 {
		s.e.cfg.Metrics.stageNanos(StagePush, time.Now().UnixNano()-origin)
	}
	s.e.egress.Add(int64(bytes))
	s.push = Push{}
	frames := len(msgs)
	if kind != PushMsgs {
		frames = 1
	}
	s.e.cfg.Metrics.deliveries(len(conns)*count, frames*len(conns), bytes)
}

// aboveFloor cuts a push to its messages at or above floor. A summary
// whose first message is below floor is dropped whole (count 0): it
// carries that message, and its count may include others below floor; the
// clients pull the gap.
func aboveFloor(kind PushKind, msgs []store.Message, count int, lastSeq, floor int64) ([]store.Message, int, int64) {
	if len(msgs) == 0 {
		return nil, 0, 0
	}
	if kind == PushSummary {
		if msgs[0].Seq < floor {
			return nil, 0, 0
		}
		return msgs, count, lastSeq
	}
	cut := cutBelow(msgs, floor)
	if len(cut) == len(msgs) {
		return msgs, count, lastSeq
	}
	lastSeq = 0
	for i := range cut {
		lastSeq = max(lastSeq, cut[i].Seq)
	}
	return cut, len(cut), lastSeq
}
