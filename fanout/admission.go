// This file holds admission: the group limits and the pacing of sends
// buffered over them (admit, limits, pace), ahead of the sender check
// (eligibility.go) and the @all quota (atall.go). An admitted send waits
// in the worker's batch; the walk goes on in commit.go.

package fanout

import (
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// large reports whether group-level limits and triggers apply to gs.
func (s *shard) large(gs *gstate) bool {
	if s.tn.LargeGroup <= 1 {
		return true
	}
	if gs.meta == nil {
		// LargeGroup was raised from 1 by SetTuning: the group's member
		// count is read from now on (not large until it is known).
		gs.meta = s.e.t2.meta(gs.gid)
	}
	return gs.meta.members.Load() >= int64(s.tn.LargeGroup)
}

// limits returns gs's rate limit: rate per second, burst and buffer size;
// ok false when the group is not limited. With other nodes taking sends
// for the group (Config.HotSet), the rate is this node's part of it.
func (s *shard) limits(gs *gstate) (rate, burst float64, buffer int, ok bool) {
	cfg := s.tn
	switch {
	case gs.hot:
		rate, buffer = cfg.HotGroupRate, cfg.HotGroupBuffer
	case cfg.GroupRate > 0 && s.large(gs):
		rate, buffer = cfg.GroupRate, cfg.GroupBuffer
	default:
		return 0, 0, 0, false
	}
	rate = nodePart(rate, gs.offered, gs.remote)
	return rate, max(rate, 1), buffer, true
}

// nodePart is a node's part of a cluster-wide rate limit: the limit split
// in proportion to the rates offered on each node, so every send has the
// same chance wherever it arrives. A node gets at least 1/s (or the whole
// limit when that is lower): a node whose first sends arrive between two
// reads of the other nodes' rates is not shut out until the next read,
// and the cluster exceeds the limit by at most 1/s per node.
func nodePart(limit, local, remote float64) float64 {
	if remote <= 0 {
		return limit
	}
	return max(limit*local/(local+remote), min(limit, 1))
}

// bucketWidth is the span of one rate bucket.
func (s *shard) bucketWidth() time.Duration {
	return max(s.e.cfg.RateWindow/rateBuckets, time.Millisecond)
}

// admit applies the group's limits to one send: it goes to the commit list,
// waits in the group's buffer, or is refused with ErrRateLimited.
func (s *shard) admit(t *task, now time.Time) {
	cfg := s.tn
	gs := s.group(t.send.GID, now)
	if err := s.checkSender(gs, t, now); err != nil {
		s.refuseSender(t, err)
		return
	}
	gs.arrivals.add(now, s.bucketWidth(), 1)
	gs.lastSeen = now
	if t.send.Kind == store.KindAtAll && cfg.AtAllPerDay > 0 && !s.admitAtAll(gs, t, now) {
		return
	}
	if now.Sub(gs.lastEval) >= s.bucketWidth() {
		s.evaluate(gs, now)
	}
	rate, burst, buffer, limited := s.limits(gs)
	if !limited && gs.queue.len() == 0 {
		s.ready = append(s.ready, t)
		return
	}
	if gs.queue.len() == 0 && (!limited || gs.bucket.take(now, rate, burst)) {
		s.ready = append(s.ready, t)
		return
	}
	for gs.queue.len() >= buffer {
		// Keep the newest: the oldest buffered send is refused (several
		// when SetTuning shrank the buffer).
		old := gs.queue.pop()
		s.e.cfg.Metrics.limited("rejected")
		s.reject(gs, old, &RetryError{Err: ErrRateLimited, After: time.Duration(float64(buffer) / rate * float64(time.Second))})
	}
	s.e.cfg.Metrics.limited("buffered")
	gs.queue.push(t)
	if !gs.paced {
		gs.paced = true
		s.paced = append(s.paced, gs)
	}
}

// reject answers a send that will not be stored.
func (s *shard) reject(gs *gstate, t *task, err error) {
	s.e.refundAtAll(gs, t)
	s.e.cfg.Metrics.sends(1, "rate_limited")
	t.send.Done(SendResult{Err: err})
	releaseTask(t)
}

// pace releases buffered sends as their groups' buckets allow.
func (s *shard) pace(now time.Time) {
	for i := 0; i < len(s.paced); {
		gs := s.paced[i]
		rate, burst, _, limited := s.limits(gs)
		for gs.queue.len() > 0 && (!limited || gs.bucket.take(now, rate, burst)) {
			s.ready = append(s.ready, gs.queue.pop())
		}
		if gs.queue.len() == 0 {
			gs.paced = false
			s.paced[i] = s.paced[len(s.paced)-1]
			s.paced[len(s.paced)-1] = nil
			s.paced = s.paced[:len(s.paced)-1]
			continue
		}
		i++
	}
}
