package fanout

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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
}

// PushKind says which frame a Push carries (PROTOCOL.md).
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
	Push(p *Push)
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

// Config configures an Engine. The zero value of every field but Store
// works.
type Config struct {
	Store    store.Store
	Presence Presence // nil = nobody is online (no pushes)
	Pusher   Pusher   // nil = no pushes

	// Shards is the number of shard workers; 0 = 4.
	Shards int
	// MaxBatch bounds the messages committed in one transaction; 0 = 512.
	MaxBatch int
	// Linger is how long a worker waits for more sends before committing a
	// batch that is not full; 0 = commit what is queued at once (batches
	// still grow under load: sends queue while the previous commit runs).
	Linger time.Duration
	// QueueCap is the hard capacity of each shard queue (tasks); 0 = 8192.
	QueueCap int
	// MinQueue is the smallest soft bound, used before any service rate is
	// measured; 0 = 256.
	MinQueue int
	// TargetWait is the queue wait the soft bound aims for (Little's Law:
	// bound = service rate x TargetWait x Safety); 0 = 200 ms.
	TargetWait time.Duration
	// Safety is the Little's Law safety factor, in (0, 1]; 0 = 0.6.
	Safety float64
	// CommitTimeout bounds one store commit; 0 = 5 s.
	CommitTimeout time.Duration
	// MergeWindow is the L1/L2 aggregation window; 0 = 200 ms.
	MergeWindow time.Duration
	// MaxMerge bounds the messages held per group in one window (L1): a
	// full window is flushed early; 0 = 256.
	MaxMerge int
	// Levels holds the degradation levels; nil = a new table.
	Levels *Levels

	Metrics *Metrics // nil = not exported
	Logger  *slog.Logger
}

func (c *Config) fill() {
	if c.Shards <= 0 {
		c.Shards = 4
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 512
	}
	if c.QueueCap <= 0 {
		c.QueueCap = 8192
	}
	if c.MinQueue <= 0 {
		c.MinQueue = 256
	}
	if c.MinQueue > c.QueueCap {
		c.MinQueue = c.QueueCap
	}
	if c.TargetWait <= 0 {
		c.TargetWait = 200 * time.Millisecond
	}
	if c.Safety <= 0 {
		c.Safety = 0.6
	}
	if c.CommitTimeout <= 0 {
		c.CommitTimeout = 5 * time.Second
	}
	if c.MergeWindow <= 0 {
		c.MergeWindow = 200 * time.Millisecond
	}
	if c.MaxMerge <= 0 {
		c.MaxMerge = 256
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Levels == nil {
		c.Levels = NewLevels(nil, c.Logger)
	}
}

// Validate reports every problem of c.
func (c Config) Validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("fanout: Store is required"))
	}
	if c.Shards < 0 || c.MaxBatch < 0 || c.QueueCap < 0 || c.MinQueue < 0 {
		errs = append(errs, errors.New("fanout: Shards, MaxBatch, QueueCap and MinQueue must not be negative"))
	}
	if c.Safety < 0 || c.Safety > 1 {
		errs = append(errs, errors.New("fanout: Safety must be in (0, 1]"))
	}
	if c.TargetWait < 0 || c.Linger < 0 || c.CommitTimeout < 0 || c.MergeWindow < 0 || c.MaxMerge < 0 {
		errs = append(errs, errors.New("fanout: durations must not be negative"))
	}
	return errors.Join(errs...)
}

// Engine routes sends to shard workers, commits them through the store and
// pushes committed batches to online members.
type Engine struct {
	cfg    Config
	st     store.Store
	pres   Presence
	push   Pusher
	shards []*shard
	seed   maphash.Seed
	levels *Levels

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
		cfg:    cfg,
		st:     cfg.Store,
		pres:   cfg.Presence,
		push:   cfg.Pusher,
		seed:   maphash.MakeSeed(),
		levels: cfg.Levels,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	e.levels.OnChange(e.levelChanged)
	e.shards = make([]*shard, cfg.Shards)
	for i := range e.shards {
		e.shards[i] = newShard(e, i)
	}
	return e, nil
}

// Store returns the engine's store.
func (e *Engine) Store() store.Store { return e.st }

// Levels returns the engine's degradation levels.
func (e *Engine) Levels() *Levels { return e.levels }

// levelChanged tells the affected connections about a new effective level.
func (e *Engine) levelChanged(gid int64, _, to Level, _ string) {
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
	to = e.levels.Effective(gid)
	conns := e.pres.AppendConns(nil, gid)
	if len(conns) > 0 {
		e.push.Degraded(gid, to, conns)
	}
}

