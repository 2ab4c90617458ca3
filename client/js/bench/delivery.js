// Delivery benchmark of the JavaScript SDK: how many messages per second
// one Node client keeps up with in one group.
//
//   node client/js/bench/delivery.js [-rates 1000,2000,4000,8000] [-seconds 3] [-senders 4] [-body 100] [-catchup 50000]
//
// It starts its own fanfared (embedded mode; $FANFARED_BIN or a go build of
// this checkout), turns the send and pull rate limits off (PUT
// /admin/v1/limits: the rules `fanfare bench -limits off` turns off, plus
// pull and frame_pull, which would otherwise pace the catch-up at 10 pulls
// a second), and then:
//   1. live: `senders` SDK clients in a worker thread (so that sending does
//      not compete with receiving for the main thread) send at each
//      offered rate for `seconds`; one receiving SDK client on the main
//      thread counts what it gets. Per step: offered and acked rates, the
//      receiver's delivered rate, how many came by pull (after resync),
//      and the lag from the ack of the highest seq to its delivery. The
//      receiver keeps up while delivered = acked, nothing is pulled and
//      the lag stays small.
//   2. catch-up: the messages stored so far (topped up to `catchup`), read
//      by a fresh client that tracks the group from seq 0: deliveries/s
//      through pulls (pages of 200).

import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads'
import { connect } from '../src/index.js'
import { startServer, WebSocket, sign } from '../testing/harness.js'

const now = () => performance.timeOrigin + performance.now()

if (!isMainThread) {
  // The senders.
  const { wsUrl, uids, gid, bodyBytes } = workerData
  const senders = await Promise.all(uids.map((u) => connect({ url: wsUrl, token: sign(u), WebSocket, maxQueuedSends: 1000000 })))
  const pad = 'x'.repeat(Math.max(0, bodyBytes - 20))
  parentPort.on('message', async (job) => {
    if (job.stop) {
      await Promise.all(senders.map((c) => c.close()))
      parentPort.close()
      return
    }
    const { rate, total } = job
    const acks = []
    const t0 = now()
    let sent = 0
    await new Promise((resolve) => {
      const tick = setInterval(() => {
        const due = Math.min(total, Math.round(((now() - t0) / 1000) * rate))
        for (; sent < due; sent++) acks.push(senders[sent % senders.length].send(gid, { n: sent, pad }).then((a) => ({ seq: a.seq, at: now() })))
        if (sent >= total) {
          clearInterval(tick)
          resolve()
        }
      }, 5)
    })
    const done = await Promise.all(acks)
    let top = done[0]
    for (const a of done) if (a.seq > top.seq) top = a
    parentPort.postMessage({ t0, acked: now(), maxSeq: top.seq, maxAckAt: top.at })
  })
  parentPort.postMessage({ ready: true })
} else {
  const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('-') ? [...acc, [a.slice(1), all[i + 1]]] : acc), []))
  const rates = (args.rates ?? '1000,2000,4000,8000').split(',').map(Number)
  const seconds = Number(args.seconds ?? 3)
  const nSenders = Number(args.senders ?? 4)
  const bodyBytes = Number(args.body ?? 100)
  const catchup = Number(args.catchup ?? 50000)

  const srv = await startServer()
  try {
    const limits = await srv.api('GET', '/admin/v1/limits')
    for (const name of ['user_group', 'user_all', 'group', 'downlink', 'frame_send', 'frame_user', 'pull', 'frame_pull']) {
      limits.rules[name] = { ...(limits.rules[name] ?? { algorithm: 'gcra', window: '1s' }), limit: 0 }
    }
    await srv.api('PUT', '/admin/v1/limits', limits)
    const uids = Array.from({ length: nSenders }, (_, i) => `s${i}`)
    const gid = await srv.group(...uids, 'rx')
    const worker = new Worker(new URL(import.meta.url), { workerData: { wsUrl: srv.wsUrl, uids, gid, bodyBytes } })
    const replies = []
    let wake = null
    worker.on('message', (m) => { replies.push(m); wake?.() })
    const reply = async () => {
      while (replies.length === 0) await new Promise((r) => { wake = r })
      return replies.shift()
    }
    await reply() // ready
    const rx = await connect({ url: srv.wsUrl, httpUrl: srv.httpUrl, WebSocket, token: srv.token('rx') })
    let delivered = 0
    let pulled = 0
    let lastSeq = 0
    let lastAt = 0
    const seen = new Map()
    rx.on('message', (m) => {
      delivered++
      if (m.pulled) pulled++
      lastSeq = m.seq
      lastAt = now()
      seen.set(m.seq, lastAt)
    })
    let resyncs = 0
    rx.on('resync', () => resyncs++)
    console.log(`fanfared ${srv.httpUrl}; ${nSenders} senders (worker thread), 1 receiver, one group, ${bodyBytes}-byte bodies, ${seconds} s per step`)
    console.log('offered/s  acked/s  delivered/s  pulled  resyncs  lag_ms')
    for (const rate of rates) {
      const d0 = delivered
      const p0 = pulled
      const r0 = resyncs
      const total = Math.round(rate * seconds)
      worker.postMessage({ rate, total })
      const r = await reply()
      const deadline = now() + 60000
      while (lastSeq < r.maxSeq && now() < deadline) await new Promise((res) => setTimeout(res, 2))
      const got = delivered - d0
      const span = (Math.max(lastAt, r.acked) - r.t0) / 1000
      const lag = seen.has(r.maxSeq) ? Math.max(0, seen.get(r.maxSeq) - r.maxAckAt) : NaN
      console.log(`${String(rate).padStart(9)}  ${String(Math.round(total / ((r.acked - r.t0) / 1000))).padStart(7)}  ${String(Math.round(got / span)).padStart(11)}  ${String(pulled - p0).padStart(6)}  ${String(resyncs - r0).padStart(7)}  ${lag.toFixed(0).padStart(6)}${got === total ? '' : `  (got ${got} of ${total})`}`)
      seen.clear()
    }
    const extra = Math.max(0, catchup - lastSeq)
    if (extra > 0) {
      worker.postMessage({ rate: 20000, total: extra })
      const r = await reply()
      while (lastSeq < r.maxSeq) await new Promise((res) => setTimeout(res, 5))
    }
    worker.postMessage({ stop: true })
    const want = lastSeq
    const fresh = await connect({ url: srv.wsUrl, WebSocket, token: srv.token('rx') })
    let n = 0
    let done
    const finished = new Promise((resolve) => { done = resolve })
    fresh.on('message', () => { if (++n === want) done() })
    const c0 = now()
    fresh.track(gid, 0)
    await finished
    const ct = (now() - c0) / 1000
    console.log(`catch-up: ${want} stored messages delivered by pull in ${ct.toFixed(2)} s = ${Math.round(want / ct)} msg/s (${fresh.stats().pulls} pulls of up to 200)`)
    await Promise.all([rx.close(), fresh.close()])
  } finally {
    await srv.stop()
  }
}
