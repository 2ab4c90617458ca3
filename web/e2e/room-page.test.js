// Browser tests of the hosted waiting-room page (/rooms/{room}/) in a real
// headless Chromium against a real fanfared (embedded mode, free ports),
// and a real target site: a small Go program using package gate
// (testdata/gatesite), built and started here, which sends visitors
// without a token to the page and accepts the access token the page brings. Users ahead of the page's visitor are real SDK
// clients on the room socket. Screenshots: test-output/browser/room-*.png.

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, execFile } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdir, mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join as joinPath } from 'node:path'
import { promisify } from 'node:util'
import { startServer, SECRET, WebSocket, repoRoot, waitFor } from '../../client/js/testing/harness.js'
import { enterRoom } from '../../client/js/src/index.js'

const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium'
const shots = joinPath(repoRoot, 'test-output', 'browser')
const T = 45000 // generous: a busy 2-core machine

let chromium
try {
  ({ chromium } = await import('playwright-core'))
} catch (e) {
  throw new Error(`playwright-core is not installed (run npm ci at the repository root): ${e.message}`)
}
if (!existsSync(CHROMIUM)) {
  throw new Error(`no Chromium at ${CHROMIUM}: install Debian's chromium package (apt-get install chromium) or set CHROMIUM`)
}

let server, browser, gate, tmp
const problems = [] // page errors and unexpected console errors (CSP violations among them)
const ahead = [] // SDK rooms of users ahead, closed in after()

before(async () => {
  await mkdir(shots, { recursive: true })
  tmp = await mkdtemp(joinPath(tmpdir(), 'fanfare-roompage-'))
  server = await startServer()
  gate = await startGateSite(`${server.httpUrl}/rooms/sale/`)
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  })
})

after(async () => {
  for (const r of ahead) r.close()
  await browser?.close()
  await server?.stop()
  await gate?.stop()
  if (tmp) await rm(tmp, { recursive: true, force: true })
})

/**
 * startGateSite builds and runs testdata/gatesite: a "shop" behind package
 * gate that knows the room token secret and sends visitors without a token
 * to queueUrl. It prints its address.
 */
async function startGateSite(queueUrl) {
  const bin = joinPath(tmp, 'gatesite')
  await promisify(execFile)(process.env.GO || 'go', ['build', '-o', bin, './web/e2e/testdata/gatesite'], { cwd: repoRoot, maxBuffer: 16 << 20 })
  const proc = spawn(bin, ['-addr', '127.0.0.1:0', '-room-token-secret', SECRET, '-queue-url', queueUrl], { stdio: ['ignore', 'pipe', 'inherit'] })
  const url = await new Promise((resolve, reject) => {
    let out = ''
    const t = setTimeout(() => reject(new Error(`gatesite did not start: ${out}`)), 30000)
    proc.stdout.setEncoding('utf8')
    proc.stdout.on('data', (c) => {
      out += c
      const m = /listening on (http:\/\/\S+)/.exec(out)
      if (m) {
        clearTimeout(t)
        resolve(m[1])
      }
    })
    proc.on('exit', (code) => reject(new Error(`gatesite exited ${code}: ${out}`)))
  })
  return {
    url,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return
      const exited = new Promise((resolve) => proc.once('exit', resolve))
      process.kill(proc.pid, 'SIGTERM')
      await exited
    },
  }
}

async function newContext(opts = {}) {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 860 }, ...opts })
  ctx.setDefaultTimeout(T)
  return ctx
}

function watch(page, name, allow = null) {
  page.on('pageerror', (e) => problems.push(`${name}: page error: ${e.message}`))
  page.on('console', (m) => {
    if (m.type() === 'error' && !(allow && allow.test(m.text()))) problems.push(`${name}: console: ${m.text()}`)
  })
  return page
}

async function shot(page, name) {
  await page.screenshot({ path: joinPath(shots, `${name}.png`), fullPage: true })
}

/** ticketUID reads the uid out of a ticket cookie (ft1.<payload>.<mac>; payload tier|exp(8)|len(room)|room|uid). */
function ticketUID(ticket) {
  const b = Buffer.from(decodeURIComponent(ticket).split('.')[1], 'base64url')
  const roomLen = b[9]
  return b.subarray(10 + roomLen).toString('utf8')
}

async function ticketCookie(ctx, room) {
  const c = (await ctx.cookies(server.httpUrl)).find((c) => c.name === `fanfare_ticket_${room}`)
  return c
}

