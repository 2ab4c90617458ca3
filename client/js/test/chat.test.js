import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { connect, FanfareError } from '../src/index.js'
import { startServer, WebSocket, waitFor, collect, flaky, pullAll } from '../testing/harness.js'

let srv
before(async () => { srv = await startServer() })
after(async () => { await srv?.stop() })

function open(uid, extra = {}) {
  return connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, token: srv.token(uid), WebSocket, ...extra })
}

test('two clients chat: each gets every message once, in seq order, with its sender', async () => {
  const gid = await srv.group('alice', 'bob')
  const alice = await open('alice')
  const bob = await open('bob')
  try {
    assert.equal(alice.uid, 'alice')
    const a = collect(alice)
    const b = collect(bob)
    const acks = []
    for (let i = 0; i < 6; i++) {
      const who = i % 2 ? bob : alice
      acks.push(await who.send(gid, { text: `hi ${i}` }))
    }
    assert.deepEqual(acks.map((x) => x.seq), [1, 2, 3, 4, 5, 6])
    for (const [name, c] of [['alice', a], ['bob', b]]) {
      await waitFor(`${name} to get 6 messages`, () => c.seqs(gid).length >= 6)
      assert.deepEqual(c.seqs(gid), [1, 2, 3, 4, 5, 6], name)
      assert.deepEqual(c.of(gid).map((m) => m.from), ['alice', 'bob', 'alice', 'bob', 'alice', 'bob'])
      assert.deepEqual(c.of(gid).map((m) => m.body.text), ['hi 0', 'hi 1', 'hi 2', 'hi 3', 'hi 4', 'hi 5'])
      assert.ok(c.of(gid).every((m) => m.gid === gid && m.ts > 0))
      assert.deepEqual(c.violations, [])
    }
  } finally {
    await alice.close()
    await bob.close()
  }
})

test('send refusals are typed errors with the server code', async () => {
  const gid = await srv.group('carol', 'dave')
  const carol = await open('carol')
  try {
    const other = await srv.group('erin')
    await assert.rejects(carol.send(other, 'x'), (e) => e instanceof FanfareError && e.code === 'forbidden' && !e.retryable)
    await assert.rejects(carol.send(gid, 'x'.repeat(40000)), (e) => e instanceof FanfareError && e.code === 'too_large')
    await assert.rejects(carol.send(0, 'x'), (e) => e.code === 'bad_request')
    await assert.rejects(carol.send(gid, undefined), (e) => e.code === 'bad_request')
  } finally {
    await carol.close()
  }
})

test('messages sent while a client is offline arrive after it reconnects, exactly once and in order', async () => {
  const gid = await srv.group('frank', 'grace')
  const net = flaky()
  const frank = await open('frank')
  const grace = await open('grace', { WebSocket: net.WebSocket, backoffMinMs: 20, backoffMaxMs: 200 })
  try {
    const g = collect(grace)
    const states = []
    grace.on('state', (s) => states.push(s.state))
    for (let i = 1; i <= 3; i++) await frank.send(gid, { n: i })
    await waitFor('grace to get the first 3', () => g.seqs(gid).length === 3)
    // The network goes: the socket dies and redials are refused.
    net.offline = true
    net.drop()
    await waitFor('grace to notice', () => !grace.connected)
    for (let i = 4; i <= 12; i++) await frank.send(gid, { n: i })
    await srv.adminSend(gid, 'frank', 'offline-admin', { n: 13 })
    await waitFor('a few refused redials', () => states.filter((s) => s === 'reconnecting').length >= 2)
    assert.equal(g.seqs(gid).length, 3, 'nothing arrives while offline')
    net.offline = false
    await waitFor('grace to catch up', () => g.seqs(gid).length >= 13)
    for (let i = 14; i <= 16; i++) await frank.send(gid, { n: i })
    await waitFor('grace to get the live ones', () => g.seqs(gid).length >= 16)
    await new Promise((r) => setTimeout(r, 200)) // any duplicate would show up by now
    assert.deepEqual(g.seqs(gid), Array.from({ length: 16 }, (_, i) => i + 1))
    assert.deepEqual(g.of(gid).map((m) => m.body.n), Array.from({ length: 16 }, (_, i) => i + 1))
    assert.ok(g.of(gid).slice(3, 13).every((m) => m.pulled), 'the missed ones came by pull')
    assert.deepEqual(g.violations, [])
    assert.ok(grace.stats().reconnects >= 1)
  } finally {
    await frank.close()
    await grace.close()
  }
})

