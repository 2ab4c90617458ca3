package redispresence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/presence"
)

// Defaults for Config.
const (
	DefaultPrefix        = "fanfare:presence:"
	DefaultFlushInterval = time.Second
	DefaultTTL           = 15 * time.Second
	DefaultBatch         = 256
	DefaultMaxQuery      = 65536
)

// ErrClosed is returned by Flush after Shutdown.
var ErrClosed = errors.New("redispresence: closed")

// Config configures a View. The zero value works.
type Config struct {
	// NodeID names this node in Redis; "" means hostname-pid-random. Two
	// live nodes must not share an id.
	NodeID string
	// Prefix starts every key; "" means DefaultPrefix. It must not contain
	// '{' or '}' (the hash tag follows it).
	Prefix string
	// FlushInterval is how often Run publishes local changes; 0 means
	// DefaultFlushInterval.
	FlushInterval time.Duration
	// TTL is how long this node's bits outlive its last flush: a node dead
	// for TTL drops out of the view. 0 means DefaultTTL; it must exceed
	// 2 x FlushInterval. Unchanged groups are renewed every TTL/3.
	TTL time.Duration
	// Batch is how many groups go into one pipeline; 0 means DefaultBatch.
	Batch int
	// MaxQuery bounds the ordinals of one OnlineAnywhere call; 0 means
	// DefaultMaxQuery.
	MaxQuery int
	// Now is the clock deciding when groups are renewed; nil means time.Now.
	// (Expiry itself runs on Redis time.)
	Now func() time.Time
	// Logger receives state changes (Redis lost, resynced); nil discards.
	Logger *slog.Logger
}

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	if strings.ContainsAny(c.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("redispresence: Prefix %q contains a brace", c.Prefix))
	}
	if c.FlushInterval < 0 {
		errs = append(errs, fmt.Errorf("redispresence: FlushInterval %v is negative", c.FlushInterval))
	}
	if c.TTL < 0 {
		errs = append(errs, fmt.Errorf("redispresence: TTL %v is negative", c.TTL))
	}
	d := c.withDefaults()
	if c.TTL >= 0 && c.FlushInterval >= 0 && d.TTL <= 2*d.FlushInterval {
		errs = append(errs, fmt.Errorf("redispresence: TTL %v must exceed 2 x FlushInterval %v", d.TTL, d.FlushInterval))
	}
	if d.TTL%time.Millisecond != 0 || d.TTL < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("redispresence: TTL %v is not a whole number of ms >= 10ms", d.TTL))
	}
	if c.Batch < 0 {
		errs = append(errs, fmt.Errorf("redispresence: Batch %d is negative", c.Batch))
	}
	if c.MaxQuery < 0 {
		errs = append(errs, fmt.Errorf("redispresence: MaxQuery %d is negative", c.MaxQuery))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.MaxQuery == 0 {
		c.MaxQuery = DefaultMaxQuery
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

func defaultNodeID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Stats counts a View's work since New.
type Stats struct {
	Flushes      int64 // Flush calls that completed
	Failures     int64 // Flush calls that failed
	FullWrites   int64 // whole bitmaps written
	DeltaWrites  int64 // bit deltas written
	Renewals     int64 // TTL renewals of unchanged groups
	Deletes      int64 // groups withdrawn (no member online here any more)
	Resyncs      int64 // full resyncs (start, after an outage, lost keys)
	BytesWritten int64 // bitmap and delta payload bytes
}

// View is this node's side of the Redis cluster view: it publishes the
// local online bits of a presence.Source and answers cluster-wide queries.
type View struct {
	rdb   redis.UniversalClient
	src   presence.Source
	cfg   Config
	node  string
	ttlMs int64

	// flushMu serializes flushes and guards the fields below it.
	flushMu  sync.Mutex
	written  map[int64]*written // what Redis holds for this node
	pending  map[int64]struct{} // groups to write
	needFull bool               // rewrite everything (start, after an outage)
	loaded   bool               // scripts loaded on this Redis
	healthy  bool
	closed   bool
	gids     []int64

	stale atomic.Bool // needFull || !healthy, for Stale
	stats struct {
		flushes, failures, full, delta, renew, del, resyncs, bytes atomic.Int64
	}

	stop     chan struct{}
	stopOnce sync.Once
	running  sync.WaitGroup
}

type written struct {
	bm      *roaring.Bitmap
	renewed time.Time
}

var _ presence.Cluster = (*View)(nil)

// New returns a View publishing src through rdb. Nothing is written until
// Flush or Run.
func New(rdb redis.UniversalClient, src presence.Source, cfg Config) (*View, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rdb == nil || src == nil {
		return nil, errors.New("redispresence: nil client or source")
	}
	cfg = cfg.withDefaults()
	node := cfg.NodeID
	if node == "" {
		node = defaultNodeID()
	}
	v := &View{
		rdb:      rdb,
		src:      src,
		cfg:      cfg,
		node:     node,
		ttlMs:    cfg.TTL.Milliseconds(),
		written:  make(map[int64]*written),
		pending:  make(map[int64]struct{}),
		needFull: true,
		stop:     make(chan struct{}),
	}
	v.stale.Store(true)
	return v, nil
}

// NodeID returns the id this node publishes under.
func (v *View) NodeID() string { return v.node }

func (v *View) tag(gid int64) string {
	return v.cfg.Prefix + "{g:" + strconv.FormatInt(gid, 10) + "}:"
}

func (v *View) nodeKey(gid int64, node string) string { return v.tag(gid) + "n:" + node }

// Run flushes every FlushInterval until ctx is done or Shutdown is called.
// A failing Redis is retried every interval; local presence is unaffected.
func (v *View) Run(ctx context.Context) error {
	v.running.Add(1)
	defer v.running.Done()
	t := time.NewTicker(v.cfg.FlushInterval)
	defer t.Stop()
	for {
		if err := v.Flush(ctx); errors.Is(err, ErrClosed) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-v.stop:
			return nil
		case <-t.C:
		}
	}
}

// Shutdown stops Run, then withdraws this node's bits from Redis so other
// nodes stop counting its users at once instead of after TTL. After
// Shutdown, Flush returns ErrClosed; queries keep working.
func (v *View) Shutdown(ctx context.Context) error {
	v.stopOnce.Do(func() { close(v.stop) })
	done := make(chan struct{})
	go func() { v.running.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	v.flushMu.Lock()
	defer v.flushMu.Unlock()
	if v.closed {
		return nil
	}
	v.closed = true
	gids := make([]int64, 0, len(v.written))
	for gid := range v.written {
		gids = append(gids, gid)
	}
	for b := range slices.Chunk(gids, v.cfg.Batch) {
		pipe := v.rdb.Pipeline()
		for _, gid := range b {
			v.evalWrite(ctx, pipe, gid, "del")
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("redispresence: withdraw: %w", err)
		}
		v.stats.del.Add(int64(len(b)))
	}
	clear(v.written)
	return nil
}

// Stale reports whether this node's bits in Redis may be missing or out of
// date beyond the normal flush lag: Redis unreachable, or the resync after
// an outage (or at start) not done yet.
func (v *View) Stale() bool { return v.stale.Load() }

// Stats returns counters since New.
func (v *View) Stats() Stats {
	s := &v.stats
	return Stats{
		Flushes: s.flushes.Load(), Failures: s.failures.Load(), FullWrites: s.full.Load(),
		DeltaWrites: s.delta.Load(), Renewals: s.renew.Load(), Deletes: s.del.Load(),
		Resyncs: s.resyncs.Load(), BytesWritten: s.bytes.Load(),
	}
}

func (v *View) evalWrite(ctx context.Context, pipe redis.Pipeliner, gid int64, mode string, args ...any) *redis.Cmd {
	tag := v.tag(gid)
	argv := make([]any, 0, 3+len(args))
	argv = append(argv, v.node, v.ttlMs, mode)
	argv = append(argv, args...)
	return writeScript.EvalSha(ctx, pipe, []string{tag + "n:" + v.node, tag + "nodes"}, argv...)
}

// op is one group's write in a flush.
type op struct {
	gid  int64
	mode string
	bm   *roaring.Bitmap // state written (nil for del)
	args []any           // delta: count of sets, sets, clears
	cmd  *redis.Cmd
	size int64
}

// Flush publishes the local changes since the last flush: each changed group
// as a bit delta or a whole bitmap (whichever is smaller), withdrawn groups
// as deletes, and TTL renewals for unchanged groups due, in pipelines of
// Batch groups. After a failure the next Flush rewrites everything, since
// keys may have expired meanwhile.
func (v *View) Flush(ctx context.Context) error {
	v.flushMu.Lock()
	defer v.flushMu.Unlock()
	if v.closed {
		return ErrClosed
	}
	err := v.flushLocked(ctx)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Redis restarted between two flushes without us seeing an error:
		// its data is gone too, so reload the scripts and rewrite it all.
		v.loaded, v.needFull = false, true
		err = v.flushLocked(ctx)
	}
	if err != nil {
		v.loaded = false // after an outage Redis may be a new, empty instance
		v.stats.failures.Add(1)
		if v.healthy || v.stats.failures.Load() == 1 {
			v.cfg.Logger.Warn("presence cluster view lost its Redis; local presence continues", "node", v.node, "err", err)
		}
		v.healthy = false
		v.needFull = true
	} else {
		v.stats.flushes.Add(1)
		v.healthy = true
	}
	v.stale.Store(!v.healthy || v.needFull)
	return err
}

func (v *View) flushLocked(ctx context.Context) error {
	// Drain before a full scan: tracking starts with the first drain, and a
	// change after it is either in the scan or in the next drain.
	v.gids = v.src.DrainDirty(v.gids[:0])
	for _, gid := range v.gids {
		v.pending[gid] = struct{}{}
	}
	full := v.needFull
	if full {
		v.gids = v.src.AppendGroups(v.gids[:0])
		for _, gid := range v.gids {
			v.pending[gid] = struct{}{}
		}
		for gid := range v.written {
			v.pending[gid] = struct{}{}
		}
	}
	if !v.loaded {
		for _, s := range []*redis.Script{writeScript, nodesScript, countScript} {
			if err := s.Load(ctx, v.rdb).Err(); err != nil {
				return fmt.Errorf("redispresence: load scripts: %w", err)
			}
		}
		v.loaded = true
	}
	now := v.cfg.Now()
	ops := make([]op, 0, len(v.pending))
	for gid := range v.pending {
		if o, ok := v.planWrite(gid, full); ok {
			ops = append(ops, o)
		} else {
			delete(v.pending, gid)
		}
	}
	renewAfter := v.cfg.TTL / 3
	for gid, w := range v.written {
		if _, ok := v.pending[gid]; !ok && now.Sub(w.renewed) >= renewAfter {
			ops = append(ops, op{gid: gid, mode: "touch", bm: w.bm})
		}
	}
	if err := v.execOps(ctx, ops, now); err != nil {
		return err
	}
	// Keys found missing (lost by Redis) were dropped from written and are
	// pending again: write them whole now rather than a flush later.
	if len(v.pending) > 0 {
		ops = ops[:0]
		for gid := range v.pending {
			if o, ok := v.planWrite(gid, true); ok {
				ops = append(ops, o)
			} else {
				delete(v.pending, gid)
			}
		}
		if err := v.execOps(ctx, ops, now); err != nil {
			return err
		}
		if len(v.pending) > 0 {
			return fmt.Errorf("redispresence: %d groups not applied", len(v.pending))
		}
	}
	if full {
		v.stats.resyncs.Add(1)
		if !v.healthy && v.stats.failures.Load() > 0 {
			v.cfg.Logger.Info("presence cluster view resynced to Redis", "node", v.node, "groups", len(v.written))
		}
	}
	v.needFull = false
	return nil
}

// planWrite decides how to publish gid. ok is false when there is nothing
// to write (no member online here and nothing published).
func (v *View) planWrite(gid int64, full bool) (op, bool) {
	cur := v.src.CloneBitmap(gid)
	prev := v.written[gid]
	if cur == nil || cur.IsEmpty() {
		if prev == nil && !full {
			return op{}, false
		}
		if prev == nil {
			// A full resync withdraws only what this process published.
			return op{}, false
		}
		return op{gid: gid, mode: "del"}, true
	}
	if prev != nil && !full {
		set := roaring.AndNot(cur, prev.bm)
		clr := roaring.AndNot(prev.bm, cur)
		n := set.GetCardinality() + clr.GetCardinality()
		if n == 0 {
			return op{gid: gid, mode: "touch", bm: cur}, true
		}
		// A delta costs about 8 bytes and one SETBIT per bit; the whole
		// bitmap one byte per 8 ordinals.
		if n <= 4096 && 8*n < uint64(cur.Maximum())/8+1 {
			args := make([]any, 0, 1+n)
			args = append(args, set.GetCardinality())
			set.Iterate(func(x uint32) bool { args = append(args, x); return true })
			clr.Iterate(func(x uint32) bool { args = append(args, x); return true })
			return op{gid: gid, mode: "delta", bm: cur, args: args, size: int64(8 * n)}, true
		}
	}
	return op{gid: gid, mode: "full", bm: cur, size: int64(cur.Maximum()/8 + 1)}, true
}

// execOps runs ops in pipelines and records what Redis now holds.
func (v *View) execOps(ctx context.Context, ops []op, now time.Time) error {
	for b := range slices.Chunk(ops, v.cfg.Batch) {
		pipe := v.rdb.Pipeline()
		for i := range b {
			o := &b[i]
			switch o.mode {
			case "full":
				o.cmd = v.evalWrite(ctx, pipe, o.gid, "full", redisBits(o.bm))
			case "delta":
				o.cmd = v.evalWrite(ctx, pipe, o.gid, "delta", o.args...)
			default:
				o.cmd = v.evalWrite(ctx, pipe, o.gid, o.mode)
			}
		}
		_, err := pipe.Exec(ctx)
		var firstErr error
		for i := range b {
			o := &b[i]
			res, cerr := o.cmd.Int64()
			if cerr != nil {
				if redis.HasErrorPrefix(cerr, "NOSCRIPT") {
					v.loaded = false
				}
				// Unknown outcome: forget what Redis holds for this group.
				delete(v.written, o.gid)
				if firstErr == nil {
					firstErr = cerr
				}
				continue
			}
			if res == 0 { // key missing: write it whole
				delete(v.written, o.gid)
				v.pending[o.gid] = struct{}{}
				continue
			}
			delete(v.pending, o.gid)
			switch o.mode {
			case "del":
				delete(v.written, o.gid)
				v.stats.del.Add(1)
			case "touch":
				if w := v.written[o.gid]; w != nil {
					w.renewed = now
				}
				v.stats.renew.Add(1)
			default:
				v.written[o.gid] = &written{bm: o.bm, renewed: now}
				if o.mode == "full" {
					v.stats.full.Add(1)
				} else {
					v.stats.delta.Add(1)
				}
				v.stats.bytes.Add(o.size)
			}
		}
		if firstErr != nil {
			return fmt.Errorf("redispresence: flush: %w", firstErr)
		}
		if err != nil {
			return fmt.Errorf("redispresence: flush: %w", err)
		}
	}
	return nil
}

// redisBits encodes bm as a Redis bitmap string: bit o is the (o%8)-th most
// significant bit of byte o/8.
func redisBits(bm *roaring.Bitmap) []byte {
	out := make([]byte, bm.Maximum()/8+1)
	bm.Iterate(func(o uint32) bool {
		out[o>>3] |= 0x80 >> (o & 7)
		return true
	})
	return out
}

// ---- queries ----

func unavailable(err error) error {
	if err == nil {
		return nil
	}
	var rerr redis.Error
	if errors.As(err, &rerr) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("redispresence: %w", err)
	}
	return fmt.Errorf("%w: %w", presence.ErrUnavailable, err)
}

