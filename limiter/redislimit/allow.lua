-- allow.lua: decide every check of one request (or of one hash-tag group of
-- it) atomically; all or nothing. Runs after prelude.lua (now, ttl_floor,
-- fmt, add_units, keep_expiry).
--
-- ARGV[1] 0, or (tests only) the time to use instead of TIME (prelude.lua)
-- ARGV[2] unique member prefix of this request
-- ARGV[3] number of checks m
-- then 12 values per check:
--   alg (1 sliding window, 2 gcra, 3 weighted), n (cost),
--   limit (gcra: burst), span (us: window; gcra: emission interval),
--   class (0 low, 1 normal, 2 vip), user cap,
--   reserve low, normal, vip, share low, normal, vip
-- KEYS: per check, 1 key (sliding, gcra) or 6 (weighted: total, class low,
-- normal, vip, user, demand hash), in check order.
--
-- Returns {allowed, index, reason, retry_us, remaining}: index (1-based) of
-- the denying check, or of the tightest one when allowed. Reasons: 1 limit,
-- 2 reserve, 3 user cap, 4 cost.
local prefix = ARGV[2]
local m = tonumber(ARGV[3])
local W = 12

-- time until the need-th oldest unit of a zset leaves the window
local function free_after(key, need, size, span)
  if need <= 0 or need > size then return span end
  local r = redis.call('ZRANGE', key, need - 1, need - 1, 'WITHSCORES')
  return tonumber(r[2]) + span - now
end

local plan = {}
local best, best_rem = 0, -1
local ki = 1
for i = 1, m do
  local a = 3 + (i - 1) * W
  local alg = tonumber(ARGV[a + 1])
  local n = tonumber(ARGV[a + 2])
  local limit = tonumber(ARGV[a + 3])
  local span = tonumber(ARGV[a + 4])
  local rem, reason, retry = 0, 0, 0
  if alg == 1 then
    local key = KEYS[ki]
    ki = ki + 1
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - span)
    local c = redis.call('ZCARD', key)
    if n > limit then
      reason, retry = 4, span
    elseif c + n > limit then
      reason, retry = 1, free_after(key, c + n - limit, c, span)
    else
      rem = limit - c - n
    end
    plan[i] = {key}
  elseif alg == 2 then
    local key = KEYS[ki]
    ki = ki + 1
    local tat = tonumber(redis.call('GET', key) or '0') or 0
    if tat < now then tat = now end
    local new_tat = tat + span * n
    local allow_at = new_tat - span * limit
    if n > limit then
      reason, retry = 4, span * limit
    elseif allow_at > now then
      reason, retry = 1, allow_at - now
    else
      rem = math.floor((now - allow_at) / span)
    end
    plan[i] = {key, new_tat}
  else
    local kt, ku, kd = KEYS[ki], KEYS[ki + 4], KEYS[ki + 5]
    local kc = {KEYS[ki + 1], KEYS[ki + 2], KEYS[ki + 3]}
    ki = ki + 6
    local cls = tonumber(ARGV[a + 5]) + 1
    local cap = tonumber(ARGV[a + 6])
    local cut = now - span
    redis.call('ZREMRANGEBYSCORE', kt, '-inf', cut)
    local tot = redis.call('ZCARD', kt)
    local used = {}
    for c = 1, 3 do
      redis.call('ZREMRANGEBYSCORE', kc[c], '-inf', cut)
      used[c] = redis.call('ZCARD', kc[c])
    end
    -- demand: requests decayed by exp(-age/window); counts denied ones too
    local d = redis.call('HMGET', kd, 't', 'd1', 'd2', 'd3')
    local at = tonumber(d[1]) or now
    local dem = {tonumber(d[2]) or 0, tonumber(d[3]) or 0, tonumber(d[4]) or 0}
    if now > at then
      local f = math.exp(-(now - at) / span)
      for c = 1, 3 do dem[c] = dem[c] * f end
      at = now
    end
    dem[cls] = dem[cls] + n
    redis.call('HSET', kd, 't', fmt(at), 'd1', fmt(dem[1]), 'd2', fmt(dem[2]), 'd3', fmt(dem[3]))
    redis.call('PEXPIRE', kd, math.max(ttl_floor, math.ceil(span * 5 / 1000)))
    local cap_left = -1
    if cap > 0 then
      redis.call('ZREMRANGEBYSCORE', ku, '-inf', cut)
      local uu = redis.call('ZCARD', ku)
      if n > cap then
        reason, retry = 4, span
      elseif uu + n > cap then
        reason, retry = 3, free_after(ku, uu + n - cap, uu, span)
      else
        cap_left = cap - uu - n
      end
    end
    if reason == 0 then
      if n > limit then
        reason, retry = 4, span
      elseif tot + n > limit then
        reason, retry = 1, free_after(kt, tot + n - limit, tot, span)
      else
        local own = used[cls] + n <= tonumber(ARGV[a + 6 + cls])
        local hold = 0
        for c = 1, 3 do
          if c ~= cls then
            local want = tonumber(ARGV[a + 6 + c])
            if not own then
              want = math.max(want, math.min(tonumber(ARGV[a + 9 + c]), math.floor(dem[c])))
            end
            hold = hold + math.max(0, want - used[c])
          end
        end
        if tot + n + hold > limit then
          reason, retry = 2, free_after(kt, tot + n + hold - limit, tot, span)
        else
          rem = limit - tot - n - hold
          if cap_left >= 0 and cap_left < rem then rem = cap_left end
        end
      end
    end
    if cap > 0 then
      plan[i] = {kt, kc[cls], ku}
    else
      plan[i] = {kt, kc[cls]}
    end
  end
  if reason ~= 0 then
    return {0, i, reason, math.ceil(retry), 0}
  end
  if best_rem < 0 or rem < best_rem then
    best, best_rem = i, rem
  end
end

-- Every check admits the request: commit all of them.
for i = 1, m do
  local a = 3 + (i - 1) * W
  local alg = tonumber(ARGV[a + 1])
  local n = tonumber(ARGV[a + 2])
  local span = tonumber(ARGV[a + 4])
  local p = plan[i]
  if alg == 2 then
    redis.call('SET', p[1], fmt(p[2]), 'PX', math.max(ttl_floor, math.ceil((p[2] - now) / 1000) + 1))
  else
    local ttl = math.max(ttl_floor, math.ceil(span / 1000) + 1)
    local base = prefix .. '.' .. i
    for _, key in ipairs(p) do
      if n == 1 then
        redis.call('ZADD', key, now, base)
      else
        add_units(key, now, base, 1, n)
      end
      keep_expiry(key, ttl)
    end
  end
end
return {1, best, 0, 0, best_rem}
