// This file holds the per-group state a worker owns (gstate) and its
// building blocks: rate rings, token buckets, hysteresis, the bounded
// buffer of paced sends. admission.go, deliver.go and triggers.go use it.

package fanout

import (
	"math"
	"time"
)

// rateBuckets is the number of buckets of a rateRing.
const rateBuckets = 10

// rateRing counts events in a sliding window of rateBuckets buckets. It is
// owned by one worker: no locks, no allocation.
type rateRing struct {
	buckets [rateBuckets]uint32
	cur     int64 // index of the newest bucket (unix nanos / width)
}

// advance moves the ring to bucket idx, zeroing the buckets it skips. A
// clock that goes backwards keeps counting into the newest bucket.
func (r *rateRing) advance(idx int64) {
	if idx <= r.cur {
		return
	}
	if idx-r.cur >= rateBuckets {
		r.buckets = [rateBuckets]uint32{}
	} else {
		for i := r.cur + 1; i <= idx; i++ {
			r.buckets[i%rateBuckets] = 0
		}
	}
	r.cur = idx
}

// add counts n events at now; width is one bucket's span.
func (r *rateRing) add(now time.Time, width time.Duration, n int) {
	idx := now.UnixNano() / int64(width)
	r.advance(idx)
	if idx < r.cur {
		idx = r.cur
	}
	r.buckets[idx%rateBuckets] += uint32(n)
}

// rate returns events per second over the window ending at now.
func (r *rateRing) rate(now time.Time, width time.Duration) float64 {
	r.advance(now.UnixNano() / int64(width))
	var sum uint32
	for _, b := range r.buckets {
		sum += b
	}
	return float64(sum) / (float64(width) * rateBuckets / float64(time.Second))
}

// tokenBucket paces a group's commits: rate tokens per second up to burst.
type tokenBucket struct {
	tokens float64
	last   time.Time
}

// refill adds the tokens earned since the last call.
func (b *tokenBucket) refill(now time.Time, rate, burst float64) {
	if b.last.IsZero() {
		b.tokens, b.last = burst, now
		return
	}
	if dt := now.Sub(b.last); dt > 0 {
		b.tokens = math.Min(burst, b.tokens+dt.Seconds()*rate)
		b.last = now
	}
}

// take consumes one token if there is one.
func (b *tokenBucket) take(now time.Time, rate, burst float64) bool {
	b.refill(now, rate, burst)
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// hysteresis is one trigger condition: it turns on as soon as the measure
// is above its threshold and off only after the measure stayed below the
// clear threshold for a hold time.
type hysteresis struct {
	on        bool
	calmSince time.Time // zero while not calm
}

// update feeds one observation; it reports whether the state changed.
func (h *hysteresis) update(now time.Time, above, calm bool, hold time.Duration) bool {
	if above {
		h.calmSince = time.Time{}
		if !h.on {
			h.on = true
			return true
		}
		return false
	}
	if !h.on {
		return false
	}
	if !calm {
		h.calmSince = time.Time{}
		return false
	}
	if h.calmSince.IsZero() {
		h.calmSince = now
	}
	if now.Sub(h.calmSince) >= hold {
		h.on, h.calmSince = false, time.Time{}
		return true
	}
	return false
}

// sendQueue is a bounded FIFO of buffered sends (the group rate limit's
// buffer). It is a ring: no allocation once grown.
type sendQueue struct {
	buf  []*task
	head int
	n    int
}

func (q *sendQueue) len() int { return q.n }

func (q *sendQueue) push(t *task) {
	if q.n == len(q.buf) {
		nb := make([]*task, max(4, 2*len(q.buf)))
		for i := range q.n {
			nb[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = nb, 0
	}
	q.buf[(q.head+q.n)%len(q.buf)] = t
	q.n++
}

func (q *sendQueue) pop() *task {
	if q.n == 0 {
		return nil
	}
	t := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return t
}

// gstate is everything the engine tracks about one group. It is owned by
// the worker that currently serves the group and travels with the group
// when it moves between the ordinary and the hot pool.
type gstate struct {
	gid  int64
	meta *groupMeta // member count (nil when every group counts as large)

	arrivals rateRing  // sends offered to the group
	commits  rateRing  // messages committed (each pushed to every member at L0)
	lastSeen time.Time // the last local send or remote batch (idle eviction)
	// seenSeq is the highest seq this node delivered for the group (local
	// commits and remote batches, pushed or held at its level): a tail
	// hint above it means a batch went missing (tailHint).
	seenSeq int64

	// Group rate limit (docs/architecture.md §8): paced by bucket, excess buffered
	// (newest buffer entries kept).
	bucket tokenBucket
	queue  sendQueue
	paced  bool // in the owner's paced list
	// Cluster-wide limit (Config.HotSet), as of the last evaluation: the
	// offered rate here and on the other nodes; demand says this node
	// publishes its offered rate.
	offered, remote float64
	demand          bool

	// @all quota: count in the current UTC day, and the (sender, client
	// id) of each counted one, so that a retry is not refused (at most
	// AtAllPerDay entries).
	atAllDay   int64
	atAllCount int
	atAllIDs   []string

	// Automatic group level.
	downlink, rate hysteresis
	auto           Level
	lastEval       time.Time

	// Hot detection.
	hot      bool
	hotSince time.Time
	moving   bool // a move between pools was requested
	movingAt time.Time
	baseline float64
	baseAt   time.Time
	cool     hysteresis // on = "still hot" from the cooling side
	marked   bool       // this node's own rate makes the group hot (HotSet mark)

	// Senders' membership (checkSender): uid -> the store's answer,
	// at most Config.MemberCache entries; nil until the first lookup.
	senders map[string]senderState

	// Merge window (L1/L2).
	win  window
	open bool // in the owner's open list

	// Tier 2: highest committed seq that active members should see, and
	// the last one handed to the tier-2 writer.
	t2Seq, t2Sent int64
	t2Dirty       bool
}
