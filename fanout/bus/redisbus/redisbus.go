package redisbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/bus"
)

// Config configures a Redis bus node. Bus.Handler and Client are
// required; every other zero value means the default given.
type Config struct {
	// Bus configures the node itself (queues, bounds, handler, metrics).
	// Bus.Logger is also this package's logger.
	Bus bus.Config
	// Client is the Redis connection: *redis.Client (one subscriber
	// connection for every group), *redis.ClusterClient or *redis.Ring
	// (one subscriber connection per bucket, on the shard owning it).
	Client redis.UniversalClient
	// Prefix starts every channel name; "" = "fanfare:bus:". It must not
	// contain '{' or '}' (the hash tag follows it).
	Prefix string
	// Buckets is the number of hash-tag buckets the groups' channels are
	// spread over (gid mod Buckets); every node of a cluster must use the
	// same value; 0 = 16. On Redis Cluster each bucket is one slot, hence
	// one shard, and costs one subscriber connection per node.
	Buckets int
	// HealthInterval: a subscriber connection silent this long is pinged,
	// and replaced when the ping is not answered within another interval
	// (a half-open TCP connection never errors by itself); 0 = 3s.
	HealthInterval time.Duration
	// ReconnectBackoff is the longest wait between failed reconnects of a
	// subscriber connection (it starts at 50ms and doubles); 0 = 1s.
	ReconnectBackoff time.Duration
}

// DefaultPrefix is the channel prefix when Config.Prefix is empty.
const DefaultPrefix = "fanfare:bus:"

// MaxBuckets bounds Config.Buckets (slots of a Redis Cluster).
const MaxBuckets = 16384

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	if err := c.Bus.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Client == nil {
		errs = append(errs, errors.New("redisbus: Client is required"))
	}
	if strings.ContainsAny(c.Prefix, "{}") {
		errs = append(errs, errors.New("redisbus: Prefix must not contain '{' or '}'"))
	}
	if c.Buckets < 0 || c.Buckets > MaxBuckets {
		errs = append(errs, fmt.Errorf("redisbus: Buckets must be in [0, %d]", MaxBuckets))
	}
	if c.HealthInterval < 0 {
		errs = append(errs, errors.New("redisbus: HealthInterval is negative"))
	}
	if c.ReconnectBackoff < 0 {
		errs = append(errs, errors.New("redisbus: ReconnectBackoff is negative"))
	}
	return errors.Join(errs...)
}

// New returns a bus node on Redis sharded pub/sub. Nothing connects until
// the node runs.
func New(cfg Config) (*bus.Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := newTransport(cfg)
	return bus.New(cfg.Bus, t)
}

// Channel returns the channel of gid (for operators: redis-cli SSUBSCRIBE).
func Channel(prefix string, buckets int, gid int64) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if buckets <= 0 {
		buckets = 16
	}
	return string(appendChannel(nil, prefix, buckets, gid))
}

func appendChannel(dst []byte, prefix string, buckets int, gid int64) []byte {
	dst = append(dst, prefix...)
	dst = append(dst, '{')
	dst = strconv.AppendUint(dst, uint64(gid)%uint64(buckets), 10)
	dst = append(dst, '}')
	return strconv.AppendInt(dst, gid, 10)
}

type transport struct {
	rdb       redis.UniversalClient
	prefix    string
	buckets   int
	health    time.Duration
	backoff   time.Duration
	log       *slog.Logger
	perBucket bool

	conns []*subConn // 1, or one per bucket

	onReconnect atomic.Pointer[func()] // bus.ReconnectNotifier

	chbuf []byte // Publish's channel scratch (one goroutine)
	cmds  []*redis.IntCmd
}

// subConn is one subscriber connection and the channels it must hold.
type subConn struct {
	mu       sync.Mutex // guards ps, channels, closed
	ps       *redis.PubSub
	channels map[string]struct{}
	closed   bool          // Run ended: no new connection
	kick     chan struct{} // ps created: start reading
}

