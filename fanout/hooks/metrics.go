package hooks

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the hooks' Prometheus collectors; a nil *Metrics records
// nothing.
type Metrics struct {
	bsSeconds  *prometheus.HistogramVec
	bsOutcomes *prometheus.CounterVec
	evAppended prometheus.Counter
	evDeliver  prometheus.Counter
	evRetries  prometheus.Counter
	evDropped  *prometheus.CounterVec
	evReorder  prometheus.Counter
	evPending  prometheus.Gauge
	evLag      prometheus.Gauge
	evHeld     prometheus.Gauge
	evAsync    prometheus.Gauge
}

// NewMetrics creates the collectors and registers them on reg (nil = not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		bsSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fanfare_hook_before_send_seconds", Help: "Duration of before-send hook calls (one per group per commit batch), by result (ok, failed).",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1},
		}, []string{"result"}),
		bsOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_hook_before_send_total", Help: "Sends decided by the before-send hook, by outcome (allow, reject, rewrite, failed_open, failed_closed).",
		}, []string{"outcome"}),
		evAppended: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_hook_events_appended_total", Help: "Events written to the event journal.",
		}),
		evDeliver: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_hook_events_delivered_total", Help: "Events the receiver acknowledged (2xx).",
		}),
		evRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_hook_event_retries_total", Help: "Retried event POSTs (failed attempts followed by another).",
		}),
		evDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_hook_events_dropped_total", Help: "Events dropped, by reason (journal_full with -hook-events-drop-when-full, max_attempts with -hook-events-max-attempts, async_queue_full, closed, journal_error).",
		}, []string{"reason"}),
		evReorder: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_hook_events_out_of_order_total", Help: "Message events delivered at or below a seq already delivered for their group (redeliveries, or appends later than the reorder window).",
		}),
		evPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fanfare_hook_events_pending", Help: "Events in the journal not yet delivered (queue depth).",
		}),
		evLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fanfare_hook_events_lag_seconds", Help: "Age of the oldest event being delivered (0 when the journal is empty).",
		}),
		evHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fanfare_hook_events_held", Help: "Emits waiting for room in a full journal (back-pressure on sends).",
		}),
		evAsync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fanfare_hook_events_async_queue", Help: "Connect and disconnect events queued for the journal.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.bsSeconds, m.bsOutcomes, m.evAppended, m.evDeliver, m.evRetries, m.evDropped,
			m.evReorder, m.evPending, m.evLag, m.evHeld, m.evAsync)
	}
	return m
}

func (m *Metrics) beforeSendSeconds(d time.Duration, ok bool) {
	if m == nil {
		return
	}
	r := "ok"
	if !ok {
		r = "failed"
	}
	m.bsSeconds.WithLabelValues(r).Observe(d.Seconds())
}

func (m *Metrics) beforeSendOutcome(outcome string, n int) {
	if m != nil {
		m.bsOutcomes.WithLabelValues(outcome).Add(float64(n))
	}
}

func (m *Metrics) eventsAppended(n int) {
	if m != nil {
		m.evAppended.Add(float64(n))
	}
}

func (m *Metrics) eventsDelivered(n int) {
	if m != nil {
		m.evDeliver.Add(float64(n))
	}
}

func (m *Metrics) eventRetry() {
	if m != nil {
		m.evRetries.Inc()
	}
}

func (m *Metrics) eventsDropped(reason string, n int) {
	if m != nil {
		m.evDropped.WithLabelValues(reason).Add(float64(n))
	}
}

func (m *Metrics) eventsReordered() {
	if m != nil {
		m.evReorder.Inc()
	}
}

func (m *Metrics) pending(n int64) {
	if m != nil {
		m.evPending.Set(float64(n))
	}
}

func (m *Metrics) lag(d time.Duration) {
	if m != nil {
		m.evLag.Set(max(d.Seconds(), 0))
	}
}

func (m *Metrics) eventsHeld(d int) {
	if m != nil {
		m.evHeld.Add(float64(d))
	}
}

func (m *Metrics) asyncDepth(d int) {
	if m != nil {
		m.evAsync.Add(float64(d))
	}
}
