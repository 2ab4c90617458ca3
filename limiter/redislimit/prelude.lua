-- prelude.lua: what allow.lua, batch.lua and lease.lua share; prepended to
-- each of them when they are loaded (redislimit.go), so each still runs
-- as one script.
--
-- now: Redis TIME in microseconds since 2023-11-14 (1700000000 s), so that
-- doubles keep sub-microsecond precision; ARGV[1], when not 0, replaces it
-- (tests only, same unit).
local now = tonumber(ARGV[1])
-- Key expiries run on real time; under a test clock they must not cut a
-- simulated window short, so they get at least an hour.
local ttl_floor = 3600000
if now == 0 then
  local t = redis.call('TIME')
  now = (tonumber(t[1]) - 1700000000) * 1000000 + tonumber(t[2])
  ttl_floor = 0
end

local function fmt(x) return string.format('%.17g', x) end

-- add_units adds members base.j .. base.k to the sorted set key, each
-- scored at score (a number, or a string formatted by fmt), in ZADD calls
-- of at most 500 members
-- (Lua's unpack has a limit on its arguments).
local function add_units(key, score, base, j, k)
  while j <= k do
    local args = {}
    local last = math.min(k, j + 499)
    for i = j, last do
      args[#args + 1] = score
      args[#args + 1] = base .. '.' .. i
    end
    redis.call('ZADD', key, unpack(args))
    j = last + 1
  end
end

-- keep_expiry gives key an expiry of ttl ms and never shortens one it has
-- (a new key has none: NX, else GT): a node's lease (lease.lua) stamps
-- units up to its lease TTL ahead, and they must outlive every window.
local function keep_expiry(key, ttl)
  if redis.call('PEXPIRE', key, ttl, 'NX') == 0 then redis.call('PEXPIRE', key, ttl, 'GT') end
end

