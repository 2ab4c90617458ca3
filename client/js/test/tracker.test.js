// Unit tests of the delivery rules (src/tracker.js) and the backoff: pushes
// in any order, duplicates, gaps, summaries, resyncs and pull pages against
// an in-memory message log that answers pulls the way docs/protocol.md §4.4
// says the server does (join_seq clamp, page size, next_seq).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Tracker, backoff, FanfareError } from '../src/index.js'
import { waitFor } from '../testing/harness.js'

/** fakeLog is one group's stored messages and a pull that pages them. */
function fakeLog({ gid = 7, n = 0, joinSeq = 1, pageSize = 200 } = {}) {
  const log = {
    gid,
    last: 0,
    pulls: [],
    fail: null, // a FanfareError to throw once
    add() {
      log.last++
      return { gid, seq: log.last, from: 'u', ts: 1000 + log.last, kind: 'text', body: { n: log.last } }
    },
    msg: (seq) => ({ gid, seq, from: 'u', ts: 1000 + seq, kind: 'text', body: { n: seq } }),
    async pull(g, from, to) {
      log.pulls.push([from, to])
      await new Promise((r) => setTimeout(r, 1))
      if (log.fail) {
        const e = log.fail
        log.fail = null
        throw e
      }
      const lo = Math.max(from, joinSeq)
      const hi = to === 0 ? log.last : Math.min(to, log.last)
      const messages = []
      for (let s = lo; s <= hi && messages.length < pageSize; s++) messages.push(log.msg(s))
      const page = { gid, messages, last_seq: log.last }
      if (messages.length && messages.at(-1).seq < hi) page.next_seq = messages.at(-1).seq + 1
      return page
    },
  }
  for (let i = 0; i < n; i++) log.add()
  return log
}

function tracker(log, options = {}) {
  const got = []
  const events = []
  const t = new Tracker({
    deliver: (m) => got.push(m),
    pull: (g, from, to) => log.pull(g, from, to),
    emit: (ev, data) => events.push([ev, data]),
    options: { gapWaitMs: 20, summaryJitterMs: 0, ...options },
  })
  t.connected()
  return { t, got, events, seqs: () => got.map((m) => m.seq) }
}

const range = (a, b) => Array.from({ length: b - a + 1 }, (_, i) => a + i)

test('in-order pushes are delivered at once; duplicates are dropped', () => {
  const log = fakeLog()
  const { t, seqs } = tracker(log)
  const m1 = log.add()
  const m2 = log.add()
  t.onMsg(m1)
  t.onMsg(m2)
  t.onMsg(m1)
  t.onBatch({ gid: log.gid, messages: [m1, m2] })
  assert.deepEqual(seqs(), [1, 2])
  assert.equal(t.stats.duplicates, 3)
  assert.equal(log.pulls.length, 0)
})

test('a reordered push within gapWaitMs fills the gap without a pull', async () => {
  const log = fakeLog()
  const { t, seqs } = tracker(log, { gapWaitMs: 200 })
  const [m1, m2, m3] = [log.add(), log.add(), log.add()]
  t.onMsg(m1)
  t.onMsg(m3)
  assert.deepEqual(seqs(), [1])
  t.onMsg(m2)
  await waitFor('3 delivered', () => seqs().length === 3)
  assert.deepEqual(seqs(), [1, 2, 3])
  assert.equal(log.pulls.length, 0)
})

test('a gap still open after gapWaitMs is pulled, exactly the missing range', async () => {
  const log = fakeLog()
  const { t, seqs, got } = tracker(log)
  const msgs = range(1, 6).map(() => log.add())
  t.onMsg(msgs[0])
  t.onMsg(msgs[4]) // 2..4 missing
  t.onMsg(msgs[5])
  await waitFor('6 delivered', () => seqs().length === 6)
  assert.deepEqual(seqs(), range(1, 6))
  assert.deepEqual(log.pulls, [[2, 4]])
  assert.deepEqual(got.map((m) => m.pulled), [false, true, true, true, false, false])
  assert.equal(t.stats.gaps, 1)
})

