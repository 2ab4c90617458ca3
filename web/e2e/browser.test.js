// Browser tests of the demo (/demo/) and the admin console (/admin/) in a
// real headless Chromium (Debian's chromium package) driven by
// playwright-core, against a real fanfared (embedded mode, temporary data
// directory, free ports) started by the SDK's test harness. Screenshots go
// to test-output/browser/. A missing chromium or node_modules fails the
// run: make test-browser says how to install them.

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { mkdir, mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join as joinPath } from 'node:path'
import { startServer, ADMIN, repoRoot, WebSocket } from '../../client/js/testing/harness.js'

const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium'
const shots = joinPath(repoRoot, 'test-output', 'browser')
const T = 30000 // generous: a busy 2-core machine

let chromium
try {
  ({ chromium } = await import('playwright-core'))
} catch (e) {
  throw new Error(`playwright-core is not installed (run npm ci at the repository root): ${e.message}`)
}
if (!existsSync(CHROMIUM)) {
  throw new Error(`no Chromium at ${CHROMIUM}: install Debian's chromium package (apt-get install chromium) or set CHROMIUM`)
}

let server, context, profile
const problems = [] // page errors and console errors (CSP violations among them)

before(async () => {
  await mkdir(shots, { recursive: true })
  // -ws-deflate: every page's sockets negotiate permessage-deflate, so
  // the whole suite runs over compressed frames both ways (Chromium
  // compresses what it sends, keeping its context within the 512-byte
  // window the server gives it).
  server = await startServer(['-ws-deflate'])
  profile = await mkdtemp(joinPath(tmpdir(), 'fanfare-chromium-'))
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 860 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  })
})

after(async () => {
  await context?.close()
  await server?.stop()
  if (profile) await rm(profile, { recursive: true, force: true })
})

// expected are the failed loads a test provokes on purpose (a wrong admin
// token, a bad limits document).
const expected = /Failed to load resource: the server responded with a status of (400|401)/

async function newPage(name, allow = null) {
  const page = await context.newPage()
  page.setDefaultTimeout(T)
  page.on('pageerror', (e) => problems.push(`${name}: page error: ${e.message}`))
  page.on('console', (m) => {
    if (m.type() === 'error' && !(allow && allow.test(m.text()))) problems.push(`${name}: console: ${m.text()}`)
  })
  return page
}

async function shot(page, name) {
  await page.screenshot({ path: joinPath(shots, `${name}.png`), fullPage: true })
}

// join opens the demo as user in group and waits until it is connected.
async function join(page, user, group = 'lobby') {
  await page.goto(`${server.httpUrl}/demo/`)
  await page.fill('#user', user)
  await page.selectOption('#group', group)
  await page.click('#join')
  await page.waitForFunction(() => document.getElementById('conn-state').textContent === 'connected')
  await page.waitForFunction(() => !document.getElementById('send').disabled)
}

async function say(page, text) {
  await page.fill('#text', text)
  await page.click('#send')
  await page.waitForFunction(() => /acked: seq \d+/.test(document.getElementById('chat-note').textContent))
}

// seen waits for a message with text in page and returns its seq.
async function seen(page, text) {
  const li = page.locator('#messages li', { hasText: text })
  await li.first().waitFor()
  return Number(await li.first().getAttribute('data-seq'))
}

let alice, bob, gid

test('the demo chats between two pages, with seqs', async () => {
  alice = await newPage('alice')
  bob = await newPage('bob')
  await join(alice, 'alice')
  await join(bob, 'bob')
  await say(alice, 'hello from alice')
  const s1 = await seen(bob, 'hello from alice')
  await say(bob, 'hi alice, bob here')
  const s2 = await seen(alice, 'hi alice, bob here')
  assert.ok(s1 >= 1, `got seq ${s1}, want a positive seq`)
  assert.equal(s2, s1 + 1, 'the reply has the next seq')
  assert.equal(await seen(alice, 'hello from alice'), s1, 'both pages show the same seq')
  const title = await alice.textContent('#chat-title')
  gid = Number(/gid (\d+)/.exec(title)[1])
  assert.ok(gid > 0, `chat title ${title} names the gid`)
  await shot(alice, 'chat-alice')
  await shot(bob, 'chat-bob')
})

