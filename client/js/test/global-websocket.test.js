// The SDK on a platform WebSocket (what browsers have): Node's built-in
// WHATWG WebSocket in a child process, no WebSocket option passed.

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { fileURLToPath } from 'node:url'
import { startServer } from '../testing/harness.js'

const run = promisify(execFile)
let srv
before(async () => { srv = await startServer() })
after(async () => { await srv?.stop() })

test('with the global WebSocket (no WebSocket option) the client chats, reconnects, catches up and pulls', async () => {
  const gid = await srv.group('ga', 'gb')
  const script = fileURLToPath(new URL('../testing/global-websocket-client.js', import.meta.url))
  const { stdout } = await run(process.execPath, ['--experimental-websocket', '--no-warnings', script, srv.wsUrl, srv.httpUrl, srv.token('ga'), srv.token('gb'), String(gid)], { timeout: 60000 })
  const out = JSON.parse(stdout.trim().split('\n').at(-1))
  assert.equal(out.fatal, undefined, out.fatal)
  assert.deepEqual(out.got, [1, 2, 3, 4, 5, 6])
  assert.deepEqual(out.pull, [2, 3, 4])
  assert.equal(out.reconnects, 1)
  // A platform WebSocket does not say why an upgrade failed.
  assert.equal(out.refused, 'handshake')
})