/**
 * aheadUser enters room as uid (over HTTP, then on the room socket with the
 * ticket) and waits until it has a place or is admitted. In a room with a
 * site target an admitted session outlives its socket (the user is on the
 * site), so users ahead make room by leave(), not close().
 */
async function aheadUser(room, uid) {
  const r = enterRoom({ httpUrl: server.httpUrl, url: server.wsBase, room, token: server.token(uid), WebSocket })
  ahead.push(r)
  let seen = false
  r.on('queue', () => { seen = true })
  r.on('granted', () => { seen = true })
  await waitFor(`${uid} in ${room}`, () => seen, T)
  return r
}

const fest = {
  title: 'Nordic Summer Tour 2027',
  text: 'Tickets for all 14 dates go on sale here.\nOne order per customer, up to 6 tickets.',
  colors: { background: '#0f1b2d', text: '#ffffff', accent: '#ffb703' },
  default_lang: 'en',
  strings: {
    en: { status_waiting: 'In the queue' },
    de: {
      title: 'Nordische Sommertournee 2027',
      text: 'Tickets für alle 14 Termine gibt es hier.',
      position: 'Ihr Platz in der Warteschlange',
      ahead: 'Vor Ihnen',
      eta: 'Geschätzte Wartezeit',
      total: 'Jetzt in der Schlange',
      next: 'Sie sind als Nächstes dran',
      status_waiting: 'In der Warteschlange',
      waiting: 'Bitte lassen Sie diese Seite geöffnet. Sie werden automatisch weitergeleitet.',
      leave: 'Warteschlange verlassen',
      eta_soon: 'Weniger als eine Minute',
      eta_minutes: 'Etwa {m} Min.',
      updated: 'Aktualisiert {time}',
    },
  },
}

test('an unknown room is a 404 page that says so', async () => {
  const ctx = await newContext()
  const page = watch(await ctx.newPage(), '404', /status of 404/)
  const resp = await page.goto(`${server.httpUrl}/rooms/no-such-sale/`)
  assert.equal(resp.status(), 404)
  assert.equal(await page.textContent('h1'), 'No such waiting room')
  assert.match(await page.textContent('main'), /no waiting room called “no-such-sale”/)
  await shot(page, 'room-404')
  await ctx.close()
})

test('the page enters, shows a live position as users ahead are admitted, keeps it over a reload, and on its turn goes to the site with a token gate accepts', async () => {
  await server.api('POST', '/admin/v1/rooms', {
    room: 'sale', max_active: 1, admit_rate: 100, smoothing_s: -1, grace_s: 120,
    site: { anonymous: true, target_url: `${gate.url}/shop`, title: 'Spring sale', text: 'Limited stock: the line keeps it fair.' },
  })
  const u0 = await aheadUser('sale', 'fan-0')
  await u0.granted() // fan-0 holds the only active slot
  const u1 = await aheadUser('sale', 'fan-1')
  const u2 = await aheadUser('sale', 'fan-2')
  // Places are ranked by the whole second of entry, ties by uid
  // (fanout/waitroom): the visitor ("anon:...") enters in a later second
  // than fan-1 and fan-2, so that it is behind them.
  await new Promise((resolve) => setTimeout(resolve, 1050 - (Date.now() % 1000)))

  const ctx = await newContext()
  const page = watch(await ctx.newPage(), 'visitor')
  // The visitor goes to the shop; gate sends it to the room's page.
  await page.goto(`${gate.url}/shop`)
  await page.waitForURL((u) => u.toString().startsWith(`${server.httpUrl}/rooms/sale/`))
  await page.locator('#card[data-view=waiting]').waitFor()
  await page.waitForFunction(() => document.getElementById('ahead').textContent === '2')
  assert.equal(await page.textContent('#position'), '3')
  assert.equal(await page.textContent('#title'), 'Spring sale')
  assert.equal(await page.getAttribute('#announce', 'aria-live'), 'polite')
  // The room admitted its first user a moment ago, before the node's next
  // snapshot: the visitor is told waiting at once, not paused.
  assert.match(await page.textContent('#announce'), /number 3 in line/)
  const uid = ticketUID((await ticketCookie(ctx, 'sale')).value)
  assert.match(uid, /^anon:/, 'an anonymous visitor has a server-minted uid')
  await shot(page, 'room-waiting')

  // A reload within the grace keeps the place: same uid, same position.
  await page.reload()
  await page.locator('#card[data-view=waiting]').waitFor()
  await page.waitForFunction(() => document.getElementById('ahead').textContent === '2')
  assert.equal(ticketUID((await ticketCookie(ctx, 'sale')).value), uid, 'the same identity after the reload')
  const st = await server.api('GET', '/admin/v1/rooms/sale')
  assert.equal(st.depth, 3, `three waiting (fan-1, fan-2, the visitor), not a second entry: ${JSON.stringify(st)}`)

  // Users ahead are admitted one by one: the page follows.
  await u0.leave() // fan-0 is done: fan-1 is admitted
  await page.waitForFunction(() => document.getElementById('ahead').textContent === '1')
  assert.equal(await page.textContent('#position'), '2')
  await u1.granted()
  await u1.leave()
  await page.waitForFunction(() => document.getElementById('ahead').textContent === '0')
  assert.equal(await page.textContent('#position'), "You're next")
  await shot(page, 'room-next')
  await u2.granted()
  const landed = page.waitForURL((u) => u.toString().startsWith(`${gate.url}/shop`), { timeout: T })
  await u2.leave()
  await page.locator('#card[data-view=granted]').waitFor()
  await shot(page, 'room-granted')
  await landed
  await page.locator('#user').waitFor()
  assert.equal(new URL(page.url()).search, '', 'gate moved the token from the query to its cookie')
  assert.ok((await ctx.cookies(gate.url)).some((c) => c.name === 'fanfare_access'), 'the gate\'s cookie')
  assert.equal(await page.textContent('#user'), uid, 'the site, through gate, sees the uid the ticket named')
  await shot(page, 'room-site')
  await ctx.close()
})

