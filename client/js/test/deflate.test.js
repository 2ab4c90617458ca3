import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { connect } from '../src/index.js'
import { startServer, WebSocket, waitFor, collect } from '../testing/harness.js'

// fanfared -ws-deflate with npm ws, which offers permessage-deflate by
// default and compresses its own messages of 1 KiB or more with zlib,
// keeping its context across messages: the server's answer limits that
// context to a 512-byte window, which it follows.
let srv
before(async () => { srv = await startServer(['-ws-deflate']) })
after(async () => { await srv?.stop() })

function open(uid) {
  return connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, token: srv.token(uid), WebSocket })
}

test('permessage-deflate is negotiated with the window the server asks for', async () => {
  const ws = new WebSocket(`${srv.wsUrl}?token=${srv.token('probe')}`)
  let answer = ''
  ws.once('upgrade', (res) => { answer = res.headers['sec-websocket-extensions'] ?? '' })
  await new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject) })
  try {
    assert.equal(ws.extensions, 'permessage-deflate')
    assert.match(answer, /^permessage-deflate/)
    assert.match(answer, /server_no_context_takeover/)
    assert.match(answer, /client_max_window_bits=9/)
  } finally {
    ws.close()
  }
})

test('large messages, compressed both ways, arrive intact and in order', async () => {
  const gid = await srv.group('alice', 'bob')
  const alice = await open('alice')
  const bob = await open('bob')
  try {
    const b = collect(bob)
    const texts = []
    for (let i = 0; i < 12; i++) {
      // 1.5-6 KiB of repetitive text: ws compresses it (over its 1 KiB
      // threshold), the server inflates it with the history of the
      // earlier messages, stores it, and pushes it compressed to bob.
      const text = `round ${i}: ` + 'the crowd sings the anthem again and again, '.repeat(30 + i * 10)
      texts.push(text)
      const ack = await alice.send(gid, { text })
      assert.equal(ack.seq, i + 1)
    }
    await waitFor('bob to get 12 messages', () => b.seqs(gid).length >= 12)
    assert.deepEqual(b.seqs(gid), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    assert.deepEqual(b.of(gid).map((m) => m.body.text), texts)
    assert.deepEqual(b.violations, [])
  } finally {
    await alice.close()
    await bob.close()
  }
})
