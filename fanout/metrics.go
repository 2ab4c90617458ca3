// This file holds the engine's Prometheus metrics (Config.Metrics).

package fanout

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the engine's Prometheus collectors. A nil *Metrics records
// nothing.
type Metrics struct {
	sendsTotal    *prometheus.CounterVec
	overloadTotal prometheus.Counter
	// remoteDropTotal counts batches from other nodes dropped because the
	// group's worker queue was full.
	remoteDropTotal prometheus.Counter
	// remoteMembersDropTotal counts membership additions from other nodes
	// dropped because the group's worker queue was full.
	remoteMembersDropTotal prometheus.Counter
	// tailGroups and tailConns count the resyncs sent for tail hints
	// above what this node pushed (remote.go, tailHint).
	tailGroups, tailConns prometheus.Counter
	// memberReconciles and memberRepairs follow the membership re-reads
	// of members.go.
	memberReconciles *prometheus.CounterVec
	memberRepairs    prometheus.Counter
	// memberFeedReads and memberAdditions follow the feed of additions
	// (members.go).
	memberFeedReads *prometheus.CounterVec
	memberAdditions prometheus.Counter
	waitSeconds     prometheus.Histogram
	procSeconds     prometheus.Histogram
	batchSize       prometheus.Histogram
	deliveryTotal   prometheus.Counter
	framesTotal     prometheus.Counter
	egressTotal     prometheus.Counter

	// touchWritten, touchFailed and touchDropped follow the users'
	// last-active writes of connects (touch.go).
	touchWritten, touchFailed, touchDropped prometheus.Counter

	nodeLevel    prometheus.Gauge
	groupLevel   *prometheus.GaugeVec // only groups not at L0
	levelChanges *prometheus.CounterVec
	egressRate   prometheus.Gauge
	commitEWMA   prometheus.Gauge
	hotCount     prometheus.Gauge
	hotRates     *prometheus.GaugeVec // only hot groups
	hotMoves     *prometheus.CounterVec
	// clusterHotCount and hotSyncs follow the cluster hot set (HotSet).
	clusterHotCount prometheus.Gauge
	sharedLimitN    prometheus.Gauge
	marksDroppedN   prometheus.Counter
	hotSyncs        *prometheus.CounterVec
	limitedTotal    *prometheus.CounterVec
	atAllCalls      *prometheus.CounterVec
	tier2Total      *prometheus.CounterVec
	tier2Rows       prometheus.Counter
	sendLatency     prometheus.Histogram
	// stageSeconds is fanfare_message_stage_seconds; stageObs holds its
	// series, resolved once so that an observation allocates nothing.
	stageSeconds *prometheus.HistogramVec
	stageObs     [numStages]prometheus.Observer
	shards       *shardCollector
}

// Stage is one point of a message's life on its way to the online members,
// measured from its Engine.Send (fanfare_message_stage_seconds).
type Stage uint8

// Stages, in the order a message passes them.
const (
	// StageAdmission: its worker took it for a commit (queue wait and
	// any group rate-limit buffer).
	StageAdmission Stage = iota
	// StageCommit: the store's Append returned (acked).
	StageCommit
	// StagePush: the pusher took its L0 push (every online member's
	// delivery queued on the event loops).
	StagePush
	// StageFirstWrite: an event loop began the write pass that carries
	// it (one observation per loop).
	StageFirstWrite
	// StageLastWrite: that loop's pass ended: every member on the loop
	// was written to.
	StageLastWrite
	numStages
)

var stageNames = [numStages]string{"admission", "commit", "push_enqueue", "first_write", "last_write"}

// String returns the stage's label value.
func (s Stage) String() string {
	if s >= numStages {
		return "unknown"
	}
	return stageNames[s]
}

