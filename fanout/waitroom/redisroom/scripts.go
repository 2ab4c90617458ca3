package redisroom

import "github.com/redis/go-redis/v9"

// KEYS layout shared by every script (all in the room's hash slot):
//
//	1 e   hash  uid -> entry "level|state|join|first|bias|score|away|admitted|expires|shard|seq|node"
//	            (node: the nodes holding the user, comma-separated, the
//	            latest first; seq: waitroom's memEntry.seq; entries written
//	            before it have none and read seq 0)
//	2 j   zset  waiting users by join time (the max-wait index)
//	3 aw  zset  away users by away-since
//	4 a   zset  admitted users by session expiry
//	5 sm  zset  VIPs being smoothed in, by join
//	6 st  hash  lmax, rate, pseq, tokens, tts, sv and sn (the quota's counts),
//	            w0..w3 (waiting users by tier) and wt (w0..w3 are kept),
//	            wn (qn is kept), passes (VIP passes) and mwv (max-wait
//	            violations), pqn, pqat, pqsl, pqsc (the start of a
//	            scheduled room: pre-queue size, start, slack key, bias
//	            scale), pqv (VIPs in the pre-queue), pqseq (the pre-queue
//	            VIPs' promise seq), oseq (the last entry seq) and wjv (jv
//	            is kept)
//	7 r   hash  admissions per second (the 5-minute window)
//	8 pl  list  VIP placements "seq|at|lo|hi", newest first
//	9 qv  zset  waiting VIPs by score (the admission quota's index)
//	10..  zset  queue shards q0..q(K-1): waiting users by score
//
// More keys are derived from KEYS[1] (same hash tag, same slot):
// <base>nodes, a hash node -> last heartbeat; <base>n:<node>, the set of
// uids whose socket that node holds; <base>sl, a zset of the users owed an
// admission (waiting, away, pre-queue after the start) by slack key (the
// max-wait guarantee); <base>pq, the pre-queue of a scheduled room by
// shuffle key; <base>qn, the waiting normal users by score; <base>jv, the
// waiting VIPs by seq (the quota's oldest VIP promise).
//
// ARGV 1-22 is the room configuration (see args in redisroom.go); script
// arguments start at ARGV[23].
const prelude = `
local K = #KEYS - 9
local MAXACTIVE = tonumber(ARGV[1])
local RATE = tonumber(ARGV[2])
local BURST = tonumber(ARGV[3])
local MAXWAIT = tonumber(ARGV[4])
local GRACE = tonumber(ARGV[5])
local HARD = tonumber(ARGV[6])
local DECAY = tonumber(ARGV[7])
local CAP = tonumber(ARGV[8])
local SMOOTH = tonumber(ARGV[9])
local TWAIT = tonumber(ARGV[10])
local SAFETY = tonumber(ARGV[11])
local TTL = tonumber(ARGV[12])
local OPEN = ARGV[13] == '1'
local BIAS = {tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])}
local SHARE = tonumber(ARGV[17])
local QUOTA = SHARE > 0 and SHARE < 1
local CAPC = tonumber(ARGV[18])
local RESERVE = tonumber(ARGV[19])
local GRATE = tonumber(ARGV[20])
local STARTS = tonumber(ARGV[21])
local ENDS = tonumber(ARGV[22])
local T = redis.call('TIME')
local NOW = tonumber(T[1])
local NOWUS = tonumber(T[1]) * 1000000 + tonumber(T[2])

local function rmilli(x) return math.floor(x * 1000 + 0.5) / 1000 end
local function fmt3(x) return string.format('%.3f', x) end
local function score(join, bias, frac) return rmilli(1.3 * join + bias * frac) end
local function qkey(i) return KEYS[10 + i] end
local BASE = string.sub(KEYS[1], 1, -2)
local NODES = BASE .. 'nodes'
local function nkey(node) return BASE .. 'n:' .. node end
local SL = BASE .. 'sl'
local PQ = BASE .. 'pq'
local QN = BASE .. 'qn'
local JV = BASE .. 'jv'
local SCHEDULED = STARTS > 0 and NOW < STARTS
local ENDED = ENDS > 0 and NOW >= ENDS

-- zcard reads a sorted set's size once per script; zadd and zrem, through
-- which every script writes its sorted sets, keep the copy (ZADD and ZREM
-- return how many members they added or removed). A batch of enters reads
-- the queue, away and pre-queue sizes many times.
local cards = {}
local function zcard(k)
  local n = cards[k]
  if n == nil then
    n = redis.call('ZCARD', k)
    cards[k] = n
  end
  return n
end
local function zadd(k, s, m)
  local n = redis.call('ZADD', k, s, m)
  if cards[k] then cards[k] = cards[k] + n end
  return n
end
local function zrem(k, m)
  local n = redis.call('ZREM', k, m)
  if cards[k] then cards[k] = cards[k] - n end
  return n
end

local function dec(s)
  if not s then return nil end
  local l, st, j, fi, b, sc, aw, ad, ex, sh, sq, nd = string.match(s,
    '^(%d+)|(%a)|(%d+)|(%d+)|([^|]+)|([^|]+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([^|]*)$')
  if not l then
    sq = '0' -- written before the seq
    l, st, j, fi, b, sc, aw, ad, ex, sh, nd = string.match(s,
      '^(%d+)|(%a)|(%d+)|(%d+)|([^|]+)|([^|]+)|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
    if not l then return nil end
  end
  return {level = tonumber(l), state = st, join = tonumber(j), first = tonumber(fi),
    bias = tonumber(b), score = tonumber(sc), away = tonumber(aw), admitted = tonumber(ad),
    expires = tonumber(ex), shard = tonumber(sh), seq = tonumber(sq), node = nd}
end
local function enc(e)
  return string.format('%d|%s|%d|%d|%.3f|%.3f|%d|%d|%d|%d|%d|%s', e.level, e.state, e.join, e.first,
    e.bias, e.score, e.away, e.admitted, e.expires, e.shard, e.seq, e.node)
end

-- An entry's node field lists the nodes holding the user, comma-separated,
-- the latest first (waitroom's holders.go).
local function withoutHolder(list, node)
  local out, found = {}, false
  for n in string.gmatch(list, '[^,]+') do
    if n == node then found = true else out[#out + 1] = n end
  end
  return table.concat(out, ','), found
end
local function firstHolder(list) return string.match(list, '^[^,]*') end

-- own records that node holds uid's socket, besides the nodes already
-- holding it, as the one that entered it last ('' = none tracked: no
-- change); the caller writes the entry. The node's first heartbeat is set
-- once per script (no script that calls own deletes one, so a second
-- HSETNX would do nothing).
local hbSet = {}
local function own(uid, e, node)
  if node == '' then return end
  local rest = withoutHolder(e.node, node)
  if rest == '' then e.node = node else e.node = node .. ',' .. rest end
  redis.call('SADD', nkey(node), uid)
  if not hbSet[node] then
    hbSet[node] = true
    redis.call('HSETNX', NODES, node, NOW)
  end
end
-- disown records that node no longer holds uid (the caller writes the
-- entry); false when it did not.
local function disown(uid, e, node)
  local rest, found = withoutHolder(e.node, node)
  if found then
    e.node = rest
    redis.call('SREM', nkey(node), uid)
  end
  return found
end
-- disownAll records that no node holds uid (the caller writes the entry).
local function disownAll(uid, e)
  for n in string.gmatch(e.node, '[^,]+') do redis.call('SREM', nkey(n), uid) end
  e.node = ''
end

-- blt compares bytes (Lua's < on strings follows the C locale's strcoll).
local function blt(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
-- tiesBelow counts the members of zset key with score s3 (formatted) that
-- sort before uid, among the first 256 of them. Redis keeps members of
-- equal score in byte order, so it is a binary search of one-member probes
-- (during a burst of entrants thousands share a second, hence a score).
local function tiesBelow(key, s3, uid)
  local lo, hi = 0, math.min(redis.call('ZCOUNT', key, s3, s3), 256)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call('ZRANGEBYSCORE', key, s3, s3, 'LIMIT', mid, 1)
    if blt(m[1], uid) then lo = mid + 1 else hi = mid end
  end
  return lo
end
local function keyless(s1, u1, s2, u2)
  if s1 ~= s2 then return s1 < s2 end
  return blt(u1, u2)
end

local function waitingCount()
  local n = 0
  for i = 0, K - 1 do n = n + zcard(qkey(i)) end
  return n
end
local function stnum(f) return tonumber(redis.call('HGET', KEYS[6], f) or '0') end
-- stc reads the st fields pseq and passes once per script: only stinc
-- (HINCRBY) changes them, and it keeps the copy.
local stcache = {}
local function stc(f)
  local v = stcache[f]
  if v == nil then
    v = stnum(f)
    stcache[f] = v
  end
  return v
end
local function stinc(f)
  local v = redis.call('HINCRBY', KEYS[6], f, 1)
  stcache[f] = v
  return v
end
-- nextSeq hands out the next entry seq (waitroom's memRoom.nextSeq).
local function nextSeq() return stinc('oseq') end

local function sfrac(join)
  if SMOOTH <= 0 then return 1 end
  return math.min(1, (NOW - join) / SMOOTH)
end

local function place(lo, hi)
  local seq = stinc('pseq')
  redis.call('LPUSH', KEYS[8], string.format('%d|%d|%.3f|%s', seq, NOW, lo, hi))
  redis.call('LTRIM', KEYS[8], 0, 4095)
end

-- The waiting users of each tier are counted in st's fields w0..w3,
-- changed by insertWaiting and unqueue in the script that adds or removes
-- the queue member (one HINCRBY). A room written before the counts existed
-- (no wt field) is recounted once, before the first change; a script
-- checks wt once.
local tiersOK = false
local function tiersKept()
  if tiersOK then return end
  tiersOK = true
  if redis.call('HEXISTS', KEYS[6], 'wt') == 1 then return end
  local c = {0, 0, 0, 0}
  for i = 0, K - 1 do
    local off = 0
    while true do
      local us = redis.call('ZRANGE', qkey(i), off, off + 999)
      if #us == 0 then break end
      local raw = redis.call('HMGET', KEYS[1], unpack(us))
      for k = 1, #us do
        local e = dec(raw[k])
        if e then c[e.level + 1] = c[e.level + 1] + 1 end
      end
      off = off + #us
    end
  end
  redis.call('HSET', KEYS[6], 'w0', c[1], 'w1', c[2], 'w2', c[3], 'w3', c[4], 'wt', 1)
end
-- qn (waiting normal users by score) is kept by insertWaiting and unqueue;
-- a room written before it existed (no wn field) fills it once.
local qnOK = false
local function qnKept()
  if qnOK then return end
  qnOK = true
  if redis.call('HEXISTS', KEYS[6], 'wn') == 1 then return end
  for i = 0, K - 1 do
    local off = 0
    while true do
      local us = redis.call('ZRANGE', qkey(i), off, off + 999, 'WITHSCORES')
      if #us == 0 then break end
      local names = {}
      for k = 1, #us, 2 do names[#names + 1] = us[k] end
      local raw = redis.call('HMGET', KEYS[1], unpack(names))
      for k = 1, #names do
        local e = dec(raw[k])
        if e and e.level == 0 then zadd(QN, us[2 * k], names[k]) end
      end
      off = off + #names
    end
  end
  redis.call('HSET', KEYS[6], 'wn', 1)
end
-- jv (waiting VIPs by seq) is kept by insertWaiting and unqueue; a room
-- written before it existed (no wjv field) fills it once, from qv.
local jvOK = false
local function jvKept()
  if jvOK then return end
  jvOK = true
  if redis.call('HEXISTS', KEYS[6], 'wjv') == 1 then return end
  local off = 0
  while true do
    local us = redis.call('ZRANGE', KEYS[9], off, off + 999)
    if #us == 0 then break end
    local raw = redis.call('HMGET', KEYS[1], unpack(us))
    for k = 1, #us do
      local e = dec(raw[k])
      if e then zadd(JV, e.seq, us[k]) end
    end
    off = off + #us
  end
  redis.call('HSET', KEYS[6], 'wjv', 1)
end
-- jvMin is the lowest seq of a waiting VIP: a jv member whose entry is
-- no longer a waiting VIP (left behind by a node of an older release,
-- whose unqueue did not know jv) is removed on the way, one whose seq
-- changed is put back under its seq. Past 1000 such members in one call
-- it answers 0: the quota yields (conservative), the next call goes on.
local function jvMin()
  jvKept()
  for _ = 1, 1000 do
    local m = redis.call('ZRANGE', JV, 0, 0, 'WITHSCORES')
    if #m == 0 then return nil end
    local e = dec(redis.call('HGET', KEYS[1], m[1]))
    if e and e.state == 'w' and e.level > 0 then
      if e.seq == tonumber(m[2]) then return e.seq end
      zadd(JV, e.seq, m[1])
    else
      zrem(JV, m[1])
    end
  end
  return 0
end
local function tierCounts()
  tiersKept()
  local w = redis.call('HMGET', KEYS[6], 'w0', 'w1', 'w2', 'w3')
  for i = 1, 4 do w[i] = tonumber(w[i] or '0') end
  return w
end

-- overdueList caches the first 1000 overdue users (loadOverdue) for the
-- rest of a script; insertWaiting and unqueue drop it when they add or
-- remove an overdue user, so a batch of enters sees each one's effect.
local overdueList, overdueTotal
local function overdueChanged(e)
  if e.join <= NOW - MAXWAIT then overdueList = nil end
end

local function insertWaiting(uid, e)
  overdueChanged(e)
  tiersKept()
  qnKept()
  jvKept()
  redis.call('HINCRBY', KEYS[6], 'w' .. e.level, 1)
  e.state = 'w'
  local s3 = fmt3(e.score)
  zadd(qkey(e.shard), s3, uid)
  zadd(KEYS[2], e.join, uid)
  if e.level > 0 then
    zadd(KEYS[9], s3, uid)
    zadd(JV, e.seq, uid)
  else
    zadd(QN, s3, uid)
  end
  local raw = enc(e)
  redis.call('HSET', KEYS[1], uid, raw)
  return raw
end

-- unqueue takes a waiting user out of the queue indexes. When that leaves
-- a class with nobody waiting, the quota's counts start from zero
-- (waitroom's memRoom.unqueue).
local function unqueue(uid, e)
  overdueChanged(e)
  tiersKept()
  qnKept()
  jvKept()
  redis.call('HINCRBY', KEYS[6], 'w' .. e.level, -1)
  zrem(qkey(e.shard), uid)
  zrem(KEYS[2], uid)
  if e.level > 0 then
    zrem(KEYS[9], uid)
    zrem(JV, uid)
  else
    zrem(QN, uid)
  end
  local nv = zcard(KEYS[9])
  if nv == 0 or nv == waitingCount() then redis.call('HDEL', KEYS[6], 'sv', 'sn') end
end

local function removeEntry(uid, e)
  if e.state == 'w' then
    unqueue(uid, e)
  elseif e.state == 'a' then
    zrem(KEYS[3], uid)
  elseif e.state == 'x' then
    zrem(KEYS[4], uid)
  elseif e.state == 'p' then
    zrem(PQ, uid)
    if e.level > 0 then redis.call('HINCRBY', KEYS[6], 'pqv', -1) end
  end
  if e.state ~= 'x' then zrem(SL, uid) end
  zrem(KEYS[5], uid)
  disownAll(uid, e)
  redis.call('HDEL', KEYS[1], uid)
end

local function loadOverdue()
  if overdueList then return end
  local cutoff = NOW - MAXWAIT
  overdueTotal = redis.call('ZCOUNT', KEYS[2], '-inf', cutoff)
  overdueList = {}
  if overdueTotal > 0 then
    local us = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff, 'LIMIT', 0, 1000)
    local raw = redis.call('HMGET', KEYS[1], unpack(us))
    for i, u in ipairs(us) do
      local e = dec(raw[i])
      if e then overdueList[#overdueList + 1] = {e.score, u} end
    end
    table.sort(overdueList, function(a, b) return keyless(a[1], a[2], b[1], b[2]) end)
  end
end
-- overdueAbove counts the loaded overdue users with a key above (s, u).
local function overdueAbove(s, u)
  local lo, hi = 1, #overdueList + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local o = overdueList[mid]
    if keyless(s, u, o[1], o[2]) then hi = mid else lo = mid + 1 end
  end
  return #overdueList - lo + 1
end

-- ahead counts the users admitted before uid (a waiting entry e): the
-- overdue users older than it when it is overdue itself; otherwise every
-- lower key in every shard plus every overdue user with a higher key.
local function ahead(uid, e)
  if e.join <= NOW - MAXWAIT then
    return redis.call('ZRANK', KEYS[2], uid)
  end
  local n = 0
  local s3 = fmt3(e.score)
  for i = 0, K - 1 do
    if i == e.shard then
      n = n + redis.call('ZRANK', qkey(i), uid)
    else
      n = n + redis.call('ZCOUNT', qkey(i), '-inf', '(' .. s3) + tiesBelow(qkey(i), s3, uid)
    end
  end
  if QUOTA then
    -- waitroom.QuotaAhead
    local v
    if e.level > 0 then
      v = redis.call('ZRANK', KEYS[9], uid)
    else
      v = redis.call('ZCOUNT', KEYS[9], '-inf', '(' .. s3) + tiesBelow(KEYS[9], s3, uid)
    end
    local nAhead, nWaiting = n - v, waitingCount() - zcard(KEYS[9])
    if e.level > 0 then
      local normals = math.floor((v + 0.01) / SHARE - v - 1) + 1
      n = v + math.max(nAhead, math.min(math.max(normals, 0), nWaiting))
    else
      local vips = math.ceil((SHARE * (nAhead + 1) - 0.01) / (1 - SHARE))
      n = nAhead + math.min(math.max(vips, 0), v)
    end
  end
  loadOverdue()
  return n + overdueAbove(e.score, uid) + (overdueTotal - #overdueList)
end

local function lmaxOf(rate, count, waiting, oldestWait)
  local lambda = rate
  if count == 0 then
    lambda = RATE
    if waiting > 0 and oldestWait >= 60 then lambda = 0 end
  end
  return math.floor(lambda * TWAIT * SAFETY)
end
-- currentLMax reads lmax once per script (only maintain writes it).
local lmaxCache
local function currentLMax()
  if lmaxCache == nil then
    local v = redis.call('HGET', KEYS[6], 'lmax')
    if v then lmaxCache = tonumber(v) else lmaxCache = lmaxOf(0, 0, 0, 0) end
  end
  return lmaxCache
end
local function window(purge)
  local all = redis.call('HGETALL', KEYS[7])
  local count, oldest = 0, NOW
  for i = 1, #all, 2 do
    local s = tonumber(all[i])
    if s <= NOW - 300 then
      if purge then redis.call('HDEL', KEYS[7], all[i]) end
    else
      count = count + tonumber(all[i + 1])
      if s < oldest then oldest = s end
    end
  end
  return count, oldest
end
local function rateOf(count, oldest)
  if count == 0 then return 0 end
  local span = math.min(NOW - oldest + 1, 300)
  if span < 1 then span = 1 end
  return count / span
end

-- The max-wait guarantee (waitroom's guarantee.go; memRoom.owed, slackAt,
-- minSlack, startIfDue).
local function owed() return waitingCount() + zcard(KEYS[3]) + zcard(PQ) end
local function slackAt(rem, others) return math.floor(GRATE * rem) - 1 - others end
-- minSlack is the smallest spare of anyone owed, nil when nobody is; a
-- start still being moved in counts with the pre-queue's slack key.
local function minSlack()
  local m = redis.call('ZRANGE', SL, 0, 0, 'WITHSCORES')
  local k = nil
  if #m > 0 then k = tonumber(m[2]) end
  if not SCHEDULED and zcard(PQ) > 0 then
    local ps = redis.call('HGET', KEYS[6], 'pqsl')
    if ps and (k == nil or tonumber(ps) < k) then k = tonumber(ps) end
  end
  if k == nil then return nil end
  return k - stc('passes')
end
local function msFmt()
  local ms = minSlack()
  if ms == nil then return '' end
  return string.format('%d', ms)
end
-- startIfDue moves (a batch of 5000 of) the pre-queue into the queue once
-- the start has come, in shuffle-key order; the first batch of a start
-- fixes the size, the slack key and the VIP bias scale for all of them, so
-- the batches together are one shuffle, done once (the entries leave pq).
local function startIfDue()
  if STARTS == 0 or SCHEDULED then return end
  local n = zcard(PQ)
  if n == 0 then return end
  if stnum('pqat') ~= STARTS then
    local scale, share = 1, stnum('pqv') / n
    if share > CAP then scale = CAP / share end
    redis.call('HSET', KEYS[6], 'pqn', n, 'pqat', STARTS,
      'pqsl', slackAt(STARTS + MAXWAIT - 1 - NOW, owed() - 1) + stc('passes'), 'pqsc', string.format('%.17g', scale),
      'pqseq', nextSeq()) -- the VIPs' promise: after every pre-queue entry, before any later one
  end
  local N, sl, scale, pseqV = stnum('pqn'), stnum('pqsl'), stnum('pqsc'), stnum('pqseq')
  local batch = redis.call('ZPOPMIN', PQ, 5000)
  cards[PQ] = nil
  for i = 1, #batch, 2 do
    local uid = batch[i]
    local rank = N - (n - (i + 1) / 2) - 1
    local e = dec(redis.call('HGET', KEYS[1], uid))
    if e then
      if e.level > 0 then
        redis.call('HINCRBY', KEYS[6], 'pqv', -1)
        local b = BIAS[e.level]
        if b < 0 then e.bias = rmilli(b * scale) end
        e.seq = pseqV
      end
      e.join = STARTS
      e.score = rmilli(1.3 * STARTS + e.bias - 0.001 * (N - rank))
      zadd(SL, sl, uid)
      if e.away ~= 0 then -- disconnected before the start
        e.state = 'a'
        e.away = NOW
        zadd(KEYS[3], NOW, uid)
        redis.call('HSET', KEYS[1], uid, enc(e))
      else
        e.away = 0
        insertWaiting(uid, e)
      end
    end
  end
end
`

