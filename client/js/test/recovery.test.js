// Recovery from what the server does under load: pushes dropped for a slow
// consumer (resync) and degradation level 2 (summary frames).

import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { connect } from '../src/index.js'
import { startServer, WebSocket, waitFor, collect, flaky } from '../testing/harness.js'

const servers = []
after(async () => { await Promise.all(servers.map((s) => s.stop())) })

/** burst sends n messages to gid as uid over the admin HTTP API, `inflight` at a time. */
async function burst(srv, gid, uid, n, body, inflight = 8) {
  let next = 0
  const worker = async () => {
    while (next < n) {
      const i = next++
      await srv.adminSend(gid, uid, `burst-${gid}-${i}`, body(i))
    }
  }
  await Promise.all(Array.from({ length: inflight }, worker))
}

test('forced drops: a slow consumer past a small outbound bound gets resync and recovers every message, once, in order', async () => {
  // 256 KiB outbound bound and pages as large: pushes past it are dropped.
  const srv = await startServer(['-outbound-bytes', '262144', '-page-bytes', '262144'])
  servers.push(srv)
  const gid = await srv.group('sender', 'slow')
  const net = flaky()
  const slow = await connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, token: srv.token('slow'), WebSocket: net.WebSocket })
  try {
    const got = collect(slow)
    const resyncs = []
    slow.on('resync', (r) => resyncs.push(r))
    await srv.adminSend(gid, 'sender', 'warmup', { i: -1 })
    await waitFor('the first push', () => got.seqs(gid).length === 1)
    // The client stops reading its socket: the kernel buffers fill, then
    // the server's outbound bytes pass the bound and it drops pushes.
    net.pause()
    const n = 700
    const pad = 'x'.repeat(16000)
    const t0 = Date.now()
    await burst(srv, gid, 'sender', n, (i) => ({ i, pad }))
    const t1 = Date.now()
    net.resume()
    await waitFor(`all ${n + 1} messages (got ${got.seqs(gid).length})`, () => got.seqs(gid).length >= n + 1, 60000)
    await new Promise((r) => setTimeout(r, 200))
    assert.equal(got.seqs(gid).length, n + 1)
    assert.deepEqual(got.violations, [])
    assert.ok(resyncs.length >= 1, 'the server sent resync')
    const st = slow.stats()
    assert.ok(st.pulled > 0, 'the dropped pushes came by pull')
    const bodies = new Set(got.of(gid).slice(1).map((m) => m.body.i))
    assert.equal(bodies.size, n)
    console.log(`# resync: burst ${t1 - t0} ms, recovery ${Date.now() - t1} ms; ${resyncs.length} resync frames, ${st.pulled} of ${n + 1} messages pulled in ${st.pulls} pulls, ${st.duplicates} duplicates dropped`)
  } finally {
    await slow.close()
  }
})

test('summary at L2: the client gets every message by pulling what the summaries stand for', async () => {
  const srv = await startServer()
  servers.push(srv)
  const gid = await srv.group('talker', 'reader')
  const reader = await connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, token: srv.token('reader'), WebSocket, summaryJitterMs: 200 })
  try {
    const got = collect(reader)
    const levels = []
    reader.on('degraded', (d) => levels.push(d))
    await srv.api('PUT', '/admin/v1/degrade', { scope: 'group', gid, level: 2, ttl_s: 600 })
    await waitFor('the degraded frame', () => levels.some((d) => d.gid === gid && d.level === 2))
    assert.equal(reader.level(gid), 2)
    assert.deepEqual(reader.levels().groups, { [gid]: 2 })
    let summaries = 0
    reader.on('frame', () => {})
    const n = 60
    await burst(srv, gid, 'talker', n, (i) => ({ i }), 4)
    await waitFor(`all ${n} messages (got ${got.seqs(gid).length})`, () => got.seqs(gid).length >= n, 30000)
    await new Promise((r) => setTimeout(r, 300))
    assert.deepEqual(got.seqs(gid), Array.from({ length: n }, (_, i) => i + 1))
    assert.deepEqual(got.violations, [])
    const pushed = got.of(gid).filter((m) => !m.pulled).length
    assert.ok(pushed >= 1 && pushed < n, `at L2 only each window's first message is pushed (pushed ${pushed} of ${n})`)
    summaries = pushed
    // Back to L0: pushes again, and the client hears of it.
    await srv.api('PUT', '/admin/v1/degrade', { scope: 'group', gid, level: null })
    await waitFor('level 0', () => reader.level(gid) === 0)
    await srv.adminSend(gid, 'talker', 'after', { i: n })
    await waitFor('the push at L0', () => got.seqs(gid).length === n + 1)
    assert.equal(got.of(gid).at(-1).pulled, false)
    console.log(`# summary: ${n} messages at L2 in ${summaries} summaries, ${reader.stats().pulls} pulls`)
  } finally {
    await reader.close()
  }
})

test('level 3 (no pushes): the client polls every pollIntervalMs and still gets every message, in order', async () => {
  const srv = await startServer()
  servers.push(srv)
  const gid = await srv.group('w', 'r')
  const reader = await connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, token: srv.token('r'), WebSocket, pollIntervalMs: 300 })
  try {
    const got = collect(reader)
    await srv.adminSend(gid, 'w', 'l0', { i: 0 })
    await waitFor('the push at L0', () => got.seqs(gid).length === 1)
    await srv.api('PUT', '/admin/v1/degrade', { scope: 'group', gid, level: 3, ttl_s: 600 })
    await waitFor('level 3', () => reader.level(gid) === 3)
    for (let i = 1; i <= 5; i++) await srv.adminSend(gid, 'w', `l3-${i}`, { i })
    await waitFor('the polled messages', () => got.seqs(gid).length === 6, 15000)
    assert.deepEqual(got.seqs(gid), [1, 2, 3, 4, 5, 6])
    assert.ok(got.of(gid).slice(1).every((m) => m.pulled), 'nothing is pushed at L3')
    assert.deepEqual(got.violations, [])
  } finally {
    await srv.api('PUT', '/admin/v1/degrade', { scope: 'group', gid, level: null })
    await reader.close()
  }
})
