-- lease.lua: give back the unspent units of a node's lease of one
-- sliding-window counter, then take a new lease of up to want units.
--
-- A lease's units are ordinary members of the counter's sorted set, named
-- <lease id>.1 .. <lease id>.<size>, but scored at the lease's end (now +
-- lease ttl) instead of now: the node spends them until then, and each
-- stays in the window for a full window after the latest instant it could
-- have been spent. So the counter never admits more than limit in any
-- window, whichever node spends its units; the price is that a leased unit
-- occupies the window for up to the lease ttl longer than a unit admitted
-- by allow.lua. The node spends them in order, so the unspent ones are the
-- last: <old id>.<size - left + 1> .. <old id>.<size>.
--
-- Runs after prelude.lua (now, ttl_floor, fmt, add_units, keep_expiry).
--
-- KEYS[1] the counter (the same key allow.lua and batch.lua use)
-- ARGV[1] 0, or (tests only) the time to use instead of TIME
-- ARGV[2] limit, ARGV[3] window (µs), ARGV[4] lease ttl (µs)
-- ARGV[5] id of the new lease, ARGV[6] units wanted (0: only give back)
-- ARGV[7] id of the lease given back ('' for none), ARGV[8] its size,
-- ARGV[9] its unspent units
--
-- Returns {granted, now}: granted may be anything from 0 to want (what the
-- window has left).
local key = KEYS[1]
local limit, span, lttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

local old, osize, oleft = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
if old ~= '' and oleft > 0 then
  local j = osize - oleft + 1
  while j <= osize do
    local ms = {}
    local last = math.min(osize, j + 499)
    for k = j, last do ms[#ms + 1] = old .. '.' .. k end
    redis.call('ZREM', key, unpack(ms))
    j = last + 1
  end
end

local want = tonumber(ARGV[6])
local grant = 0
if want > 0 then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - span))
  local c = redis.call('ZCARD', key)
  grant = math.min(want, limit - c)
  if grant > 0 then
    add_units(key, fmt(now + lttl), ARGV[5], 1, grant)
    keep_expiry(key, math.max(ttl_floor, math.ceil((span + lttl) / 1000) + 1))
  else
    grant = 0
  end
end
return {grant, now}
