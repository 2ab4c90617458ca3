// The Server-Sent Events fallback (docs/protocol.md §13) against a real
// fanfared: a client whose WebSocket cannot be opened receives over
// GET /v1/events (fetch streaming, as in browsers) and sends, pulls and
// marks reads over HTTP, and resumes after its stream is cut.

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createServer as createTCP, connect as dialTCP } from 'node:net'
import { createServer as createHTTP } from 'node:http'
import { connect } from '../src/index.js'
import { startServer, WebSocket, waitFor, collect } from '../testing/harness.js'

let srv
before(async () => { srv = await startServer(['-sse-heartbeat', '1s', '-sse-max-lifetime', '2s']) })
after(async () => { await srv?.stop() })

/** refuser answers every request, the WebSocket upgrade included, with 403: a proxy that does not pass WebSocket. */
async function refuser() {
  const h = createHTTP((req, res) => { res.writeHead(403).end() })
  h.on('upgrade', (req, sock) => { sock.end('HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n') })
  await new Promise((r) => h.listen(0, '127.0.0.1', r))
  return { url: `ws://127.0.0.1:${h.address().port}/ws`, close: () => new Promise((r) => { h.closeAllConnections?.(); h.close(r) }) }
}

/** cutProxy forwards TCP to the HTTP port; cut() severs every connection it carries (new ones still go through). */
async function cutProxy(target) {
  const { hostname, port } = new URL(target)
  const socks = new Set()
  const p = createTCP((c) => {
    const u = dialTCP(Number(port), hostname)
    socks.add(c).add(u)
    c.pipe(u).pipe(c)
    const drop = () => { c.destroy(); u.destroy(); socks.delete(c); socks.delete(u) }
    c.on('error', drop).on('close', drop)
    u.on('error', drop).on('close', drop)
  })
  await new Promise((r) => p.listen(0, '127.0.0.1', r))
  return {
    url: `http://127.0.0.1:${p.address().port}`,
    cut: () => { for (const s of socks) s.destroy(); socks.clear() },
    close: () => new Promise((r) => { for (const s of socks) s.destroy(); p.close(r) }),
  }
}

test('a client whose WebSocket is refused falls back to SSE: every message once and in order, sends over HTTP, resumes after cuts', async () => {
  const gid = await srv.group('sse-alice', 'sse-bob')
  const block = await refuser()
  const proxy = await cutProxy(srv.httpUrl)
  const alice = await connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, token: srv.token('sse-alice'), WebSocket })
  const bob = await connect({ url: block.url, httpUrl: proxy.url, token: srv.token('sse-bob'), WebSocket, backoffMinMs: 10, backoffMaxMs: 100 })
  try {
    assert.equal(alice.transport, 'websocket')
    assert.equal(bob.transport, 'sse')
    const b = collect(bob)
    const total = 120
    for (let i = 1; i <= total; i++) {
      const ack = await (i % 3 === 0 ? bob : alice).send(gid, { n: i })
      assert.equal(ack.seq, i)
      if (i === 40 || i === 80) proxy.cut()
      if (i === 60) await new Promise((r) => setTimeout(r, 2500)) // past the stream's lifetime
    }
    await waitFor(`bob to get ${total} messages`, () => b.seqs(gid).length >= total)
    assert.deepEqual(b.seqs(gid), Array.from({ length: total }, (_, i) => i + 1))
    assert.deepEqual(b.violations, [])
    assert.ok(bob.stats().reconnects >= 2, `bob reconnected ${bob.stats().reconnects} times, want at least 2 (two cuts and a lifetime end, which can coincide)`)
    assert.equal(bob.transport, 'sse')
    // reads and pulls over HTTP
    bob.read(gid, total)
    await waitFor('the read mark', async () => (await (await fetch(`${srv.httpUrl}/v1/sync`, { headers: { Authorization: 'Bearer ' + srv.token('sse-bob') } })).json()).groups[0].last_read_seq === total)
    const page = await bob.pull(gid, 5, 9)
    assert.deepEqual(page.messages.map((m) => m.seq), [5, 6, 7, 8, 9])
  } finally {
    await alice.close()
    await bob.close()
    await block.close()
    await proxy.close()
  }
})

test('transport sse is forced without a WebSocket URL; errors keep their server code', async () => {
  const gid = await srv.group('sse-carol', 'sse-dave')
  const carol = await connect({ transport: 'sse', httpUrl: srv.httpUrl, token: srv.token('sse-carol') })
  try {
    assert.equal(carol.transport, 'sse')
    const c = collect(carol)
    const ack = await carol.send(gid, 'hi')
    assert.equal(ack.seq, 1)
    await waitFor('carol to get her own message', () => c.seqs(gid).length === 1)
    const other = await srv.group('sse-erin')
    await assert.rejects(carol.send(other, 'x'), (e) => e.code === 'forbidden' && !e.retryable)
  } finally {
    await carol.close()
  }
  await assert.rejects(connect({ transport: 'sse', token: 't' }), /needs httpUrl/)
  await assert.rejects(connect({ transport: 'carrier-pigeon', url: srv.wsUrl, token: 't' }), /transport/)
})

test('a WebSocket refused by the server itself (401) does not fall back', async () => {
  await assert.rejects(connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, token: 'not-a-token', WebSocket }), (e) => e.status === 401)
})
