// The hosted waiting-room page (/rooms/{room}/, docs/protocol.md §12): a
// site sends its visitors here. It reads the room's public site document
// (theme, strings, phase), enters over HTTP (the ticket cookie is the
// visitor's identity, so a reload keeps the place), waits on the room
// socket with ?ticket= or, when the socket cannot be opened, by polling,
// and on its turn sends the visitor to the site with the access token.
//
// Room data is only ever inserted as text (textContent), colours only
// after a hex check, through CSS custom properties. Nothing is loaded from
// outside the node but the room's logo.

import { enterRoom, roomSite } from '../../sdk/src/index.js'
import { en, pickLanguage, resolveStrings, format } from './strings.js'

const $ = (id) => document.getElementById(id)
const HEX = /^#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6})$/

// /rooms/{room}/ under whatever prefix a proxy serves the node at.
const m = /^(.*)\/rooms\/([^/]+)\/?$/.exec(location.pathname)
const roomName = m ? decodeURIComponent(m[2]) : ''
const httpUrl = location.origin + (m ? m[1] : '')

let S = { ...en } // the strings in effect
let lang = 'en'
let site = {}
let clockOffset = 0 // server time - local time, ms (from the site answer's Date)
let room = null
let view = ''
let firstPosition = 0
let lastAnnounce = 0
let lastAnnounced = ''
let ticker = null
let redirectTimer = null
let token = ''

// A user token may come in the fragment (#token=...): never sent to a
// server by the browser, and removed from the address bar at once.
if (location.hash.length > 1) {
  const h = new URLSearchParams(location.hash.slice(1))
  token = h.get('token') || ''
  if (token) history.replaceState(null, '', location.pathname + location.search)
}

function nf(n) {
  try {
    return new Intl.NumberFormat(lang).format(n)
  } catch {
    return String(n)
  }
}

function clock(ms) {
  try {
    return new Intl.DateTimeFormat(lang, { hour: '2-digit', minute: '2-digit', second: '2-digit' }).format(new Date(ms))
  } catch {
    return new Date(ms).toLocaleTimeString()
  }
}

function when(ms) {
  try {
    return new Intl.DateTimeFormat(lang, { dateStyle: 'full', timeStyle: 'short' }).format(new Date(ms))
  } catch {
    return new Date(ms).toString()
  }
}

function setText(id, text) {
  const el = $(id)
  if (el.textContent !== text) el.textContent = text
}

/** duration is a short human wait: "2 min 05 s" style, used for retries. */
function duration(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000))
  if (s < 60) return `${s} s`
  const mnt = Math.floor(s / 60)
  if (mnt < 60) return `${mnt} min ${String(s % 60).padStart(2, '0')} s`
  return `${Math.floor(mnt / 60)} h ${String(mnt % 60).padStart(2, '0')} min`
}

function etaText(etaS) {
  if (!Number.isFinite(etaS)) return S.eta_unknown
  if (etaS < 60) return S.eta_soon
  const mins = Math.ceil(etaS / 60)
  if (mins < 60) return format(S.eta_minutes, { m: nf(mins) })
  return format(S.eta_hours, { h: nf(Math.floor(mins / 60)), m: nf(mins % 60) })
}

// ---- theme ------------------------------------------------------------

function rgb(hex) {
  let h = hex.slice(1)
  if (h.length === 3) h = [...h].map((c) => c + c).join('')
  return [0, 2, 4].map((i) => parseInt(h.slice(i, i + 2), 16))
}

function luminance(hex) {
  const [r, g, b] = rgb(hex).map((v) => {
    const c = v / 255
    return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4
  })
  return 0.2126 * r + 0.7152 * g + 0.0722 * b
}

function contrast(a, b) {
  const [x, y] = [luminance(a), luminance(b)].sort((p, q) => q - p)
  return (x + 0.05) / (y + 0.05)
}

function mix(a, b, t) {
  const [p, q] = [rgb(a), rgb(b)]
  return '#' + p.map((v, i) => Math.round(v + (q[i] - v) * t).toString(16).padStart(2, '0')).join('')
}

function readableOn(bg, ...candidates) {
  for (const c of candidates) if (c && contrast(c, bg) >= 4.5) return c
  return contrast('#111111', bg) >= contrast('#ffffff', bg) ? '#111111' : '#ffffff'
}

