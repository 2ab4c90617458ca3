package redislimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/limiter"
)

// limitsKey holds the cluster's limits document (JSON); the channel of the
// same name announces changes.
func (l *Limiter) limitsKey() string { return l.prefix + "limits" }

// PublishLimits stores lim (normalized) in Redis as the cluster's limits
// and tells every node running WatchLimits to apply it. It does not change
// this instance by itself: a node applies it through its own WatchLimits
// (or the caller applies it directly as well).
func (l *Limiter) PublishLimits(ctx context.Context, lim limiter.Limits) error {
	n := lim.Normalize()
	if err := n.Validate(); err != nil {
		return err
	}
	doc, err := json.Marshal(n)
	if err != nil {
		return err
	}
	if err := l.client.Set(ctx, l.limitsKey(), doc, 0).Err(); err != nil {
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	if err := l.client.Publish(ctx, l.limitsKey(), "changed").Err(); err != nil {
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	return nil
}

// StoredLimits returns the limits document stored by PublishLimits; ok is
// false when there is none. Rules an older node stored that are now
// limiter.RetiredRules are dropped.
func (l *Limiter) StoredLimits(ctx context.Context) (lim limiter.Limits, ok bool, err error) {
	doc, err := l.client.Get(ctx, l.limitsKey()).Bytes()
	if errors.Is(err, redis.Nil) {
		return lim, false, nil
	}
	if err != nil {
		return lim, false, fmt.Errorf("%w: %w", limiter.ErrUnavailable, err)
	}
	if err := json.Unmarshal(doc, &lim); err != nil {
		return lim, false, fmt.Errorf("redislimit: stored limits: %w", err)
	}
	lim.DropRetired()
	return lim, true, nil
}

// WatchLimits calls apply with the stored limits document now (if there is
// one), whenever any node publishes a new one, and every poll interval in
// case a message was lost (0 means 30s); an unchanged document is not
// applied twice. apply is typically (*limiter.Failover).SetLimits. Errors
// from Redis or apply are logged, not fatal. It returns nil when ctx ends.
func (l *Limiter) WatchLimits(ctx context.Context, poll time.Duration, apply func(limiter.Limits) error) error {
	if poll <= 0 {
		poll = 30 * time.Second
	}
	sub := l.client.Subscribe(ctx, l.limitsKey())
	defer sub.Close()
	msgs := sub.Channel()
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var last []byte
	load := func() {
		doc, err := l.client.Get(ctx, l.limitsKey()).Bytes()
		switch {
		case errors.Is(err, redis.Nil):
			return
		case err != nil:
			if ctx.Err() == nil {
				l.log.Warn("redislimit: reading stored limits", "err", err)
			}
			return
		case bytes.Equal(doc, last):
			return
		}
		var lim limiter.Limits
		if err := json.Unmarshal(doc, &lim); err != nil {
			l.log.Error("redislimit: stored limits are not valid JSON", "err", err)
			return
		}
		if dropped := lim.DropRetired(); len(dropped) > 0 {
			l.log.Info("redislimit: stored limits name retired rules, ignored (the engine's tuning sets them)", "rules", dropped)
		}
		if err := apply(lim); err != nil {
			l.log.Error("redislimit: applying stored limits", "err", err)
			return
		}
		last = doc
		l.log.Info("redislimit: limits reloaded from Redis")
	}
	load()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-msgs:
		case <-tick.C:
		}
		load()
	}
}
