package limiter

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts decisions per rule, user class and result. A nil *Metrics
// records nothing. One Metrics may be shared by several limiters (the
// Failover and its backends should not all get one, or requests are counted
// twice: give it to the outermost limiter).
//
// Labels are bounded: rule (configured rule names), class (low, normal,
// vip), result (allowed, denied), reason (none, limit, reserve, user_cap,
// cost).
type Metrics struct {
	decisions *prometheus.CounterVec

	mu    sync.Mutex                           // serializes cache writers
	cache atomic.Pointer[map[metricKey]metric] // copy-on-write; lock-free reads
}

type metricKey struct {
	rule   string
	class  Class
	reason Reason
}

type metric struct{ c prometheus.Counter }

// NewMetrics creates the decision counter fanfare_limiter_decisions_total
// and registers it on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "fanfare",
			Subsystem: "limiter",
			Name:      "decisions_total",
			Help:      "Rate-limit checks by rule, user class and result. An allowed request counts once per check; a denied one only for the denying check.",
		}, []string{"rule", "class", "result", "reason"}),
	}
	empty := map[metricKey]metric{}
	m.cache.Store(&empty)
	if reg != nil {
		if err := reg.Register(m.decisions); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Observe records one decision over checks; l (the limits in force) maps
// levels to classes.
func (m *Metrics) Observe(l *Limits, checks []Check, d Decision) {
	if m == nil {
		return
	}
	if d.Allowed {
		for i := range checks {
			m.counter(checks[i].Rule, l.ClassOf(checks[i].Tier), ReasonNone).Inc()
		}
		return
	}
	if d.Index >= 0 && d.Index < len(checks) {
		m.counter(checks[d.Index].Rule, l.ClassOf(checks[d.Index].Tier), d.Reason).Inc()
	}
}

// Vec returns the underlying counter fanfare_limiter_decisions_total.
func (m *Metrics) Vec() *prometheus.CounterVec { return m.decisions }

func (m *Metrics) counter(rule string, class Class, reason Reason) prometheus.Counter {
	k := metricKey{rule, class, reason}
	if c, ok := (*m.cache.Load())[k]; ok {
		return c.c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.cache.Load()
	if c, ok := old[k]; ok {
		return c.c
	}
	result := "denied"
	if reason == ReasonNone {
		result = "allowed"
	}
	c := m.decisions.WithLabelValues(rule, class.String(), result, reason.String())
	next := make(map[metricKey]metric, len(old)+1)
	for kk, v := range old {
		next[kk] = v
	}
	next[k] = metric{c}
	m.cache.Store(&next)
	return c
}
