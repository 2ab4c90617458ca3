// This file holds the Engine and its lifecycle: New, Run (the workers and
// the controller goroutine), Shutdown, the gid -> worker route, the level
// notices, and the read-through calls (Messages, Sync, MarkRead). A send's
// walk starts in send.go; the engine's configuration is in config.go.

package fanout

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// Engine routes sends to shard workers, commits them through the store and
// pushes committed batches to online members.
type Engine struct {
	cfg  Config
	st   store.Store
	pres Presence
	push Pusher
	bus  Bus
	// joiners holds, per group, its recent joiners (gid -> *joiners):
	// members added or connected here whose pushes are cut at their
	// join_seq (a window or a late bus batch may hold older commits).
	joiners sync.Map
	// views: per group, the membership version this node's presence
	// reflects (cluster mode; see members.go).
	views membershipViews
	// feed reads the store's feed of additions (cluster mode; members.go).
	feed memberFeed
	// touches coalesces the users' last-active writes of connects
	// (touch.go).
	touches *toucher
	// leaves orders connects' membership reads against removals (by uid).
	leaves [leaveStripes]leaveStripe
	// memberDownUntil: unix nanoseconds (engine clock) until which
	// checkSender lets sends pass unchecked after a failed lookup.
	memberDownUntil atomic.Int64
	shards          []*shard // ordinary pool
	hotSh           []*shard // hot pool
	seed            maphash.Seed
	levels          *Levels
	now             func() time.Time
	// tune is the tuning in force (SetTuning swaps it); workers load it
	// once per batch or tick. e.cfg's tunable fields are the values at
	// New and are not read after it.
	tune atomic.Pointer[Tuning]

	// routeMu orders sends against moves between pools: Send holds it for
	// reading across the route lookup and the (non-blocking) enqueue; a
	// move takes it for writing to publish the new route, so that once it
	// returns no sender can still enqueue on the old route.
	routeMu sync.RWMutex
	hot     atomic.Pointer[map[int64]struct{}] // copy on write under routeMu
	moveReq chan moveRequest
	moves   atomic.Int64 // moves under way (workers' drain waits for them)

	egress atomic.Int64 // bytes pushed (frames x recipients)
	node   nodeTriggers // controller-owned
	t2     *tier2

	hotMu   sync.Mutex
	hotInfo map[int64]hotInfo
	demand  map[int64]float64 // offered rate of groups limited here, for the HotSet

	// Cluster hot set (Config.HotSet): the view is written by the
	// hot-set goroutine, read by workers and the admin API; hotSetDown
	// and hotKick belong to that goroutine.
	view       atomic.Pointer[hotView]
	hotKick    chan struct{}
	hotSetDown bool

	// Shared @all quota (Config.AtAllQuota): unix nanoseconds until which
	// workers count @all locally after a failure.
	atAllDownUntil atomic.Int64
	// bg: background calls of the workers (@all refunds); Run waits.
	bg sync.WaitGroup

	closing  atomic.Bool
	stopOnce sync.Once
	stop     chan struct{} // closed by Shutdown: workers drain and exit
	done     chan struct{} // closed when Run's workers have exited
	started  atomic.Bool
}

// New returns an engine; call Run to start its workers.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fill()
	e := &Engine{
		cfg:     cfg,
		st:      cfg.Store,
		pres:    cfg.Presence,
		push:    cfg.Pusher,
		bus:     cfg.Bus,
		seed:    maphash.MakeSeed(),
		levels:  cfg.Levels,
		now:     cfg.Now,
		moveReq: make(chan moveRequest, 256),
		hotInfo: map[int64]hotInfo{},
		demand:  map[int64]float64{},
		hotKick: make(chan struct{}, 1),
		feed:    memberFeed{kick: make(chan struct{}, 1)},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	t := cfg.Tuning
	e.tune.Store(&t)
	e.hot.Store(&map[int64]struct{}{})
	e.view.Store(emptyHotView)
	e.t2 = newTier2(e)
	e.touches = newToucher(e.st.TouchUsers, cfg.TouchInterval, cfg.TouchPendingMax, cfg.CommitTimeout, cfg.Logger, cfg.Metrics)
	e.levels.OnChange(e.levelChanged)
	e.shards = make([]*shard, cfg.Shards)
	for i := range e.shards {
		e.shards[i] = newShard(e, i, false)
	}
	e.hotSh = make([]*shard, cfg.HotShards)
	for i := range e.hotSh {
		e.hotSh[i] = newShard(e, i, true)
	}
	cfg.Metrics.attach(e)
	return e, nil
}

// Store returns the engine's store.
func (e *Engine) Store() store.Store { return e.st }