// NewMetrics creates the engine's collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sendsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_sends_total", Help: "Sends processed by the engine, by result.",
		}, []string{"result"}),
		tailGroups: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_tail_resyncs_total",
			Help: "Tail hints of other nodes above what this node pushed of the group (each sent a resync to the group's members online here).",
		}),
		tailConns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_tail_resync_connections_total",
			Help: "Connections sent a resync for a tail hint above what this node pushed.",
		}),
		remoteDropTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_remote_batches_dropped_total", Help: "Batches from other nodes not pushed because the group's worker queue was full (clients pull the gap).",
		}),
		memberReconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_member_rereads_total", Help: "Re-reads of a group's online members from the store before a push, because the batch carried a membership version this node had not applied (a change lost on the bus, or the group's first batch here), by result (ok, failed, deferred: not tried within 1 s of a failure); a failed or deferred one pushes nothing (clients pull).",
		}, []string{"result"}),
		memberRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_member_repairs_total", Help: "Members online here whose removal was lost on the bus, found by a membership re-read and dropped from the group before the push.",
		}),
		touchWritten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_user_touches_written_total", Help: "Users whose last-active time (the latest connect) the engine wrote to the store, each at most once per -touch-interval.",
		}),
		touchFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_user_touches_failed_total", Help: "Users whose last-active write failed (retried at the next flush, within -touch-pending-max).",
		}),
		touchDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_user_touches_dropped_total", Help: "Last-active times lost: connects of new users while -touch-pending-max users waited, failed retries beyond it, and failed writes at shutdown.",
		}),
		memberFeedReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_member_feed_reads_total", Help: "Pages read from the store's feed of membership additions (cluster mode), by result (ok, failed: the store read or a group's repair failed; the page is read again).",
		}, []string{"result"}),
		memberAdditions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_member_additions_repaired_total", Help: "Members online here whose addition on another node was lost on the bus, found in the feed of additions and joined to the group (with a resync).",
		}),
		remoteMembersDropTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_remote_member_changes_dropped_total", Help: "Member additions from other nodes not applied because the group's worker queue was full (the feed of additions repairs them).",
		}),
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
		egressTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_push_bytes_total", Help: "Push bytes handed to connections (the bytes of the frames on the wire, all recipients together, as the pusher reports them).",
		}),
		nodeLevel: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fanfare_node_degradation_level", Help: "The node scope's degradation level (forced, else automatic).",
		}),
		groupLevel: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fanfare_group_degradation_level", Help: "Group scope degradation level, for groups not at L0 only.",
		}, []string{"gid"}),
		levelChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_degradation_changes_total", Help: "Changes of a scope's level, by scope and new level.",
		}, []string{"scope", "to"}),
		egressRate: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fanfare_node_egress_bytes_per_second", Help: "Push egress rate measured by the node trigger.",
		}),
		commitEWMA: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fanfare_store_commit_latency_ewma_seconds", Help: "Commit latency EWMA watched by the store latency alarm.",
		}),
		hotCount: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fanfare_hot_groups", Help: "Groups served by the hot pool.",
		}),
		hotRates: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fanfare_hot_group_rate", Help: "Offered message rate of each hot group (messages per second).",
		}, []string{"gid"}),
		hotMoves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_hot_group_moves_total", Help: "Groups moved between the pools, by destination.",
		}, []string{"to"}),
		clusterHotCount: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fanfare_cluster_hot_groups", Help: "Groups marked hot by any node at the last read of the cluster hot set (this node's own while the hot set cannot be read; 0 without one).",
		}),
		sharedLimitN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fanfare_cluster_shared_limit_groups", Help: "Groups other nodes publish a mark for (an offered rate of a group they limit, or a hot mark), at the last read of the cluster hot set: for those this node limits too, it enforces its part of the limit (0 without a hot set or while it cannot be read).",
		}),
		marksDroppedN: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_hot_marks_dropped_total", Help: "Marks this node left out of a round of the cluster hot set (past fanout.MaxHotMarks, the least busy limited groups): their limits were this node's alone that round.",
		}),
		hotSyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_hot_set_syncs_total", Help: "Rounds of publishing this node's marks (hot groups, offered rates of limited groups) and reading the cluster's, by result (ok, failed: hot status and group limits follow this node's traffic only).",
		}, []string{"result"}),
		limitedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_group_limited_total", Help: "Group-level limit decisions: buffered, rejected (buffer full), at_all (daily quota).",
		}, []string{"result"}),
		atAllCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_at_all_quota_calls_total", Help: "Calls of the cluster's @all quota (Redis), by result: ok, failed (this node counts @all itself for 5 s), refund_failed.",
		}, []string{"result"}),
		tier2Total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fanfare_tier2_windows_total", Help: "Tier-2 group windows by outcome (written, skipped_*, nobody, failed).",
		}, []string{"result"}),
		tier2Rows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fanfare_tier2_members_total", Help: "Member conversations advanced by tier 2.",
		}),
		sendLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fanfare_send_latency_seconds",
			Help:    "Time from Engine.Send to the ack of a stored (or duplicate) send: queue wait, group rate-limit buffer, commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		stageSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fanfare_message_stage_seconds",
			Help:    "Time from a message's Engine.Send to each stage of its delivery: admission (its worker took it), commit (stored, acked), push_enqueue (queued for every online member), first_write and last_write (an event loop's write pass carrying it began and ended, one observation per loop). Pushes at L0 only.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18),
		}, []string{"stage"}),
		shards: newShardCollector(),
	}
	for i := range m.stageObs {
		m.stageObs[i] = m.stageSeconds.WithLabelValues(stageNames[i])
	}
	if reg != nil {
		reg.MustRegister(m.stageSeconds)
		reg.MustRegister(m.tailGroups, m.tailConns)
		reg.MustRegister(m.touchWritten, m.touchFailed, m.touchDropped)
		reg.MustRegister(m.sendsTotal, m.overloadTotal, m.remoteDropTotal, m.remoteMembersDropTotal, m.memberReconciles, m.memberRepairs, m.memberFeedReads, m.memberAdditions, m.waitSeconds, m.procSeconds, m.batchSize, m.deliveryTotal, m.framesTotal,
			m.egressTotal, m.nodeLevel, m.groupLevel, m.levelChanges, m.egressRate, m.commitEWMA, m.hotCount, m.hotRates,
			m.hotMoves, m.clusterHotCount, m.sharedLimitN, m.marksDroppedN, m.hotSyncs, m.limitedTotal, m.atAllCalls, m.tier2Total, m.tier2Rows, m.sendLatency, m.shards)
	}
	return m
}

