// Delivery benchmark in a browser tab: how many messages per second the SDK
// keeps up with in headless Chromium (Debian's chromium, driven by npm
// playwright-core), one group, senders in Node.
//
//   node client/js/bench/browser.js [-rates 1000,2000,4000] [-seconds 3] [-senders 4] [-body 100] [-chromium /usr/bin/chromium]
//
// Like delivery.js: its own fanfared (embedded mode, -allowed-origins * for
// the page's origin), send limits off, and per offered rate the acked rate,
// what the tab delivered per second, how much came by pull, and the lag
// from the ack of the highest seq to its delivery in the tab.

import { createServer } from 'node:http'
import { readFile } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { chromium } from 'playwright-core'
import { connect } from '../src/index.js'
import { startServer, WebSocket } from '../testing/harness.js'

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('-') ? [...acc, [a.slice(1), all[i + 1]]] : acc), []))
const rates = (args.rates ?? '1000,2000,4000').split(',').map(Number)
const seconds = Number(args.seconds ?? 3)
const nSenders = Number(args.senders ?? 4)
const bodyBytes = Number(args.body ?? 100)
const root = fileURLToPath(new URL('..', import.meta.url))

const srv = await startServer(['-allowed-origins', '*'])
const web = createServer(async (req, res) => {
  const path = req.url.split('?')[0]
  if (path === '/') {
    res.setHeader('Content-Type', 'text/html')
    res.end('<!doctype html><title>fanfare SDK bench</title>')
    return
  }
  try {
    const body = await readFile(root + path.replace(/\.\.+/g, ''))
    res.setHeader('Content-Type', 'text/javascript')
    res.end(body)
  } catch {
    res.statusCode = 404
    res.end()
  }
}).listen(0, '127.0.0.1')
await new Promise((r) => web.once('listening', r))
const browser = await chromium.launch({ executablePath: args.chromium ?? '/usr/bin/chromium', args: ['--no-sandbox'] })
try {
  const limits = await srv.api('GET', '/admin/v1/limits')
  for (const name of ['user_group', 'user_all', 'group', 'downlink', 'frame_send', 'frame_user', 'pull', 'frame_pull']) {
    limits.rules[name] = { ...(limits.rules[name] ?? { algorithm: 'gcra', window: '1s' }), limit: 0 }
  }
  await srv.api('PUT', '/admin/v1/limits', limits)
  const uids = Array.from({ length: nSenders }, (_, i) => `s${i}`)
  const gid = await srv.group(...uids, 'tab')
  const page = await browser.newPage()
  await page.goto(`http://127.0.0.1:${web.address().port}/`)
  await page.evaluate(async ({ url, token }) => {
    const { connect } = await import('/src/index.js')
    const c = await connect({ url, token })
    window.bench = { delivered: 0, pulled: 0, resyncs: 0, lastSeq: 0, at: new Map() }
    c.on('message', (m) => {
      const b = window.bench
      b.delivered++
      if (m.pulled) b.pulled++
      b.lastSeq = m.seq
      b.at.set(m.seq, performance.timeOrigin + performance.now())
    })
    c.on('resync', () => window.bench.resyncs++)
  }, { url: srv.wsUrl, token: srv.token('tab') })
  const senders = await Promise.all(uids.map((u) => connect({ url: srv.wsUrl, token: srv.token(u), WebSocket, maxQueuedSends: 1000000 })))
  const pad = 'x'.repeat(Math.max(0, bodyBytes - 20))
  const ua = await browser.version()
  console.log(`fanfared ${srv.httpUrl}; Chromium ${ua} tab receiving, ${nSenders} senders in Node, one group, ${bodyBytes}-byte bodies, ${seconds} s per step`)
  console.log('offered/s  acked/s  delivered/s  pulled  resyncs  lag_ms')
  for (const rate of rates) {
    const before = await page.evaluate(() => ({ d: window.bench.delivered, p: window.bench.pulled, r: window.bench.resyncs }))
    const total = Math.round(rate * seconds)
    const acks = []
    const t0 = performance.timeOrigin + performance.now()
    let sent = 0
    await new Promise((resolve) => {
      const tick = setInterval(() => {
        const due = Math.min(total, Math.round(((performance.timeOrigin + performance.now() - t0) / 1000) * rate))
        for (; sent < due; sent++) acks.push(senders[sent % nSenders].send(gid, { n: sent, pad }).then((a) => ({ seq: a.seq, at: performance.timeOrigin + performance.now() })))
        if (sent >= total) {
          clearInterval(tick)
          resolve()
        }
      }, 5)
    })
    const done = await Promise.all(acks)
    const tAcked = performance.timeOrigin + performance.now()
    let top = done[0]
    for (const a of done) if (a.seq > top.seq) top = a
    await page.waitForFunction((seq) => window.bench.lastSeq >= seq, top.seq, { timeout: 60000, polling: 20 })
    const after = await page.evaluate((seq) => {
      const b = window.bench
      let last = 0
      for (const t of b.at.values()) last = Math.max(last, t)
      const r = { d: b.delivered, p: b.pulled, r: b.resyncs, last, top: b.at.get(seq) }
      b.at.clear()
      return r
    }, top.seq)
    const got = after.d - before.d
    const span = (Math.max(after.last, tAcked) - t0) / 1000
    console.log(`${String(rate).padStart(9)}  ${String(Math.round(total / ((tAcked - t0) / 1000))).padStart(7)}  ${String(Math.round(got / span)).padStart(11)}  ${String(after.p - before.p).padStart(6)}  ${String(after.r - before.r).padStart(7)}  ${Math.max(0, after.top - top.at).toFixed(0).padStart(6)}${got === total ? '' : `  (got ${got} of ${total})`}`)
  }
  await Promise.all(senders.map((c) => c.close()))
} finally {
  await browser.close()
  web.close()
  await srv.stop()
}
