package bus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// Node is one node's end of the bus: a bounded, coalescing publish queue,
// a bounded inbox, the subscribed-group set and the goroutines that move
// them over a Transport. It implements Bus.
type Node struct {
	cfg Config
	id  string
	tr  Transport
	log *slog.Logger

	// subMu guards want and ops (leaf lock).
	subMu sync.RWMutex
	want  map[int64]struct{} // groups asked for (Subscribe, Presence)
	ops   map[int64]bool     // changes since the last flush: true = subscribe (or touch), false = unsubscribe

	// Owned by the control goroutine.
	applied          map[int64]struct{} // what the transport was told
	spare            map[int64]bool
	adds, dels, gbuf []int64
	subFailing       bool

	out outbox
	in  inbox

	up     atomic.Bool // publishing works (optimistic at start)
	closed atomic.Bool // Publish refused from now on

	runMu   sync.Mutex // guards running, cancel
	running bool
	cancel  context.CancelFunc

	stop     chan struct{} // closed by Shutdown
	stopOnce sync.Once
	drained  chan struct{} // closed by the publisher after its final drain
	done     chan struct{} // closed when Run returns
	syncReq  chan chan error

	st         counters
	lastDecErr atomic.Int64 // unix ns of the last logged decode error
	tailClock  atomic.Int64 // unix ns, set by tailLoop every tick (tailDue)
	// reconnecting: a Config.Reconnected call is under way; again: one
	// more reconnect came meanwhile.
	reconnecting, reconnectAgain atomic.Bool
}

var _ Bus = (*Node)(nil)

