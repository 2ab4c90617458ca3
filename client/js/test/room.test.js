// Waiting rooms through enterRoom against a real fanfared.

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { enterRoom, roomUrl } from '../src/index.js'
import { startServer, WebSocket, waitFor } from '../testing/harness.js'

let srv
before(async () => { srv = await startServer() })
after(async () => { await srv?.stop() })

function enter(room, uid, extra = {}) {
  return enterRoom({ url: srv.wsUrl, room, token: srv.token(uid), WebSocket, ...extra })
}

test('roomUrl accepts the socket base, the chat socket or the room socket', () => {
  assert.equal(roomUrl('ws://h:1', 'sale'), 'ws://h:1/rooms/sale/ws')
  assert.equal(roomUrl('ws://h:1/ws', 'sale'), 'ws://h:1/rooms/sale/ws')
  assert.equal(roomUrl('wss://h/edge/ws', 'a.b'), 'wss://h/edge/rooms/a.b/ws')
  assert.equal(roomUrl('ws://h:1/rooms/x/ws', 'ignored'), 'ws://h:1/rooms/x/ws')
  assert.throws(() => enterRoom({ url: 'http://h', room: 'x', token: 't', WebSocket }), /scheme/)
  assert.throws(() => enterRoom({ url: 'ws://h', room: 'no spaces', token: 't', WebSocket }), /room/)
  assert.throws(() => enterRoom({ url: 'ws://h', room: 'x', token: 't', WebSocket, heartbeat: 5 }), /unknown option heartbeat/)
})

test('the waiting room grants in order of entry, with positions and ETAs as the server sends them', async () => {
  // One admission a second; the first entrant takes the one-token burst.
  await srv.api('POST', '/admin/v1/rooms', { room: 'sale', max_active: 10, admit_rate: 1, smoothing_s: -1 })
  const uids = ['u0', 'u1', 'u2', 'u3']
  const rooms = []
  const granted = []
  const firstQueue = {}
  const queues = {}
  try {
    for (const uid of uids) {
      const r = enter('sale', uid)
      rooms.push(r)
      queues[uid] = []
      r.on('queue', (q) => {
        queues[uid].push(q)
        firstQueue[uid] ??= q
      })
      r.on('granted', (g) => granted.push({ uid, g }))
      // Enter one after the other: each is in line before the next comes.
      await waitFor(`${uid} in line`, () => firstQueue[uid] || granted.some((x) => x.uid === uid))
    }
    const frames = await Promise.all(rooms.map((r) => r.granted()))
    assert.deepEqual(granted.map((x) => x.uid), uids, 'granted in order of entry')
    for (const [i, g] of frames.entries()) {
      assert.equal(g.room, 'sale')
      assert.equal(typeof g.access_token, 'string')
      assert.ok(g.expires_at > Date.now(), `granted ${i} expires_at ${g.expires_at}`)
    }
    // Those who waited saw their place: position ahead + 1, within total.
    for (const uid of uids.slice(1)) {
      const q = firstQueue[uid]
      assert.ok(q, `${uid} got a queue frame`)
      assert.equal(q.room, 'sale')
      assert.ok(q.status === 'waiting' || q.status === 'paused')
      assert.equal(q.ahead, q.position - 1)
      assert.ok(q.position >= 1 && q.position <= q.total)
      if (q.status === 'waiting') assert.ok(Number.isInteger(q.eta_s) && q.eta_s >= 0, `eta_s ${q.eta_s}`)
    }
    // Nobody but those who entered earlier is ever ahead.
    for (const [k, uid] of uids.entries()) if (k > 0) assert.ok(firstQueue[uid].position <= k, `${uid} entered ${k}th, first position ${firstQueue[uid].position}`)
    assert.ok(queues.u3.some((q) => q.status === 'waiting' && Number.isInteger(q.eta_s)), 'an ETA once admissions are seen')
  } finally {
    for (const r of rooms) r.close()
  }
})

test('a closed room rejects: the rejected event, granted() rejects with the code, no redial', async () => {
  await srv.api('POST', '/admin/v1/rooms', { room: 'shut', state: 'closed' })
  const r = enter('shut', 'late')
  const rejected = []
  r.on('rejected', (f) => rejected.push(f))
  await assert.rejects(r.granted(), (e) => e.code === 'room_closed' && e.retryAfterMs === 0)
  assert.equal(rejected.length, 1)
  assert.equal(rejected[0].code, 'room_closed')
  assert.ok(r.closed)
})

test('an unknown room ends the Room with not_found (the upgrade answers 404)', async () => {
  const r = enter('nope', 'x')
  const closed = new Promise((resolve) => r.on('close', resolve))
  const { error } = await closed
  assert.equal(error.code, 'not_found')
  assert.equal(error.status, 404)
})