test('without httpUrl a reconnect catches up tracked groups by pull', async () => {
  const gid = await srv.group('heidi', 'ivan')
  const net = flaky()
  const heidi = await open('heidi')
  const ivan = await connect({ url: srv.wsUrl, token: srv.token('ivan'), WebSocket: net.WebSocket, backoffMinMs: 20, backoffMaxMs: 100 })
  try {
    const v = collect(ivan)
    await heidi.send(gid, 'one')
    await waitFor('ivan to track the group from its first push', () => v.seqs(gid).length === 1)
    net.offline = true
    net.drop()
    await waitFor('ivan offline', () => !ivan.connected)
    for (let i = 0; i < 5; i++) await heidi.send(gid, `off ${i}`)
    net.offline = false
    await waitFor('ivan to catch up', () => v.seqs(gid).length === 6)
    assert.deepEqual(v.seqs(gid), [1, 2, 3, 4, 5, 6])
    await assert.rejects(ivan.sync(), (e) => e.code === 'no_http')
  } finally {
    await heidi.close()
    await ivan.close()
  }
})

test('retries never duplicate: a resent id gets the original seq, and sends cut off by a dropped socket are stored once', async () => {
  const gid = await srv.group('judy', 'ken')
  const net = flaky()
  const judy = await open('judy', { WebSocket: net.WebSocket, backoffMinMs: 20, backoffMaxMs: 400 })
  try {
    // The server has the message under this id already (an earlier attempt
    // whose ack was lost): the retry answers its seq and stores nothing.
    const first = await srv.adminSend(gid, 'judy', 'judy-fixed-1', { v: 'original' })
    const again = await judy.send(gid, { v: 'retry' }, { id: 'judy-fixed-1' })
    assert.equal(again.seq, first.seq)
    assert.equal(again.id, 'judy-fixed-1')
    // Kill the socket right after each send: the ack is lost (or the frame
    // never left); the SDK resends under the same id on the next socket.
    const acks = []
    for (let i = 0; i < 8; i++) {
      const p = judy.send(gid, { k: i })
      net.drop()
      acks.push(await p)
    }
    assert.ok(judy.stats().retries >= 1, `retries ${judy.stats().retries}`)
    const stored = await pullAll(srv, 'judy', gid)
    assert.equal(stored.length, 9, `stored ${JSON.stringify(stored.map((m) => m.body))}`)
    assert.deepEqual(stored[0].body, { v: 'original' })
    for (let i = 0; i < 8; i++) {
      const m = stored.find((x) => x.seq === acks[i].seq)
      assert.deepEqual(m.body, { k: i }, `ack ${i} names seq ${acks[i].seq}`)
    }
    assert.equal(new Set(acks.map((a) => a.seq)).size, 8)
  } finally {
    await judy.close()
  }
})

test('frames right behind hello (a group level announced at connect) reach listeners added after await connect()', async () => {
  const gid = await srv.group('lena', 'mo')
  await srv.api('PUT', '/admin/v1/degrade', { scope: 'group', gid, level: 2, ttl_s: 60 })
  try {
    const lena = await open('lena')
    const seen = []
    lena.on('degraded', (d) => seen.push(d))
    try {
      await waitFor('the degraded event', () => seen.length > 0, 10000)
      assert.deepEqual(seen[0], { gid, level: 2, effective: 2, node: 0 })
      assert.equal(lena.level(gid), 2)
    } finally {
      await lena.close()
    }
  } finally {
    await srv.api('PUT', '/admin/v1/degrade', { scope: 'group', gid, level: null })
  }
})
