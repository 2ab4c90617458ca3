package limiter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FailoverConfig configures a Failover. The zero value works.
type FailoverConfig struct {
	// Share is the fraction of each limit one node enforces on its own while
	// the primary is unreachable (rules with a FallbackShare keep theirs);
	// 0 means 1/Nodes.
	Share float64
	// Nodes is the expected number of nodes, used when Share is 0; 0 means 1.
	Nodes int
	// ProbeInterval is how often Run pings the primary while on the
	// fallback; 0 means 1s.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one ping; 0 means 500ms.
	ProbeTimeout time.Duration
	// Logger receives switch events; nil discards.
	Logger *slog.Logger
	// Registerer receives the failover metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Metrics records decisions (give it to the Failover, not to the
	// wrapped limiters); nil records nothing.
	Metrics *Metrics
}

// Validate reports configuration errors.
func (c FailoverConfig) Validate() error {
	var errs []error
	if c.Share < 0 || c.Share > 1 {
		errs = append(errs, fmt.Errorf("limiter: failover share %v outside [0, 1]", c.Share))
	}
	if c.Nodes < 0 {
		errs = append(errs, fmt.Errorf("limiter: failover nodes %d is negative", c.Nodes))
	}
	if c.ProbeInterval < 0 || c.ProbeTimeout < 0 {
		errs = append(errs, errors.New("limiter: failover probe interval and timeout must not be negative"))
	}
	return errors.Join(errs...)
}

// Failover decides with the primary (shared, Redis) limiter and switches to
// the fallback (in-process) limiter, enforcing a per-node share of every
// limit, as soon as the primary fails with ErrUnavailable. Run probes the
// primary and switches back when it answers. Switches are logged and
// counted; a gauge shows the current mode.
//
// State is not carried across a switch: the fallback starts from its own
// (per-node) counters and the primary from whatever Redis still holds.
type Failover struct {
	primary  Pinger
	fallback Limiter
	cfg      FailoverConfig
	share    float64
	log      *slog.Logger

	limits atomic.Pointer[Limits] // unscaled, as set
	down   atomic.Bool
	mu     sync.Mutex // serializes SetLimits and mode switches
	since  time.Time  // when the current outage began; guarded by mu

	active   prometheus.Gauge
	switches *prometheus.CounterVec
}

var _ Limiter = (*Failover)(nil)

// NewFailover wraps primary and fallback. The fallback's limits are set to
// the primary's, scaled to this node's share.
func NewFailover(primary Pinger, fallback Limiter, cfg FailoverConfig) (*Failover, error) {
	if primary == nil || fallback == nil {
		return nil, errors.New("limiter: failover needs a primary and a fallback")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = time.Second
	}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = 500 * time.Millisecond
	}
	share := cfg.Share
	if share == 0 {
		share = 1
		if cfg.Nodes > 1 {
			share = 1 / float64(cfg.Nodes)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	f := &Failover{
		primary:  primary,
		fallback: fallback,
		cfg:      cfg,
		share:    share,
		log:      log,
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "fanfare", Subsystem: "limiter", Name: "fallback_active",
			Help: "1 while rate limits are decided in-process because Redis is unreachable.",
		}),
		switches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "fanfare", Subsystem: "limiter", Name: "fallback_switches_total",
			Help: "Switches between the Redis limiter and the in-process fallback, by target.",
		}, []string{"to"}),
	}
	if r := cfg.Registerer; r != nil {
		for _, c := range []prometheus.Collector{f.active, f.switches} {
			if err := r.Register(c); err != nil {
				return nil, err
			}
		}
	}
	if err := f.SetLimits(primary.Limits()); err != nil {
		return nil, err
	}
	return f, nil
}

// Allow decides with the primary, or with the fallback while the primary is
// unreachable. It returns an error only when the caller's context ended or
// the checks are invalid.
func (f *Failover) Allow(ctx context.Context, checks ...Check) (Decision, error) {
	if !f.down.Load() {
		d, err := f.primary.Allow(ctx, checks...)
		if err == nil {
			f.cfg.Metrics.Observe(f.limits.Load(), checks, d)
			return d, nil
		}
		if !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			return d, err
		}
		f.switchDown(err)
	}
	d, err := f.fallback.Allow(ctx, checks...)
	if err == nil {
		f.cfg.Metrics.Observe(f.limits.Load(), checks, d)
	}
	return d, err
}

// Limits returns the limits as set (not scaled).
func (f *Failover) Limits() Limits { return f.limits.Load().Clone() }

// SetLimits sets l on the primary and l scaled to this node's share on the
// fallback.
func (f *Failover) SetLimits(l Limits) error {
	n := l.Normalize()
	if err := n.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.primary.SetLimits(n); err != nil {
		return err
	}
	if err := f.fallback.SetLimits(n.Scaled(f.share)); err != nil {
		return err
	}
	f.limits.Store(&n)
	return nil
}

// Fallback reports whether decisions are currently made in-process.
func (f *Failover) Fallback() bool { return f.down.Load() }

// ActiveGauge returns the gauge fanfare_limiter_fallback_active.
func (f *Failover) ActiveGauge() prometheus.Gauge { return f.active }

// SwitchCounter returns fanfare_limiter_fallback_switches_total, labelled
// to="fallback" or to="primary".
func (f *Failover) SwitchCounter() *prometheus.CounterVec { return f.switches }

// Share returns the fraction of each limit enforced while on the fallback.
func (f *Failover) Share() float64 { return f.share }

// Run pings the primary every ProbeInterval while on the fallback and
// switches back when a ping succeeds. It returns nil when ctx ends.
func (f *Failover) Run(ctx context.Context) error {
	t := time.NewTicker(f.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !f.down.Load() {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, f.cfg.ProbeTimeout)
		err := f.primary.Ping(pctx)
		cancel()
		if err != nil {
			f.log.Debug("limiter: primary still unreachable", "err", err)
			continue
		}
		f.switchUp()
	}
}

func (f *Failover) switchDown(cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down.Load() {
		return
	}
	f.down.Store(true)
	f.since = time.Now()
	f.active.Set(1)
	f.switches.WithLabelValues("fallback").Inc()
	f.log.Warn("limiter: Redis unreachable, deciding in-process with a per-node share",
		"share", f.share, "err", cause)
}

func (f *Failover) switchUp() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.down.Load() {
		return
	}
	f.down.Store(false)
	f.active.Set(0)
	f.switches.WithLabelValues("primary").Inc()
	f.log.Info("limiter: Redis reachable again, back to shared limits",
		"outage", time.Since(f.since).Round(time.Millisecond).String())
}