// enterScript enters one or more users, one after the other, exactly as
// that many calls would at the same second (a batch: see enterQueue).
// From ARGV[23] every user has 11 fields: uid, level, shard, restore mode
// (” none, 'w' waiting, 'x' active), join, first, bias, admitted,
// expires, node (” = untracked), shuffle key (waitroom.ShuffleKey, used
// by a pre-queue entry).
// Returns one reply per user: {status, reject, entry, ahead, waiting,
// ended, pseq, now, lmax, rate, pre-queue size, short (admissions missing
// for the guarantee; 0 = none)}.
var enterScript = redis.NewScript(prelude + `
local function enter(uid, level, shard, rmode, rjoin, rfirst, rbias, radmitted, rexpires, node, shuffle)
  local ended = false
  startIfDue()
  local raw = redis.call('HGET', KEYS[1], uid)
  local e = dec(raw)
  if e and rmode == 'x' and e.state ~= 'x' then
    removeEntry(uid, e)
    e = nil
  end
  if e then
    if e.state == 'x' then
      if e.expires > NOW then
        if node ~= '' and node ~= firstHolder(e.node) then
          own(uid, e, node)
          raw = enc(e)
          redis.call('HSET', KEYS[1], uid, raw)
        end
        return {5, '', raw, 0, waitingCount(), false, stc('pseq'), NOW, 0, '0', zcard(PQ), 0}
      end
      removeEntry(uid, e)
      ended = {'expired', raw}
    elseif e.state == 'p' then
      if (node ~= '' and node ~= firstHolder(e.node)) or e.away ~= 0 then
        if node ~= '' and node ~= firstHolder(e.node) then own(uid, e, node) end
        e.away = 0 -- back before the start
        raw = enc(e)
        redis.call('HSET', KEYS[1], uid, raw)
      end
      return {2, '', raw, 0, waitingCount(), false, stc('pseq'), NOW, 0, '0', zcard(PQ), 0}
    elseif e.state == 'w' then
      if node ~= '' and node ~= firstHolder(e.node) then
        own(uid, e, node)
        raw = enc(e)
        redis.call('HSET', KEYS[1], uid, raw)
      end
      return {2, '', raw, ahead(uid, e), waitingCount(), false, stc('pseq'), NOW, 0, '0', zcard(PQ), 0}
    elseif e.state == 'a' then
      local away = NOW - e.away
      if away <= HARD then
        zrem(KEYS[3], uid)
        local status = 3
        if away > GRACE then
          local delta = math.floor((away - GRACE) * DECAY)
          local ow = owed()
          local fit = math.min(NOW - MAXWAIT + 1 + math.ceil((ow + 1) / GRATE), NOW)
          if delta > 0 and fit - e.join > delta then delta = fit - e.join end
          if delta > 0 then
            local smoothing = redis.call('ZSCORE', KEYS[5], uid)
            e.join = e.join + delta
            e.score = rmilli(e.score + 1.3 * delta)
            if smoothing then zadd(KEYS[5], e.join, uid) end
            zadd(SL, slackAt(e.join + MAXWAIT - 1 - NOW, ow) + stc('passes'), uid)
            if e.level > 0 then e.seq = nextSeq() end -- a new promise (waitroom's Memory.Enter)
          end
          status = 4
        end
        e.away = NOW -- in a waiting entry: back since
        own(uid, e, node)
        local raw = insertWaiting(uid, e)
        return {status, '', raw, ahead(uid, e), waitingCount(), false, stc('pseq'), NOW, 0, '0', zcard(PQ), 0}
      end
      removeEntry(uid, e)
    end
  end

  if rmode ~= '' then
    local join = tonumber(rjoin)
    if join == 0 then join = NOW end
    join = math.min(join, NOW)
    local first = math.min(tonumber(rfirst), NOW)
    if first == 0 or first > join then first = join end
    e = {level = level, state = 'w', join = join, first = first, bias = tonumber(rbias),
      score = 0, away = 0, admitted = 0, expires = 0, shard = shard, seq = 0, node = ''}
    own(uid, e, node)
    if rmode == 'x' then
      e.state = 'x'
      e.admitted = tonumber(radmitted)
      e.expires = tonumber(rexpires)
      if e.admitted == 0 then e.admitted = NOW end
      if e.expires == 0 then e.expires = NOW end
      e.score = score(e.join, e.bias, 1)
      redis.call('HSET', KEYS[1], uid, enc(e))
      zadd(KEYS[4], e.expires, uid)
      return {5, '', enc(e), 0, waitingCount(), ended, stc('pseq'), NOW, 0, '0', zcard(PQ), 0}
    end
    local frac = 1
    if e.bias < 0 then frac = sfrac(e.join) end
    e.score = score(e.join, e.bias, frac)
    local sl = slackAt(e.join + MAXWAIT - 1 - NOW, owed()) + stc('passes')
    e.seq = nextSeq()
    local raw = insertWaiting(uid, e)
    zadd(SL, sl, uid)
    if frac < 1 then zadd(KEYS[5], e.join, uid) end
    return {1, '', raw, ahead(uid, e), waitingCount(), ended, stc('pseq'), NOW, 0, '0', zcard(PQ), 0}
  end

  local waiting = waitingCount()
  local pre = zcard(PQ)
  if not OPEN or ENDED then
    return {6, 'room_closed', '', 0, waiting, ended, 0, NOW, 0, '0', pre, 0}
  end
  local lm = currentLMax()
  if waiting >= lm and not SCHEDULED then
    return {6, 'room_full', '', 0, waiting, ended, 0, NOW, lm, redis.call('HGET', KEYS[6], 'rate') or '0', pre, 0}
  end
  -- the max-wait guarantee (waitroom's Memory.Enter)
  local ow = owed()
  local slack = slackAt(MAXWAIT - 1, ow)
  local need = 0
  if level == 0 then need = RESERVE end
  if slack < need then
    return {6, 'room_full', '', 0, waiting, ended, 0, NOW, 0, '0', pre, need - slack}
  end
  if SCHEDULED then
    e = {level = level, state = 'p', join = STARTS, first = NOW, bias = 0, score = 0, away = 0,
      admitted = 0, expires = 0, shard = shard, seq = nextSeq(), node = ''}
    own(uid, e, node)
    zadd(PQ, shuffle, uid)
    if level > 0 then redis.call('HINCRBY', KEYS[6], 'pqv', 1) end
    redis.call('HSET', KEYS[1], uid, enc(e))
    return {1, '', enc(e), 0, waiting, ended, stc('pseq'), NOW, 0, '0', pre + 1, 0}
  end
  e = {level = level, state = 'w', join = NOW, first = NOW, bias = 0, score = 0, away = 0,
    admitted = 0, expires = 0, shard = shard, seq = nextSeq(), node = ''}
  own(uid, e, node)
  if level > 0 then
    e.bias = BIAS[level]
    if waiting > 0 and e.bias < 0 then
      local share = zcard(KEYS[9]) / waiting
      if share > CAP then e.bias = rmilli(e.bias * CAP / share) end
    end
    if e.bias < 0 and ow > 0 then
      local ms = minSlack()
      if ms ~= nil and ms < 1 then
        e.bias = 0
      else
        stinc('passes')
      end
    end
  end
  local frac = 1
  if e.bias < 0 then frac = sfrac(NOW) end
  e.score = score(NOW, e.bias, frac)
  local raw = insertWaiting(uid, e)
  zadd(SL, slack + stc('passes'), uid)
  if frac < 1 then zadd(KEYS[5], NOW, uid) end
  if e.bias < 0 then place(e.score, 'inf') end
  return {1, '', raw, ahead(uid, e), waitingCount(), ended, stc('pseq'), NOW, 0, '0', zcard(PQ), 0}
end

local out = {}
for i = 23, #ARGV, 11 do
  out[#out + 1] = enter(ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4], ARGV[i + 5],
    ARGV[i + 6], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9], ARGV[i + 10])
end
return out
`)