test('Chromium negotiates permessage-deflate, and long messages arrive intact both ways', async () => {
  const carol = await newPage('carol')
  const cdp = await context.newCDPSession(carol)
  await cdp.send('Network.enable')
  const answers = []
  cdp.on('Network.webSocketHandshakeResponseReceived', (e) => {
    const h = e.response.headers
    answers.push(h['Sec-WebSocket-Extensions'] ?? h['sec-websocket-extensions'] ?? '')
  })
  await join(carol, 'carol')
  assert.ok(answers.length >= 1, 'saw the socket handshake')
  assert.match(answers[0], /permessage-deflate/)
  assert.match(answers[0], /server_no_context_takeover/)
  assert.match(answers[0], /client_max_window_bits=9/)
  // Two long, similar messages: the browser compresses both, the second
  // referring back into the first; bob gets both pushed compressed.
  const long = (n) => `carol ${n}: ` + 'the stands sing the old song of the club, louder each time. '.repeat(28)
  await say(carol, long(1))
  await say(carol, long(2))
  const s1 = await seen(bob, long(1))
  const s2 = await seen(bob, long(2))
  assert.equal(s2, s1 + 1)
  assert.equal(await carol.locator('#messages li', { hasText: long(2) }).count(), 1)
  await carol.close()
})

test('a page that went offline catches up by pull when it is back', async () => {
  await bob.click('#offline')
  await bob.waitForFunction(() => document.getElementById('conn-state').textContent.startsWith('offline'))
  await say(alice, 'while bob was away 1')
  await say(alice, 'while bob was away 2')
  await shot(bob, 'offline-bob')
  await bob.click('#offline')
  for (const text of ['while bob was away 1', 'while bob was away 2']) {
    await seen(bob, text)
    const tag = bob.locator('#messages li', { hasText: text }).locator('.tag')
    assert.equal(await tag.textContent(), 'pulled', `${text}: delivered by the catch-up pull`)
  }
  await bob.locator('#messages li.sys', { hasText: 'caught up 2 messages' }).waitFor()
  await say(bob, 'back online')
  await seen(alice, 'back online')
  await shot(bob, 'caught-up-bob')
})