test('the page falls back to polling when the room socket cannot be opened', async () => {
  await server.api('POST', '/admin/v1/rooms', { room: 'poll', max_active: 1, admit_rate: 100, smoothing_s: -1, site: { anonymous: true } })
  const u0 = await aheadUser('poll', 'poller-0')
  await u0.granted()
  const ctx = await newContext()
  const page = watch(await ctx.newPage(), 'poller', /WebSocket/)
  let refused = 0
  await page.routeWebSocket(/\/rooms\/poll\/ws/, (ws) => { refused++; ws.close({ code: 1011, reason: 'blocked by the test' }) })
  await page.goto(`${server.httpUrl}/rooms/poll/`)
  await page.waitForFunction(() => document.getElementById('ahead').textContent === '0')
  assert.ok(refused >= 1, 'the page tried the socket first')
  u0.close()
  await page.locator('#card[data-view=granted]').waitFor()
  assert.match(await page.textContent('#granted-text'), /admitted/, 'no target: the page says so and offers the code')
  assert.equal(await page.isVisible('#copy'), true)
  await shot(page, 'room-granted-polling')
  await ctx.close()
})

test('the room\'s theme and a second language: title, colours and strings from the site object, picked by the browser\'s language', async () => {
  await server.api('POST', '/admin/v1/rooms', { room: 'tour', max_active: 1, admit_rate: 100, smoothing_s: -1, site: { anonymous: true, ...fest } })
  const holder = await aheadUser('tour', 'tour-0')
  await holder.granted()
  for (const [locale, title, label, badge] of [
    ['de-DE', fest.strings.de.title, fest.strings.de.position, fest.strings.de.status_waiting],
    ['en-GB', fest.title, 'Your place in line', 'In the queue'],
    ['fr-FR', fest.title, 'Your place in line', 'In the queue'], // no French: the default language
  ]) {
    const ctx = await newContext({ locale })
    const page = watch(await ctx.newPage(), `tour-${locale}`)
    await page.goto(`${server.httpUrl}/rooms/tour/`)
    await page.locator('#card[data-view=waiting]').waitFor()
    assert.equal(await page.textContent('#title'), title, locale)
    assert.equal(await page.textContent('#position-label'), label, locale)
    assert.equal(await page.textContent('#badge-text'), badge, locale)
    assert.equal(await page.getAttribute('html', 'lang'), locale.startsWith('de') ? 'de' : 'en')
    const colors = await page.evaluate(() => ({
      bg: getComputedStyle(document.body).backgroundColor,
      title: getComputedStyle(document.getElementById('title')).color,
      big: getComputedStyle(document.getElementById('position')).color,
    }))
    assert.deepEqual(colors, { bg: 'rgb(15, 27, 45)', title: 'rgb(255, 255, 255)', big: 'rgb(255, 183, 3)' }, locale)
    await shot(page, `room-theme-${locale}`)
    if (locale === 'de-DE') {
      await page.setViewportSize({ width: 390, height: 844 })
      await shot(page, 'room-theme-phone')
    }
    await ctx.close()
  }
})