// New returns a Node on tr. Nothing moves until Run.
func New(cfg Config, tr Transport) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if tr == nil {
		return nil, errors.New("bus: nil transport")
	}
	cfg.fill()
	id := cfg.NodeID
	if id == "" {
		id = defaultNodeID()
	}
	n := &Node{
		cfg:     cfg,
		id:      id,
		tr:      tr,
		log:     cfg.Logger,
		want:    make(map[int64]struct{}),
		ops:     make(map[int64]bool),
		applied: make(map[int64]struct{}),
		spare:   make(map[int64]bool),
		stop:    make(chan struct{}),
		drained: make(chan struct{}),
		done:    make(chan struct{}),
		syncReq: make(chan chan error),
	}
	n.out.open = make(map[int64]*entry)
	n.out.tails = make(map[int64]tailHint)
	n.out.dueAt = make(map[int64][]int64)
	n.out.wake = make(chan struct{}, 1)
	n.in.ring = make([]inItem, cfg.InboxBatches)
	n.in.wake = make(chan struct{}, 1)
	n.up.Store(true)
	n.tailClock.Store(cfg.Now().UnixNano())
	if rn, ok := tr.(ReconnectNotifier); ok && cfg.Reconnected != nil {
		rn.NotifyReconnect(n.reconnected)
	}
	if cfg.Members != nil {
		n.want[ControlGID] = struct{}{}
		n.ops[ControlGID] = true
	}
	if cfg.Registerer != nil {
		if err := n.register(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func defaultNodeID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	if len(id) > MaxNodeID {
		id = id[len(id)-MaxNodeID:]
	}
	return id
}

// ID returns the node id carried in Batch.Origin.
func (n *Node) ID() string { return n.id }

// Up reports whether publishing works (false from a failed publish until
// a probe succeeds).
func (n *Node) Up() bool { return n.up.Load() }

// ---- publishing ----

// entryOverhead is what one queued payload costs besides its bytes.
const entryOverhead = 64

// maxPooledBuf keeps grown payload buffers out of the free list.
const maxPooledBuf = 64 << 10

type entry struct {
	gid     int64 // the channel: ControlGID for membership changes
	buf     []byte
	count   int // messages, or changed members
	members bool
	// tail: a tail hint of gid, seq at version (requeued when not sent).
	tail         bool
	seq, version int64
	at           time.Time
	stale        bool // set by send
}

func (e *entry) cost() int { return len(e.buf) + entryOverhead }

// outbox is the publish queue: q[head:] pending oldest first, open the
// pending payload of each group that still takes appends.
type outbox struct {
	mu       sync.Mutex
	q        []*entry
	head     int
	open     map[int64]*entry
	bytes    int // cost of pending and in-flight entries
	inflight int // cost of entries taken by the publisher
	free     []*entry
	wake     chan struct{}
	// tails are the groups published to since their last tail hint went
	// out, with when it is due (Config.TailDelay).
	tails map[int64]tailHint
	// dueAt indexes tails by tick (tailSlot of the due time a hint had
	// when it was noted first): the tick looks only at the slots that came
	// due, not at every waiting hint. A hint whose due time moved later
	// since is filed again under its new slot when its old one comes up.
	// slotsDone is the last slot looked at completely.
	dueAt     map[int64][]int64
	slotsDone int64
	slotFree  [][]int64 // emptied slot slices, reused
}

// tailHint is a group's pending tail hint.
type tailHint struct {
	seq, version int64
	due          time.Time
}

// Publish hands one group's newly committed messages (seq order) to the
// other nodes. It never blocks and allocates nothing in the steady state:
// it appends msgs' encoding to gid's pending payload (coalescing with what
// is not sent yet) or starts a new one, and returns; msgs may be reused at
// once. When the queue is over MaxPendingBytes the oldest pending payloads
// are dropped first: the newest hint reaches the other nodes, and its seq
// shows their clients the gap to pull. A non-nil error (ErrUnavailable,
// ErrFull, ErrTooLarge, ErrClosed) means messages were dropped, counted by
// reason.
func (n *Node) Publish(gid, version int64, msgs []store.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if n.closed.Load() {
		n.st.drop(dropClosed, len(msgs))
		return ErrClosed
	}
	last := msgs[len(msgs)-1].Seq
	if !n.up.Load() {
		n.st.drop(dropUnavailable, len(msgs))
		n.noteTail(gid, version, last, n.tailDue())
		return ErrUnavailable
	}
	hl := headerLen(n.id, gid)
	maxRec := n.cfg.MaxPayloadBytes - hl
	need, tooLarge := 0, 0
	for i := range msgs {
		sz := recordSize(&msgs[i])
		if sz > maxRec {
			tooLarge++
			continue
		}
		need += sz
	}
	var err error
	if tooLarge > 0 {
		n.st.drop(dropTooLarge, tooLarge)
		err = ErrTooLarge
		if tooLarge == len(msgs) {
			n.noteTail(gid, version, last, n.tailDue())
			return err
		}
	}
	if !n.reserve(need, len(msgs), hl, maxRec) {
		n.st.drop(dropQueueFull, len(msgs)-tooLarge)
		n.noteTail(gid, version, last, n.tailDue())
		return ErrFull
	}
	o := &n.out
	n.noteTailLocked(gid, version, last, n.tailDue())
	e := o.open[gid]
	if e != nil {
		n.st.coalesced.Add(1)
	}
	for i := range msgs {
		m := &msgs[i]
		sz := recordSize(m)
		if sz > maxRec {
			continue
		}
		if e == nil || len(e.buf)+sz > n.cfg.MaxPayloadBytes || e.count >= n.cfg.MaxBatchMessages {
			e = n.newEntryLocked(gid)
		}
		raiseVersion(e.buf, version)
		before := len(e.buf)
		e.buf = appendRecord(e.buf, m)
		e.count++
		setCount(e.buf, e.count)
		o.bytes += len(e.buf) - before
	}
	n.queuedUnlock()
	return err
}

// tailDue is when a hint noted now is due: TailDelay plus one tick after
// the clock tailLoop last read (a coarse clock, so that Publish reads
// none: the quiet time before a hint is TailDelay to TailDelay plus two
// ticks, never less).
func (n *Node) tailDue() time.Time {
	return time.Unix(0, n.tailClock.Load()).Add(n.cfg.TailDelay + n.tailTick())
}

// tailTick is tailLoop's period.
func (n *Node) tailTick() time.Duration { return max(n.cfg.TailDelay/4, 10*time.Millisecond) }

// noteTail records that gid's tail hint (seq at version) is due at due,
// or later if a newer publish already set a later time.
func (n *Node) noteTail(gid, version, seq int64, due time.Time) {
	if n.cfg.TailDelay < 0 {
		return
	}
	n.out.mu.Lock()
	n.noteTailLocked(gid, version, seq, due)
	n.out.mu.Unlock()
}

func (n *Node) noteTailLocked(gid, version, seq int64, due time.Time) {
	if n.cfg.TailDelay < 0 {
		return
	}
	o := &n.out
	t, ok := o.tails[gid]
	if !ok && len(o.tails) >= n.cfg.MaxTails {
		n.st.tailsDropped.Add(1)
		return
	}
	t.seq, t.version = max(t.seq, seq), max(t.version, version)
	if due.After(t.due) {
		t.due = due
	}
	o.tails[gid] = t
	if !ok {
		n.fileTailLocked(gid, t.due)
	}
}

// tailSlot is the tick of the wheel that t falls in.
func (n *Node) tailSlot(t time.Time) int64 { return t.UnixNano() / int64(n.tailTick()) }

// fileTailLocked files gid's hint under the slot of due.
func (n *Node) fileTailLocked(gid int64, due time.Time) {
	o := &n.out
	// A slot looked at already is not looked at again: a hint noted due
	// in the past (requeued after a failed publish) goes into the next.
	slot := max(n.tailSlot(due), o.slotsDone+1)
	l, ok := o.dueAt[slot]
	if !ok && len(o.slotFree) > 0 {
		l = o.slotFree[len(o.slotFree)-1]
		o.slotFree = o.slotFree[:len(o.slotFree)-1]
	}
	o.dueAt[slot] = append(l, gid)
}

// tailsPerTick bounds the hints queued per tailLoop tick: after an outage
// that kept many, they go out over several ticks, not all at once (each
// makes every online member of its group pull on every node).
const tailsPerTick = 1024

// queueDueTails queues up to limit of the tail hints that are due, each as a
// payload of its own on its group's channel (after every batch of the
// group queued before it). It looks only at the slots of dueAt up to
// now's: the hints filed there and, once, each filed hint whose due time
// moved later (then filed again), so a tick costs the hints that came
// due, not every waiting one (BenchmarkQueueDueTails). A hint goes out
// at the first tick at or after its due time.
func (n *Node) queueDueTails(now time.Time, limit int) {
	o := &n.out
	o.mu.Lock()
	queued := 0
	cur := n.tailSlot(now)
	if cur-o.slotsDone > int64(len(o.dueAt)) {
		// Ticks were missed (an outage, a clock jump): fewer slots are
		// filed than passed, so start at the oldest filed one.
		low := cur
		for slot := range o.dueAt {
			low = min(low, slot)
		}
		o.slotsDone = low - 1
	}
	for slot := o.slotsDone + 1; slot <= cur; slot++ {
		l, filed := o.dueAt[slot]
		keep, full := l[:0], false
		for _, gid := range l {
			t, ok := o.tails[gid]
			switch {
			case full:
				keep = append(keep, gid)
			case !ok:
				// Gone out already (a stale filing: its hint was noted
				// again since, and filed again).
			case t.due.After(now):
				if n.tailSlot(t.due) == slot {
					keep = append(keep, gid) // later in this tick's slot
				} else {
					n.fileTailLocked(gid, t.due) // moved later: filed where it is due
				}
			case queued >= limit || !n.makeRoomLocked(headerLen(n.id, gid)+varintLen(t.seq)+entryOverhead):
				full = true
				keep = append(keep, gid)
			default:
				e := n.queueEntryLocked(gid, false)
				e.tail, e.seq, e.version = true, t.seq, t.version
				e.buf = AppendTail(e.buf[:0], n.id, gid, t.version, t.seq)
				o.bytes += e.cost()
				if o.open[gid] != nil {
					delete(o.open, gid) // later batches go after the hint
				}
				delete(o.tails, gid)
				queued++
			}
		}
		if len(keep) > 0 {
			// The rest of this slot waits for the next tick: the limit,
			// a full queue, or hints due later in the current slot.
			o.dueAt[slot] = keep
			break
		}
		if filed {
			delete(o.dueAt, slot)
			o.slotFree = append(o.slotFree, keep)
		}
		o.slotsDone = slot
	}
	if queued > 0 {
		n.queuedUnlock()
		return
	}
	o.mu.Unlock()
}

// tailLoop queues the due tail hints while the backend is up.
func (n *Node) tailLoop(ctx context.Context) {
	if n.cfg.TailDelay < 0 {
		return
	}
	t := time.NewTicker(n.tailTick())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.stop:
			return
		case <-t.C:
		}
		now := n.cfg.Now()
		n.tailClock.Store(now.UnixNano())
		if n.up.Load() {
			n.queueDueTails(now, tailsPerTick)
		}
	}
}

