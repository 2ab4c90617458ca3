-- refund.lua: undo what allow.lua committed for one hash-tag group of a
-- request that another group denied (Redis Cluster mode only). Same KEYS and
-- ARGV as the allow call. Sliding and weighted units are removed by their
-- unique members; a GCRA timestamp is moved back by the cost, which restores
-- the bucket exactly (allow set it to max(tat, now) + cost, and any time
-- between tat and now was idle capacity the bucket caps anyway). Demand is
-- not refunded: the request did ask.
local prefix = ARGV[2]
local m = tonumber(ARGV[3])
local W = 12
local ki = 1
for i = 1, m do
  local a = 3 + (i - 1) * W
  local alg = tonumber(ARGV[a + 1])
  local n = tonumber(ARGV[a + 2])
  local span = tonumber(ARGV[a + 4])
  local keys
  if alg == 1 then
    keys = {KEYS[ki]}
    ki = ki + 1
  elseif alg == 2 then
    local v = redis.call('GET', KEYS[ki])
    if v then
      redis.call('SET', KEYS[ki], string.format('%.17g', tonumber(v) - span * n), 'KEEPTTL')
    end
    ki = ki + 1
    keys = {}
  else
    local cls = tonumber(ARGV[a + 5]) + 1
    keys = {KEYS[ki], KEYS[ki + cls]}
    if tonumber(ARGV[a + 6]) > 0 then keys[3] = KEYS[ki + 4] end
    ki = ki + 6
  end
  local base = prefix .. '.' .. i
  for _, key in ipairs(keys) do
    if n == 1 then
      redis.call('ZREM', key, base)
    else
      for k = 1, n do redis.call('ZREM', key, base .. '.' .. k) end
    end
  end
end
return 1