/**
 * applyTheme sets the room's colours as custom properties. The server
 * validates them; they are checked again here, and a text colour that
 * would be unreadable (WCAG contrast under 4.5:1) is replaced.
 */
function applyTheme(colors) {
  const c = colors && typeof colors === 'object' ? colors : {}
  const pick = (v, d) => (typeof v === 'string' && HEX.test(v) ? v : d)
  const bg = pick(c.background, '#eef1f6')
  const dark = luminance(bg) < 0.2
  const surface = dark ? mix(bg, '#ffffff', 0.08) : mix(bg, '#ffffff', 0.85)
  const fg = readableOn(surface, pick(c.text, dark ? '#f4f6fb' : '#161b26'))
  let accent = pick(c.accent, dark ? '#8ea2ff' : '#3451d1')
  if (contrast(accent, surface) < 3) accent = fg // the big number must stay legible
  const root = document.documentElement.style
  root.setProperty('--bg', bg)
  root.setProperty('--surface', surface)
  root.setProperty('--fg', fg)
  root.setProperty('--muted', mix(fg, surface, 0.35))
  root.setProperty('--line', mix(fg, surface, 0.85))
  root.setProperty('--accent', accent)
  root.setProperty('--on-accent', readableOn(accent, '#ffffff', '#111111'))
  // The page title and text sit on the background, not on the card.
  const brand = readableOn(bg, fg)
  root.setProperty('--brand-fg', brand)
  root.setProperty('--brand-muted', readableOn(bg, mix(brand, bg, 0.3), brand))
  // Status colours readable on the card: darker on a light one, lighter on a dark one.
  root.setProperty('--warn', readableOn(surface, dark ? '#ffb454' : '#a15c00'))
  root.setProperty('--ok', dark ? '#3fb96f' : '#1f7a3f')
  document.body.classList.toggle('dark', dark)
}

/**
 * applySite renders the site document: {room, state, phase, starts_at,
 * ends_at, site: {title, text, logo_url, colors, strings, default_lang}}.
 */
