package redishot

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout"
)

// MaxMarks bounds the marks of one Sync (one script call): a caller that
// passes more publishes the MaxMarks it lists first. The engine never
// passes more (fanout.MaxHotMarks).
const MaxMarks = fanout.MaxHotMarks

// Config configures a Set.
type Config struct {
	// Client is the Redis client (a single server or a Cluster); required.
	Client redis.UniversalClient
	// Prefix is put before every key; "" = "fanfare:hot:".
	Prefix string
}

// Set is the hot set in Redis.
type Set struct {
	rdb   redis.UniversalClient
	nodes string // key of the nodes zset
	node  string // key prefix of a node's hash
}

var _ fanout.HotSet = (*Set)(nil)

// New returns a Set on cfg.Client.
func New(cfg Config) (*Set, error) {
	if cfg.Client == nil {
		return nil, errors.New("redishot: Client is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "fanfare:hot:"
	}
	tag := cfg.Prefix + "{hot}:"
	return &Set{rdb: cfg.Client, nodes: tag + "nodes", node: tag + "n:"}, nil
}

// syncScript replaces one node's marks and returns every live node's.
// KEYS[1] the node's hash, KEYS[2] nodes zset. ARGV[1] node id, ARGV[2]
// ttl ms, ARGV[3..] gid, value pairs. Returns a flat list: node, its hash
// as HGETALL returns it, node, ...
var syncScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. now) -- as Redis expires keys: past, not at, their time
redis.call('DEL', KEYS[1])
if #ARGV > 2 then
  for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
  if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
else
  redis.call('ZREM', KEYS[2], ARGV[1])
end
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[1])
local out = {}
for _, n in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local h = redis.call('HGETALL', prefix .. n)
  if #h > 0 then
    out[#out + 1] = n
    out[#out + 1] = h
  end
end
return out
`)

// Sync implements fanout.HotSet: it replaces node's marks (their GID,
// Rate, Hot and Since; Node is node) and returns every live node's, in one
// round trip. ttl is rounded up to a whole millisecond.
func (s *Set) Sync(ctx context.Context, node string, marks []fanout.HotMark, ttl time.Duration) ([]fanout.HotMark, error) {
	if node == "" {
		return nil, errors.New("redishot: empty node id")
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("redishot: ttl must be positive, got %v", ttl)
	}
	marks = marks[:min(len(marks), MaxMarks)]
	argv := make([]any, 0, 2+2*len(marks))
	argv = append(argv, node, int64((ttl+time.Millisecond-1)/time.Millisecond))
	for _, m := range marks {
		v := strconv.FormatFloat(m.Rate, 'g', 6, 64) + " 0"
		if m.Hot {
			v = strconv.FormatFloat(m.Rate, 'g', 6, 64) + " " + strconv.FormatInt(m.Since.UnixMilli(), 10)
		}
		argv = append(argv, m.GID, v)
	}
	res, err := syncScript.Run(ctx, s.rdb, []string{s.node + node, s.nodes}, argv...).Slice()
	if err != nil {
		return nil, fmt.Errorf("redishot: sync: %w", err)
	}
	return decode(res)
}

// decode parses the script's answer.
func decode(res []any) ([]fanout.HotMark, error) {
	var out []fanout.HotMark
	for i := 0; i+1 < len(res); i += 2 {
		node, ok1 := res[i].(string)
		h, ok2 := res[i+1].([]any)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("redishot: unexpected answer %T, %T", res[i], res[i+1])
		}
		for j := 0; j+1 < len(h); j += 2 {
			f, _ := h[j].(string)
			v, _ := h[j+1].(string)
			m, err := parseMark(node, f, v)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
	}
	return out, nil
}

func parseMark(node, field, value string) (fanout.HotMark, error) {
	gid, err := strconv.ParseInt(field, 10, 64)
	rate, since, ok := strings.Cut(value, " ")
	if err != nil || !ok {
		return fanout.HotMark{}, fmt.Errorf("redishot: bad mark %q = %q of node %q", field, value, node)
	}
	r, err1 := strconv.ParseFloat(rate, 64)
	ms, err2 := strconv.ParseInt(since, 10, 64)
	if err1 != nil || err2 != nil {
		return fanout.HotMark{}, fmt.Errorf("redishot: bad mark %q = %q of node %q", field, value, node)
	}
	if ms == 0 { // not hot: the group's offered rate only
		return fanout.HotMark{GID: gid, Node: node, Rate: r}, nil
	}
	return fanout.HotMark{GID: gid, Node: node, Rate: r, Hot: true, Since: time.UnixMilli(ms)}, nil
}
