package fanout

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
)

// Conn is one client connection as the engine sees it: an opaque,
// comparable handle owned by the gateway. The gateway's Pusher receives the
// same values back.
type Conn interface {
	// UID is the authenticated user of the connection.
	UID() string
}

// Presence is what the engine needs from the local presence index;
// *presence.Local[Conn] implements it.
type Presence interface {
	// Connect registers c for uid and marks uid online in ms.
	Connect(uid string, c Conn, ms []presence.Membership) error
	// Disconnect unregisters c; uid goes offline when it was its last.
	Disconnect(uid string, c Conn) bool
	// Join sets uid's bit in gid if uid is online.
	Join(gid int64, uid string, ordinal uint32) error
	// Leave clears uid's bit in gid at once.
	Leave(gid int64, uid string)
	// AppendConns appends the connections of gid's online members to dst.
	AppendConns(dst []Conn, gid int64) []Conn
	// UserOnline reports whether uid has a connection on this node (tier
	// 2 skips online members: they got the push).
	UserOnline(uid string) bool
}

// PushKind says which frame a Push carries (docs/protocol.md §4.8-§4.10).
type PushKind uint8

// Push kinds, by degradation level.
const (
	PushMsgs    PushKind = iota // L0: one msg frame per message
	PushBatch                   // L1: one batch frame per group per window
	PushSummary                 // L2: one summary frame per group per window
)

// Push is one delivery of a group's committed messages to connections.
type Push struct {
	GID  int64
	Kind PushKind
	// Msgs are the messages in seq order (PushMsgs, PushBatch); for
	// PushSummary, Msgs[0] is the first message of the window.
	Msgs    []store.Message
	Count   int   // messages the push stands for (summary count)
	LastSeq int64 // highest seq in the push
	Conns   []Conn
}

// Pusher delivers pushes to connections. Its methods are called on a shard
// worker (or, for Degraded, on the goroutine that changed a level); they
// must encode each frame once, must not block, and must not retain the
// slices they are given after they return.
type Pusher interface {
	// Push delivers p and returns the bytes it wrote to each connection
	// (the encoded size of its frames); the engine counts that times
	// len(p.Conns) as node egress (the egress trigger, docs/architecture.md
	// §8, and fanfare_egress_bytes_total).
	Push(p *Push) (bytes int)
	// Degraded tells conns that the effective level of gid is now level;
	// gid 0 with nil conns means node-wide: every connection.
	Degraded(gid int64, level Level, conns []Conn)
}

// SendRequest is one message to store and push.
type SendRequest struct {
	GID         int64
	UID         string
	ClientMsgID string
	Kind        string // "" = text
	// Body is raw JSON. The engine keeps it after Done (merge windows):
	// the caller must not reuse it.
	Body []byte
	// Done receives the outcome on the shard worker after commit (or at
	// once when the request is refused). It must not block.
	Done func(SendResult)
}

// SendResult is the outcome of a send. Err is nil when the message is stored
// (Seq set; Duplicate when it was stored before under the same client id).
type SendResult struct {
	Seq       int64
	CreatedAt time.Time
	Duplicate bool
	Err       error
}

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
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	t := cfg.Tuning
	e.tune.Store(&t)
	e.hot.Store(&map[int64]struct{}{})
	e.view.Store(emptyHotView)
	e.t2 = newTier2(e)
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

// Send enqueues req on its group's worker. It never blocks: when the queue
// is past its bound, req.Done gets ErrOverloaded (as a *RetryError) at once.
func (e *Engine) Send(req SendRequest) {
	if e.closing.Load() {
		req.Done(SendResult{Err: &RetryError{Err: ErrClosed, After: time.Second}})
		return
	}
	if e.levels.Effective(req.GID) >= L4Reject {
		e.cfg.Metrics.sends(1, "refused_l4")
		req.Done(SendResult{Err: &RetryError{Err: ErrUnavailable, After: 5 * time.Second}})
		return
	}
	t := taskPool.Get().(*task)
	t.kind = taskSend
	t.send = req
	t.enq = time.Now()
	e.routeMu.RLock()
	err := e.route(req.GID).enqueue(t)
	e.routeMu.RUnlock()
	if err != nil {
		t.reset()
		taskPool.Put(t)
		req.Done(SendResult{Err: err})
	}
}