function applySite(doc) {
  const d = doc && typeof doc === 'object' ? doc : {}
  const theme = d.site && typeof d.site === 'object' ? d.site : {}
  site = { ...theme, phase: d.phase, state: d.state, starts_at: d.starts_at, ends_at: d.ends_at }
  const langs = navigator.languages?.length ? navigator.languages : [navigator.language]
  lang = pickLanguage(site.strings, site.default_lang, langs)
  S = resolveStrings(site.strings, lang, site.default_lang)
  document.documentElement.lang = lang
  const own = site.strings && typeof site.strings === 'object' ? site.strings[lang] : null
  const title = (own && typeof own.title === 'string' && own.title) || (typeof site.title === 'string' && site.title) || S.title
  const text = (own && typeof own.text === 'string' && own.text) || (typeof site.text === 'string' && site.text) || S.text
  setText('title', title)
  $('text').hidden = !text
  setText('text', text)
  document.title = title
  const logo = typeof site.logo_url === 'string' ? site.logo_url : ''
  if (logo && (/^https:\/\//i.test(logo) || /^\/(?!\/)/.test(logo))) {
    const img = $('logo')
    img.alt = title
    img.src = logo
    img.hidden = false
    img.onerror = () => { img.hidden = true }
  }
  applyTheme(site.colors)
  for (const [id, key] of [['loading-text', 'connecting'], ['position-label', 'position'], ['ahead-label', 'ahead'],
    ['eta-label', 'eta'], ['total-label', 'total'], ['countdown-label', 'countdown'], ['cd-d-l', 'days'], ['cd-h-l', 'hours'],
    ['cd-m-l', 'minutes'], ['cd-s-l', 'seconds'], ['scheduled-note', 'scheduled_note'], ['continue', 'continue'],
    ['copy', 'copy_code'], ['check', 'check_again'], ['rejoin', 'join_again'], ['leave', 'leave'], ['left-title', 'left'],
    ['granted-title', 'granted'], ['error-title', 'error']]) {
    setText(id, S[key])
  }
}

/** ms reads a time of the site document: Unix ms, or an RFC 3339 string. */
function ms(v) {
  if (Number.isFinite(v) && v > 0) return v
  if (typeof v === 'string' && v) {
    const t = Date.parse(v)
    if (Number.isFinite(t)) return t
  }
  return 0
}

// ---- views ------------------------------------------------------------

const views = ['loading', 'waiting', 'scheduled', 'granted', 'rejected', 'closed', 'left', 'notfound', 'error']

function show(name, badge) {
  const card = $('card')
  card.dataset.view = name
  card.setAttribute('aria-busy', name === 'loading' ? 'true' : 'false')
  const section = name === 'paused' ? 'waiting' : name
  for (const v of views) $('v-' + v).hidden = v !== section
  setText('badge-text', badge)
  $('badge').hidden = !badge
  $('leave').hidden = !['waiting', 'paused', 'scheduled'].includes(name)
  view = name
}

function announce(text, { urgent = false, force = false } = {}) {
  const now = Date.now()
  // Screen readers hear a change of status at once, a new position at
  // most every 15 s (a long line must not talk all the time).
  if (!force && !urgent && now - lastAnnounce < 15000) return
  if (text === lastAnnounced && !force) return
  lastAnnounce = now
  lastAnnounced = text
  setText(urgent ? 'alert' : 'announce', text)
}

function stopTicker() {
  clearInterval(ticker)
  ticker = null
}

function updated() {
  setText('updated', format(S.updated, { time: clock(Date.now()) }))
}

function showQueue(q) {
  const paused = q.status === 'paused'
  // A change of status (from another view, or between waiting and
  // paused) is announced at once.
  const changed = paused ? view !== 'paused' : view !== 'waiting'
  stopTicker()
  show(paused ? 'paused' : 'waiting', paused ? S.status_paused : S.status_waiting)
  const position = Number.isSafeInteger(q.position) && q.position > 0 ? q.position : 0
  const ahead = Number.isSafeInteger(q.ahead) && q.ahead >= 0 ? q.ahead : Math.max(0, position - 1)
  if (position > firstPosition) {
    firstPosition = position
    remember(firstPosition)
  }
  const big = $('position')
  const next = ahead === 0
  big.classList.toggle('next', next)
  setText('position', next ? S.next : nf(position))
  setText('ahead', nf(ahead))
  setText('eta', paused ? '–' : etaText(q.eta_s))
  setText('total', Number.isSafeInteger(q.total) ? nf(q.total) : '–')
  setText('waiting-note', paused ? S.paused : S.waiting)
  $('vip-note').hidden = !q.vip_ahead_notice
  setText('vip-note', S.vip_ahead)
  // Progress: how much of the line that was ahead at the start is gone.
  const pct = firstPosition <= 1 ? 96 : 4 + (92 * (firstPosition - position)) / (firstPosition - 1)
  $('bar').style.transform = `scaleX(${(pct / 100).toFixed(3)})`
  $('progress').setAttribute('aria-valuenow', String(Math.round(pct)))
  $('progress').setAttribute('aria-valuetext', format(S.live_position, { position: nf(position), ahead: nf(ahead) }))
  document.title = `(${next ? '1' : nf(position)}) ${$('title').textContent}`
  announce(paused ? S.paused : format(S.live_position, { position: nf(position), ahead: nf(ahead) }), { force: changed })
  updated()
}

function showScheduled(startsAtLocal) {
  const wasOther = view !== 'scheduled'
  show('scheduled', S.status_scheduled)
  setText('starts-at', when(startsAtLocal + clockOffset))
  const tick = () => {
    const left = startsAtLocal - Date.now()
    const s = Math.max(0, Math.ceil(left / 1000))
    const d = Math.floor(s / 86400)
    const parts = { d, h: Math.floor(s / 3600) % 24, m: Math.floor(s / 60) % 60, s: s % 60 }
    setText('cd-d', nf(parts.d))
    for (const k of ['h', 'm', 's']) setText('cd-' + k, String(parts[k]).padStart(2, '0'))
    $('cd-d').parentElement.hidden = d === 0
    $('cd-h').parentElement.classList.toggle('zero', d === 0 && parts.h === 0)
    $('countdown').setAttribute('aria-label', format(S.live_scheduled, { time: duration(left) }))
    if (left <= 0) setText('starts-at', S.opening)
  }
  tick()
  if (!ticker) ticker = setInterval(tick, 250)
  document.title = $('title').textContent
  if (wasOther) announce(format(S.live_scheduled, { time: duration(startsAtLocal - Date.now()) }), { force: true })
  updated()
}

/** safeUrl returns u when it is an absolute http(s) URL, else ''. */
function safeUrl(u) {
  try {
    const x = new URL(u)
    return x.protocol === 'https:' || x.protocol === 'http:' ? x.toString() : ''
  } catch {
    return ''
  }
}

function showGranted(g) {
  stopTicker()
  remember(0)
  show('granted', S.status_granted)
  $('bar').style.transform = 'scaleX(1)'
  const target = safeUrl(g.redirect_url)
  document.title = `✓ ${$('title').textContent}`
  const cont = $('continue')
  const copy = $('copy')
  if (target) {
    setText('granted-text', S.redirecting)
    cont.href = target
    cont.hidden = false
    copy.hidden = true
    announce(`${S.granted} ${S.redirecting}`, { urgent: true, force: true })
    clearTimeout(redirectTimer)
    redirectTimer = setTimeout(() => location.assign(target), 1200)
    return
  }
  const exp = Number.isFinite(g.expires_at) ? ` ${format(S.valid_until, { time: clock(g.expires_at) })}` : ''
  setText('granted-text', S.granted_no_target + exp)
  cont.hidden = true
  copy.hidden = typeof g.access_token !== 'string' || !navigator.clipboard
  copy.onclick = async () => {
    try {
      await navigator.clipboard.writeText(g.access_token)
      setText('copy', S.copied)
    } catch {
      // the browser refused; nothing else to do
    }
  }
  announce(S.granted_no_target, { urgent: true, force: true })
  updated()
}

function showRejectedFull(retryMs) {
  stopTicker()
  show('rejected', S.status_full)
  setText('rejected-title', S.rejected_full)
  const wait = Math.min(Math.max(retryMs || 5000, 1000), 5 * 60000)
  const until = Date.now() + wait
  const tick = () => {
    const left = until - Date.now()
    setText('rejected-text', left > 0 ? format(S.retry_in, { time: duration(left) }) : S.retrying)
    $('retry-bar').style.transform = `scaleX(${Math.min(1, 1 - left / wait).toFixed(3)})`
    if (left <= 0) {
      stopTicker()
      start()
    }
  }
  tick()
  ticker = setInterval(tick, 250)
  announce(`${S.rejected_full} ${format(S.retry_in, { time: duration(wait) })}`, { urgent: true, force: true })
}

function showClosed(ended) {
  stopTicker()
  const title = ended ? S.ended : S.rejected_closed
  show('closed', S.status_closed)
  setText('closed-title', title)
  $('check').hidden = ended
  document.title = $('title').textContent
  announce(title, { urgent: true, force: true })
}

function showError(title, text) {
  stopTicker()
  show('error', S.status_error)
  setText('error-title', title)
  setText('error-text', text || '')
  announce(`${title} ${text || ''}`, { urgent: true, force: true })
}

// ---- the flow ---------------------------------------------------------

async function wsBase() {
  try {
    const r = await fetch(`${location.pathname.replace(/\/?$/, '/')}config.json`)
    const c = await r.json()
    if (typeof c.ws_url === 'string' && /^wss?:\/\//.test(c.ws_url)) return c.ws_url
    if (typeof c.ws_port === 'string' && /^\d{1,5}$/.test(c.ws_port)) {
      return `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.hostname.includes(':') ? `[${location.hostname}]` : location.hostname}:${c.ws_port}`
    }
  } catch {
    // no socket: the room polls
  }
  return ''
}

let wsUrl = ''

/** isOver reports whether the room has ended for good (its ends_at passed), not just closed for now. */
function isOver() {
  const end = ms(site.ends_at)
  return site.phase === 'ended' && end > 0 && end - clockOffset <= Date.now()
}

function scheduledStart() {
  const at = ms(site.starts_at)
  return site.phase === 'scheduled' && at ? at - clockOffset : 0
}

/**
 * remember keeps the first position seen in this tab's session storage, so
 * that the progress bar survives a reload (the place does too).
 */
function remember(v) {
  try {
    if (v > 0) sessionStorage.setItem(`fanfare-first-${roomName}`, String(v))
    else sessionStorage.removeItem(`fanfare-first-${roomName}`)
  } catch {
    // storage off: the bar starts again from here
  }
}

function recalled() {
  try {
    const v = Number(sessionStorage.getItem(`fanfare-first-${roomName}`))
    return Number.isSafeInteger(v) && v > 0 ? v : 0
  } catch {
    return 0
  }
}

function start() {
  room?.close()
  firstPosition = view === '' ? recalled() : 0
  const opts = { httpUrl, room: roomName }
  if (wsUrl) opts.url = wsUrl
  if (token) opts.token = token
  const r = enterRoom(opts)
  room = r
  r.on('queue', (q) => {
    if (room !== r) return
    $('conn').hidden = true
    if (q.status === 'scheduled') {
      // starts_in_s is the server's own count: immune to a wrong local clock.
      const local = Number.isFinite(q.starts_in_s) ? Date.now() + q.starts_in_s * 1000 : ms(q.starts_at) - clockOffset
      return showScheduled(local)
    }
    showQueue(q)
  })
  r.on('granted', (g) => { if (room === r) showGranted(g) })
  r.on('rejected', (f) => {
    if (room !== r) return
    if (f.code === 'room_closed') showClosed(isOver())
    else showRejectedFull(f.retry_after_ms)
  })
  r.on('state', (s) => {
    if (room !== r) return
    if (s.state === 'reconnecting' && view !== 'granted') {
      setText('conn', S.reconnecting)
      $('conn').hidden = false
    } else if (s.state === 'open' || s.state === 'polling') {
      $('conn').hidden = true
    }
  })
  r.on('error', (e) => {
    if (room !== r || view !== 'loading') return
    if (e.retryable || e.code === 'connection_lost' || e.code === 'timeout' || e.code === 'internal') {
      setText('loading-text', S.error)
    }
  })
  r.on('close', ({ error }) => {
    if (room !== r || !error) return
    if (error.code === 'not_found') return notFound()
    if (error.code === 'unauthorized' || error.code === 'forbidden') return showError(S.need_token, S.need_token_text)
    if (error.code === 'room_full' || error.code === 'room_closed') return // the rejected event showed it
    if (view !== 'granted') showError(S.error, error.serverMessage || error.code)
  })
  if (view === '' || view === 'loading' || view === 'left' || view === 'rejected' || view === 'closed') {
    const at = scheduledStart()
    if (at > Date.now()) showScheduled(at)
    else show('loading', S.status_loading)
  }
}

function notFound() {
  stopTicker()
  // The server answers an unknown room's page with its 404 page; a room
  // deleted while the page is open ends here.
  $('brand').hidden = true
  show('notfound', '')
  setText('notfound-title', S.not_found)
  setText('notfound-text', S.not_found_text)
  document.title = S.not_found
  announce(S.not_found, { urgent: true, force: true })
}

async function main() {
  if (!roomName) return notFound()
  $('leave').onclick = async () => {
    const r = room
    room = null
    stopTicker()
    show('left', S.status_left)
    remember(0)
    announce(S.left, { force: true })
    document.title = $('title').textContent
    try {
      await r?.leave()
    } catch {
      // the place lapses after the grace anyway
    }
  }
  $('rejoin').onclick = () => start()
  $('check').onclick = async () => {
    try {
      applySite(await roomSite({ httpUrl, room: roomName }))
    } catch (e) {
      if (e.code === 'not_found') return notFound()
    }
    start()
  }
  let doc
  const sock = wsBase()
  for (let attempt = 0; ; attempt++) {
    try {
      doc = await roomSite({ httpUrl, room: roomName })
      break
    } catch (e) {
      if (e.code === 'not_found') return notFound()
      if (attempt === 0) applySite({})
      setText('loading-text', S.error)
      await new Promise((resolve) => setTimeout(resolve, Math.min(30000, 1000 * 2 ** attempt)))
    }
  }
  if (Number.isFinite(doc.serverDate)) {
    const off = doc.serverDate - Date.now()
    clockOffset = Math.abs(off) > 2000 ? off : 0 // the Date header has 1 s steps
  }
  applySite(doc)
  if (site.phase === 'ended' || site.state === 'closed') return showClosed(isOver())
  wsUrl = await sock
  start()
}

main()
