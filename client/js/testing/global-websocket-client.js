// Run by test/global-websocket.test.js under `node --experimental-websocket`:
// the SDK with no WebSocket option, i.e. the platform's global WebSocket
// (Node's built-in WHATWG one, as in a browser: no terminate(), no HTTP
// status on a refused upgrade). Prints one JSON line with what it saw.

import { connect } from '../src/index.js'

const [wsUrl, httpUrl, tokA, tokB, gid] = process.argv.slice(2)
const out = { got: [] }
try {
  if (typeof globalThis.WebSocket !== 'function') throw new Error('no global WebSocket')
  const a = await connect({ url: wsUrl, httpUrl, token: tokA })
  const b = await connect({ url: wsUrl, httpUrl, token: tokB, backoffMinMs: 20, backoffMaxMs: 100 })
  b.on('message', (m) => out.got.push(m.seq))
  for (let i = 0; i < 3; i++) await a.send(Number(gid), { i })
  while (out.got.length < 3) await new Promise((r) => setTimeout(r, 10))
  b.reconnect() // a spec WebSocket is closed, not terminated
  for (let i = 3; i < 6; i++) await a.send(Number(gid), { i })
  while (out.got.length < 6) await new Promise((r) => setTimeout(r, 10))
  out.pull = (await b.pull(Number(gid), 2, 4)).messages.map((m) => m.seq)
  out.reconnects = b.stats().reconnects
  try {
    await connect({ url: wsUrl, token: 'bad' })
  } catch (e) {
    out.refused = e.code
  }
  await a.close()
  await b.close()
} catch (e) {
  out.fatal = String(e?.stack ?? e)
}
console.log(JSON.stringify(out))