// shardCollector exports each worker's queue depth and Little's Law bound
// at scrape time (labels pool and shard: a few series per node).
type shardCollector struct {
	depth, bound *prometheus.Desc
	e            atomic.Pointer[Engine] // the engine built with these metrics
}

func newShardCollector() *shardCollector {
	return &shardCollector{
		depth: prometheus.NewDesc("fanfare_shard_queue_depth",
			"Tasks waiting in a shard worker's queue (including tasks parked for groups moving in), compared against its bound.",
			[]string{"pool", "shard"}, nil),
		bound: prometheus.NewDesc("fanfare_shard_queue_bound",
			"A shard worker's current soft queue bound from Little's Law (service rate x target wait x safety, within min bound..capacity); past it sends are refused as overloaded.",
			[]string{"pool", "shard"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *shardCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.depth
	ch <- c.bound
}

// Collect implements prometheus.Collector.
func (c *shardCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.e.Load()
	if e == nil {
		return
	}
	for _, pool := range [][]*shard{e.shards, e.hotSh} {
		for _, s := range pool {
			id := strconv.Itoa(s.id)
			ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(int64(len(s.q))+s.held.Load()), s.pool(), id)
			ch <- prometheus.MustNewConstMetric(c.bound, prometheus.GaugeValue, float64(s.bound.Load()), s.pool(), id)
		}
	}
}

// attach makes the shard gauges report e's workers.
func (m *Metrics) attach(e *Engine) {
	if m != nil {
		m.shards.e.Store(e)
	}
}

// stageSince observes stage at to for a send that entered at from.
func (m *Metrics) stageSince(st Stage, from, to time.Time) {
	if m != nil {
		m.stageObs[st].Observe(to.Sub(from).Seconds())
	}
}

func (m *Metrics) stageNanos(st Stage, d int64) {
	if m != nil {
		m.stageObs[st].Observe(float64(d) / 1e9)
	}
}

// ObserveWrites records an event loop's write pass for a push whose
// Push.Origin is origin: the pass began at first and ended at last (all
// Unix nanoseconds). A pusher calls it from its write path; it allocates
// nothing, and a nil *Metrics records nothing.
func (m *Metrics) ObserveWrites(origin, first, last int64) {
	if m == nil || origin == 0 {
		return
	}
	m.stageObs[StageFirstWrite].Observe(float64(first-origin) / 1e9)
	m.stageObs[StageLastWrite].Observe(float64(last-origin) / 1e9)
}

func (m *Metrics) sendAcked(d time.Duration) {
	if m != nil {
		m.sendLatency.Observe(d.Seconds())
	}
}

func (m *Metrics) sends(n int, result string) {
	if m == nil || n == 0 {
		return
	}
	m.sendsTotal.WithLabelValues(result).Add(float64(n))
}

func (m *Metrics) remoteMembersDropped() {
	if m != nil {
		m.remoteMembersDropTotal.Inc()
	}
}

func (m *Metrics) memberReconcile(result string, removed int) {
	if m != nil {
		m.memberReconciles.WithLabelValues(result).Inc()
		m.memberRepairs.Add(float64(removed))
	}
}

// touches counts users' last-active writes (touch.go).
func (m *Metrics) touches(written, failed, dropped int) {
	if m == nil {
		return
	}
	m.touchWritten.Add(float64(written))
	m.touchFailed.Add(float64(failed))
	m.touchDropped.Add(float64(dropped))
}

// memberFeed counts one feed page by result ("" = none) and the members
// it repaired.
func (m *Metrics) memberFeed(result string, repaired int) {
	if m == nil {
		return
	}
	if result != "" {
		m.memberFeedReads.WithLabelValues(result).Inc()
	}
	m.memberAdditions.Add(float64(repaired))
}

func (m *Metrics) tailResyncs(conns int) {
	if m != nil {
		m.tailGroups.Inc()
		m.tailConns.Add(float64(conns))
	}
}

func (m *Metrics) remoteDropped() {
	if m != nil {
		m.remoteDropTotal.Inc()
	}
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

func (m *Metrics) deliveries(msgs, frames, bytes int) {
	if m != nil {
		m.deliveryTotal.Add(float64(msgs))
		m.framesTotal.Add(float64(frames))
		m.egressTotal.Add(float64(bytes))
	}
}

var levelNames = [...]string{"0", "1", "2", "3", "4"}

func (m *Metrics) levelChanged(gid int64, to Level) {
	if m == nil || to < 0 || to > MaxLevel {
		return
	}
	if gid == 0 {
		m.nodeLevel.Set(float64(to))
		m.levelChanges.WithLabelValues("node", levelNames[to]).Inc()
		return
	}
	m.levelChanges.WithLabelValues("group", levelNames[to]).Inc()
	label := strconv.FormatInt(gid, 10)
	if to == L0Normal {
		m.groupLevel.DeleteLabelValues(label)
	} else {
		m.groupLevel.WithLabelValues(label).Set(float64(to))
	}
}

func (m *Metrics) nodeSample(egress, lat float64) {
	if m != nil {
		m.egressRate.Set(egress)
		m.commitEWMA.Set(lat)
	}
}

func (m *Metrics) hotMove(toHot bool) {
	if m == nil {
		return
	}
	if toHot {
		m.hotMoves.WithLabelValues("hot").Inc()
	} else {
		m.hotMoves.WithLabelValues("normal").Inc()
	}
}

func (m *Metrics) hotGroups(gid int64, hot bool, n int) {
	if m == nil {
		return
	}
	m.hotCount.Set(float64(n))
	if !hot {
		m.hotRates.DeleteLabelValues(strconv.FormatInt(gid, 10))
	}
}

func (m *Metrics) hotRate(gid int64, rate float64) {
	if m != nil {
		m.hotRates.WithLabelValues(strconv.FormatInt(gid, 10)).Set(rate)
	}
}

func (m *Metrics) limited(result string) {
	if m != nil {
		m.limitedTotal.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) tier2(result string, rows int) {
	if m != nil {
		m.tier2Total.WithLabelValues(result).Inc()
		m.tier2Rows.Add(float64(rows))
	}
}

func (m *Metrics) hotSync(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.hotSyncs.WithLabelValues("ok").Inc()
	} else {
		m.hotSyncs.WithLabelValues("failed").Inc()
	}
}

func (m *Metrics) clusterHot(n int) {
	if m != nil {
		m.clusterHotCount.Set(float64(n))
	}
}

func (m *Metrics) atAllQuota(result string) {
	if m != nil {
		m.atAllCalls.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) marksDropped(n int) {
	if m != nil {
		m.marksDroppedN.Add(float64(n))
	}
}

func (m *Metrics) sharedLimits(n int) {
	if m != nil {
		m.sharedLimitN.Set(float64(n))
	}
}