// departScript: ARGV[23] uid, [24] 'disconnect' or 'leave', [25] the
// disconnecting node (” = every holder).
// Returns {prev state letter, ended entry or false, now, held (1 when
// another node still holds the user and nothing else changed)}.
var departScript = redis.NewScript(prelude + `
local uid = ARGV[23]
local node = ARGV[25]
local raw = redis.call('HGET', KEYS[1], uid)
local e = dec(raw)
if not e then return {'', false, NOW, 0} end
local prev = e.state
if ARGV[24] ~= 'leave' and node ~= '' and e.node ~= '' then
  if disown(uid, e, node) then redis.call('HSET', KEYS[1], uid, enc(e)) end
  if e.node ~= '' then return {prev, false, NOW, 1} end -- another node holds the user
end
if e.state == 'x' then
  removeEntry(uid, e)
  return {prev, raw, NOW, 0}
end
if ARGV[24] == 'leave' then
  removeEntry(uid, e)
elseif e.state == 'p' then
  disownAll(uid, e)
  e.away = NOW
  redis.call('HSET', KEYS[1], uid, enc(e))
elseif e.state == 'w' then
  unqueue(uid, e)
  disownAll(uid, e)
  e.state = 'a'
  e.away = NOW
  zadd(KEYS[3], NOW, uid)
  redis.call('HSET', KEYS[1], uid, enc(e))
end
return {prev, false, NOW, 0}
`)

