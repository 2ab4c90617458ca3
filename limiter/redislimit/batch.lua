-- batch.lua: decide many requests (or, on Redis Cluster, many hash-tag
-- groups of requests whose keys share one slot) in one call. Each request
-- is decided exactly as allow.lua would decide it had the requests been sent
-- one after the other in this order: all or nothing per request, every
-- request sees the units of those before it. Only the bookkeeping is shared:
-- one TIME for the whole batch; a rule's values are sent and parsed once;
-- a key's expired members are trimmed and it is counted once (the count is
-- then carried along); a GCRA timestamp is read once and written once;
-- demand hashes are written once; expiries are set once per key, to the
-- longest any request needed.
--
-- Runs after prelude.lua (now, ttl_floor, fmt, add_units, keep_expiry).
--
-- ARGV[1] 0, or (tests only) the time to use instead of TIME
-- ARGV[2] number of requests R
-- ARGV[3] number of rule value sets P, then P times 10 values:
--   alg, limit (gcra: burst), span, user cap (0: none), reserve low, normal,
--   vip, share low, normal, vip (as in allow.lua)
-- then per request: its unique member prefix, its number of checks m, and
-- per check 3 values: index of its rule value set (1-based), cost, class.
-- KEYS: every request's keys, in request order, laid out as in allow.lua.
--
-- Returns 5 values per request, as allow.lua returns for one.
local nowstr = fmt(now)
local R = tonumber(ARGV[2])
local P = tonumber(ARGV[3])
local par = {}
for p = 1, P do
  local a = 3 + (p - 1) * 10
  local span = tonumber(ARGV[a + 3])
  par[p] = {
    alg = tonumber(ARGV[a + 1]), limit = tonumber(ARGV[a + 2]), span = span,
    cap = tonumber(ARGV[a + 4]),
    res = {tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])},
    share = {tonumber(ARGV[a + 8]), tonumber(ARGV[a + 9]), tonumber(ARGV[a + 10])},
    cut = fmt(now - span),
    ttl = math.max(ttl_floor, math.ceil(span / 1000) + 1),
    dttl = math.max(ttl_floor, math.ceil(span * 5 / 1000)),
  }
end

-- zsets: key -> cut it was trimmed at, and its count of members after it
-- (plain tables of values: no table per key, less for Lua to collect)
local zcut, zcnt = {}, {}
local function zcount(key, cut)
  if zcut[key] == cut then return zcnt[key] end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', cut)
  local c = redis.call('ZCARD', key)
  zcut[key], zcnt[key] = cut, c
  return c
