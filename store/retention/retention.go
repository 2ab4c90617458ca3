package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/store"
)

// Config configures a Sweeper.
type Config struct {
	Store store.Store // required
	// Keep is how long messages are kept; required (> 0).
	Keep time.Duration
	// Interval is the time between the starts of two rounds; 0 = 10 min.
	Interval time.Duration
	// Batch bounds the messages one ExpireMessages call deletes; 0 = 1000.
	Batch int
	// Lock, when set, is asked before each round for the round's slot
	// (now / Interval, in Unix time): the first node to take a slot
	// sweeps it, false means another node did. An error skips the round
	// (logged).
	Lock func(ctx context.Context, slot int64, lease time.Duration) (bool, error)
	Now  func() time.Time // nil = time.Now
	// Registerer receives the sweeper's metrics; nil = not exported.
	Registerer prometheus.Registerer
	Logger     *slog.Logger // nil = discard
}

// pageSize is how many gids one GroupIDs call returns.
const pageSize = 1000

// Sweeper runs the rounds.
type Sweeper struct {
	cfg     Config
	expired prometheus.Counter
	rounds  *prometheus.CounterVec
}

// New returns a Sweeper for cfg.
func New(cfg Config) (*Sweeper, error) {
	if cfg.Store == nil {
		return nil, errors.New("retention: Store is required")
	}
	if cfg.Keep <= 0 {
		return nil, fmt.Errorf("retention: Keep must be positive, got %v", cfg.Keep)
	}
	if cfg.Interval < 0 || cfg.Batch < 0 {
		return nil, errors.New("retention: Interval and Batch must not be negative")
	}
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Minute
	}
	if cfg.Batch == 0 {
		cfg.Batch = 1000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Sweeper{
		cfg: cfg,
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_messages_expired_total", Help: "Messages deleted by the retention policy (-retention).",
		}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_retention_rounds_total", Help: "Retention rounds by result: done, skipped (another node holds the round), failed.",
		}, []string{"result"}),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.expired); err != nil {
			return nil, err
		}
		if err := cfg.Registerer.Register(s.rounds); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Run sweeps at once and then every Interval until ctx is done; it
// returns nil then.
func (s *Sweeper) Run(ctx context.Context) error {
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		s.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// round runs one round unless another node holds it, and logs it.
func (s *Sweeper) round(ctx context.Context) {
	if s.cfg.Lock != nil {
		slot := s.cfg.Now().UnixNano() / int64(s.cfg.Interval)
		ok, err := s.cfg.Lock(ctx, slot, 2*s.cfg.Interval)
		if err != nil {
			if ctx.Err() == nil {
				s.rounds.WithLabelValues("failed").Inc()
				s.cfg.Logger.Warn("retention: round skipped, the round lock could not be taken", "err", err)
			}
			return
		}
		if !ok {
			s.rounds.WithLabelValues("skipped").Inc()
			return
		}
	}
	start := time.Now()
	groups, deleted, err := s.Round(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.rounds.WithLabelValues("failed").Inc()
			s.cfg.Logger.Warn("retention: round failed or left groups out (the next round tries them again)", "err", err, "groups", groups, "deleted", deleted)
		}
		return
	}
	s.rounds.WithLabelValues("done").Inc()
	if deleted > 0 {
		s.cfg.Logger.Info("retention: expired messages deleted", "deleted", deleted, "groups", groups,
			"older_than", s.cfg.Keep.String(), "took", time.Since(start).Round(time.Microsecond).String())
	}
}

// Round deletes every group's messages older than Keep, now, and returns
// how many groups it walked and messages it deleted. A group that fails is
// left for the next round and the walk goes on (the error names the first
// such group and how many failed); a failed walk or the end of ctx stops
// it.
func (s *Sweeper) Round(ctx context.Context) (groups, deleted int, err error) {
	cut := s.cfg.Now().Add(-s.cfg.Keep)
	after := int64(0)
	var first error
	failed := 0
	for {
		gids, err := s.cfg.Store.GroupIDs(ctx, after, pageSize)
		if err != nil {
			return groups, deleted, errors.Join(err, first)
		}
		for _, gid := range gids {
			if err := ctx.Err(); err != nil {
				return groups, deleted, err
			}
			for {
				n, err := s.cfg.Store.ExpireMessages(ctx, gid, cut, s.cfg.Batch)
				deleted += n
				s.expired.Add(float64(n))
				if err != nil {
					if failed++; first == nil {
						first = fmt.Errorf("group %d: %w", gid, err)
					}
					break
				}
				if n < s.cfg.Batch {
					break
				}
			}
			groups++
		}
		if len(gids) < pageSize {
			if failed > 0 {
				return groups, deleted, fmt.Errorf("%d groups left for the next round, the first: %w", failed, first)
			}
			return groups, deleted, nil
		}
		after = gids[len(gids)-1]
	}
}
