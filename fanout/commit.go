// This file holds the commit: a worker's admitted sends go to the store in
// one Append (commit), are acked, published on the bus and noted for tier
// 2 (noteTier2, tier2.go). The walk goes on in deliver.go.

package fanout

import (
	"context"
	"errors"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// commitReady commits the admitted sends in batches of at most MaxBatch.
func (s *shard) commitReady() {
	for len(s.ready) > 0 {
		n := min(len(s.ready), s.e.cfg.MaxBatch)
		s.commit(s.ready[:n])
		rest := copy(s.ready, s.ready[n:])
		clear(s.ready[rest:])
		s.ready = s.ready[:rest]
	}
}

// commit stores one run of sends in one transaction, acks them and pushes
// the new messages, grouped per group in seq order. It releases the tasks.
func (s *shard) commit(tasks []*task) {
	m := s.e.cfg.Metrics
	start := time.Now()
	if s.e.cfg.BeforeSend != nil {
		if tasks = s.moderate(tasks); len(tasks) == 0 {
			return
		}
	}
	s.reqs = s.reqs[:0]
	for _, t := range tasks {
		m.queueWait(start.Sub(t.enq))
		m.stageSince(StageAdmission, t.enq, start)
		s.reqs = append(s.reqs, store.AppendRequest{
			GID:         t.send.GID,
			Sender:      t.send.UID,
			ClientMsgID: t.send.ClientMsgID,
			Kind:        t.send.Kind,
			Body:        t.send.Body,
		})
	}
	if cap(s.res) < len(tasks) {
		s.res = make([]store.AppendResult, len(tasks))
	}
	s.res = s.res[:len(tasks)]
	clear(s.res)

	ctx, cancel := context.WithTimeout(context.Background(), s.e.cfg.CommitTimeout)
	err := s.e.st.Append(ctx, s.reqs, s.res)
	cancel()
	end := time.Now()
	s.commitNanos.Add(int64(end.Sub(start)))
	s.commitCount.Add(1)
	now := s.e.now()
	if err != nil {
		if !errors.Is(err, store.ErrBadRequest) && !errors.Is(err, store.ErrTooLarge) {
			s.commitFails.Add(1)
			s.e.cfg.Logger.Warn("commit failed", "shard", s.id, "pool", s.pool(), "messages", len(tasks), "err", err)
			err = &RetryError{Err: errors.Join(ErrUnavailable, err), After: time.Second}
		}
		for _, t := range tasks {
			s.e.refundAtAll(s.gs[t.send.GID], t)
			t.send.Done(SendResult{Err: err})
			releaseTask(t)
		}
		m.sends(len(tasks), "failed")
		m.process(time.Since(start), len(tasks))
		return
	}
	s.commitOKs.Add(1)
	var evErr error
	if s.e.cfg.Events != nil {
		evErr = s.emitMessages(tasks)
	}

	committed := 0
	for k, t := range tasks {
		r := s.res[k]
		if r.Err == nil && evErr == nil {
			m.sendAcked(end.Sub(t.enq))
		}
		if r.Err == nil && !r.Duplicate {
			m.stageSince(StageCommit, t.enq, end)
		}
		if r.Err == nil && evErr != nil {
			// Stored, but its event is not durable: not acked (a retry
			// gets the seq and journals the event); pushed all the same.
			t.send.Done(SendResult{Err: evErr})
		} else {
			t.send.Done(SendResult{Seq: r.Seq, CreatedAt: r.CreatedAt, Duplicate: r.Duplicate, Err: r.Err})
		}
		if r.Err != nil {
			gs := s.gs[t.send.GID]
			s.e.refundAtAll(gs, t) // not stored: not counted
			if gs != nil && gs.senders != nil && (errors.Is(r.Err, store.ErrNotMember) || errors.Is(r.Err, store.ErrMuted)) {
				s.noteSender(gs, t.send.UID, r.Err, now) // a cached answer went stale
			}
			continue
		}
		if r.Duplicate {
			// Stored before, on another UTC day: that day counted it,
			// so a charge taken today is given back. On the same day the
			// charge stays: it may be the only count the message has
			// (a retry on another node was admitted as already charged
			// and stored first).
			if t.atAll && utcDay(r.CreatedAt) != t.atDay {
				s.e.refundAtAll(s.gs[t.send.GID], t)
			}
			continue
		}
		committed++
		gi, ok := s.gidx[t.send.GID]
		if !ok {
			gi = len(s.groups)
			if gi < cap(s.groups) {
				s.groups = s.groups[:gi+1]
				s.groups[gi].gid, s.groups[gi].version = t.send.GID, 0
				s.groups[gi].msgs = s.groups[gi].msgs[:0]
			} else {
				s.groups = append(s.groups, groupMsgs{gid: t.send.GID})
			}
			s.groups[gi].origin = t.enq.UnixNano()
			s.gidx[t.send.GID] = gi
		}
		s.groups[gi].version = max(s.groups[gi].version, r.MemberVersion)
		s.groups[gi].msgs = append(s.groups[gi].msgs, store.Message{
			GID:         t.send.GID,
			Seq:         r.Seq,
			Sender:      t.send.UID,
			ClientMsgID: t.send.ClientMsgID,
			Kind:        s.reqs[k].Kind,
			Body:        t.send.Body,
			CreatedAt:   r.CreatedAt,
		})
	}
	m.sends(committed, "stored")
	m.sends(len(tasks)-committed, "rejected_or_duplicate")

	for i := range s.groups {
		g := &s.groups[i]
		gs := s.group(g.gid, now)
		gs.commits.add(now, s.bucketWidth(), len(g.msgs))
		for j := range g.msgs {
			// @all is for online members only: it does not move the
			// active members' conversation index.
			if g.msgs[j].Kind != store.KindAtAll && g.msgs[j].Seq > gs.t2Seq {
				gs.t2Seq = g.msgs[j].Seq
			}
		}
		if gs.t2Seq > gs.t2Sent && !gs.t2Dirty {
			gs.t2Dirty = true
			s.t2dirty = append(s.t2dirty, gs)
		}
		if s.e.pres != nil && s.e.push != nil && s.e.membersCurrent(g.gid, g.version) {
			s.origin = g.origin
			s.deliver(gs, g.msgs)
			s.origin = 0
		}
		if s.e.bus != nil {
			_ = s.e.bus.Publish(g.gid, g.version, g.msgs) // never blocks; a drop is counted and repaired by pull
		}
	}
	for i := range s.groups {
		clear(s.groups[i].msgs) // drop body references
	}
	s.groups = s.groups[:0]
	clear(s.gidx)
	for _, t := range tasks {
		releaseTask(t)
	}

	busy := time.Since(start)
	m.process(busy, len(tasks))
	s.observeRate(len(tasks), busy)
}

// noteTier2 hands each group's newest committed seq of this window to the
// tier-2 writer (one note per group per window).
func (s *shard) noteTier2() {
	for i, gs := range s.t2dirty {
		s.e.t2.note(gs.gid, gs.t2Seq)
		gs.t2Sent = gs.t2Seq
		gs.t2Dirty = false
		s.t2dirty[i] = nil
	}
	s.t2dirty = s.t2dirty[:0]
}