// SendWait is Send for callers that can block (the HTTP API): it waits for
// the outcome or ctx.
func (e *Engine) SendWait(ctx context.Context, req SendRequest) SendResult {
	ch := make(chan SendResult, 1)
	req.Done = func(r SendResult) { ch <- r }
	e.Send(req)
	select {
	case r := <-ch:
		return r
	case <-ctx.Done():
		// The send may still commit; a retry with the same client id
		// returns its seq.
		return SendResult{Err: ctx.Err()}
	}
}

// AddMembers adds uids to gid through the group's worker, so that the new
// members' presence bits are set between batches, and returns the members.
// With a bus, the other nodes apply the change too (RemoteMembers).
func (e *Engine) AddMembers(ctx context.Context, gid int64, uids []string) ([]store.Member, error) {
	var ms []store.Member
	err := e.onWorker(ctx, gid, func(ctx context.Context) error {
		var err error
		ms, err = e.st.AddMembers(ctx, gid, uids)
		if err != nil {
			return err
		}
		if e.bus != nil {
			// On the worker, before any later commit of gid publishes:
			// the other nodes get the change ahead of the batches that
			// follow it (a drop is counted by the bus; the members then
			// get their pushes there after their next connect).
			_ = e.bus.PublishMembers(gid, memberVersion(ms), false, ms)
		}
		if err := e.joined(gid, ms); err != nil {
			return err
		}
		e.applied(gid, memberVersion(ms))
		return nil
	})
	return ms, err
}

// joined applies members just added to gid (on this node or another) to
// this node: their presence bits, gid's recent joiners (a batch committed
// before the join, still on its way, must not reach them) and the bus
// subscription. It runs on gid's worker.
func (e *Engine) joined(gid int64, ms []store.Member) error {
	online := false
	for _, m := range ms {
		e.addJoiner(gid, m.UID, m.JoinSeq)
		if e.pres != nil {
			if err := e.pres.Join(gid, m.UID, m.Ordinal); err != nil {
				return err
			}
			online = online || e.pres.UserOnline(m.UID)
		}
	}
	if e.bus != nil && online {
		_ = e.bus.Subscribe(gid)
	}
	return nil
}

// left applies members removed from gid (on this node or another) to this
// node: their presence bits are cleared, so no push collected afterwards
// reaches them. The bus drops gid at its next presence sweep if nobody is
// left online here.
func (e *Engine) left(gid int64, ms []store.Member) {
	if e.pres == nil {
		return
	}
	for _, m := range ms {
		ls := e.leaveStripe(m.UID)
		ls.mu.Lock()
		ls.gen.Add(1)
		e.pres.Leave(gid, m.UID)
		ls.mu.Unlock()
	}
}

// Bus is what the engine needs from the cross-node bus; *bus.Node
// implements it.
type Bus interface {
	// Publish hands gid's newly committed messages, stored at
	// membership version version, to the other nodes without blocking (a
	// drop is counted by the bus).
	Publish(gid, version int64, msgs []store.Message) error
	// PublishMembers hands a committed membership change of gid (ms
	// added, or removed) that made membership version version to the
	// other nodes without blocking (a drop is counted by the bus, and
	// repaired by version: see members.go).
	PublishMembers(gid, version int64, removed bool, ms []store.Member) error
	// Subscribe asks for the batches of gid at once (the bus also follows
	// presence on its own).
	Subscribe(gid int64) error
}

// Remote takes a batch another node committed and pushes it to this
// node's online members on the group's worker, in order with local
// commits. It never blocks: when the worker's queue is full the batch is
// dropped and clients pull the gap.
func (e *Engine) Remote(b *bus.Batch) {
	if e.closing.Load() || len(b.Msgs) == 0 {
		b.Release()
		return
	}
	t := taskPool.Get().(*task)
	t.kind = taskRemote
	t.gid = b.GID
	t.remote = b
	t.enq = time.Now()
	e.routeMu.RLock()
	ok, err := e.route(b.GID).tryEnqueueControl(t)
	e.routeMu.RUnlock()
	if !ok || err != nil {
		e.cfg.Metrics.remoteDropped()
		b.Release()
		releaseTask(t)
	}
}

