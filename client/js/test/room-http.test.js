// Waiting rooms entered over HTTP (enterRoom with httpUrl): the ticket, the
// socket with ?ticket=, the polling fallback, leave, and roomSite, against
// a real fanfared.

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { enterRoom, roomSite } from '../src/index.js'
import { startServer, WebSocket, waitFor } from '../testing/harness.js'

let srv
before(async () => { srv = await startServer() })
after(async () => { await srv?.stop() })

/** holdSlot admits uid over the socket so that later entrants wait. */
async function holdSlot(room, uid) {
  const r = enterRoom({ url: srv.wsBase, room, token: srv.token(uid), WebSocket })
  await r.granted()
  return r
}

function record(r) {
  const seen = { queue: [], granted: [], rejected: [], states: [], errors: [] }
  r.on('queue', (q) => seen.queue.push(q))
  r.on('granted', (g) => seen.granted.push(g))
  r.on('rejected', (f) => seen.rejected.push(f))
  r.on('state', (s) => seen.states.push(s.state))
  r.on('error', (e) => seen.errors.push(e))
  return seen
}

test('options: url or httpUrl is required; a bad httpUrl, ticket or poll bound is named', () => {
  assert.throws(() => enterRoom({ room: 'x', token: 't' }), /url .* or httpUrl/)
  assert.throws(() => enterRoom({ httpUrl: 'ftp://h', room: 'x' }), /httpUrl scheme/)
  assert.throws(() => enterRoom({ httpUrl: 'not a url', room: 'x' }), /not a URL/)
  assert.throws(() => enterRoom({ httpUrl: 'http://h', room: 'x', ticket: 5 }), /ticket/)
  assert.throws(() => enterRoom({ httpUrl: 'http://h', room: 'x', minPollMs: 0 }), /minPollMs/)
  assert.throws(() => enterRoom({ httpUrl: 'http://h', room: 'x', minPollMs: 50, maxPollMs: 10 }), /exceeds maxPollMs/)
  assert.throws(() => enterRoom({ url: 'ws://h', room: 'x' }), /token, refreshToken or ticket/)
  // Over HTTP no credential is needed up front (an anonymous room, or the cookie).
  const r = enterRoom({ httpUrl: 'http://127.0.0.1:1', room: 'x', maxReconnectAttempts: 0 })
  r.close()
})

test('roomSite returns the site document; an unknown room is not_found', async () => {
  await srv.api('POST', '/admin/v1/rooms', { room: 'site-doc', site: { title: 'Sale', colors: { accent: '#123456' }, anonymous: true } })
  const doc = await roomSite({ httpUrl: srv.httpUrl, room: 'site-doc' })
  assert.equal(doc.room, 'site-doc')
  assert.equal(doc.site.title, 'Sale')
  assert.equal(doc.site.colors.accent, '#123456')
  assert.ok(Number.isFinite(doc.serverDate) && Math.abs(doc.serverDate - Date.now()) < 60000, `serverDate ${doc.serverDate}`)
  await assert.rejects(roomSite({ httpUrl: srv.httpUrl, room: 'no-site-here' }), (e) => e.code === 'not_found' && e.status === 404)
})

test('enter over HTTP, wait on the socket with the ticket: the same place, then granted', async () => {
  await srv.api('POST', '/admin/v1/rooms', { room: 'h-sock', max_active: 1, admit_rate: 100, smoothing_s: -1 })
  const holder = await holdSlot('h-sock', 'hs-0')
  const r = enterRoom({ httpUrl: srv.httpUrl, url: srv.wsBase, room: 'h-sock', token: srv.token('hs-1'), WebSocket })
  const seen = record(r)
  try {
    await waitFor('on the socket', () => r.transport === 'socket' && seen.queue.length > 0)
    assert.ok(r.ticket.length > 0, 'a ticket from enter')
    assert.equal(seen.queue.at(-1).position, 1)
    holder.close()
    const g = await r.granted()
    assert.equal(typeof g.access_token, 'string')
    assert.equal(seen.granted.length, 1)
    assert.ok(!seen.states.includes('polling'))
  } finally {
    r.close()
  }
})

test('without a socket the room polls status at poll_after_ms; leave gives the place up', async () => {
  await srv.api('POST', '/admin/v1/rooms', { room: 'h-poll', max_active: 1, admit_rate: 100, smoothing_s: -1 })
  const holder = await holdSlot('h-poll', 'hp-0')
  const a = enterRoom({ httpUrl: srv.httpUrl, room: 'h-poll', token: srv.token('hp-1'), minPollMs: 50 })
  const sa = record(a)
  // b enters once a is in line: two entries at once may land in either order.
  await waitFor('a in line', () => sa.queue.length > 0)
  const b = enterRoom({ httpUrl: srv.httpUrl, room: 'h-poll', token: srv.token('hp-2'), minPollMs: 50 })
  const sb = record(b)
  try {
    await waitFor('both in line', () => sa.queue.length > 0 && sb.queue.length > 0)
    assert.equal(a.transport, 'poll')
    assert.equal(sb.queue.at(-1).position, 2)
    await a.leave()
    assert.ok(a.closed)
    await waitFor('b moves up by polling', () => sb.queue.at(-1)?.position === 1)
    holder.close()
    const g = await b.granted()
    assert.equal(typeof g.access_token, 'string')
    assert.equal(sb.granted.length, 1, 'repeated polls do not repeat the grant')
  } finally {
    a.close()
    b.close()
  }
})

test('a socket that refuses the upgrade makes the room poll (pollFallbackAfter)', async () => {
  await srv.api('POST', '/admin/v1/rooms', { room: 'h-fall', max_active: 1, admit_rate: 100, smoothing_s: -1 })
  const holder = await holdSlot('h-fall', 'hf-0')
  // A socket URL where nothing speaks WebSocket: the HTTP port.
  const r = enterRoom({ httpUrl: srv.httpUrl, url: srv.httpUrl.replace('http', 'ws'), room: 'h-fall', token: srv.token('hf-1'), WebSocket, minPollMs: 50, backoffMinMs: 10, backoffMaxMs: 20 })
  const seen = record(r)
  try {
    await waitFor('polling', () => r.transport === 'poll')
    assert.ok(seen.errors.length >= 1, 'the failed dial was reported')
    holder.close()
    await r.granted()
  } finally {
    r.close()
  }
})

test('a forged ticket is refused unauthorized and ends the room', async () => {
  await srv.api('POST', '/admin/v1/rooms', { room: 'h-forged' })
  const r = enterRoom({ httpUrl: srv.httpUrl, room: 'h-forged', ticket: 'ft1.AAAA.BBBB' })
  const closed = new Promise((resolve) => r.on('close', resolve))
  const { error } = await closed
  assert.equal(error.code, 'unauthorized')
  assert.equal(error.status, 401)
})
