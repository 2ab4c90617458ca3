package fanout

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the engine's Prometheus collectors. A nil *Metrics records
// nothing.
type Metrics struct {
	sendsTotal    *prometheus.CounterVec
	overloadTotal prometheus.Counter
	waitSeconds   prometheus.Histogram
	procSeconds   prometheus.Histogram
	batchSize     prometheus.Histogram
	deliveryTotal prometheus.Counter
	framesTotal   prometheus.Counter
}

// NewMetrics creates the engine's collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sendsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_sends_total", Help: "Sends processed by the engine, by result.",
		}, []string{"result"}),
		overloadTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_sends_overloaded_total", Help: "Sends refused because a shard queue was past its bound.",
		}),
		waitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fanfare_queue_wait_seconds", Help: "Time a send waited in its shard queue.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		procSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fanfare_batch_process_seconds", Help: "Time to commit, ack and push one batch.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fanfare_commit_batch_messages", Help: "Messages per commit.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		deliveryTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_deliveries_total", Help: "Message deliveries handed to connections (messages x connections).",
		}),
		framesTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_push_frames_total", Help: "Push frames handed to connections (frames x connections).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.sendsTotal, m.overloadTotal, m.waitSeconds, m.procSeconds, m.batchSize, m.deliveryTotal, m.framesTotal)
	}
	return m
}

func (m *Metrics) sends(n int, result string) {
	if m == nil || n == 0 {
		return
	}
	m.sendsTotal.WithLabelValues(result).Add(float64(n))
}

func (m *Metrics) overloaded() {
	if m != nil {
		m.overloadTotal.Inc()
	}
}

func (m *Metrics) queueWait(d time.Duration) {
	if m != nil {
		m.waitSeconds.Observe(d.Seconds())
	}
}

func (m *Metrics) process(d time.Duration, n int) {
	if m != nil {
		m.procSeconds.Observe(d.Seconds())
		m.batchSize.Observe(float64(n))
	}
}

func (m *Metrics) deliveries(msgs, frames int) {
	if m != nil {
		m.deliveryTotal.Add(float64(msgs))
		m.framesTotal.Add(float64(frames))
	}
}