// reserve locks the outbox and makes room for count records of need
// bytes in all, packed into payloads of header hl and at most maxRec
// bytes of records; false (unlocked, nothing dropped) when even an empty
// queue would not hold them. On true the caller holds n.out.mu.
func (n *Node) reserve(need, count, hl, maxRec int) bool {
	// Worst case of greedy packing: every payload just over half full.
	entries := 1 + 2*need/maxRec + count/n.cfg.MaxBatchMessages
	est := need + entries*(hl+entryOverhead)
	o := &n.out
	o.mu.Lock()
	if !n.makeRoomLocked(est) {
		o.mu.Unlock()
		return false
	}
	return true
}

// queuedUnlock ends a Publish or PublishMembers that queued payloads:
// it exports the queue's size, releases the outbox and wakes the
// publisher without blocking.
func (n *Node) queuedUnlock() {
	o := &n.out
	n.st.pendingBytes.Store(int64(o.bytes))
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (n *Node) newEntryLocked(gid int64) *entry {
	e := n.queueEntryLocked(gid, false)
	e.buf = appendHeader(e.buf[:0], n.id, gid, 0)
	n.out.open[gid] = e
	n.out.bytes += e.cost()
	return e
}

// newMembersEntryLocked queues a membership payload for gid on
// ControlGID; it never takes appends from a later change (not open).
func (n *Node) newMembersEntryLocked(gid, version int64, removed bool) *entry {
	e := n.queueEntryLocked(ControlGID, true)
	e.buf = appendFrameHeader(e.buf[:0], frameMembers, n.id, gid, version)
	e.buf = append(e.buf, memberOp(removed))
	n.out.bytes += e.cost()
	return e
}

func (n *Node) queueEntryLocked(ch int64, members bool) *entry {
	o := &n.out
	var e *entry
	if k := len(o.free); k > 0 {
		e = o.free[k-1]
		o.free[k-1] = nil
		o.free = o.free[:k-1]
	} else {
		e = &entry{}
	}
	e.gid, e.count, e.members, e.at = ch, 0, members, n.cfg.Now()
	e.tail, e.seq, e.version = false, 0, 0 // a recycled hint's
	o.q = append(o.q, e)
	return e
}

// dropEntry counts a dropped payload: its messages, or one membership
// change.
func (n *Node) dropEntry(r dropReason, e *entry) {
	if e.members {
		n.st.droppedChanges.Add(1)
		return
	}
	if e.tail {
		return // requeued by the caller, or the node is closing
	}
	n.st.drop(r, e.count)
}

// PublishMembers hands a committed membership change of gid to every
// other node (see Bus). It queues one payload (more for a change larger
// than MaxPayloadBytes or MaxBatchMessages) on ControlGID, in order with
// the node's batches (it closes gid's pending payload to later appends);
// the bounds and drops are those of Publish, counted as dropped changes.
// A change is never coalesced with another.
func (n *Node) PublishMembers(gid, version int64, removed bool, ms []store.Member) error {
	if len(ms) == 0 {
		return nil
	}
	if n.closed.Load() {
		n.st.droppedChanges.Add(1)
		return ErrClosed
	}
	if !n.up.Load() {
		n.st.droppedChanges.Add(1)
		return ErrUnavailable
	}
	hl := headerLen(n.id, gid) + 1 // + op
	maxRec := n.cfg.MaxPayloadBytes - hl
	need := 0
	for i := range ms {
		sz := memberRecordSize(&ms[i], removed)
		if sz > maxRec {
			// A uid is far smaller than the smallest payload: only a
			// caller that skipped validation gets here.
			n.st.droppedChanges.Add(1)
			return ErrTooLarge
		}
		need += sz
	}
	if !n.reserve(need, len(ms), hl, maxRec) {
		n.st.droppedChanges.Add(1)
		return ErrFull
	}
	o := &n.out
	// A batch of gid published after the change must not be coalesced
	// into a payload queued before it: the other nodes would push it
	// under the old membership.
	delete(o.open, gid)
	var e *entry
	for i := range ms {
		m := &ms[i]
		sz := memberRecordSize(m, removed)
		if e == nil || len(e.buf)+sz > n.cfg.MaxPayloadBytes || e.count >= n.cfg.MaxBatchMessages {
			e = n.newMembersEntryLocked(gid, version, removed)
		}
		before := len(e.buf)
		e.buf = appendMemberRecord(e.buf, m, removed)
		e.count++
		setCount(e.buf, e.count)
		o.bytes += len(e.buf) - before
	}
	n.queuedUnlock()
	return nil
}

// makeRoomLocked drops the oldest pending payloads until est more bytes
// fit; false (dropping nothing) when even an empty queue would not do.
func (n *Node) makeRoomLocked(est int) bool {
	o := &n.out
	limit := n.cfg.MaxPendingBytes
	if o.bytes+est <= limit {
		return true
	}
	if o.inflight+est > limit {
		return false
	}
	for o.bytes+est > limit && o.head < len(o.q) {
		e := o.q[o.head]
		o.q[o.head] = nil
		o.head++
		if o.open[e.gid] == e {
			delete(o.open, e.gid)
		}
		o.bytes -= e.cost()
		n.dropEntry(dropQueueFull, e)
		if e.tail {
			n.noteTailLocked(e.gid, e.version, e.seq, n.cfg.Now())
		}
		n.recycleLocked(e)
	}
	n.compactLocked()
	return true
}

func (n *Node) compactLocked() {
	o := &n.out
	if o.head == len(o.q) {
		o.q = o.q[:0]
		o.head = 0
	} else if o.head > 64 && o.head > len(o.q)/2 {
		k := copy(o.q, o.q[o.head:])
		clear(o.q[k:])
		o.q = o.q[:k]
		o.head = 0
	}
}

func (n *Node) recycleLocked(e *entry) {
	o := &n.out
	if cap(e.buf) > maxPooledBuf || len(o.free) >= 64 {
		return
	}
	e.buf = e.buf[:0]
	o.free = append(o.free, e)
}

// take moves up to MaxPipeline pending payloads to dst, in order.
func (n *Node) take(dst []*entry) []*entry {
	o := &n.out
	o.mu.Lock()
	for o.head < len(o.q) && len(dst) < n.cfg.MaxPipeline {
		e := o.q[o.head]
		o.q[o.head] = nil
		o.head++
		if o.open[e.gid] == e {
			delete(o.open, e.gid)
		}
		o.inflight += e.cost()
		dst = append(dst, e)
	}
	n.compactLocked()
	o.mu.Unlock()
	return dst
}

func (n *Node) release(es []*entry) {
	o := &n.out
	o.mu.Lock()
	for i, e := range es {
		o.bytes -= e.cost()
		o.inflight -= e.cost()
		n.recycleLocked(e)
		es[i] = nil
	}
	n.st.pendingBytes.Store(int64(o.bytes))
	o.mu.Unlock()
}

// publishLoop drains the queue through the transport, one pipelined round
// at a time, in order; while the backend is down it probes instead.
func (n *Node) publishLoop(ctx context.Context) {
	defer close(n.drained)
	var (
		batch []*entry
		outs  []Outgoing
		probe *time.Ticker
	)
	defer func() {
		if probe != nil {
			probe.Stop()
		}
	}()
	for {
		if !n.up.Load() {
			if probe == nil {
				probe = time.NewTicker(n.cfg.ProbeInterval)
			}
			select {
			case <-ctx.Done():
				return
			case <-n.stop:
				n.dropPending(dropClosed)
				return
			case <-probe.C:
			}
			pctx, cancel := context.WithTimeout(ctx, n.cfg.PublishTimeout)
			err := n.tr.Ping(pctx)
			cancel()
			if err == nil {
				n.setUp(true, nil)
				probe.Stop()
				probe = nil
			}
			continue
		}
		batch = n.take(batch[:0])
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-n.stop:
				// Final drain: send what is left while it goes through,
				// the tail hints not due yet included.
				n.queueDueTails(n.cfg.Now().Add(n.cfg.TailDelay+n.tailTick()), n.cfg.MaxTails)
				for n.up.Load() && ctx.Err() == nil {
					if batch = n.take(batch[:0]); len(batch) == 0 {
						break
					}
					outs = n.send(ctx, batch, outs)
				}
				n.dropPending(dropClosed)
				return
			case <-n.out.wake:
			}
			continue
		}
		outs = n.send(ctx, batch, outs)
	}
}

