// How many messages per second one browser tab takes in through the
// JavaScript SDK (node web/e2e/delivery-bench.mjs [messages] [senders]):
// a fanfared (embedded mode) is started, a headless Chromium page of the
// node's own origin connects with the SDK served at /sdk/ and counts
// messages, while this process sends them over the HTTP API (admin sends,
// which skip the per-user limits) from several concurrent senders. It
// prints the node's ingest rate and the tab's delivery rate and lag, then
// the rate at which a second tab catches the same messages up by pull; a
// measurement, not a test.

import { chromium } from 'playwright-core'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startServer } from '../../client/js/testing/harness.js'

const N = Number(process.argv[2] || 5000)
const SENDERS = Number(process.argv[3] || 16)
const server = await startServer()
const profile = await mkdtemp(join(tmpdir(), 'fanfare-bench-chromium-'))
const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
})
try {
  const gid = await server.group('reader', 'writer')
  const page = await ctx.newPage()
  await page.goto(`${server.httpUrl}/demo/`)
  await page.evaluate(async ({ url, token, gid }) => {
    const { connect } = await import('/sdk/src/index.js')
    const c = await connect({ url, token, httpUrl: location.origin })
    window.bench = { n: 0, first: 0, last: 0, lagSum: 0, lagMax: 0, dup: 0, prev: 0 }
    c.on('message', (m) => {
      if (m.gid !== gid) return
      const b = window.bench, now = Date.now()
      if (m.seq !== b.prev + 1) b.dup++
      b.prev = m.seq
      if (!b.n) b.first = now
      b.n++
      b.last = now
      const lag = now - m.ts
      b.lagSum += lag
      if (lag > b.lagMax) b.lagMax = lag
    })
    c.track(gid)
  }, { url: server.wsUrl, token: server.token('reader'), gid })

  const t0 = Date.now()
  let next = 0
  await Promise.all(Array.from({ length: SENDERS }, async () => {
    while (next < N) {
      const i = next++
      await server.adminSend(gid, 'writer', `b-${i}`, { text: `m${i}` })
    }
  }))
  const sent = Date.now() - t0
  const deadline = Date.now() + 120000
  let b
  for (;;) {
    b = await page.evaluate(() => window.bench)
    if (b.n >= N || Date.now() > deadline) break
    await new Promise((r) => setTimeout(r, 100))
  }
  const took = b.last - t0
  console.log(`sent ${N} messages in ${sent} ms (${Math.round(N / (sent / 1000))} msg/s ingest, ${SENDERS} HTTP senders)`)
  console.log(`the tab got ${b.n} in ${took} ms from the first send (${Math.round(b.n / (took / 1000))} msg/s), ` +
    `out of order or repeated: ${b.dup}, lag mean ${Math.round(b.lagSum / b.n)} ms, max ${b.lagMax} ms`)
  // Catch-up: a second tab connects after the fact and pulls every
  // message (pages of at most 200): what a tab takes in when the node is
  // not the limit.
  const late = await ctx.newPage()
  await late.goto(`${server.httpUrl}/demo/`)
  const pulled = await late.evaluate(async ({ url, token, gid, n }) => {
    const { connect } = await import('/sdk/src/index.js')
    const c = await connect({ url, token })
    let got = 0
    const t0 = performance.now()
    await new Promise((resolve) => {
      c.on('message', (m) => { if (m.gid === gid && ++got === n) resolve() })
      c.track(gid, 0)
    })
    return { got, ms: performance.now() - t0 }
  }, { url: server.wsUrl, token: server.token('reader'), gid, n: N })
  console.log(`catch-up: a second tab pulled ${pulled.got} in ${Math.round(pulled.ms)} ms (${Math.round(pulled.got / (pulled.ms / 1000))} msg/s)`)
} finally {
  await ctx.close()
  await server.stop()
  await rm(profile, { recursive: true, force: true })
}