// Run runs the shard workers until ctx is done or Shutdown drains them.
func (e *Engine) Run(ctx context.Context) error {
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("fanout: Run called twice")
	}
	var wg sync.WaitGroup
	for _, s := range e.shards {
		wg.Go(func() { s.run() })
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			e.beginStop()
			break loop
		case <-e.stop:
			break loop
		case <-tick.C:
			e.levels.ExpireForced()
		}
	}
	wg.Wait()
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

func (e *Engine) shardOf(gid int64) *shard {
	h := maphash.Comparable(e.seed, gid)
	return e.shards[h%uint64(len(e.shards))]
}

// Send enqueues req on its group's worker. It never blocks: when the queue
// is past its bound, req.Done gets ErrOverloaded (as a *RetryError) at once.
func (e *Engine) Send(req SendRequest) {
	if e.closing.Load() {
		req.Done(SendResult{Err: &RetryError{Err: ErrClosed, After: time.Second}})
		return
	}
	if e.levels.Effective(req.GID) >= L4Reject {
		req.Done(SendResult{Err: &RetryError{Err: ErrUnavailable, After: 5 * time.Second}})
		return
	}
	s := e.shardOf(req.GID)
	t := taskPool.Get().(*task)
	t.kind = taskSend
	t.send = req
	t.enq = time.Now()
	if err := s.enqueue(t); err != nil {
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
func (e *Engine) AddMembers(ctx context.Context, gid int64, uids []string) ([]store.Member, error) {
	var ms []store.Member
	err := e.onWorker(ctx, gid, func(ctx context.Context) error {
		var err error
		ms, err = e.st.AddMembers(ctx, gid, uids)
		if err != nil {
			return err
		}
		if e.pres != nil {
			for _, m := range ms {
				if err := e.pres.Join(gid, m.UID, m.Ordinal); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return ms, err
}

// RemoveMember removes uid from gid through the group's worker: nothing
// committed after this returns is pushed to uid.
func (e *Engine) RemoveMember(ctx context.Context, gid int64, uid string) error {
	return e.onWorker(ctx, gid, func(ctx context.Context) error {
		_, err := e.st.RemoveMember(ctx, gid, uid)
		if err != nil {
			return err
		}
		if e.pres != nil {
			e.pres.Leave(gid, uid)
		}
		return nil
	})
}

// onWorker runs fn on gid's worker between batches and waits for it.
func (e *Engine) onWorker(ctx context.Context, gid int64, fn func(context.Context) error) error {
	if e.closing.Load() {
		return &RetryError{Err: ErrClosed, After: time.Second}
	}
	done := make(chan error, 1)
	t := taskPool.Get().(*task)
	t.kind = taskFunc
	t.fn = fn
	t.fnDone = done
	t.enq = time.Now()
	s := e.shardOf(gid)
	if err := s.enqueueControl(ctx, t); err != nil {
		t.reset()
		taskPool.Put(t)
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Connect registers a connection of uid: it marks the user active and sets
// its presence bits in all its groups. It calls the store (blocking).
func (e *Engine) Connect(ctx context.Context, c Conn) ([]store.Member, error) {
	uid := c.UID()
	if e.pres != nil {
		// Register first so that a concurrent AddMembers sees uid online.
		if err := e.pres.Connect(uid, c, nil); err != nil {
			return nil, err
		}
	}
	if err := e.st.TouchUser(ctx, uid, time.Now()); err != nil {
		e.Disconnect(c)
		return nil, err
	}
	ms, err := e.st.UserGroups(ctx, uid)
	if err != nil {
		e.Disconnect(c)
		return nil, err
	}
	if e.pres != nil {
		for _, m := range ms {
			if err := e.pres.Join(m.GID, uid, m.Ordinal); err != nil {
				e.Disconnect(c)
				return nil, err
			}
		}
	}
	return ms, nil
}

// Disconnect unregisters a connection.
func (e *Engine) Disconnect(c Conn) {
	if e.pres != nil {
		e.pres.Disconnect(c.UID(), c)
	}
}

// Messages returns uid's view of gid in [fromSeq, toSeq] (see store.Store).
func (e *Engine) Messages(ctx context.Context, gid int64, uid string, fromSeq, toSeq int64) ([]store.Message, int64, error) {
	return e.st.Messages(ctx, gid, uid, fromSeq, toSeq, 0)
}

// Sync returns uid's groups with last_seq, last_read_seq and unread.
func (e *Engine) Sync(ctx context.Context, uid string) ([]store.SyncEntry, error) {
	return e.st.Sync(ctx, uid)
}

// MarkRead advances uid's last_read_seq in gid (never backwards).
func (e *Engine) MarkRead(ctx context.Context, gid int64, uid string, seq int64) error {
	return e.st.MarkRead(ctx, gid, uid, seq)
}