// send publishes one round and releases its entries.
func (n *Node) send(ctx context.Context, batch []*entry, outs []Outgoing) []Outgoing {
	now := n.cfg.Now()
	outs = outs[:0]
	for _, e := range batch {
		// A late membership change is still worth applying (it is what
		// stops pushes to a removed member); a late batch is not (the
		// clients pull the gap).
		if e.stale = !e.members && !e.tail && now.Sub(e.at) > n.cfg.MaxDelay; e.stale {
			n.dropEntry(dropStale, e)
			continue
		}
		outs = append(outs, Outgoing{GID: e.gid, Payload: e.buf})
	}
	if len(outs) > 0 {
		pctx, cancel := context.WithTimeout(ctx, n.cfg.PublishTimeout)
		sent, err := n.tr.Publish(pctx, outs)
		cancel()
		k := 0
		for _, e := range batch {
			if e.stale {
				continue
			}
			switch {
			case k >= sent:
				n.dropEntry(dropError, e)
				if e.tail {
					n.noteTail(e.gid, e.version, e.seq, now)
				}
			case e.tail:
				n.st.published.Add(1)
				n.st.tailsPublished.Add(1)
			case e.members:
				n.st.published.Add(1)
				n.st.publishedChanges.Add(1)
			default:
				n.st.published.Add(1)
				n.st.publishedMsgs.Add(int64(e.count))
			}
			k++
		}
		if err != nil && ctx.Err() == nil {
			n.st.publishErrors.Add(1)
			n.setUp(false, err)
		}
	}
	clear(outs)
	n.release(batch)
	return outs[:0]
}

