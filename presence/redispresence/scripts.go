package redispresence

import "github.com/redis/go-redis/v9"

// Every script touches only keys of one group, which share the {g:<gid>}
// hash tag, so each runs on one Redis Cluster slot. Times come from Redis
// TIME, so node clocks never matter.

// writeScript applies one node's state for one group and renews its
// liveness. KEYS[1] node bitmap, KEYS[2] nodes zset (member node id, score
// expiry in Redis ms). ARGV[1] node id, ARGV[2] ttl ms, ARGV[3] mode:
//
//	full  ARGV[4] = the whole bitmap (Redis bit order)
//	delta ARGV[4] = n, ARGV[5..4+n] bits to set, the rest bits to clear;
//	      refused (0) when the key is missing (expired or lost), since
//	      applying a delta to nothing would publish a partial set
//	touch renew TTLs only; 0 when the key is missing
//	del   this node has no member of the group online any more
//
// Returns 1 when applied, 0 when the caller must send a full write.
var writeScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local mode = ARGV[3]
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if mode == 'del' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 1
end
if mode == 'full' then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ttl)
elseif mode == 'delta' then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  local n = tonumber(ARGV[4])
  for i = 5, 4 + n do redis.call('SETBIT', KEYS[1], ARGV[i], 1) end
  for i = 5 + n, #ARGV do redis.call('SETBIT', KEYS[1], ARGV[i], 0) end
  redis.call('PEXPIRE', KEYS[1], ttl)
elseif mode == 'touch' then
  if redis.call('PEXPIRE', KEYS[1], ttl) == 0 then return 0 end
else
  return redis.error_reply('redispresence: bad mode ' .. mode)
end
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
return 1
`)

// nodesScript returns the live node ids of one group. KEYS[1] nodes zset.
var nodesScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
`)

// countScript counts the union of node bitmaps: a member online on several
// nodes counts once. KEYS[1..n] node bitmaps, KEYS[n+1] a scratch key
// created and deleted inside the script.
var countScript = redis.NewScript(`
local n = #KEYS - 1
if n == 1 then return redis.call('BITCOUNT', KEYS[1]) end
redis.call('BITOP', 'OR', KEYS[n + 1], unpack(KEYS, 1, n))
local c = redis.call('BITCOUNT', KEYS[n + 1])
redis.call('DEL', KEYS[n + 1])
return c
`)