test('maxBuffered bounds the pushes held per group: one more drops the highest, which is pulled later', async () => {
  const log = fakeLog()
  const { t, seqs } = tracker(log, { maxBuffered: 3, gapWaitMs: 10000 })
  const msgs = range(1, 10).map(() => log.add())
  t.onMsg(msgs[0])
  for (const m of msgs.slice(2, 5)) t.onMsg(m) // 3, 4, 5 held: exactly the bound
  assert.equal(t.pendingCount(log.gid), 3)
  assert.equal(t.stats.overflow, 0)
  t.onMsg(msgs[5]) // 6: one past the bound
  assert.equal(t.pendingCount(log.gid), 3)
  assert.equal(t.stats.overflow, 1)
  for (const m of msgs.slice(6)) t.onMsg(m)
  assert.equal(t.pendingCount(log.gid), 3)
  assert.equal(t.stats.overflow, 5)
  // A resync (or summary) says what exists: everything is pulled in order.
  t.onResync({ gid: log.gid, last_seq: 10 })
  await waitFor('10 delivered', () => seqs().length === 10)
  assert.deepEqual(seqs(), range(1, 10))
})

test('summary: the first message is delivered, the rest pulled page by page through next_seq', async () => {
  const log = fakeLog({ pageSize: 3 })
  const { t, seqs, got } = tracker(log)
  range(1, 10).forEach(() => log.add())
  t.onSummary({ gid: log.gid, count: 10, first: log.msg(1), last_seq: 10 })
  await waitFor('10 delivered', () => seqs().length === 10)
  assert.deepEqual(seqs(), range(1, 10))
  assert.equal(got[0].pulled, false)
  assert.deepEqual(log.pulls, [[2, 10], [5, 10], [8, 10]])
})

test('summaryJitterMs delays the pull, and summaries arriving meanwhile wait with it', async () => {
  const log = fakeLog()
  const got = []
  const t = new Tracker({
    deliver: (m) => got.push(m.seq),
    pull: (g, from, to) => log.pull(g, from, to),
    emit: () => {},
    options: { summaryJitterMs: 200 },
    random: () => 0.5, // wait 100 ms
  })
  t.connected()
  range(1, 4).forEach(() => log.add())
  const t0 = Date.now()
  t.onSummary({ gid: log.gid, count: 2, first: log.msg(1), last_seq: 2 })
  await new Promise((r) => setTimeout(r, 40))
  t.onSummary({ gid: log.gid, count: 2, first: log.msg(3), last_seq: 4 })
  assert.deepEqual(got, [1])
  assert.equal(log.pulls.length, 0, 'no pull before the jittered wait')
  await waitFor('4 delivered', () => got.length === 4)
  const waited = Date.now() - t0
  assert.ok(waited >= 95, `pulled after ${waited} ms, want the 100 ms jitter`)
  assert.deepEqual(got, [1, 2, 3, 4])
  assert.deepEqual(log.pulls, [[2, 2], [4, 4]], 'both windows filled in the one delayed fill')
})

test('resync: a tracked group pulls from delivered+1; an untracked one starts at last_seq', async () => {
  const log = fakeLog()
  const { t, seqs, events } = tracker(log)
  const m1 = log.add()
  t.onMsg(m1)
  range(2, 5).forEach(() => log.add())
  t.onResync({ gid: log.gid, last_seq: 5 })
  await waitFor('5 delivered', () => seqs().length === 5)
  assert.deepEqual(seqs(), range(1, 5))
  assert.deepEqual(events.filter(([e]) => e === 'resync'), [['resync', { gid: 7, last_seq: 5 }]])
  t.onResync({ gid: 99, last_seq: 40 })
  assert.equal(t.cursors()[99], 40)
})

test('seqs below join_seq are skipped: a probe of a new member starts at its join_seq', async () => {
  const log = fakeLog({ n: 8, joinSeq: 6 })
  const { t, seqs } = tracker(log)
  t.track(log.gid, 0)
  await waitFor('6..8 delivered', () => seqs().length === 3)
  assert.deepEqual(seqs(), [6, 7, 8])
  assert.equal(t.cursors()[log.gid], 8)
})

test('a pull that fails with a retryable server error is retried after its hint; forbidden drops the group', async () => {
  const log = fakeLog({ n: 3 })
  const { t, seqs, events } = tracker(log)
  log.fail = new FanfareError('rate_limited', 'slow down', { retryAfterMs: 30 })
  t.track(log.gid, 0)
  await waitFor('3 delivered', () => seqs().length === 3)
  assert.ok(events.some(([e, d]) => e === 'error' && d.code === 'rate_limited'))
  log.add()
  log.fail = new FanfareError('forbidden', 'not a member of this group')
  t.onResync({ gid: log.gid, last_seq: 4 })
  await waitFor('group_lost', () => events.some(([e]) => e === 'group_lost'))
  assert.equal(t.cursors()[log.gid], undefined)
})