// Nodes returns the ids of the live nodes with at least one member of gid
// online, sorted.
func (v *View) Nodes(ctx context.Context, gid int64) ([]string, error) {
	nodes, err := nodesScript.Run(ctx, v.rdb, []string{v.tag(gid) + "nodes"}).StringSlice()
	if err != nil {
		return nil, unavailable(err)
	}
	slices.Sort(nodes)
	return nodes, nil
}

// OnlineCount returns the number of distinct members of gid online on any
// live node: the popcount of the OR of the nodes' bitmaps, so a member
// online on two nodes counts once. Two round trips.
func (v *View) OnlineCount(ctx context.Context, gid int64) (int64, error) {
	nodes, err := v.Nodes(ctx, gid)
	if err != nil || len(nodes) == 0 {
		return 0, err
	}
	keys := make([]string, 0, len(nodes)+1)
	for _, n := range nodes {
		keys = append(keys, v.nodeKey(gid, n))
	}
	keys = append(keys, v.tag(gid)+"tmp")
	n, err := countScript.Run(ctx, v.rdb, keys).Int64()
	return n, unavailable(err)
}

// OnlineAnywhere appends to dst, for each ordinal, whether that member of
// gid is online on any live node: one BITFIELD_RO per live node, pipelined.
// A batch above Config.MaxQuery is refused with ErrBatchTooLarge.
func (v *View) OnlineAnywhere(ctx context.Context, gid int64, ordinals []uint32, dst []bool) ([]bool, error) {
	if len(ordinals) > v.cfg.MaxQuery {
		return dst, fmt.Errorf("%w: %d ordinals > %d", presence.ErrBatchTooLarge, len(ordinals), v.cfg.MaxQuery)
	}
	start := len(dst)
	dst = slices.Grow(dst, len(ordinals))[:start+len(ordinals)]
	out := dst[start:]
	clear(out)
	if len(ordinals) == 0 {
		return dst, nil
	}
	nodes, err := v.Nodes(ctx, gid)
	if err != nil {
		return dst[:start], err
	}
	if len(nodes) == 0 {
		return dst, nil
	}
	const chunk = 4096
	args := make([]any, 0, 2*min(chunk, len(ordinals)))
	pipe := v.rdb.Pipeline()
	var cmds []*redis.IntSliceCmd
	for _, n := range nodes {
		key := v.nodeKey(gid, n)
		for c := range slices.Chunk(ordinals, chunk) {
			args = args[:0]
			for _, o := range c {
				args = append(args, "u1", o)
			}
			cmds = append(cmds, pipe.BitFieldRO(ctx, key, args...))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return dst[:start], unavailable(err)
	}
	nchunks := (len(ordinals) + chunk - 1) / chunk
	for i, cmd := range cmds {
		base := (i % nchunks) * chunk
		for j, bit := range cmd.Val() {
			if bit != 0 {
				out[base+j] = true
			}
		}
	}
	return dst, nil
}