func (n *Node) dropPending(reason dropReason) {
	o := &n.out
	o.mu.Lock()
	for o.head < len(o.q) {
		e := o.q[o.head]
		o.q[o.head] = nil
		o.head++
		o.bytes -= e.cost()
		n.dropEntry(reason, e)
		n.recycleLocked(e)
	}
	clear(o.open)
	n.compactLocked()
	n.st.pendingBytes.Store(int64(o.bytes))
	o.mu.Unlock()
}

func (n *Node) setUp(up bool, err error) {
	if n.up.Swap(up) == up {
		return
	}
	if up {
		n.log.Info("bus backend available again: publishing resumed", "node", n.id)
	} else {
		n.log.Warn("bus backend unavailable: publishes are dropped until it answers", "node", n.id, "err", err)
	}
}

// ---- receiving ----

type inItem struct {
	gid     int64
	p       []byte
	count   int
	members bool
	tail    bool
}

// inbox is a bounded ring of received payloads.
type inbox struct {
	mu    sync.Mutex
	ring  []inItem
	head  int
	n     int
	bytes int
	wake  chan struct{}
}

// recv is the transport's callback: it checks the header, drops the node's
// own payloads and queues the rest for the deliverer, evicting the oldest
// when the inbox is full (never blocking the transport's reader).
func (n *Node) recv(gid int64, p []byte) {
	h, err := decodeHeader(p)
	members := h.frame == frameMembers
	// A batch comes on its group's channel, a membership change on
	// ControlGID, and only to a node that asked for changes.
	ok := err == nil && h.count <= n.cfg.MaxBatchMessages &&
		((!members && h.gid == gid) || (members && gid == ControlGID && n.cfg.Members != nil))
	if !ok {
		n.decodeError(gid, errors.Join(ErrCorrupt, err))
		return
	}
	if h.origin == n.id {
		n.st.self.Add(1)
		return
	}
	n.st.received.Add(1)
	if !members {
		n.st.receivedMsgs.Add(int64(h.count))
	}
	in := &n.in
	in.mu.Lock()
	for in.n > 0 && (in.n == len(in.ring) || in.bytes+len(p) > n.cfg.InboxBytes) {
		old := &in.ring[in.head]
		n.dropItem(old)
		in.bytes -= len(old.p)
		*old = inItem{}
		in.head = (in.head + 1) % len(in.ring)
		in.n--
	}
	it := inItem{gid: gid, p: p, count: h.count, members: members, tail: h.frame == frameTail}
	if len(p) > n.cfg.InboxBytes {
		in.mu.Unlock()
		n.dropItem(&it)
		return
	}
	in.ring[(in.head+in.n)%len(in.ring)] = it
	in.n++
	in.bytes += len(p)
	n.st.inboxBytes.Store(int64(in.bytes))
	in.mu.Unlock()
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

func (n *Node) dropItem(it *inItem) {
	if it.members {
		n.st.droppedChanges.Add(1)
		return
	}
	if it.tail {
		n.st.tailsDropped.Add(1)
		return
	}
	n.st.drop(dropInbox, it.count)
}

func (n *Node) decodeError(gid int64, err error) {
	n.st.decodeErrors.Add(1)
	now := time.Now().UnixNano()
	last := n.lastDecErr.Load()
	if now-last > int64(10*time.Second) && n.lastDecErr.CompareAndSwap(last, now) {
		n.log.Warn("bus payload dropped: does not decode", "node", n.id, "gid", gid, "err", err)
	}
}

func (n *Node) popInbox(dst []inItem) []inItem {
	in := &n.in
	in.mu.Lock()
	for in.n > 0 && len(dst) < 64 {
		it := &in.ring[in.head]
		dst = append(dst, *it)
		in.bytes -= len(it.p)
		*it = inItem{}
		in.head = (in.head + 1) % len(in.ring)
		in.n--
	}
	n.st.inboxBytes.Store(int64(in.bytes))
	in.mu.Unlock()
	return dst
}

// deliverLoop calls the handler, one goroutine, in order of arrival.
func (n *Node) deliverLoop(ctx context.Context) {
	var items []inItem
	for {
		items = n.popInbox(items[:0])
		if len(items) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-n.in.wake:
			}
			continue
		}
		for i := range items {
			n.deliver(&items[i])
			items[i] = inItem{}
		}
	}
}

