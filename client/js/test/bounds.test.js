// Every bound of the client at its edge, against a real fanfared: the
// send queue, retries, retry hints, request timeouts, heartbeats,
// reconnect attempts, pull ranges and sync pages; and the token refresh.

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { connect, Client, FanfareError } from '../src/index.js'
import { startServer, WebSocket, waitFor, collect, flaky, pullAll } from '../testing/harness.js'

let srv
// The smallest page budget (pulls of 10 KB messages page by 3) and one
// group per sync page, so that paging is exercised.
before(async () => { srv = await startServer(['-page-bytes', '36864', '-sync-page', '1']) })
after(async () => { await srv?.stop() })

function open(uid, extra = {}) {
  return connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, token: srv.token(uid), WebSocket, ...extra })
}

test('options are checked: every bad bound is named', () => {
  assert.throws(() => new Client({ url: 'http://x', token: 't', WebSocket }), /scheme/)
  assert.throws(() => new Client({ url: 'ws://x/ws', WebSocket }), /token or refreshToken/)
  assert.throws(() => new Client({ url: 'ws://x/ws', token: 't', WebSocket, maxQueuedSends: 0, maxRetries: -1, gapWaitMs: 1.5 }),
    (e) => /maxQueuedSends/.test(e.message) && /maxRetries/.test(e.message) && /gapWaitMs/.test(e.message))
  assert.throws(() => new Client({ url: 'ws://x/ws', token: 't', WebSocket, backoffMinMs: 500, backoffMaxMs: 100 }), /backoffMinMs/)
  assert.throws(() => new Client({ url: 'ws://x/ws', token: 't', WebSocket, httpUrl: 'ftp://x' }), /httpUrl/)
  assert.throws(() => new Client({ url: 'ws://x/ws', token: 't', WebSocket: 42 }), /WebSocket/)
  assert.throws(() => new Client({ url: 'ws://x/ws', token: 't', WebSocket, maxRetry: 3 }), /unknown option maxRetry/)
  const c = new Client({ url: 'ws://x/ws', token: 't', WebSocket, maxReconnectAttempts: Infinity })
  assert.equal(c.options.maxQueuedSends, 1000)
})

test('maxQueuedSends: sends past the bound are refused at once with queue_full; those within it complete', async () => {
  const gid = await srv.group('q1')
  const net = flaky()
  const c = await open('q1', { WebSocket: net.WebSocket, maxQueuedSends: 3, backoffMinMs: 20, backoffMaxMs: 100 })
  try {
    net.offline = true
    net.drop()
    await waitFor('offline', () => !c.connected)
    const queued = [c.send(gid, 1), c.send(gid, 2), c.send(gid, 3)]
    assert.equal(c.stats().outstandingSends, 3)
    await assert.rejects(c.send(gid, 4), (e) => e instanceof FanfareError && e.code === 'queue_full')
    net.offline = false
    const acks = await Promise.all(queued)
    assert.deepEqual(acks.map((a) => a.seq).sort(), [1, 2, 3])
    assert.equal((await c.send(gid, 5)).seq, 4, 'room again once they completed')
  } finally {
    await c.close()
  }
})

test('maxRetries: 0 returns the first rate_limited with its hint; 1 retries after the hint and succeeds', async () => {
  // user_group allows a burst of 10 then 5/s: 12 sends at once overflow it.
  const gid = await srv.group('r0', 'r1')
  const strict = await open('r0', { maxRetries: 0 })
  const patient = await open('r1', { maxRetries: 1 })
  try {
    const results = await Promise.allSettled(Array.from({ length: 12 }, (_, i) => strict.send(gid, i)))
    const refused = results.filter((r) => r.status === 'rejected').map((r) => r.reason)
    assert.ok(refused.length >= 1, 'some sends are over the limit')
    for (const e of refused) {
      assert.equal(e.code, 'rate_limited')
      assert.ok(e.retryable && e.fromServer && e.retryAfterMs > 0, `hint ${e.retryAfterMs}`)
    }
    assert.equal(strict.stats().retries, 0)
    // 11 at once: the 11th is refused once and admitted on its one retry
    // after the hint (two refused at once would race for one token).
    const ok = await Promise.all(Array.from({ length: 11 }, (_, i) => patient.send(gid, i)))
    assert.equal(new Set(ok.map((a) => a.seq)).size, 11)
    // (All 11 may pass on a slow machine: the bucket refills as they go.)
    assert.ok(patient.stats().retries <= 1, `retries ${patient.stats().retries}`)
  } finally {
    await strict.close()
    await patient.close()
  }
})