func newTransport(cfg Config) *transport {
	t := &transport{
		rdb:     cfg.Client,
		prefix:  cfg.Prefix,
		buckets: cfg.Buckets,
		health:  cfg.HealthInterval,
		backoff: cfg.ReconnectBackoff,
		log:     cfg.Bus.Logger,
	}
	if t.prefix == "" {
		t.prefix = DefaultPrefix
	}
	if t.buckets == 0 {
		t.buckets = 16
	}
	if t.health == 0 {
		t.health = 3 * time.Second
	}
	if t.backoff == 0 {
		t.backoff = time.Second
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	_, single := cfg.Client.(*redis.Client)
	t.perBucket = !single
	k := 1
	if t.perBucket {
		k = t.buckets
	}
	for range k {
		t.conns = append(t.conns, &subConn{channels: make(map[string]struct{}), kick: make(chan struct{}, 1)})
	}
	return t
}

func (t *transport) channel(gid int64) string {
	return string(appendChannel(nil, t.prefix, t.buckets, gid))
}

func (t *transport) conn(gid int64) *subConn {
	if !t.perBucket {
		return t.conns[0]
	}
	return t.conns[uint64(gid)%uint64(t.buckets)]
}

// parseGID returns the gid of one of our channel names.
func (t *transport) parseGID(ch string) (int64, bool) {
	rest, ok := strings.CutPrefix(ch, t.prefix)
	if !ok {
		return 0, false
	}
	i := strings.IndexByte(rest, '}')
	if i < 0 {
		return 0, false
	}
	gid, err := strconv.ParseInt(rest[i+1:], 10, 64)
	return gid, err == nil
}

// Publish sends ps as one pipeline of SPUBLISH (one round trip per shard).
func (t *transport) Publish(ctx context.Context, ps []bus.Outgoing) (int, error) {
	pipe := t.rdb.Pipeline()
	t.cmds = t.cmds[:0]
	for _, p := range ps {
		t.chbuf = appendChannel(t.chbuf[:0], t.prefix, t.buckets, p.GID)
		t.cmds = append(t.cmds, pipe.SPublish(ctx, string(t.chbuf), p.Payload))
	}
	_, err := pipe.Exec(ctx)
	sent := 0
	for _, c := range t.cmds {
		if c.Err() != nil {
			break
		}
		sent++
	}
	clear(t.cmds)
	if err == nil && sent < len(ps) {
		err = errors.New("redisbus: publish incomplete")
	}
	return sent, err
}

// Subscribe adds channels to their connections. A failing SSUBSCRIBE
// (Redis down) keeps them: go-redis resubscribes at its reconnect, and a
// replaced connection starts from the channel set.
func (t *transport) Subscribe(ctx context.Context, gids []int64) error {
	return t.change(ctx, gids, true)
}

// Unsubscribe removes channels from their connections.
func (t *transport) Unsubscribe(ctx context.Context, gids []int64) error {
	return t.change(ctx, gids, false)
}

func (t *transport) change(ctx context.Context, gids []int64, sub bool) error {
	// Group by connection: on a cluster one SSUBSCRIBE must stay in one
	// slot, which a bucket is.
	byConn := make(map[*subConn][]string)
	for _, gid := range gids {
		sc := t.conn(gid)
		byConn[sc] = append(byConn[sc], t.channel(gid))
	}
	var errs []error
	for sc, chans := range byConn {
		if err := sc.change(ctx, t.rdb, chans, sub); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (sc *subConn) change(ctx context.Context, rdb redis.UniversalClient, chans []string, sub bool) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sub {
		for _, ch := range chans {
			sc.channels[ch] = struct{}{}
		}
		if sc.closed {
			return nil
		}
		if sc.ps == nil {
			// Created with its channels, so a cluster client connects it
			// to the shard owning them.
			sc.ps = rdb.SSubscribe(ctx, chans...)
			select {
			case sc.kick <- struct{}{}:
			default:
			}
			return sc.ps.Ping(ctx) // SSubscribe above does not report errors
		}
		return sc.ps.SSubscribe(ctx, chans...)
	}
	for _, ch := range chans {
		delete(sc.channels, ch)
	}
	if sc.ps == nil || sc.closed {
		return nil
	}
	return sc.ps.SUnsubscribe(ctx, chans...)
}

// rebuild replaces sc's connection by a new one holding every channel.
func (sc *subConn) rebuild(ctx context.Context, rdb redis.UniversalClient) {
	sc.mu.Lock()
	old := sc.ps
	sc.ps = nil
	if len(sc.channels) > 0 && !sc.closed {
		chans := make([]string, 0, len(sc.channels))
		for ch := range sc.channels {
			chans = append(chans, ch)
		}
		sc.ps = rdb.SSubscribe(ctx, chans...)
	}
	sc.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
}

func (sc *subConn) wanted(ch string) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	_, ok := sc.channels[ch]
	return ok
}

func (sc *subConn) pubsub() *redis.PubSub {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.ps
}

func (t *transport) Ping(ctx context.Context) error { return t.rdb.Ping(ctx).Err() }

// Run reads every subscriber connection, one goroutine each, until ctx is
// done, then closes them.
func (t *transport) Run(ctx context.Context, recv func(int64, []byte)) error {
	var wg sync.WaitGroup
	for i, sc := range t.conns {
		wg.Go(func() { t.read(ctx, i, sc, recv) })
	}
	<-ctx.Done()
	for _, sc := range t.conns {
		sc.mu.Lock()
		ps := sc.ps
		sc.ps, sc.closed = nil, true
		sc.mu.Unlock()
		if ps != nil {
			_ = ps.Close() // unblocks a pending read
		}
	}
	wg.Wait()
	return nil
}

func (t *transport) read(ctx context.Context, idx int, sc *subConn, recv func(int64, []byte)) {
	var (
		pinged  bool
		failing bool
		wait    = 50 * time.Millisecond
	)
	for ctx.Err() == nil {
		ps := sc.pubsub()
		if ps == nil {
			select {
			case <-ctx.Done():
				return
			case <-sc.kick:
			}
			continue
		}
		msg, err := ps.ReceiveTimeout(ctx, t.health)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if pinged {
					t.log.Warn("bus subscriber connection silent; replacing it", "conn", idx)
					sc.rebuild(ctx, t.rdb)
					pinged = false
					continue
				}
				_ = ps.Ping(ctx)
				pinged = true
				continue
			}
			if sc.pubsub() != ps {
				continue // replaced or closed under us
			}
			if rerr := redis.Error(nil); errors.As(err, &rerr) {
				// A server reply, not a broken connection: on a cluster a
				// MOVED for SSUBSCRIBE after a slot moved. go-redis keeps
				// such a connection; replace it once the slot map is
				// reloaded.
				if !failing {
					failing = true
					t.log.Warn("bus subscriber got a server error; resubscribing", "conn", idx, "err", err)
				}
				t.reloadSlots(ctx)
				if !sleepCtx(ctx, wait) {
					return
				}
				wait = min(2*wait, t.backoff)
				sc.rebuild(ctx, t.rdb)
				continue
			}
			if !failing {
				failing = true
				t.log.Warn("bus subscriber lost Redis; reconnecting", "conn", idx, "err", err)
			}
			if !sleepCtx(ctx, wait) {
				return
			}
			wait = min(2*wait, t.backoff)
			continue
		}
		pinged = false
		if failing {
			failing = false
			wait = 50 * time.Millisecond
			t.log.Info("bus subscriber reconnected; subscriptions restored", "conn", idx)
			if fn := t.onReconnect.Load(); fn != nil {
				(*fn)()
			}
		}
		switch m := msg.(type) {
		case *redis.Message:
			gid, ok := t.parseGID(m.Channel)
			if !ok {
				continue
			}
			recv(gid, bus.AliasBytes(m.Payload))
		case *redis.Subscription:
			// Redis Cluster drops sharded subscriptions whose slot moved
			// (an sunsubscribe we did not ask for): reconnect to the new
			// owner with every channel.
			if m.Kind == "sunsubscribe" && sc.wanted(m.Channel) {
				t.log.Info("bus subscription dropped by Redis (slot moved?); resubscribing", "conn", idx, "channel", m.Channel)
				t.reloadSlots(ctx)
				sc.rebuild(ctx, t.rdb)
			}
		}
	}
}

// reloadSlots asks a cluster client to reload its slot map (go-redis does
// it in the background; a connection rebuilt meanwhile may reach the old
// owner, get MOVED and be rebuilt again).
func (t *transport) reloadSlots(ctx context.Context) {
	if cc, ok := t.rdb.(*redis.ClusterClient); ok {
		cc.ReloadState(ctx)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// NotifyReconnect implements bus.ReconnectNotifier: fn runs each time a
// subscriber connection is back after losing Redis (what was published
// meanwhile did not reach this node).
func (t *transport) NotifyReconnect(fn func()) { t.onReconnect.Store(&fn) }
