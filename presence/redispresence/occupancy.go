package redispresence

// This file answers the member presence feed (docs/architecture.md §7.1):
// counts of large groups and rosters of small ones, for many groups in one
// pipeline per call.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/presence"
)

// occupancyScript answers one OccupancyQuery. KEYS[1] nodes zset, KEYS[2]
// scratch, KEYS[3] the roster hash (field node -> JSON array of its online
// uids). ARGV[1] the node bitmaps' key prefix, ARGV[2] the calling node,
// ARGV[3] ttl ms, ARGV[4] "count" or "roster", ARGV[5] "", "set" or "del"
// (this node's roster), ARGV[6] the roster to set.
//
// count: BITCOUNT of the OR of the live nodes' bitmaps (a member online on
// two nodes counts once). roster: the calling node's field and those of
// the live nodes (the zset the bitmap writes keep), fields of dead nodes
// pruned; the hash lives ttl past the last call, and every node with a
// member of the group online calls once per feed interval.
var occupancyScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nodes = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
if ARGV[4] == 'count' then
  local n = #nodes
  if n == 0 then return 0 end
  local keys = {}
  for i, nd in ipairs(nodes) do keys[i] = ARGV[1] .. nd end
  if n == 1 then return redis.call('BITCOUNT', keys[1]) end
  redis.call('BITOP', 'OR', KEYS[2], unpack(keys))
  local c = redis.call('BITCOUNT', KEYS[2])
  redis.call('DEL', KEYS[2])
  return c
end
if ARGV[5] == 'set' then
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[6])
elseif ARGV[5] == 'del' then
  redis.call('HDEL', KEYS[3], ARGV[2])
end
if redis.call('EXISTS', KEYS[3]) == 0 then return {} end
redis.call('PEXPIRE', KEYS[3], ARGV[3])
local live = {}
live[ARGV[2]] = true
for _, nd in ipairs(nodes) do live[nd] = true end
local out = {}
local all = redis.call('HGETALL', KEYS[3])
for i = 1, #all, 2 do
  if live[all[i]] then
    out[#out + 1] = all[i + 1]
  else
    redis.call('HDEL', KEYS[3], all[i])
  end
end
return out
`)

// Occupancy answers qs in order (appended to dst): one script call per
// group, pipelined in batches of Config.Batch, one round trip per batch.
// Redis errors wrap presence.ErrUnavailable as the other queries' do.
func (v *View) Occupancy(ctx context.Context, qs []presence.OccupancyQuery, dst []presence.Occupancy) ([]presence.Occupancy, error) {
	for len(qs) > 0 {
		n := min(len(qs), v.cfg.Batch)
		var err error
		if dst, err = v.occupancyBatch(ctx, qs[:n], dst); err != nil {
			return dst, err
		}
		qs = qs[n:]
	}
	return dst, nil
}

func (v *View) occupancyBatch(ctx context.Context, qs []presence.OccupancyQuery, dst []presence.Occupancy) ([]presence.Occupancy, error) {
	cmds, err := v.runOccupancy(ctx, qs)
	if err != nil && isNoScript(err) {
		if err = occupancyScript.Load(ctx, v.rdb).Err(); err == nil {
			cmds, err = v.runOccupancy(ctx, qs)
		}
	}
	if err != nil {
		return dst, unavailable(err)
	}
	for i, q := range qs {
		if !q.Roster {
			c, err := cmds[i].Int64()
			if err != nil {
				return dst, unavailable(err)
			}
			dst = append(dst, presence.Occupancy{Count: c})
			continue
		}
		vals, err := cmds[i].StringSlice()
		if err != nil {
			return dst, unavailable(err)
		}
		var uids []string
		for _, raw := range vals {
			var part []string
			if err := json.Unmarshal([]byte(raw), &part); err != nil {
				return dst, fmt.Errorf("redispresence: roster of group %d: %w", q.GID, err)
			}
			uids = append(uids, part...)
		}
		slices.Sort(uids)
		uids = slices.Compact(uids)
		dst = append(dst, presence.Occupancy{Count: int64(len(uids)), UIDs: uids})
	}
	return dst, nil
}

func (v *View) runOccupancy(ctx context.Context, qs []presence.OccupancyQuery) ([]*redis.Cmd, error) {
	pipe := v.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(qs))
	ttl := v.ttlMs
	for i, q := range qs {
		tag := v.tag(q.GID)
		mode, op, val := "count", "", ""
		if q.Roster {
			mode = "roster"
			if q.Publish {
				op = "del"
				if len(q.UIDs) > 0 {
					b, _ := json.Marshal(q.UIDs) // []string always marshals
					op, val = "set", string(b)
				}
			}
		}
		cmds[i] = occupancyScript.EvalSha(ctx, pipe, []string{tag + "nodes", tag + "tmp", tag + "r"},
			tag+"n:", v.node, ttl, mode, op, val)
	}
	_, err := pipe.Exec(ctx)
	return cmds, err
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
