// Package redisjournal is the event journal of cluster mode: one Redis
// Stream that every node appends to, a cursor key, and a lease that makes
// one node at a time the deliverer (docs/architecture.md §17).
//
// Invariants: an Append is one script (capacity check and XADDs, atomic),
// durable as Redis is (AOF with appendfsync as the deployment sets it);
// the cursor moves, and the stream is trimmed up to it, only in a script
// that checks this node still holds the lease, so a node that lost it
// cannot move the cursor of the one that took over; Read gives only
// entries older than the reorder window, so appends of one group from
// several nodes (a group's sends may commit on any node) are read
// together and the stream sorts them by seq. All keys share one hash
// tag: the scripts run on one Redis Cluster slot. No goroutines.
package redisjournal

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/hooks"
)

// Config configures a Journal.
type Config struct {
	Client redis.UniversalClient
	// Prefix names the keys, inside a hash tag; "" = "fanfare:hooks:".
	Prefix string
	// Node names this node (the lease's value); required.
	Node string
	// Capacity bounds the undelivered entries; 0 = 1,000,000.
	Capacity int
	// Reorder is how old an entry must be before it is read; 0 = 250 ms.
	Reorder time.Duration
	// LeaseTTL is how long the deliverer's lease lives without a renewal
	// (each Read renews it); 0 = 10 s.
	LeaseTTL time.Duration
}

// Journal is a Redis-backed hooks.Journal.
type Journal struct {
	rdb                   redis.UniversalClient
	stream, cursor, lease string
	node                  string
	capacity              int
	reorder, ttl          time.Duration
}

var _ hooks.Journal = (*Journal)(nil)

// New returns the journal of cfg.
func New(cfg Config) (*Journal, error) {
	if cfg.Client == nil || cfg.Node == "" {
		return nil, errors.New("redisjournal: Client and Node are required")
	}
	if cfg.Capacity < 0 || cfg.Reorder < 0 || cfg.LeaseTTL < 0 {
		return nil, errors.New("redisjournal: Capacity, Reorder and LeaseTTL must not be negative")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "fanfare:hooks:"
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = 1_000_000
	}
	if cfg.Reorder == 0 {
		cfg.Reorder = 250 * time.Millisecond
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 10 * time.Second
	}
	tag := "{" + cfg.Prefix + "}"
	return &Journal{rdb: cfg.Client, stream: tag + "stream", cursor: tag + "cursor", lease: tag + "lease",
		node: cfg.Node, capacity: cfg.Capacity, reorder: cfg.Reorder, ttl: cfg.LeaseTTL}, nil
}

var appendScript = redis.NewScript(`
if redis.call('XLEN', KEYS[1]) + #ARGV - 1 > tonumber(ARGV[1]) then return 0 end
for i = 2, #ARGV do redis.call('XADD', KEYS[1], '*', 'e', ARGV[i]) end
return 1`)

// Append implements hooks.Journal.
func (j *Journal) Append(ctx context.Context, recs [][]byte) error {
	args := make([]any, 0, len(recs)+1)
	args = append(args, j.capacity)
	for _, r := range recs {
		args = append(args, r)
	}
	ok, err := appendScript.Run(ctx, j.rdb, []string{j.stream}, args...).Int()
	if err != nil {
		return fmt.Errorf("redisjournal: %w", err)
	}
	if ok == 0 {
		return hooks.ErrFull
	}
	return nil
}

var leaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if v then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`)

// Read implements hooks.Journal: it takes or renews the lease; without
// it there is nothing to read.
func (j *Journal) Read(ctx context.Context, max int) ([]hooks.Record, error) {
	held, err := leaseScript.Run(ctx, j.rdb, []string{j.lease}, j.node, j.ttl.Milliseconds()).Int()
	if err != nil {
		return nil, fmt.Errorf("redisjournal: %w", err)
	}
	if held == 0 {
		return nil, nil
	}
	now, err := j.rdb.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("redisjournal: %w", err)
	}
	cur, err := j.rdb.Get(ctx, j.cursor).Result()
	if errors.Is(err, redis.Nil) {
		cur = "0-0"
	} else if err != nil {
		return nil, fmt.Errorf("redisjournal: %w", err)
	}
	end := strconv.FormatInt(now.Add(-j.reorder).UnixMilli(), 10)
	msgs, err := j.rdb.XRangeN(ctx, j.stream, "("+cur, end, int64(max)).Result()
	if err != nil {
		return nil, fmt.Errorf("redisjournal: %w", err)
	}
	out := make([]hooks.Record, 0, len(msgs))
	for _, m := range msgs {
		v, _ := m.Values["e"].(string)
		out = append(out, hooks.Record{ID: m.ID, Data: []byte(v)})
	}
	return out, nil
}

var ackScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[3], ARGV[2])
redis.call('XTRIM', KEYS[1], 'MINID', ARGV[3])
return 1`)

// Ack implements hooks.Journal.
func (j *Journal) Ack(ctx context.Context, id string) error {
	ms, seq, ok := strings.Cut(id, "-")
	n, err := strconv.ParseUint(seq, 10, 64)
	if !ok || err != nil {
		return fmt.Errorf("redisjournal: bad id %q", id)
	}
	next := ms + "-" + strconv.FormatUint(n+1, 10)
	held, err := ackScript.Run(ctx, j.rdb, []string{j.stream, j.lease, j.cursor}, j.node, id, next).Int()
	if err != nil {
		return fmt.Errorf("redisjournal: %w", err)
	}
	if held == 0 {
		return hooks.ErrNotDeliverer
	}
	return nil
}

// Pending implements hooks.Journal.
func (j *Journal) Pending(ctx context.Context) (int64, error) {
	return j.rdb.XLen(ctx, j.stream).Result()
}

// Release gives up the lease (at shutdown), so another node delivers at
// once rather than after LeaseTTL.
func (j *Journal) Release(ctx context.Context) error {
	return releaseScript.Run(ctx, j.rdb, []string{j.lease}, j.node).Err()
}

var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1`)