// admitScript: ARGV[23] max (0 = none), [24] channel (” = none).
// Returns {tokens, now, {{uid, entry, overdue, late}...}}.
var admitScript = redis.NewScript(prelude + `
local MAX = tonumber(ARGV[23])
startIfDue()
if SCHEDULED or zcard(PQ) > 0 then return {'0', NOW, {}} end
local tokens = tonumber(redis.call('HGET', KEYS[6], 'tokens') or '0')
local tts = stnum('tts')
if tts == 0 then
  tokens = BURST
elseif NOWUS > tts then
  tokens = math.min(BURST, tokens + RATE * (NOWUS - tts) / 1e6)
end
tokens = math.min(tokens, BURST)
if NOWUS > tts then tts = NOWUS end
local budget = math.min(math.floor(tokens), MAXACTIVE - zcard(KEYS[4]))
if MAX > 0 then budget = math.min(budget, MAX) end
local cutoff = NOW - MAXWAIT
local expires = NOW + TTL
-- the quota's counts of VIP and normal admissions in the current
-- contention (waitroom.RoomConfig.VIPAdmitShare)
local sv, sn = 0, 0
if QUOTA then
  local q = redis.call('HMGET', KEYS[6], 'sv', 'sn')
  sv, sn = tonumber(q[1] or '0'), tonumber(q[2] or '0')
end
-- waiting VIPs and normal users, kept up to date below
local nv, nn = 0, 0
if QUOTA then
  nv = zcard(KEYS[9])
  nn = waitingCount() - nv
end
local out = {}
while budget > 0 do
  local uid, overdue, yielded = nil, false, false
  local o = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if #o > 0 and tonumber(o[2]) <= cutoff then
    uid, overdue = o[1], true
  else
    local bs, bu = nil, nil
    for i = 0, K - 1 do
      local c = redis.call('ZRANGE', qkey(i), 0, 0, 'WITHSCORES')
      if #c > 0 then
        local s = tonumber(c[2])
        if bs == nil or keyless(s, c[1], bs, bu) then bs, bu = s, c[1] end
      end
    end
    if bu == nil then break end
    uid = bu
    if QUOTA and not (sv + 0.01 < SHARE * (sv + sn + 1)) and redis.call('ZSCORE', KEYS[9], bu) then
      qnKept()
      local c = redis.call('ZRANGE', QN, 0, 0)
      if #c > 0 then
        -- waitroom's quotaMay: only a normal user owed before every
        -- waiting VIP's promise; otherwise the quota yields
        local m = jvMin()
        local ne = dec(redis.call('HGET', KEYS[1], c[1]))
        if m == nil or (ne and ne.seq < m) then uid = c[1] else yielded = true end
      end
    end
  end
  local e = dec(redis.call('HGET', KEYS[1], uid))
  if QUOTA then
    -- waitroom's countShare and shareCount, and unqueue's reset
    if not overdue and not yielded and nv > 0 and nn > 0 then
      if e.level > 0 then sv = sv + 1 else sn = sn + 1 end
      if sv + sn > 1048576 then sv, sn = sv / 2, sn / 2 end
    end
    if e.level > 0 then nv = nv - 1 else nn = nn - 1 end
    if nv == 0 or nn == 0 then sv, sn = 0, 0 end
  end
  unqueue(uid, e)
  zrem(KEYS[5], uid)
  zrem(SL, uid)
  local late = NOW - math.max(e.join, e.away) > MAXWAIT + 1
  if late then redis.call('HINCRBY', KEYS[6], 'mwv', 1) end
  e.state = 'x'
  e.admitted = NOW
  e.expires = expires
  local s = enc(e)
  redis.call('HSET', KEYS[1], uid, s)
  zadd(KEYS[4], expires, uid)
  tokens = tokens - 1
  budget = budget - 1
  out[#out + 1] = {uid, s, overdue and 1 or 0, late and 1 or 0}
end
if #out > 0 then
  redis.call('HINCRBY', KEYS[7], NOW, #out)
  if ARGV[24] ~= '' then
    local msg = {tostring(NOW), tostring(expires)}
    for i, a in ipairs(out) do msg[#msg + 1] = a[1] end
    redis.call('PUBLISH', ARGV[24], table.concat(msg, '\0'))
  end
end
redis.call('HSET', KEYS[6], 'tokens', string.format('%.17g', tokens), 'tts', string.format('%d', tts))
if QUOTA then
  redis.call('HSET', KEYS[6], 'sv', string.format('%.17g', sv), 'sn', string.format('%.17g', sn))
end
return {string.format('%.17g', tokens), NOW, out}
`)