// RemoteMembers takes a membership change another node committed and
// applies it to this node with the code of a local change (joined, left),
// on the group's worker, in order with the group's pushes. An addition
// matters here only if one of the added members is online here: else it
// is skipped (their connect reads the membership), so that a node does not
// keep recent joiners for every group of the cluster. An addition is checked
// against the store on the worker first: a removal made since (here or on
// a third node, whose change may arrive first) wins, so a late addition
// never revives a removed member. It never blocks: when the worker's queue
// is full, a removal is applied at once from the caller's goroutine
// (earlier than its turn, which can only cost the member a push it could
// still have had), an addition is dropped (counted; the members get this
// node's pushes after their next connect).
func (e *Engine) RemoteMembers(c *bus.MemberChange) {
	if e.closing.Load() || e.pres == nil || len(c.Members) == 0 {
		return
	}
	if !c.Removed && !e.anyOnline(c.Members) {
		e.applied(c.GID, c.Version) // nothing to set here
		return
	}
	t := taskPool.Get().(*task)
	t.kind = taskFunc
	t.gid = c.GID
	t.fn = func(ctx context.Context) error {
		if c.Removed {
			e.left(c.GID, c.Members)
		} else if err := e.joined(c.GID, e.stillMembers(ctx, c.GID, c.Members)); err != nil {
			return err
		}
		e.applied(c.GID, c.Version)
		return nil
	}
	t.enq = time.Now()
	e.routeMu.RLock()
	ok, err := e.route(c.GID).tryEnqueueControl(t)
	e.routeMu.RUnlock()
	if ok && err == nil {
		return
	}
	releaseTask(t)
	if c.Removed {
		e.left(c.GID, c.Members)
		e.applied(c.GID, c.Version)
		return
	}
	e.cfg.Metrics.remoteMembersDropped()
	e.cfg.Logger.Warn("remote membership change dropped: group worker queue full; the members get pushes here after their next connect",
		"gid", c.GID, "origin", c.Origin, "members", len(c.Members))
}

// stillMembers returns the memberships of ms that the store still holds,
// as it holds them now. A member whose row cannot be read (store failing)
// is kept as announced: a push too many beats a member left out.
func (e *Engine) stillMembers(ctx context.Context, gid int64, ms []store.Member) []store.Member {
	out := ms[:0:0]
	for _, m := range ms {
		cur, err := e.st.Member(ctx, gid, m.UID)
		switch {
		case err == nil:
			out = append(out, cur)
		case errors.Is(err, store.ErrNotMember):
			// removed since: skip
		default:
			e.cfg.Logger.Warn("remote membership addition not checked: store failing", "gid", gid, "uid", m.UID, "err", err)
			out = append(out, m)
		}
	}
	return out
}

func (e *Engine) anyOnline(ms []store.Member) bool {
	for _, m := range ms {
		if e.pres.UserOnline(m.UID) {
			return true
		}
	}
	return false
}

// RemoveMember removes uid from gid through the group's worker: nothing
// committed after this returns is pushed to uid, on this node or (with a
// bus, once the change reached them) on the others.
func (e *Engine) RemoveMember(ctx context.Context, gid int64, uid string) error {
	return e.onWorker(ctx, gid, func(ctx context.Context) error {
		m, err := e.st.RemoveMember(ctx, gid, uid)
		if err != nil {
			return err
		}
		ms := []store.Member{{GID: gid, UID: uid, Ordinal: m.Ordinal}}
		if e.bus != nil {
			_ = e.bus.PublishMembers(gid, m.MemberVersion, true, ms)
		}
		e.left(gid, ms)
		e.applied(gid, m.MemberVersion)
		return nil
	})
}