test('the console forces the group to L3 and back while the demo shows it', async () => {
  const admin = await newPage('admin', expected)
  await admin.goto(`${server.httpUrl}/admin/`)
  await admin.fill('#token', 'not-the-admin-token')
  await admin.click('#signin button')
  await admin.locator('#signin-error', { hasText: 'not this node' }).waitFor()
  await admin.fill('#token', ADMIN)
  await admin.press('#token', 'Enter') // keyboard sign-in
  await admin.locator('#console').waitFor()
  assert.equal(await admin.evaluate(() => localStorage.length), 0, 'nothing in localStorage')
  assert.equal(await admin.evaluate(() => document.cookie), '', 'no cookie')
  // The charts have points, the online panel lists the demo group.
  await admin.locator('#online-body tr', { hasText: String(gid) }).first().waitFor()
  await admin.locator('#rooms-body tr[data-room="demo"]').waitFor()
  // The rooms table breaks the queue down by tier, summing to the waiting column.
  const room = admin.locator('#rooms-body tr[data-room="demo"] td')
  const byTier = (await room.nth(5).textContent()).split(' / ').map(Number)
  assert.equal(byTier.length, 4, 'four tiers in the by-tier cell')
  assert.equal(byTier.reduce((a, b) => a + b, 0), Number(await room.nth(2).textContent()), 'by tier sums to waiting')
  // The max-wait guarantee's columns: phase, pre-queue, owed / capacity, violations (0).
  assert.equal(await room.nth(14).textContent(), 'open', 'phase of an unscheduled room')
  assert.equal(await room.nth(15).textContent(), '0', 'no pre-queue')
  assert.match(await room.nth(16).textContent(), /^\d+ \/ \d+$/, 'owed / capacity')
  assert.equal(await room.nth(17).textContent(), '0', 'no max-wait violation')

  await admin.fill('#g-gid', String(gid))
  await admin.selectOption('#g-level', '3')
  await admin.click('#g-force')
  await admin.locator(`#groups-body tr[data-gid="${gid}"]`, { hasText: 'L3' }).first().waitFor()
  for (const p of [alice, bob]) {
    await p.waitForFunction(() => document.getElementById('group-level').textContent === 'L3' &&
      document.getElementById('eff-level').textContent === 'L3')
  }
  // At L3 nothing is pushed: bob's page gets alice's message by its poll.
  await say(alice, 'sent at level 3')
  await seen(bob, 'sent at level 3')
  assert.equal(await bob.locator('#messages li', { hasText: 'sent at level 3' }).locator('.tag').textContent(), 'pulled')
  assert.equal(await bob.locator('#messages li.sys', { hasText: 'caught up' }).textContent(),
    'online again: caught up 2 messages by pull', 'a level 3 poll is not counted as catch-up')
  await admin.waitForTimeout(2500) // a few chart points
  await shot(admin, 'console-group-l3')
  await shot(bob, 'demo-group-l3')

  await admin.click('#g-clear')
  await admin.locator(`#groups-body tr[data-gid="${gid}"]`).waitFor({ state: 'detached' })
  for (const p of [alice, bob]) {
    await p.waitForFunction(() => document.getElementById('group-level').textContent === 'L0')
  }
  await shot(bob, 'demo-group-l0-again')

  // The node's level reaches the pages too (a degraded frame without gid).
  await admin.selectOption('#n-level', '1')
  await admin.fill('#n-ttl', '120')
  await admin.click('#n-force')
  await admin.locator('#node-level', { hasText: 'L1' }).waitFor()
  await bob.waitForFunction(() => document.getElementById('node-level').textContent === 'L1' &&
    document.getElementById('eff-level').textContent === 'L1' && document.getElementById('group-level').textContent === 'L0')
  await shot(bob, 'demo-node-l1')
  await admin.click('#n-clear')
  await bob.waitForFunction(() => document.getElementById('node-level').textContent === 'L0')

  // Limits: a bad document shows the server's error, a dry run changes nothing.
  const doc = await admin.inputValue('#limits')
  await admin.fill('#limits', doc.replace('"vip_from_level": 1', '"vip_from_level": 1, "bogus": 2'))
  await admin.click('#l-validate')
  await admin.locator('#limits-msg', { hasText: 'bad_request' }).waitFor()
  await admin.fill('#limits', doc)
  await admin.click('#l-validate')
  await admin.locator('#limits-msg', { hasText: 'valid: nothing changed' }).waitFor()
  await admin.close()
})

test('the waiting room page shows its place until it is granted', async () => {
  await alice.click('#enter')
  await alice.locator('#r-status', { hasText: 'granted' }).waitFor()
  await bob.click('#enter')
  await bob.locator('#r-status', { hasText: 'waiting' }).waitFor()
  assert.equal(await bob.textContent('#r-position'), '1')
  assert.match(await bob.textContent('#r-eta'), /^\d+ s( \(next in line\))?$/)
  await shot(bob, 'room-waiting-bob')
  await shot(alice, 'room-granted-alice')
  await alice.click('#leave')
  await bob.locator('#r-status', { hasText: 'granted' }).waitFor()
  await shot(bob, 'room-granted-bob')
})