test('a scheduled room counts down to its start, live, and lets the visitor in when it opens', async () => {
  const rfc = (ms) => new Date(Math.ceil(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z')
  const at = Date.now() + (3600 + 2 * 60 + 30) * 1000
  await server.api('POST', '/admin/v1/rooms', { room: 'launch', starts_at: rfc(at), site: { anonymous: true, ...fest, strings: undefined } })
  const doc = await (await fetch(`${server.httpUrl}/v1/rooms/launch/site`)).json()
  assert.equal(doc.phase, 'scheduled', JSON.stringify(doc))
  const ctx = await newContext()
  const page = watch(await ctx.newPage(), 'launch')
  await page.goto(`${server.httpUrl}/rooms/launch/`)
  await page.locator('#card[data-view=scheduled]').waitFor()
  assert.equal(await page.textContent('#badge-text'), 'Not open yet')
  assert.equal(await page.textContent('#cd-h'), '01')
  assert.match(await page.textContent('#cd-m'), /^0[12]$/)
  assert.equal(await page.isVisible('#cd-d'), false, 'no days box under a day')
  const s0 = await page.textContent('#cd-s')
  await page.waitForFunction((s) => document.getElementById('cd-s').textContent !== s, s0)
  assert.match(await page.getAttribute('#countdown', 'aria-label'), /^The line opens in 1 h 0[12] min\.$/)
  await shot(page, 'room-scheduled')
  await page.setViewportSize({ width: 390, height: 844 })
  await shot(page, 'room-scheduled-phone')
  await ctx.close()

  // A room opening in a few seconds: the countdown runs out, the pre-queue
  // is ordered, and the visitor (alone) is admitted.
  await server.api('POST', '/admin/v1/rooms', { room: 'soon', starts_at: rfc(Date.now() + 15000), site: { anonymous: true } })
  const ctx2 = await newContext()
  const p2 = watch(await ctx2.newPage(), 'soon')
  await p2.goto(`${server.httpUrl}/rooms/soon/`)
  await p2.locator('#card[data-view=scheduled]').waitFor()
  await p2.locator('#card[data-view=granted]').waitFor()
  await ctx2.close()
})

test('room text is inserted as text, never as markup; unreadable colours are replaced', async () => {
  await server.api('POST', '/admin/v1/rooms', {
    room: 'inject', max_active: 1, admit_rate: 100, smoothing_s: -1,
    site: {
      anonymous: true, title: '<img src=x onerror="window.pwned=1">', text: '<b>bold</b> & <script>window.pwned=2</script>',
      colors: { background: '#ffffff', text: '#f4f4f4', accent: '#fafafa' }, // valid hex, but white on white
    },
  })
  const ctx = await newContext()
  const page = watch(await ctx.newPage(), 'inject')
  await page.goto(`${server.httpUrl}/rooms/inject/`)
  await page.locator('#card[data-view=granted]').waitFor() // nobody ahead
  assert.equal(await page.textContent('#title'), '<img src=x onerror="window.pwned=1">')
  assert.equal(await page.locator('#title img, #text b, #text script').count(), 0)
  assert.equal(await page.evaluate(() => window.pwned), undefined)
  const c = await page.evaluate(() => ['title', 'granted-title'].map((id) => getComputedStyle(document.getElementById(id)).color))
  assert.deepEqual(c, ['rgb(17, 17, 17)', 'rgb(17, 17, 17)'], 'white-on-white text becomes dark')
  await ctx.close()
})

test('keyboard: the leave button is reachable by Tab and gives the place up', async () => {
  await server.api('POST', '/admin/v1/rooms', { room: 'keys', max_active: 1, admit_rate: 100, smoothing_s: -1, site: { anonymous: true } })
  const holder = await aheadUser('keys', 'keys-0')
  await holder.granted()
  const ctx = await newContext()
  const page = watch(await ctx.newPage(), 'keys')
  await page.goto(`${server.httpUrl}/rooms/keys/`)
  await page.locator('#card[data-view=waiting]').waitFor()
  await page.keyboard.press('Tab')
  assert.equal(await page.evaluate(() => document.activeElement.id), 'leave')
  await page.keyboard.press('Enter')
  await page.locator('#card[data-view=left]').waitFor()
  await waitFor('the room empty after leave', async () => (await server.api('GET', '/admin/v1/rooms/keys')).depth === 0, T)
  await ctx.close()
})

test('no page error and no console error (CSP violations included)', () => {
  assert.deepEqual(problems, [])
})