// onWorker runs fn on gid's worker between batches and waits for it.
func (e *Engine) onWorker(ctx context.Context, gid int64, fn func(context.Context) error) error {
	done := make(chan error, 1)
	t := taskPool.Get().(*task)
	t.kind = taskFunc
	t.gid = gid
	t.fn = fn
	t.fnDone = done
	t.enq = time.Now()
	// Membership changes are rare admin operations: they are not refused
	// by the send bound but wait for room, without holding routeMu while
	// waiting (a move needs it).
	for {
		e.routeMu.RLock()
		ok, err := e.route(gid).tryEnqueueControl(t)
		e.routeMu.RUnlock()
		if err != nil {
			t.reset()
			taskPool.Put(t)
			return err
		}
		if ok {
			break
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			t.reset()
			taskPool.Put(t)
			return ctx.Err()
		}
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Connect registers a connection of uid: it marks the user active, loads
// its groups and sets its presence bits. It calls the store (blocking).
func (e *Engine) Connect(ctx context.Context, c Conn) ([]store.Member, error) {
	return e.ConnectReady(ctx, c, nil)
}

// ConnectReady is Connect calling ready (which sends hello) just before c
// is registered in presence, so that every push to c follows what ready
// wrote, and a client that syncs after hello misses nothing.
func (e *Engine) ConnectReady(ctx context.Context, c Conn, ready func()) ([]store.Member, error) {
	uid := c.UID()
	if err := e.st.TouchUser(ctx, uid, e.now()); err != nil {
		return nil, err
	}
	// A removal committed after this read cannot have cleared its bits
	// before Connect sets them (connectMemberships reads again).
	ms, err := e.connectMemberships(ctx, uid, func(ms []store.Member) error {
		if ready != nil {
			ready() // hello: no push can reach c before it is registered below
		}
		if e.pres == nil {
			return nil
		}
		bits := make([]presence.Membership, len(ms))
		for i, m := range ms {
			e.connectJoiner(m)
			bits[i] = presence.Membership{GID: m.GID, Ordinal: m.Ordinal}
		}
		// Connect does not evict another member holding one of these
		// ordinals: a membership read above may already be stale.
		return e.pres.Connect(uid, c, bits)
	})
	if err != nil {
		return nil, err
	}
	if e.pres == nil {
		return ms, nil
	}
	// A join or leave committed between the read above and Connect found
	// uid offline and changed no bit: read again and reconcile. Changes
	// committed after this read run their Join/Leave on a registered uid.
	fresh, err := e.st.UserGroups(ctx, uid)
	if err != nil {
		e.Disconnect(c)
		return nil, err
	}
	stale := make(map[int64]uint32, len(ms))
	for _, m := range ms {
		stale[m.GID] = m.Ordinal
	}
	for _, m := range fresh {
		if ord, ok := stale[m.GID]; !ok || ord != m.Ordinal {
			e.connectJoiner(m)
			if err := e.pres.Join(m.GID, uid, m.Ordinal); err != nil {
				e.Disconnect(c)
				return nil, err
			}
		}
		delete(stale, m.GID)
	}
	for gid := range stale {
		e.pres.Leave(gid, uid)
	}
	if e.bus != nil {
		for _, m := range fresh {
			_ = e.bus.Subscribe(m.GID) // at once; the bus also follows presence
		}
	}
	return fresh, nil
}

// connectJoiner makes m a recent joiner of its group before a connect
// sets m's bit. With a bus the group's window here, or a batch
// still on its way from another node, may hold messages committed before
// m joined (on another node, while m was offline here); on one node every
// commit below join_seq was pushed before the join ran on the group's
// worker (runFunc flushes its window), and no joiner is kept.
func (e *Engine) connectJoiner(m store.Member) {
	if e.bus != nil {
		e.addJoiner(m.GID, m.UID, m.JoinSeq)
	}
}

// Disconnect unregisters a connection.
func (e *Engine) Disconnect(c Conn) {
	if e.pres != nil {
		e.pres.Disconnect(c.UID(), c)
	}
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