// granted connects uid (tier lvl) to room and resolves with the open
// socket once it is granted.
function granted(room, uid, lvl) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${server.wsBase}/rooms/${room}/ws?token=${server.token(uid, { lvl })}`)
    const t = setTimeout(() => { ws.close(); reject(new Error(`${uid} not granted within ${T} ms`)) }, T)
    ws.on('message', (data) => {
      if (JSON.parse(data).type === 'granted') {
        clearTimeout(t)
        resolve(ws)
      }
    })
    ws.on('error', (e) => { clearTimeout(t); reject(e) })
  })
}

test('the console shows what this node admitted and the waits, by tier', async () => {
  // A room admitting one user a second; seven users of tiers 0, 2 and 3
  // arrive at once, so most of them wait a few seconds. The demo room
  // admitted alice and bob in the test before.
  await server.api('POST', '/admin/v1/rooms', { room: 'sale', max_active: 20, admit_rate: 1 })
  const users = [['n1', 0], ['n2', 0], ['n3', 0], ['n4', 0], ['v2a', 2], ['v2b', 2], ['v3', 3]]
  const sockets = await Promise.all(users.map(([uid, lvl]) => granted('sale', uid, lvl)))
  const { rooms } = await server.api('GET', '/admin/v1/rooms')
  const api = Object.fromEntries(rooms.map((x) => [x.room, x]))
  assert.deepEqual(api.sale.admitted_by_tier, [4, 0, 2, 1])
  assert.deepEqual(api.sale.wait_by_tier.map((w) => w.n), [4, 0, 2, 1])
  assert.ok(Math.max(...api.sale.wait_by_tier.map((w) => w.max_s)) >= 2,
    `seven admissions at 1/s: someone waited at least 2 s (${JSON.stringify(api.sale.wait_by_tier)})`)
  assert.equal(api.demo.admitted_by_tier.reduce((a, b) => a + b, 0), 2, 'alice and bob admitted to the demo room')

  const admin = await newPage('admin-rooms')
  await admin.goto(`${server.httpUrl}/admin/`)
  await admin.fill('#token', ADMIN)
  await admin.press('#token', 'Enter')
  await admin.locator('#rooms-body tr[data-room="sale"]').waitFor()
  const secs = (v) => v < 60 ? `${Math.round(v)}s` : null // the waits here are short
  for (const name of ['sale', 'demo']) {
    const cells = admin.locator(`#rooms-body tr[data-room="${name}"] td`)
    assert.equal(await cells.nth(18).textContent(), api[name].admitted_by_tier.join(' / '), `${name}: admitted by tier`)
    // One line per tier with waits: "tier: p50 / p99", as the API says.
    const lines = await cells.nth(19).locator('div').allTextContents()
    const want = api[name].wait_by_tier.flatMap((w, tier) => w.n ? [`${tier}: ${secs(w.p50_s)} / ${secs(w.p99_s)}`] : [])
    assert.deepEqual(lines, want, `${name}: wait p50 / p99 lines`)
    assert.ok(lines.length >= 1, `${name}: at least one tier with waits`)
    assert.match(await cells.nth(19).getAttribute('title'), /tier 0: \d+ waits, p50 \d+s, p90 \d+s, p99 \d+s, max \d+s/)
  }
  assert.deepEqual(await admin.locator('#rooms-body tr[data-room="sale"] td').nth(19).locator('div').evaluateAll((ds) => ds.map((d) => d.dataset.tier)),
    ['0', '2', '3'], 'sale: lines for tiers 0, 2 and 3')
  assert.equal(await admin.locator('#rooms-body tr[data-room="sale"] td').nth(17).textContent(), '0', 'no max-wait violation')
  // Readable at 1280 px: the page does not scroll sideways (the shots
  // are taken first, to see what went wrong when it does).
  const overflow = await admin.evaluate(() => {
    const t = document.querySelector('#rooms-body').closest('table')
    return { table: t.scrollWidth, card: t.parentElement.clientWidth, page: document.documentElement.scrollWidth, view: window.innerWidth }
  })
  await shot(admin, 'console-rooms-admitted')
  await admin.locator('#h-rooms').locator('xpath=..').screenshot({ path: joinPath(shots, 'console-rooms-admitted-card.png') })
  assert.ok(overflow.table <= overflow.card && overflow.page <= overflow.view, `rooms table wider than its card at 1280 px: ${JSON.stringify(overflow)}`)
  for (const ws of sockets) ws.close()
  await admin.close()
})

test('no page error and no console error (CSP violations included)', () => {
  assert.deepEqual(problems, [])
})
