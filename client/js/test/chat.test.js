import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { connect, FanfareError } from '../src/index.js'
import { startServer, WebSocket, waitFor, collect } from '../testing/harness.js'

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
