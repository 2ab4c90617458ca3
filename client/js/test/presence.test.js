import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { connect, FanfareError } from '../src/index.js'
import { startServer, WebSocket, waitFor } from '../testing/harness.js'

let srv
// A fast feed; groups of at most 3 members are listed and get join/leave events.
before(async () => { srv = await startServer(['-presence-interval', '100ms', '-presence-list-max', '3', '-presence-events-max', '3']) })
after(async () => { await srv?.stop() })

function open(uid) {
  return connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, token: srv.token(uid), WebSocket })
}

test('presence: counts pushed as members come and go, with who, and the list page by page', async () => {
  const gid = await srv.group('pa', 'pb', 'pc')
  const a = await open('pa')
  const seen = []
  a.on('presence', (p) => { if (p.gid === gid) seen.push(p) })
  let b
  try {
    await waitFor('pa to see 1 online', () => a.online(gid)?.online === 1)
    b = await open('pb')
    const joined = await waitFor('pa to see pb come online', () => seen.find((p) => p.online === 2))
    assert.deepEqual(joined.joined, ['pb'])
    assert.deepEqual(joined.left, [])
    await waitFor('pb to see 2 online', () => b.online(gid)?.online === 2)

    const first = await a.onlineMembers(gid, { limit: 1 })
    assert.deepEqual(first, { gid, online: 2, ts: first.ts, listed: true, members: ['pa'], nextCursor: 'pa' })
    const second = await a.onlineMembers(gid, { cursor: first.nextCursor, limit: 1 })
    assert.deepEqual(second.members, ['pb'])
    assert.equal(second.nextCursor, '')
    assert.deepEqual(await a.allOnlineMembers(gid), { online: 2, listed: true, members: ['pa', 'pb'] })

    await b.close()
    b = null
    const left = await waitFor('pa to see pb go offline', () => seen.find((p) => p.online === 1 && p.left.length))
    assert.deepEqual(left.left, ['pb'])
  } finally {
    await a.close()
    await b?.close()
  }
})

test('presence: a large group is counted, not listed; non-members and bad pages are refused', async () => {
  const large = await srv.group('qa', 'qb', 'qc', 'qd')
  const other = await srv.group('qz')
  const a = await open('qa')
  try {
    await waitFor('qa to see 1 online', () => a.online(large)?.online === 1)
    const p = await a.onlineMembers(large)
    assert.equal(p.listed, false)
    assert.equal(p.online, 1)
    assert.deepEqual(p.members, [])
    await assert.rejects(a.onlineMembers(other), (e) => e instanceof FanfareError && e.code === 'forbidden')
    await assert.rejects(a.onlineMembers(large, { limit: 501 }), (e) => e.code === 'bad_request')
    await assert.rejects(a.onlineMembers(0), (e) => e.code === 'bad_request')
  } finally {
    await a.close()
  }
})