// Levels returns the engine's degradation levels.
func (e *Engine) Levels() *Levels { return e.levels }

// levelChanged tells the affected connections about a new effective level
// and exports the scope's level.
func (e *Engine) levelChanged(gid int64, _, to Level, _ string) {
	e.cfg.Metrics.levelChanged(gid, to)
	if e.push == nil {
		return
	}
	if gid == 0 {
		e.push.Degraded(0, to, nil)
		return
	}
	if e.pres == nil {
		return
	}
	// A group notice carries the group's own level: the client's effective
	// level is max(node, group), so it stays right when the node's level
	// changes later (a notice with the effective level would go stale).
	conns := e.pres.AppendConns(nil, gid)
	if len(conns) > 0 {
		e.push.Degraded(gid, to, conns)
	}
}

// Run runs the shard workers until ctx is done or Shutdown drains them. Its
// own goroutine is the controller: forced-level expiry, node triggers and
// moves of groups between the pools.
func (e *Engine) Run(ctx context.Context) error {
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("fanout: Run called twice")
	}
	var wg sync.WaitGroup
	for _, s := range e.shards {
		wg.Go(func() { s.run() })
	}
	for _, s := range e.hotSh {
		wg.Go(func() { s.run() })
	}
	t2stop := make(chan struct{})
	t2done := make(chan struct{})
	go func() {
		defer close(t2done)
		e.t2.run(t2stop)
	}()
	hsDone := make(chan struct{})
	go func() {
		defer close(hsDone)
		if e.cfg.HotSet != nil {
			e.runHotSync(ctx, e.stop)
		}
	}()
	touchStop := make(chan struct{})
	touchDone := make(chan struct{})
	go func() {
		defer close(touchDone)
		e.touches.run(touchStop)
	}()
	feedDone := make(chan struct{})
	go func() {
		defer close(feedDone)
		if e.feedOn() {
			e.runFeed(e.stop)
		}
	}()
	tick := time.NewTicker(e.cfg.NodeInterval)
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			e.beginStop()
			break loop
		case <-e.stop:
			break loop
		case m := <-e.moveReq:
			e.move(m)
		case <-tick.C:
			e.levels.ExpireForced()
			e.evalNode(ctx)
			e.sweepViews(e.now())
		}
	}
	wg.Wait()
	e.bg.Wait() // after the workers: no new ones
	close(t2stop)
	<-t2done
	<-hsDone
	<-feedDone
	// The last touches are written after the workers stopped; a connect
	// after this writes its own (toucher.touch).
	close(touchStop)
	<-touchDone
	close(e.done)
	return nil
}

func (e *Engine) beginStop() {
	e.stopOnce.Do(func() {
		e.closing.Store(true)
		close(e.stop)
	})
}

// Shutdown stops accepting sends, lets the workers commit and ack what is
// queued, and waits for them until ctx is done.
func (e *Engine) Shutdown(ctx context.Context) error {
	e.beginStop()
	if !e.started.Load() {
		return nil
	}
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// route returns gid's worker: the hot pool's for hot groups. Call with
// routeMu held for reading.
func (e *Engine) route(gid int64) *shard {
	h := maphash64(e, gid)
	if _, hot := (*e.hot.Load())[gid]; hot {
		return e.hotSh[h%uint64(len(e.hotSh))]
	}
	return e.shards[h%uint64(len(e.shards))]
}

func maphash64(e *Engine, gid int64) uint64 { return maphash.Comparable(e.seed, gid) }

// IsHot reports whether gid is routed to the hot pool.
func (e *Engine) IsHot(gid int64) bool {
	_, hot := (*e.hot.Load())[gid]
	return hot
}

// Messages returns uid's view of gid in [fromSeq, toSeq], one page of at
// most the store's range of messages whose sizes sum to at most maxBytes
// (0 = no byte bound), and always one message (see store.Store).
func (e *Engine) Messages(ctx context.Context, gid int64, uid string, fromSeq, toSeq int64, maxBytes int) ([]store.Message, int64, error) {
	return e.st.Messages(ctx, gid, uid, fromSeq, toSeq, 0, maxBytes)
}

// Sync returns one page of uid's groups with last_seq, last_read_seq and
// unread: at most limit groups with a gid above afterGID, in gid order
// (see store.Store).
func (e *Engine) Sync(ctx context.Context, uid string, afterGID int64, limit int) ([]store.SyncEntry, error) {
	return e.st.Sync(ctx, uid, afterGID, limit)
}

// MarkRead advances uid's last_read_seq in gid (never backwards).
func (e *Engine) MarkRead(ctx context.Context, gid int64, uid string, seq int64) error {
	return e.st.MarkRead(ctx, gid, uid, seq)
}