func (n *Node) deliver(it *inItem) {
	if !n.Subscribed(it.gid) {
		n.st.unsubscribed.Add(1)
		return
	}
	if it.members {
		// Rare (admin operations): a fresh value the handler owns.
		c := new(MemberChange)
		if err := DecodeMembers(c, it.p, n.cfg.MaxBatchMessages); err != nil {
			n.decodeError(it.gid, err)
			return
		}
		n.st.delivered.Add(1)
		n.st.deliveredChanges.Add(1)
		n.cfg.Members(c)
		return
	}
	b := batchPool.Get().(*Batch)
	if err := DecodeBatch(b, it.p, n.cfg.MaxBatchMessages); err != nil {
		b.Release()
		n.decodeError(it.gid, err)
		return
	}
	n.st.delivered.Add(1)
	n.st.deliveredMsgs.Add(int64(len(b.Msgs)))
	if b.Tail > 0 {
		n.st.tailsDelivered.Add(1)
	}
	n.cfg.Handler(b)
}

// ---- subscriptions ----

// Subscribe asks for the batches of gid; see Bus. It also marks gid as
// touched, so a Presence sweep running at the same time keeps it.
func (n *Node) Subscribe(gid int64) error {
	n.subMu.Lock()
	if _, ok := n.want[gid]; !ok {
		if len(n.want) >= n.cfg.MaxGroups {
			n.subMu.Unlock()
			n.st.refused.Add(1)
			return ErrTooManyGroups
		}
		n.want[gid] = struct{}{}
	}
	n.ops[gid] = true
	n.subMu.Unlock()
	return nil
}