test('maxRetryAfterMs: a hint above it is returned at once instead of waited out', async () => {
  const gid = await srv.group('ra')
  const c = await open('ra', { maxRetryAfterMs: 1 })
  try {
    const results = await Promise.allSettled(Array.from({ length: 12 }, (_, i) => c.send(gid, i)))
    const refused = results.filter((r) => r.status === 'rejected').map((r) => r.reason)
    assert.ok(refused.length >= 1)
    assert.ok(refused.every((e) => e.code === 'rate_limited' && e.retryAfterMs > 1))
    assert.equal(c.stats().retries, 0)
  } finally {
    await c.close()
  }
})

test('requestTimeoutMs and maxRetries: unanswered attempts time out, are retried under one id, and the message is stored once', async () => {
  const gid = await srv.group('tm')
  const net = flaky()
  const c = await open('tm', { WebSocket: net.WebSocket, requestTimeoutMs: 300, maxRetries: 2, heartbeatMs: 60000 })
  try {
    net.pause() // acks are written by the server but never read
    const t0 = Date.now()
    await assert.rejects(c.send(gid, { v: 1 }, { id: 'tm-1' }), (e) => e.code === 'timeout')
    const took = Date.now() - t0
    assert.equal(c.stats().retries, 2, 'maxRetries 2: three attempts')
    assert.ok(took >= 900 && took < 5000, `three 300 ms attempts took ${took} ms`)
    net.resume()
    const ack = await c.send(gid, { v: 1 }, { id: 'tm-1' })
    const stored = await pullAll(srv, 'tm', gid)
    assert.equal(stored.length, 1)
    assert.equal(stored[0].seq, ack.seq)
  } finally {
    await c.close()
  }
})

test('heartbeatMs: a connection silent for a heartbeat after a ping is dropped and redialed', async () => {
  const gid = await srv.group('hb', 'hb2')
  const net = flaky()
  // Below the server's ping frame limit (2/s), and slack for a slow pong.
  const c = await open('hb', { WebSocket: net.WebSocket, heartbeatMs: 1000, backoffMinMs: 20, backoffMaxMs: 100 })
  const other = await open('hb2')
  try {
    const got = collect(c)
    const drops = []
    c.on('state', (s) => { if (s.state === 'disconnected') drops.push(s) })
    await new Promise((r) => setTimeout(r, 2500))
    assert.equal(drops.length, 0, 'pongs keep a live connection up')
    net.pause()
    await waitFor('the heartbeat to drop the silent connection', () => drops.length === 1, 10000)
    assert.match(drops[0].reason, /heartbeat/)
    await waitFor('reconnected', () => c.connected)
    await other.send(gid, 'after')
    await waitFor('the message on the new connection', () => got.seqs(gid).length === 1)
  } finally {
    await c.close()
    await other.close()
  }
})

test('maxReconnectAttempts: the client gives up after that many refused redials, and sends reject closed', async () => {
  const gid = await srv.group('gu')
  const net = flaky()
  const c = await open('gu', { WebSocket: net.WebSocket, maxReconnectAttempts: 2, backoffMinMs: 10, backoffMaxMs: 20 })
  const attempts = []
  c.on('state', (s) => { if (s.state === 'reconnecting') attempts.push(s.attempt) })
  c.on('error', () => {})
  const closed = new Promise((resolve) => c.on('close', resolve))
  const pending = c.send(gid, 'never').catch((e) => e)
  net.offline = true
  net.drop()
  const { error } = await closed
  assert.equal(error.code, 'closed')
  assert.deepEqual(attempts, [1, 2])
  assert.equal(c.state, 'closed')
  const e = await pending
  assert.ok(e.code === 'closed' || e.code === 'connection_lost', e.message)
  await assert.rejects(c.send(gid, 'x'), (err) => err.code === 'closed')
})

