package redisquota

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout"
)

// keyTTL keeps a day's set until the day after it has ended.
const keyTTL = 2 * 86400

// Config configures a Quota.
type Config struct {
	// Client is the Redis client (a single server or a Cluster); required.
	Client redis.UniversalClient
	// Prefix is put before every key; "" = "fanfare:atall:".
	Prefix string
}

// Quota is the @all quota in Redis.
type Quota struct {
	rdb    redis.UniversalClient
	prefix string
}

var _ fanout.AtAllQuota = (*Quota)(nil)

// New returns a Quota on cfg.Client.
func New(cfg Config) (*Quota, error) {
	if cfg.Client == nil {
		return nil, errors.New("redisquota: Client is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "fanfare:atall:"
	}
	return &Quota{rdb: cfg.Client, prefix: cfg.Prefix}, nil
}

// takeScript charges ARGV[1] to the set KEYS[1] of at most ARGV[2]
// members: 1 charged now, 2 charged before (admitted uncharged), 0
// refused.
var takeScript = redis.NewScript(`
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 2 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
`)

func (q *Quota) key(gid, day int64) string {
	return q.prefix + "{" + strconv.FormatInt(gid, 10) + "}:" + strconv.FormatInt(day, 10)
}

// Take implements fanout.AtAllQuota.
func (q *Quota) Take(ctx context.Context, gid, day int64, key string, limit int) (fanout.AtAllCharge, error) {
	n, err := takeScript.Run(ctx, q.rdb, []string{q.key(gid, day)}, key, limit, keyTTL).Int()
	if err != nil {
		return fanout.AtAllRefused, fmt.Errorf("redisquota: take: %w", err)
	}
	switch n {
	case 1:
		return fanout.AtAllCharged, nil
	case 2:
		return fanout.AtAllRetry, nil
	}
	return fanout.AtAllRefused, nil
}

// Refund implements fanout.AtAllQuota.
func (q *Quota) Refund(ctx context.Context, gid, day int64, key string) error {
	if err := q.rdb.SRem(ctx, q.key(gid, day), key).Err(); err != nil {
		return fmt.Errorf("redisquota: refund: %w", err)
	}
	return nil
}