// Unsubscribe stops the batches of gid; see Bus. ControlGID stays.
func (n *Node) Unsubscribe(gid int64) {
	if gid == ControlGID && n.cfg.Members != nil {
		return
	}
	n.subMu.Lock()
	if _, ok := n.want[gid]; ok {
		delete(n.want, gid)
		n.ops[gid] = false
	}
	n.subMu.Unlock()
}

// Subscribed reports whether gid is asked for (applied or pending).
func (n *Node) Subscribed(gid int64) bool {
	n.subMu.RLock()
	_, ok := n.want[gid]
	n.subMu.RUnlock()
	return ok
}

// SyncSubscriptions applies the pending subscription changes now and
// returns when the transport has them (for a Redis transport: the
// SSUBSCRIBE was written). It needs Run.
func (n *Node) SyncSubscriptions(ctx context.Context) error {
	r := make(chan error, 1)
	select {
	case n.syncReq <- r:
	case <-n.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// subChunk bounds the groups of one transport Subscribe call.
const subChunk = 1000

func (n *Node) controlLoop(ctx context.Context) {
	flush := time.NewTicker(n.cfg.FlushInterval)
	defer flush.Stop()
	var recon <-chan time.Time
	if n.cfg.Presence != nil {
		t := time.NewTicker(n.cfg.ReconcileInterval)
		defer t.Stop()
		recon = t.C
		n.reconcile()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-flush.C:
			_ = n.applySubs(ctx)
		case <-recon:
			n.reconcile()
		case r := <-n.syncReq:
			r <- n.applySubs(ctx)
		}
	}
}

func (n *Node) applySubs(ctx context.Context) error {
	n.subMu.Lock()
	if len(n.ops) == 0 {
		n.subMu.Unlock()
		return nil
	}
	ops := n.ops
	n.ops, n.spare = n.spare, nil
	n.subMu.Unlock()

	n.adds, n.dels = n.adds[:0], n.dels[:0]
	for gid, sub := range ops {
		_, have := n.applied[gid]
		switch {
		case sub && !have:
			n.adds = append(n.adds, gid)
			n.applied[gid] = struct{}{}
		case !sub && have:
			n.dels = append(n.dels, gid)
			delete(n.applied, gid)
		}
	}
	clear(ops)
	n.spare = ops
	n.st.subscriptions.Store(int64(len(n.applied)))

	var errs []error
	for s := n.dels; len(s) > 0; {
		k := min(len(s), subChunk)
		if err := n.tr.Unsubscribe(ctx, s[:k]); err != nil {
			errs = append(errs, err)
		}
		s = s[k:]
	}
	for s := n.adds; len(s) > 0; {
		k := min(len(s), subChunk)
		if err := n.tr.Subscribe(ctx, s[:k]); err != nil {
			errs = append(errs, err)
		}
		s = s[k:]
	}
	err := errors.Join(errs...)
	if err != nil {
		n.st.subscribeErrors.Add(1)
		if !n.subFailing {
			n.log.Warn("bus subscription change failed; kept for the reconnect", "node", n.id,
				"added", len(n.adds), "removed", len(n.dels), "err", err)
		}
	}
	n.subFailing = err != nil
	return err
}

// reconcile follows Presence: it adds every group with a member online
// here and drops every group with none, unless the group was touched
// (Subscribe) since the last flush, which then wins.
func (n *Node) reconcile() {
	p := n.cfg.Presence
	n.gbuf = p.AppendGroups(n.gbuf[:0])
	n.subMu.Lock()
	for _, gid := range n.gbuf {
		if _, ok := n.want[gid]; ok {
			continue
		}
		if len(n.want) >= n.cfg.MaxGroups {
			n.st.refused.Add(1)
			continue
		}
		n.want[gid] = struct{}{}
		n.ops[gid] = true
	}
	n.subMu.Unlock()

	n.subMu.RLock()
	n.gbuf = n.gbuf[:0]
	for gid := range n.want {
		n.gbuf = append(n.gbuf, gid)
	}
	n.subMu.RUnlock()
	gone := n.gbuf[:0]
	for _, gid := range n.gbuf {
		if gid != ControlGID && p.OnlineCount(gid) == 0 {
			gone = append(gone, gid)
		}
	}
	if len(gone) == 0 {
		return
	}
	n.subMu.Lock()
	for _, gid := range gone {
		if _, touched := n.ops[gid]; touched {
			continue
		}
		if _, ok := n.want[gid]; ok {
			delete(n.want, gid)
			n.ops[gid] = false
		}
	}
	n.subMu.Unlock()
}

// ---- lifecycle ----

// Run moves batches until ctx is done (returning ctx.Err()) or Shutdown
// (returning nil). It runs the transport's receiver, the publisher, the
// deliverer (the handler's goroutine) and the subscription controller, and
// waits for all of them.
func (n *Node) Run(ctx context.Context) error {
	n.runMu.Lock()
	if n.running || n.closed.Load() {
		n.runMu.Unlock()
		if n.closed.Load() {
			return nil
		}
		return errors.New("bus: Run called twice")
	}
	rctx, cancel := context.WithCancel(ctx)
	n.running, n.cancel = true, cancel
	n.runMu.Unlock()
	defer close(n.done)
	defer cancel()

	var wg sync.WaitGroup
	trErr := make(chan error, 1)
	wg.Go(func() {
		if err := n.tr.Run(rctx, n.recv); err != nil && rctx.Err() == nil {
			trErr <- err
		}
	})
	wg.Go(func() { n.publishLoop(rctx) })
	wg.Go(func() { n.deliverLoop(rctx) })
	wg.Go(func() { n.controlLoop(rctx) })
	wg.Go(func() { n.tailLoop(rctx) })
	var err error
	select {
	case <-rctx.Done():
	case err = <-trErr:
		n.log.Error("bus transport stopped", "node", n.id, "err", err)
	}
	cancel()
	wg.Wait()
	if err != nil {
		return err
	}
	select {
	case <-n.stop:
		return nil
	default:
		return ctx.Err()
	}
}

// Shutdown refuses further publishes, sends what is queued (while the
// backend takes it and ctx allows), then stops Run and waits for it.
func (n *Node) Shutdown(ctx context.Context) error {
	n.runMu.Lock()
	n.closed.Store(true)
	n.stopOnce.Do(func() { close(n.stop) })
	running, cancel := n.running, n.cancel
	n.runMu.Unlock()
	if !running {
		return nil
	}
	var err error
	select {
	case <-n.drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	cancel()
	select {
	case <-n.done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	return err
}

// reconnected is the transport's notice that it subscribed again after
// losing the backend: Config.Reconnected gets the subscribed groups, from
// a goroutine of its own, one call at a time (a notice during a call makes
// one more).
func (n *Node) reconnected() {
	n.reconnectAgain.Store(true)
	if !n.reconnecting.CompareAndSwap(false, true) {
		return
	}
	go func() {
		for {
			for n.reconnectAgain.Swap(false) {
				n.subMu.RLock()
				gids := make([]int64, 0, len(n.want))
				for gid := range n.want {
					if gid != ControlGID {
						gids = append(gids, gid)
					}
				}
				n.subMu.RUnlock()
				n.cfg.Reconnected(gids)
			}
			n.reconnecting.Store(false)
			// A notice between the last Swap and the Store finds
			// reconnecting set and returns: take it here.
			if !n.reconnectAgain.Load() || !n.reconnecting.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}
