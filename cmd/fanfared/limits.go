package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/local"
	"github.com/fanfare-im/fanfare/limiter/redislimit"
)

// limits is the node's rate limiting: the shared limiter (Redis with an
// in-process fallback in cluster mode, in-process in embedded mode) and the
// per-node one for connection admission.
type limits struct {
	shared  limiter.Limiter
	remote  bool // shared may block on Redis
	node    *local.Limiter
	runs    []func(context.Context) error
	publish func(context.Context, limiter.Limits) error // cluster mode: share with the other nodes
	// roomQuota is the waiting rooms' default admission quota, from the
	// room_admit rule of the limits in force.
	roomQuota atomic.Uint64 // math.Float64bits
}

// setRoomQuota derives the waiting rooms' default quota from doc.
func (lm *limits) setRoomQuota(doc limiter.Limits) {
	r := doc.Normalize().Rules[limiter.RoomAdmit]
	lm.roomQuota.Store(math.Float64bits(r.VIPShare()))
}

// RoomQuota is waitroom.Config.AdmitQuota.
func (lm *limits) RoomQuota() float64 { return math.Float64frombits(lm.roomQuota.Load()) }

// loadLimits reads the limits document (defaults when path is empty).
func loadLimits(path string) (limiter.Limits, error) {
	if path == "" {
		return limiter.Default(), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return limiter.Limits{}, fmt.Errorf("limits file: %w", err)
	}
	var l limiter.Limits
	if err := json.Unmarshal(b, &l); err != nil {
		return limiter.Limits{}, fmt.Errorf("limits file %s: %w", path, err)
	}
	l = l.Normalize()
	if err := l.Validate(); err != nil {
		return limiter.Limits{}, fmt.Errorf("limits file %s: %w", path, err)
	}
	return l, nil
}

func newLimits(cfg *config, rdb redis.UniversalClient, reg prometheus.Registerer, log *slog.Logger) (*limits, error) {
	doc, err := loadLimits(cfg.LimitsFile)
	if err != nil {
		return nil, err
	}
	metrics, err := limiter.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	lm := &limits{}
	lm.setRoomQuota(doc)
	lm.node, err = local.New(local.Config{Limits: doc, Logger: log})
	if err != nil {
		return nil, err
	}
	lm.runs = append(lm.runs, lm.node.Run)
	if rdb == nil {
		shared, err := local.New(local.Config{Limits: doc, Metrics: metrics, Logger: log})
		if err != nil {
			return nil, err
		}
		lm.shared = shared
		lm.runs = append(lm.runs, shared.Run)
		return lm, nil
	}
	rl, err := redislimit.New(redislimit.Config{Client: rdb, Prefix: cfg.RedisPrefix + "lim:", Limits: doc, Logger: log,
		Batch: cfg.LimitsBatch > 0, MaxBatch: cfg.LimitsBatch, MaxInflight: cfg.LimitsBatchInflight,
		LeaseTTL: cfg.LimitsLeaseTTL, LeaseMax: cfg.LimitsLeaseMax, LeaseMinHits: cfg.LimitsLeaseMinHits})
	if err != nil {
		return nil, err
	}
	fb, err := local.New(local.Config{Limits: doc, Logger: log})
	if err != nil {
		return nil, err
	}
	f, err := limiter.NewFailover(rl, fb, limiter.FailoverConfig{Nodes: cfg.ExpectedNodes, Logger: log, Registerer: reg, Metrics: metrics})
	if err != nil {
		return nil, err
	}
	lm.shared, lm.remote = f, true
	lm.publish = rl.PublishLimits
	lm.runs = append(lm.runs, fb.Run, f.Run, rl.Run, func(ctx context.Context) error {
		// Limits changed on any node (admin API) reach every node.
		return rl.WatchLimits(ctx, 5*time.Second, func(l limiter.Limits) error {
			if err := f.SetLimits(l); err != nil {
				return err
			}
			if err := lm.node.SetLimits(l); err != nil {
				return err
			}
			lm.setRoomQuota(l)
			return nil
		})
	})
	return lm, nil
}

// reload re-reads the limits file (SIGHUP).
func (lm *limits) reload(path string) error {
	doc, err := loadLimits(path)
	if err != nil {
		return err
	}
	return lm.apply(context.Background(), doc)
}

// apply puts doc in force on this node's limiters and, in cluster mode,
// publishes it to the other nodes.
func (lm *limits) apply(ctx context.Context, doc limiter.Limits) error {
	if err := lm.shared.SetLimits(doc); err != nil {
		return err
	}
	if err := lm.node.SetLimits(doc); err != nil {
		return err
	}
	lm.setRoomQuota(doc)
	if lm.publish != nil {
		return lm.publish(ctx, doc)
	}
	return nil
}
