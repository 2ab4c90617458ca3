package fanout

import (
	"context"
	"errors"
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