test('a pull lost with the connection resumes after the reconnect', async () => {
  const log = fakeLog({ n: 5 })
  const { t, seqs } = tracker(log)
  log.fail = new FanfareError('connection_lost', 'gone')
  t.track(log.gid, 0)
  await waitFor('the failed pull', () => log.pulls.length === 1)
  await new Promise((r) => setTimeout(r, 30))
  assert.deepEqual(seqs(), [])
  t.disconnected()
  t.connected()
  t.resume({ probe: true })
  await waitFor('5 delivered', () => seqs().length === 5)
  assert.deepEqual(seqs(), range(1, 5))
})

test('maxCatchUp skips the oldest of a long catch-up and says so', async () => {
  const log = fakeLog({ n: 20 })
  const { t, seqs, events } = tracker(log, { maxCatchUp: 5 })
  t.applySync([{ gid: log.gid, last_seq: 20, last_read_seq: 0, unread: 20 }])
  await waitFor('5 delivered', () => seqs().length === 5)
  assert.deepEqual(seqs(), range(16, 20))
  assert.deepEqual(events.find(([e]) => e === 'skipped'), ['skipped', { gid: 7, from: 1, to: 15 }])
})

test('sync: untracked groups start at last_read_seq, or at last_seq with skipUnread', async () => {
  const log = fakeLog({ n: 6 })
  const { t, seqs } = tracker(log)
  t.applySync([{ gid: log.gid, last_seq: 6, last_read_seq: 4, unread: 2 }])
  await waitFor('5, 6 delivered', () => seqs().length === 2)
  assert.deepEqual(seqs(), [5, 6])
  const b = tracker(fakeLog({ n: 6 }))
  b.t.applySync([{ gid: 7, last_seq: 6, last_read_seq: 0, unread: 6 }], { skipUnread: true })
  assert.equal(b.t.cursors()[7], 6)
})

test('degraded: group and node levels, the higher one in effect; level 3 polls', async () => {
  const log = fakeLog({ n: 2 })
  const { t, seqs, events } = tracker(log, { pollIntervalMs: 30 })
  t.onDegraded({ gid: 7, level: 2 })
  assert.equal(t.level(7), 2)
  t.onDegraded({ level: 1 })
  assert.equal(t.level(7), 2)
  assert.equal(t.level(0), 1)
  t.onDegraded({ level: 3 })
  assert.equal(t.level(7), 3)
  assert.deepEqual(events.at(-1), ['degraded', { gid: 0, level: 3, effective: 3, node: 3 }])
  // At level 3 nothing is pushed: the group is polled.
  t.track(7, 0)
  await waitFor('2 delivered', () => seqs().length === 2)
  log.add()
  await waitFor('the poll to find seq 3', () => seqs().length === 3)
  t.connected() // a new connection: the server announces the levels again
  assert.equal(t.level(7), 0)
  t.close()
})

test('backoff is a uniform draw in [d/2, d], d doubling from min up to max', () => {
  assert.equal(backoff(100, 1000, 0, () => 0), 50)
  assert.equal(backoff(100, 1000, 0, () => 1), 100)
  assert.equal(backoff(100, 1000, 3, () => 1), 800)
  assert.equal(backoff(100, 1000, 4, () => 1), 1000)
  assert.equal(backoff(100, 1000, 50, () => 1), 1000)
  assert.equal(backoff(100, 1000, 50, () => 0), 500)
  for (let n = 0; n < 20; n++) {
    const d = backoff(250, 30000, n)
    assert.ok(d >= Math.min(250 * 2 ** n, 30000) / 2 && d <= Math.min(250 * 2 ** n, 30000), `attempt ${n}: ${d}`)
  }
})

test('a listener that throws does not stop the others; its exception goes to the error listeners', async () => {
  const { Emitter } = await import('../src/util.js')
  const e = new Emitter()
  const got = []
  const errors = []
  e.on('message', () => { throw new Error('app bug') })
  const off = e.on('message', (m) => got.push(m))
  e.on('error', (err) => errors.push(err.message))
  e.emit('message', 1)
  off()
  e.emit('message', 2)
  assert.deepEqual(got, [1])
  assert.deepEqual(errors, ['app bug', 'app bug'])
  let once = 0
  e.once('state', () => once++)
  e.emit('state', {})
  e.emit('state', {})
  assert.equal(once, 1)
  assert.equal(e.emit('nobody', 1), false)
})