// maintainScript: ARGV[23] node (” = no heartbeat), [24] node timeout
// in seconds (0 = no sweep).
// Returns {now, {{uid, entry, reason}...} ended, {uid...} dropped, stepped,
// rate, lmax, orphans}.
var maintainScript = redis.NewScript(prelude + `
startIfDue()
local expired = {}
local ex = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', NOW, 'LIMIT', 0, 1000)
for _, uid in ipairs(ex) do
  local raw = redis.call('HGET', KEYS[1], uid)
  local e = dec(raw)
  if e then
    removeEntry(uid, e)
    expired[#expired + 1] = {uid, raw, 'expired'}
  else
    zrem(KEYS[4], uid)
  end
end
if ARGV[23] ~= '' then redis.call('HSET', NODES, ARGV[23], NOW) end
local orphans = 0
local timeout = tonumber(ARGV[24])
if timeout > 0 then
  local hbs = redis.call('HGETALL', NODES)
  local budget = 1000
  local hbOf = {}
  for i = 1, #hbs, 2 do hbOf[hbs[i]] = tonumber(hbs[i + 1]) end
  for i = 1, #hbs, 2 do
    local dead, hb = hbs[i], tonumber(hbs[i + 1])
    if NOW - hb > timeout and budget > 0 then
      local lost = redis.call('SPOP', nkey(dead), budget)
      budget = budget - #lost
      for _, uid in ipairs(lost) do
        local raw = redis.call('HGET', KEYS[1], uid)
        local e = dec(raw)
        local held = false
        if e then held = select(2, withoutHolder(e.node, dead)) end
        local away, alive = hb, false
        if held then
          e.node = withoutHolder(e.node, dead) -- SPOP took it out of the node's set
          -- waitroom's sweep rule: the user is disconnected once no live
          -- node holds it, away since the latest heartbeat of its holders
          for n in string.gmatch(e.node, '[^,]+') do
            local h = hbOf[n]
            if h and NOW - h <= timeout then alive = true elseif h and h > away then away = h end
          end
          if not alive then disownAll(uid, e) end
        end
        if held and alive then -- another live node still holds the user
          redis.call('HSET', KEYS[1], uid, enc(e))
        elseif held then
          local hb = away
          if e.state == 'w' then
            unqueue(uid, e)
            e.state = 'a'
            e.away = hb
            zadd(KEYS[3], hb, uid)
            redis.call('HSET', KEYS[1], uid, enc(e))
            orphans = orphans + 1
          elseif e.state == 'x' then
            removeEntry(uid, e)
            expired[#expired + 1] = {uid, raw, 'disconnect'}
          elseif e.state == 'p' then
            e.away = hb
            redis.call('HSET', KEYS[1], uid, enc(e))
          end
        end
      end
      if redis.call('SCARD', nkey(dead)) == 0 then redis.call('HDEL', NODES, dead) end
    end
  end
end
local dropped = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', NOW - HARD, 'LIMIT', 0, 1000)
for _, uid in ipairs(dropped) do
  local e = dec(redis.call('HGET', KEYS[1], uid))
  if e then removeEntry(uid, e) else zrem(KEYS[3], uid) end
end
local stepped = 0
local lo, hi = nil, nil
local sm = redis.call('ZRANGE', KEYS[5], 0, 4999)
for _, uid in ipairs(sm) do
  local e = dec(redis.call('HGET', KEYS[1], uid))
  if not e then
    zrem(KEYS[5], uid)
  elseif e.state == 'w' then
    local frac = sfrac(e.join)
    local ns = score(e.join, e.bias, frac)
    if ns < e.score then
      zadd(qkey(e.shard), fmt3(ns), uid)
      if e.level > 0 then zadd(KEYS[9], fmt3(ns), uid) end
      if lo == nil or ns < lo then lo = ns end
      if hi == nil or e.score > hi then hi = e.score end
      e.score = ns
      redis.call('HSET', KEYS[1], uid, enc(e))
      stepped = stepped + 1
    end
    if frac >= 1 then zrem(KEYS[5], uid) end
  end
end
if stepped > 0 then place(lo, fmt3(hi)) end
local count, oldest = window(true)
local rate = rateOf(count, oldest)
local waiting = waitingCount()
local ow = 0
local o = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #o > 0 then ow = NOW - tonumber(o[2]) end
local lm = lmaxOf(rate, count, waiting, ow)
local rs = string.format('%.17g', rate)
redis.call('HSET', KEYS[6], 'lmax', lm, 'rate', rs)
return {NOW, expired, dropped, stepped, rs, lm, orphans}
`)

