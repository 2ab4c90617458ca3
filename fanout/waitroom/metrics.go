package waitroom

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the room subsystem's Prometheus collectors. They are always
// recorded; they are registered only when Config.Registerer is set.
type metrics struct {
	waiting      *prometheus.GaugeVec
	active       *prometheus.GaugeVec
	rate         *prometheus.GaugeVec
	lmax         *prometheus.GaugeVec
	eta          *prometheus.GaugeVec
	alert        *prometheus.GaugeVec
	admitted     *prometheus.CounterVec
	rejected     *prometheus.CounterVec
	ended        *prometheus.CounterVec
	perceived    *prometheus.HistogramVec
	wait         *prometheus.HistogramVec
	violations   *prometheus.CounterVec
	preQueue     *prometheus.GaugeVec
	owed         *prometheus.GaugeVec
	service      *prometheus.HistogramVec
	degradation  prometheus.Gauge
	backendCalls *prometheus.CounterVec
	webhook      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	waitBuckets := []float64{1, 5, 15, 30, 60, 120, 300, 600, 900, 1200, 1500, 1800, 2700, 3600}
	m := &metrics{
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fanfare_room_waiting",
			Help: "Connected users waiting in the room's queue (depth)."}, []string{"room"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fanfare_room_active",
			Help: "Admitted sessions."}, []string{"room"}),
		rate: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fanfare_room_admission_rate",
			Help: "Admissions per second over the 5-minute window."}, []string{"room"}),
		lmax: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fanfare_room_lmax",
			Help: "Little's Law capacity of the queue (rate x target wait x safety factor)."}, []string{"room"}),
		eta: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fanfare_room_tail_eta_seconds",
			Help: "ETA of the last user in the queue (depth / rate); -1 when paused."}, []string{"room"}),
		alert: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fanfare_room_capacity_alert",
			Help: "Queue depth against L_max: 0 below 50%, 1 at 50%, 2 at 80%."}, []string{"room"}),
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanfare_room_admitted_total",
			Help: "Admissions by this node, by level and whether the max-wait rule chose them."}, []string{"room", "level", "overdue"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanfare_room_rejected_total",
			Help: "Entrants refused, by code."}, []string{"room", "code"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanfare_room_sessions_ended_total",
			Help: "Admitted sessions ended by this node, by reason."}, []string{"room", "reason"}),
		perceived: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fanfare_room_perceived_wait_seconds",
			Help: "Wait from first join to admission, as the user perceives it.", Buckets: waitBuckets}, []string{"room", "level"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fanfare_room_wait_seconds",
			Help:    "Wait the max-wait promise bounds (admission - max(join, return from away)), by level.",
			Buckets: waitBuckets}, []string{"room", "level"}),
		violations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanfare_room_max_wait_violations_total",
			Help: "Admissions by this node that broke the max-wait promise (must stay 0)."}, []string{"room"}),
		preQueue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fanfare_room_pre_queue",
			Help: "Users in a scheduled room's pre-queue, waiting for its start."}, []string{"room"}),
		owed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fanfare_room_owed",
			Help: "Users owed an admission (waiting, away, pre-queue), against the room's max-wait capacity."}, []string{"room"}),
		service: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fanfare_room_service_time_seconds",
			Help: "Admitted session length (admission to end).", Buckets: waitBuckets}, []string{"room"}),
		degradation: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fanfare_room_degradation_level",
			Help: "Waiting-room degradation level: 0 normal, 1 memory high, 2 overloaded, 3 local fallback."}),
		backendCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanfare_room_backend_errors_total",
			Help: "Failed waiting-room backend calls, by backend."}, []string{"backend"}),
		webhook: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanfare_room_webhook_total",
			Help: "Session-end webhook deliveries, by result (ok, failed, dropped)."}, []string{"result"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.waiting, m.active, m.rate, m.lmax, m.eta, m.alert, m.admitted,
			m.rejected, m.ended, m.perceived, m.wait, m.violations, m.preQueue, m.owed, m.service, m.degradation, m.backendCalls, m.webhook} {
			reg.MustRegister(c)
		}
	}
	return m
}

func (m *metrics) dropRoom(room string) {
	for _, g := range []*prometheus.GaugeVec{m.waiting, m.active, m.rate, m.lmax, m.eta, m.alert, m.preQueue, m.owed} {
		g.DeleteLabelValues(room)
	}
}