test('pull pages through next_seq; maxPullRange bounds one call at its edge', async () => {
  const gid = await srv.group('pl')
  const pad = 'p'.repeat(10000)
  for (let i = 1; i <= 10; i++) await srv.adminSend(gid, 'pl', `pl-${i}`, { i, pad })
  const c = await open('pl')
  const small = await open('pl', { maxPullRange: 4 })
  try {
    const all = await c.pull(gid, 0)
    assert.deepEqual(all.messages.map((m) => m.seq), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert.equal(all.lastSeq, 10)
    assert.ok(all.messages.every((m) => m.body.pad.length === 10000 && m.pulled))
    const part = await c.pull(gid, 3, 7)
    assert.deepEqual(part.messages.map((m) => m.seq), [3, 4, 5, 6, 7])
    const four = await small.pull(gid, 1)
    assert.deepEqual(four.messages.map((m) => m.seq), [1, 2, 3, 4])
    const rest = await small.pull(gid, 5, 8)
    assert.deepEqual(rest.messages.map((m) => m.seq), [5, 6, 7, 8])
    await assert.rejects(c.pull(gid, 5, 2), (e) => e.code === 'bad_request')
  } finally {
    await c.close()
    await small.close()
  }
})

test('sync follows next_after; maxSyncPages bounds it', async () => {
  const gids = [await srv.group('sy'), await srv.group('sy'), await srv.group('sy')]
  const c = await open('sy')
  const capped = await open('sy', { maxSyncPages: 2 })
  capped.on('error', () => {})
  try {
    const groups = await c.sync()
    assert.deepEqual(groups.map((g) => g.gid), gids)
    await assert.rejects(capped.sync(), (e) => e.code === 'protocol' && /maxSyncPages/.test(e.message))
  } finally {
    await c.close()
    await capped.close()
  }
})

test('sync retries a GET whose connection was cut or that was answered 503, up to maxRetries', async () => {
  const gid = await srv.group('sr')
  // A real HTTP hop in front of fanfared's API that misbehaves on demand.
  const faults = { cut: 0, busy: 0, syncs: 0 }
  const proxy = http.createServer(async (req, res) => {
    if (req.url.startsWith('/v1/sync')) {
      faults.syncs++
      if (faults.cut > 0) {
        faults.cut--
        req.socket.destroy()
        return
      }
      if (faults.busy > 0) {
        faults.busy--
        res.writeHead(503, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ error: { code: 'unavailable', message: 'busy', retry_after_ms: 10 } }))
        return
      }
    }
    const up = await fetch(srv.httpUrl + req.url, { headers: { authorization: req.headers.authorization } })
    res.writeHead(up.status, { 'content-type': up.headers.get('content-type') ?? 'application/json' })
    res.end(Buffer.from(await up.arrayBuffer()))
  })
  await new Promise((resolve) => proxy.listen(0, '127.0.0.1', resolve))
  const httpUrl = `http://127.0.0.1:${proxy.address().port}`
  const c = await connect({ url: srv.wsUrl, httpUrl, token: srv.token('sr'), WebSocket, maxRetries: 3, backoffMinMs: 10, backoffMaxMs: 50 })
  c.on('error', () => {})
  try {
    await waitFor('the connect sync', () => faults.syncs >= 1)
    await new Promise((resolve) => setTimeout(resolve, 200))
    faults.cut = 2
    faults.busy = 1
    const groups = await c.sync()
    assert.deepEqual(groups.map((g) => g.gid), [gid])
    faults.cut = 100
    faults.syncs = 0
    await assert.rejects(c.sync(), (e) => e.code === 'connection_lost')
    assert.ok(faults.syncs >= 4 && faults.syncs <= 8, `always-cutting hop: ${faults.syncs} requests, want 1 + maxRetries (3)`)
  } finally {
    await c.close()
    proxy.closeAllConnections()
    proxy.close()
  }
})

test('refreshToken is called before every reconnect (not before the first connect with a token), and alone is enough', async () => {
  const gid = await srv.group('rt', 'rt2')
  const net = flaky()
  let calls = 0
  const c = await open('rt', { WebSocket: net.WebSocket, refreshToken: async () => { calls++; return srv.token('rt') }, backoffMinMs: 20, backoffMaxMs: 100 })
  const only = await connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, refreshToken: () => srv.token('rt2'), WebSocket })
  try {
    assert.equal(calls, 0)
    assert.equal(only.uid, 'rt2')
    net.drop()
    await waitFor('reconnected', () => c.stats().reconnects === 1 && c.connected)
    assert.equal(calls, 1)
    assert.equal((await c.send(gid, 'ok')).seq, 1)
  } finally {
    await c.close()
    await only.close()
  }
})

test('a refused first connect rejects with the status: 401 for a bad token', async () => {
  await assert.rejects(connect({ url: srv.wsUrl, token: 'not-a-jwt', WebSocket }), (e) => e instanceof FanfareError && e.code === 'unauthorized' && e.status === 401)
})

test('token expiry: the server closes at exp (1008 token expired); refreshToken gets a new one, without it the client ends unauthorized', async () => {
  const gid = await srv.group('ex1', 'ex2', 'ex3')
  let refreshed = 0
  const kept = await open('ex1', { token: srv.token('ex1', { ttlS: 2 }), refreshToken: () => { refreshed++; return srv.token('ex1') }, backoffMinMs: 20, backoffMaxMs: 100 })
  const ended = await open('ex2', { token: srv.token('ex2', { ttlS: 2 }), backoffMinMs: 20, backoffMaxMs: 100 })
  const sender = await open('ex3')
  ended.on('error', () => {})
  try {
    const got = collect(kept)
    const closes = []
    kept.on('state', (s) => { if (s.state === 'disconnected') closes.push(s) })
    const end = new Promise((resolve) => ended.on('close', resolve))
    const { error } = await end
    assert.equal(error.code, 'unauthorized')
    await waitFor('the refreshed client back', () => kept.connected && refreshed === 1, 10000)
    assert.equal(closes[0].code, 1008)
    assert.match(closes[0].reason, /token expired/)
    await sender.send(gid, 'still here')
    await waitFor('delivery after the refresh', () => got.seqs(gid).length === 1)
  } finally {
    await kept.close()
    await sender.close()
  }
})