// snapshotScript: ARGV[23] since (placement seq), ARGV[24..] uids.
// Returns {now, waiting, away, active, vip, overdue, count, oldest, lmax,
// {{entry or false, ahead}...}, placements, pseq, {w0, w1, w2, w3},
// pre-queue, violations, owed, min slack (” = nobody owed)}.
var snapshotScript = redis.NewScript(prelude + `
local pos = {}
for i = 24, #ARGV do
  local uid = ARGV[i]
  local raw = redis.call('HGET', KEYS[1], uid)
  local e = dec(raw)
  if not e then
    pos[#pos + 1] = {false, 0}
  elseif e.state == 'w' then
    pos[#pos + 1] = {raw, ahead(uid, e)}
  else
    pos[#pos + 1] = {raw, 0}
  end
end
local count, oldest = window(false)
local pseq = stc('pseq')
local fresh = math.min(pseq - tonumber(ARGV[23]), 4096)
local pl = {}
if fresh > 0 then pl = redis.call('LRANGE', KEYS[8], 0, fresh - 1) end
return {NOW, waitingCount(), zcard(KEYS[3]), zcard(KEYS[4]), zcard(KEYS[9]),
  redis.call('ZCOUNT', KEYS[2], '-inf', NOW - MAXWAIT), count, oldest, currentLMax(), pos, pl, pseq, tierCounts(),
  zcard(PQ), stnum('mwv'), owed(), msFmt()}
`)

// trimScript: no extra ARGV. Returns the number of entries removed.
var trimScript = redis.NewScript(prelude + `
local us = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. (NOW - GRACE), 'LIMIT', 0, 1000)
for _, uid in ipairs(us) do
  local e = dec(redis.call('HGET', KEYS[1], uid))
  if e then removeEntry(uid, e) else zrem(KEYS[3], uid) end
end
redis.call('LTRIM', KEYS[8], 0, 63)
return #us
`)