end
local zttl, zorder = {}, {} -- key -> expiry to set (ms), in first-use order
local function zadd_ttl(key, ttl)
  local old = zttl[key]
  if not old then
    zorder[#zorder + 1] = key
    zttl[key] = ttl
  elseif ttl > old then
    zttl[key] = ttl
  end
end

local tatv, tatset, tatorder = {}, {}, {} -- GCRA key -> tat, written
local function tat_of(key)
  local v = tatv[key]
  if not v then
    v = tonumber(redis.call('GET', key) or '0') or 0
    tatv[key] = v
    tatorder[#tatorder + 1] = key
  end
  return v
end

local dems, demorder = {}, {} -- demand hash key -> {at, d1, d2, d3, span}
local function dem_of(key)
  local e = dems[key]
  if not e then
    local d = redis.call('HMGET', key, 't', 'd1', 'd2', 'd3')
    e = {tonumber(d[1]), tonumber(d[2]) or 0, tonumber(d[3]) or 0, tonumber(d[4]) or 0, 0}
    dems[key] = e
    demorder[#demorder + 1] = key
  end
  return e
end

-- time until the need-th oldest unit of a zset leaves the window
local function free_after(key, need, size, span)
  if need <= 0 or need > size then return span end
  local r = redis.call('ZRANGE', key, need - 1, need - 1, 'WITHSCORES')
  return tonumber(r[2]) + span - now
end

-- add a request's n units to a zset (members mb.1 .. mb.n, or mb for one)
local function commit(key, n, mb, ttl)
  if n == 1 then
    redis.call('ZADD', key, nowstr, mb)
  else
    add_units(key, nowstr, mb, 1, n)
  end
  zcnt[key] = zcnt[key] + n
  zadd_ttl(key, ttl)
end

local out = {}
-- per check of the request being decided (reused: indices 1..m are set
-- before they are read): rule values, cost, keys to commit, new GCRA tat
local pars, ns, pk1, pk2, pk3, ptat = {}, {}, {}, {}, {}, {}
local ai, ki = 4 + P * 10, 1
for q = 1, R do
  local prefix = ARGV[ai]
  local m = tonumber(ARGV[ai + 1])
  local base = ai + 1 -- check i's values are base + (i - 1) * 3 + 1 .. 3
  local best, best_rem = 0, -1
  local denied, d_reason, d_retry = 0, 0, 0
  local qk = ki
  for i = 1, m do
    local a = base + (i - 1) * 3
    local pr = par[tonumber(ARGV[a + 1])]
    local n = tonumber(ARGV[a + 2])
    pars[i], ns[i] = pr, n
    local alg, limit, span = pr.alg, pr.limit, pr.span
    local rem, reason, retry = 0, 0, 0
    if alg == 1 then
      local key = KEYS[qk]
      qk = qk + 1
      local c = zcount(key, pr.cut)
      if n > limit then
        reason, retry = 4, span
      elseif c + n > limit then
        reason, retry = 1, free_after(key, c + n - limit, c, span)
      else
        rem = limit - c - n
      end
      pk1[i], pk2[i], pk3[i] = key, false, false
    elseif alg == 2 then
      local key = KEYS[qk]
      qk = qk + 1
      local tat = tat_of(key)
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
      pk1[i], ptat[i] = key, new_tat
    else
      local kt, ku, kd = KEYS[qk], KEYS[qk + 4], KEYS[qk + 5]
      local kc = {KEYS[qk + 1], KEYS[qk + 2], KEYS[qk + 3]}
      qk = qk + 6
      local cls = tonumber(ARGV[a + 3]) + 1
      local cap = pr.cap
      local cut = pr.cut
      local tot = zcount(kt, cut)
      local used = {zcount(kc[1], cut), zcount(kc[2], cut), zcount(kc[3], cut)}
      local e = dem_of(kd)
      local at = e[1] or now
      if now > at then
        local f = math.exp(-(now - at) / span)
        for c = 1, 3 do e[c + 1] = e[c + 1] * f end
        at = now
      end
      e[1] = at
      e[cls + 1] = e[cls + 1] + n
      if pr.dttl > e[5] then e[5] = pr.dttl end
      local dem = {e[2], e[3], e[4]}
      local cap_left = -1
      if cap > 0 then
        local uu = zcount(ku, cut)
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
          local own = used[cls] + n <= pr.res[cls]
          local hold = 0
          for c = 1, 3 do
            if c ~= cls then
              local want = pr.res[c]
              if not own then
                want = math.max(want, math.min(pr.share[c], math.floor(dem[c])))
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
      pk1[i], pk2[i], pk3[i] = kt, kc[cls], false
      if cap > 0 then pk3[i] = ku end
    end
    if reason ~= 0 then
      denied, d_reason, d_retry = i, reason, retry
      break
    end
    if best_rem < 0 or rem < best_rem then
      best, best_rem = i, rem
    end
  end

  local o = #out
  if denied > 0 then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = 0, denied, d_reason, math.ceil(d_retry), 0
  else
    -- Every check admits the request: commit all of them.
    for i = 1, m do
      local pr, n = pars[i], ns[i]
      if pr.alg == 2 then
        tatv[pk1[i]], tatset[pk1[i]] = ptat[i], true
      else
        local mb = prefix .. '.' .. i
        commit(pk1[i], n, mb, pr.ttl)
        if pk2[i] then commit(pk2[i], n, mb, pr.ttl) end
        if pk3[i] then commit(pk3[i], n, mb, pr.ttl) end
      end
    end
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = 1, best, 0, 0, best_rem
  end
  -- the next request's values and keys: skip this one's whole layout (a
  -- denied request stopped reading early)
  for i = 1, m do
    if par[tonumber(ARGV[base + (i - 1) * 3 + 1])].alg == 3 then ki = ki + 6 else ki = ki + 1 end
  end
  ai = base + m * 3 + 1
end

for _, key in ipairs(tatorder) do
  if tatset[key] then
    local v = tatv[key]
    redis.call('SET', key, fmt(v), 'PX', math.max(ttl_floor, math.ceil((v - now) / 1000) + 1))
  end
end
for _, key in ipairs(zorder) do
  keep_expiry(key, zttl[key])
end
for _, key in ipairs(demorder) do
  local e = dems[key]
  redis.call('HSET', key, 't', fmt(e[1]), 'd1', fmt(e[2]), 'd2', fmt(e[3]), 'd3', fmt(e[4]))
  redis.call('PEXPIRE', key, e[5])
end
return out
