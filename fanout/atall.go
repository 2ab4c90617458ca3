// This file is the one home of @all: the quota a group may spend per UTC
// day, local or shared by the cluster (AtAllQuota): admission counts a
// send (admitAtAll), a refused or failed commit gives it back
// (refundAtAll). Admission is in admission.go; the walk goes on in
// commit.go.

package fanout

import (
	"context"
	"errors"
	"slices"
	"time"
)

// errNoSharedQuota: the node counts an @all itself.
var errNoSharedQuota = errors.New("fanout: no shared @all quota")

// AtAllQuota is the cluster's count of @all messages per group per UTC day
// (docs/architecture.md §8); *redisquota.Quota implements it. Nil in
// Config.AtAllQuota = each node counts its own.
//
// The engine calls Take on the group's worker, bounded by atAllTimeout,
// and Refund in the background. When Take fails the worker counts the
// @all locally and keeps doing so for atAllRetry before it asks again, so
// an unreachable backend costs a worker at most one timeout per period.
type AtAllQuota interface {
	// Take charges the @all send key to gid's quota of day (days since
	// the Unix epoch, UTC) of at most limit. A key charged that day
	// already is admitted again without a charge (AtAllRetry: the store
	// answers it with its seq).
	Take(ctx context.Context, gid, day int64, key string, limit int) (AtAllCharge, error)
	// Refund gives back key's charge of day (a send charged by Take that
	// was refused after all, or not stored as a new message).
	Refund(ctx context.Context, gid, day int64, key string) error
}

// AtAllCharge is the answer of AtAllQuota.Take.
type AtAllCharge uint8

// Answers of AtAllQuota.Take.
const (
	AtAllRefused AtAllCharge = iota // the day's quota is used up
	AtAllCharged                    // charged now: refund it if the send is not stored
	AtAllRetry                      // charged before: admitted, nothing to refund
)

const (
	// atAllTimeout bounds one call of the shared @all quota.
	atAllTimeout = 100 * time.Millisecond
	// atAllRetry is how long a node counts @all locally after the shared
	// quota failed.
	atAllRetry = 5 * time.Second
)

// takeAtAll charges t to the shared @all quota (on t's worker). An error
// means the node counts t itself: there is no shared quota, it failed
// just now, or it failed less than atAllRetry ago.
func (e *Engine) takeAtAll(t *task, day int64, limit int, now time.Time) (bool, error) {
	q := e.cfg.AtAllQuota
	if q == nil {
		return false, errNoSharedQuota
	}
	if now.UnixNano() < e.atAllDownUntil.Load() {
		return false, errNoSharedQuota
	}
	ctx, cancel := context.WithTimeout(context.Background(), atAllTimeout)
	c, err := q.Take(ctx, t.send.GID, day, atAllKey(t), limit)
	cancel()
	if err != nil {
		if e.atAllDownUntil.Swap(now.Add(atAllRetry).UnixNano()) == 0 {
			e.cfg.Logger.Warn("@all quota unavailable: each node counts its own @all until it answers", "err", err, "retry_every", atAllRetry)
		}
		e.cfg.Metrics.atAllQuota("failed")
		return false, err
	}
	if e.atAllDownUntil.Swap(0) != 0 {
		e.cfg.Logger.Info("@all quota reachable again: @all counted for the cluster")
	}
	e.cfg.Metrics.atAllQuota("ok")
	if c == AtAllCharged {
		t.atAll, t.shared, t.atDay = true, true, day
	}
	return c != AtAllRefused, nil
}

// refundSharedAtAll gives t's charge back to the shared quota, in the
// background (a refused or failed send must not wait for it; Run waits for
// these before it returns). A lost refund leaves the day's quota one
// short.
func (e *Engine) refundSharedAtAll(t *task) {
	gid, day, key := t.send.GID, t.atDay, atAllKey(t)
	e.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := e.cfg.AtAllQuota.Refund(ctx, gid, day, key); err != nil {
			e.cfg.Logger.Warn("@all quota: refund lost (the day's quota stays one short)", "gid", gid, "err", err)
			e.cfg.Metrics.atAllQuota("refund_failed")
		}
	})
}

// admitAtAll counts an @all send against its group's daily quota, or
// refuses it. A retry of a counted @all passes uncounted (the store answers
// it with its seq). With a shared quota the count is the cluster's (one
// round trip on this worker, bounded by atAllTimeout; @all is rare); while
// that fails, the node counts its own, and a send it counted then is still
// recognized as a retry once the shared quota answers again.
func (s *shard) admitAtAll(gs *gstate, t *task, now time.Time) bool {
	day := utcDay(now)
	if gs.atAllDay != day {
		gs.atAllDay, gs.atAllCount = day, 0
		clear(gs.atAllIDs)
		gs.atAllIDs = gs.atAllIDs[:0]
	}
	k := atAllKey(t)
	if ok, err := s.e.takeAtAll(t, day, s.tn.AtAllPerDay, now); err == nil {
		if !ok && !slices.Contains(gs.atAllIDs, k) {
			s.refuseAtAll(gs, t, now)
			return false
		}
		return true
	}
	if slices.Contains(gs.atAllIDs, k) {
		return true
	}
	if gs.atAllCount >= s.tn.AtAllPerDay {
		s.refuseAtAll(gs, t, now)
		return false
	}
	gs.atAllCount++
	gs.atAllIDs = append(gs.atAllIDs, k)
	t.atAll, t.atDay = true, day
	return true
}

// refuseAtAll refuses an @all over the quota until the next UTC day.
func (s *shard) refuseAtAll(gs *gstate, t *task, now time.Time) {
	next := time.Unix((utcDay(now)+1)*86400, 0)
	s.e.cfg.Metrics.limited("at_all")
	s.reject(gs, t, &RetryError{Err: ErrAtAllQuota, After: next.Sub(now)})
}

// atAllKey identifies one @all send for the quota's retry check.
func atAllKey(t *task) string { return t.send.UID + "\x00" + t.send.ClientMsgID }

// refundAtAll gives back the quota of an @all send that was not stored.
func (e *Engine) refundAtAll(gs *gstate, t *task) {
	if !t.atAll {
		return
	}
	t.atAll = false
	if t.shared {
		e.refundSharedAtAll(t)
		return
	}
	if gs == nil {
		return
	}
	gs.atAllCount--
	k := atAllKey(t)
	for i, id := range gs.atAllIDs {
		if id == k {
			gs.atAllIDs = append(gs.atAllIDs[:i], gs.atAllIDs[i+1:]...)
			break
		}
	}
}

// utcDay returns the day number of now in UTC.
func utcDay(now time.Time) int64 { return now.Unix() / 86400 }