test('a push or a resync before the sync after connect keeps the unread messages below it', async () => {
  for (const first of ['msg', 'resync']) {
    const log = fakeLog({ n: 10, joinSeq: 3 })
    const got = []
    const t = new Tracker({
      deliver: (m) => got.push(m),
      pull: (g, from, to) => log.pull(g, from, to),
      emit: () => {},
      options: { gapWaitMs: 20, summaryJitterMs: 0 },
    })
    t.connected({ syncing: true })
    if (first === 'msg') t.onMsg(log.msg(10))
    else t.onResync({ gid: log.gid, last_seq: 10 })
    await new Promise((r) => setTimeout(r, 60)) // longer than gapWaitMs: nothing moves yet
    assert.deepEqual(got, [], `${first}: nothing delivered before the sync answers`)
    t.applySync([{ gid: log.gid, last_seq: 10, last_read_seq: 0, unread: 8 }])
    t.endSync()
    t.resume()
    await waitFor(`${first}: 3..10 delivered`, () => got.length === 8)
    assert.deepEqual(got.map((m) => m.seq), range(3, 10), first)
  }
})

test('a group first pushed during a sync that does not list it starts at the push', async () => {
  const log = fakeLog({ n: 5 })
  const got = []
  const t = new Tracker({ deliver: (m) => got.push(m), pull: (g, f, to) => log.pull(g, f, to), emit: () => {}, options: { gapWaitMs: 20 } })
  t.connected({ syncing: true })
  t.onMsg(log.msg(5))
  t.applySync([])
  t.endSync()
  await waitFor('5 delivered', () => got.length === 1)
  assert.deepEqual(got.map((m) => m.seq), [5])
})

test('a group first seen after the sync by a push or a resync starts at its sync entry, not at the push', async () => {
  // A member added while online: its node's first push can come after
  // messages stored since its join, and a resync says nothing of where to
  // start. The group waits for its own sync entry (place).
  for (const first of ['msg', 'resync']) {
    const log = fakeLog({ n: 10, joinSeq: 3 })
    const got = []
    const asked = []
    let answer
    const t = new Tracker({
      deliver: (m) => got.push(m),
      pull: (g, from, to) => log.pull(g, from, to),
      emit: () => {},
      place: (gid) => {
        asked.push(gid)
        return new Promise((resolve) => { answer = resolve })
      },
      options: { gapWaitMs: 20, summaryJitterMs: 0 },
    })
    t.connected({ syncing: true })
    t.applySync([])
    t.endSync()
    if (first === 'msg') t.onMsg(log.msg(10))
    else t.onResync({ gid: log.gid, last_seq: 10 })
    assert.deepEqual(asked, [log.gid], `${first}: the group's entry is asked for`)
    await new Promise((r) => setTimeout(r, 60)) // longer than gapWaitMs: nothing moves yet
    assert.deepEqual(got, [], `${first}: nothing delivered before the entry answers`)
    answer({ gid: log.gid, last_seq: 10, last_read_seq: 0, unread: 8 })
    await waitFor(`${first}: 3..10 delivered`, () => got.length === 8)
    assert.deepEqual(got.map((m) => m.seq), range(3, 10), first)
  }
})

test('a group whose entry lookup fails or finds no membership starts where its first push said', async () => {
  for (const outcome of ['error', 'none']) {
    const log = fakeLog({ n: 5 })
    const got = []
    const events = []
    const t = new Tracker({
      deliver: (m) => got.push(m),
      pull: (g, f, to) => log.pull(g, f, to),
      emit: (ev, data) => events.push(ev),
      place: async () => {
        if (outcome === 'error') throw new FanfareError('unavailable', 'sync down')
        return null
      },
      options: { gapWaitMs: 20 },
    })
    t.connected()
    t.onMsg(log.msg(5))
    await waitFor(`${outcome}: 5 delivered`, () => got.length === 1)
    assert.deepEqual(got.map((m) => m.seq), [5], outcome)
    assert.equal(events.includes('error'), outcome === 'error', outcome)
  }
})
