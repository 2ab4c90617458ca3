// The fanfare admin console: one page on this node's admin API
// (docs/protocol.md §9). The admin token lives in this tab's sessionStorage
// only; every request carries it as a bearer token. Nothing is loaded from
// elsewhere, and the page never reloads: panels refresh every 2 s, the
// charts every second.

import { Chart, fmt } from './chart.js'

const $ = (id) => document.getElementById(id)
const KEY = 'fanfare.admin-token'
let token = sessionStorage.getItem(KEY) || ''
let timers = []

class APIError extends Error {
  constructor(status, code, message) {
    super(message || code || `HTTP ${status}`)
    this.status = status
    this.code = code
  }
}

async function api(method, path, body) {
  const resp = await fetch(path, {
    method,
    headers: { Authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'Content-Type': 'application/json' }) },
    body: body === undefined ? undefined : (typeof body === 'string' ? body : JSON.stringify(body)),
    cache: 'no-store',
  })
  const text = await resp.text()
  let data = null
  try { data = text ? JSON.parse(text) : null } catch { /* not JSON */ }
  if (!resp.ok) {
    const e = data && data.error
    throw new APIError(resp.status, e && e.code, e ? `${e.code}: ${e.message}` : `HTTP ${resp.status}: ${text.slice(0, 200)}`)
  }
  return data
}

// el builds an element; children are nodes or text (never parsed as HTML).
function el(tag, attrs = {}, ...children) {
  const n = document.createElement(tag)
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') n.className = v
    else if (k.startsWith('on')) n.addEventListener(k.slice(2), v)
    else n.setAttribute(k, v)
  }
  for (const c of children) n.append(c instanceof Node ? c : String(c ?? ''))
  return n
}

function lvl(n) { return el('span', { class: `lvl l${n}` }, `L${n}`) }
function when(ms) { return ms ? new Date(ms).toLocaleTimeString() : '' }
function fill(body, rows, cols, empty) {
  body.replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: cols, class: 'empty' }, empty))]))
}

function status(text, bad = false) {
  const s = $('status')
  s.textContent = text
  s.style.color = bad ? '#ffb4ab' : ''
}

// --- sign in -----------------------------------------------------------

async function signIn(t) {
  token = t
  await api('GET', '/admin/v1/degrade') // 401 for a wrong token
  sessionStorage.setItem(KEY, t)
  $('signin-panel').hidden = true
  $('console').hidden = false
  $('signout').hidden = false
  start()
}

function signOut() {
  for (const t of timers) clearInterval(t)
  timers = []
  token = ''
  sessionStorage.removeItem(KEY)
  $('console').hidden = true
  $('signout').hidden = true
  $('signin-panel').hidden = false
  $('token').value = ''
  $('token').focus()
  status('')
}

$('signin').addEventListener('submit', async (ev) => {
  ev.preventDefault()
  $('signin-error').textContent = ''
  try {
    await signIn($('token').value.trim())
  } catch (e) {
    token = ''
    $('signin-error').textContent = e.status === 401 ? 'That is not this node\'s admin token.' : e.message
  }
})
$('signout').addEventListener('click', signOut)

// --- levels --------------------------------------------------------------

async function putDegrade(body, errEl = $('levels-error')) {
  errEl.textContent = ''
  try {
    renderDegrade(await api('PUT', '/admin/v1/degrade', body))
  } catch (e) {
    errEl.textContent = e.message
  }
}

function renderDegrade(d) {
  const n = d.node
  $('node-level').replaceWith(Object.assign(lvl(n.level), { id: 'node-level' }))
  const parts = [`auto L${n.auto}`]
  if (n.forced !== null && n.forced !== undefined) parts.push(`forced L${n.forced}` + (n.expires_at ? ` until ${when(n.expires_at)}` : ''))
  if (n.cause) parts.push(n.cause)
  $('node-detail').textContent = parts.join(' · ')
  const rows = d.groups.map((g) => el('tr', { 'data-gid': g.gid },
    el('td', {}, g.gid), el('td', {}, lvl(g.level)),
    el('td', {}, g.forced === null || g.forced === undefined ? '' : `L${g.forced}`), el('td', {}, `L${g.auto}`),
    el('td', {}, when(g.expires_at)), el('td', {}, g.hot ? 'hot' : ''), el('td', {}, g.cause || ''),
    el('td', {}, g.forced === null || g.forced === undefined ? '' :
      el('button', { type: 'button', 'aria-label': `clear the level of group ${g.gid}`, onclick: () => putDegrade({ scope: 'group', gid: g.gid, level: null }) }, 'Clear'))))
  fill($('groups-body'), rows, 8, 'every group follows the node (L0 and nothing forced)')
}

$('node-form').addEventListener('submit', (ev) => {
  ev.preventDefault()
  putDegrade({ scope: 'node', level: Number($('n-level').value), ttl_s: Number($('n-ttl').value) || 0 })
})
$('n-clear').addEventListener('click', () => putDegrade({ scope: 'node', level: null }))
$('group-form').addEventListener('submit', (ev) => {
  ev.preventDefault()
  putDegrade({ scope: 'group', gid: Number($('g-gid').value), level: Number($('g-level').value), ttl_s: Number($('g-ttl').value) || 0 })
})
$('g-clear').addEventListener('click', () => {
  if (!$('g-gid').reportValidity()) return
  putDegrade({ scope: 'group', gid: Number($('g-gid').value), level: null })
})

// --- hot groups, online ----------------------------------------------------

function renderHot(h) {
  fill($('hot-body'), h.groups.map((g) => el('tr', {},
    el('td', {}, g.gid), el('td', {}, fmt(g.rate)), el('td', {}, fmt(g.baseline)), el('td', {}, when(g.since)), el('td', {}, g.source || ''))),
  5, 'no hot group')
}

function renderOnline(o) {
  $('online-scope').textContent = `(${o.groups_online} group${o.groups_online === 1 ? '' : 's'} with members on this node; counts: ${o.scope})`
  fill($('online-body'), o.groups.map((g) => el('tr', {},
    el('td', {}, g.gid), el('td', {}, g.online + (g.stale ? ' (stale)' : '')), el('td', {}, g.online_here),
    el('td', {}, el('button', { type: 'button', 'aria-label': `pick group ${g.gid} for the level switches`, onclick: () => { $('g-gid').value = g.gid; $('g-level').focus() } }, 'Levels…')))),
  4, 'nobody online')
}

// --- rooms -----------------------------------------------------------------

async function roomState(room, state) {
  $('rooms-error').textContent = ''
  try {
    await api('POST', '/admin/v1/rooms', { room, state })
    renderRooms(await api('GET', '/admin/v1/rooms'))
  } catch (e) {
    $('rooms-error').textContent = e.message
  }
}

function renderRooms(r) {
  fill($('rooms-body'), r.rooms.map((x) => {
    const eta = x.admission_rate > 0 ? Math.ceil(x.depth / x.admission_rate) + ' s' : (x.depth ? 'paused' : '0 s')
    const other = x.state === 'open' ? 'closed' : 'open'
    return el('tr', { 'data-room': x.room },
      el('td', {}, x.room), el('td', {}, x.state), el('td', {}, x.depth), el('td', {}, Math.max(0, x.depth - x.vip_waiting)),
      el('td', {}, x.vip_waiting), el('td', { class: 'by-tier', title: 'waiting by tier: 0 / 1 / 2 / 3' }, (x.waiting_by_tier || []).join(' / ')),
      el('td', {}, x.away), el('td', {}, x.overdue), el('td', {}, `${x.active}/${x.max_active}`),
      el('td', {}, fmt(x.admit_rate)), el('td', {}, x.admission_rate.toFixed(2)), el('td', {}, x.l_max),
      el('td', {}, lvl(x.level)), el('td', {}, eta),
      el('td', { class: 'phase', title: schedule(x) }, x.phase + (x.phase === 'scheduled' && x.starts_at ? ` (in ${Math.max(0, Math.ceil((x.starts_at - Date.now()) / 1000))} s)` : '')),
      el('td', {}, x.pre_queue),
      el('td', { title: x.min_slack === undefined ? 'nobody owed' : `smallest spare: ${x.min_slack} admissions` }, `${x.owed} / ${x.capacity}`),
      el('td', { class: x.max_wait_violations ? 'violations error' : 'violations' }, x.max_wait_violations),
      el('td', { class: 'admitted', title: 'admitted by this node, by tier 0 / 1 / 2 / 3' }, (x.admitted_by_tier || []).join(' / ')),
      waitCell(x.wait_by_tier || []),
      el('td', {}, el('button', { type: 'button', onclick: () => roomState(x.room, other) }, x.state === 'open' ? 'Close' : 'Open')))
  }), 21, 'no room (create one below)')
}

// secs formats a wait in seconds compactly: 42s, 3m07s, 1h05m.
function secs(v) {
  const s = Math.round(v)
  if (s < 60) return `${s}s`
  const pad = (n) => String(n).padStart(2, '0')
  if (s < 3600) return `${Math.floor(s / 60)}m${pad(s % 60)}s`
  return `${Math.floor(s / 3600)}h${pad(Math.floor(s / 60) % 60)}m`
}

// waitCell shows, per tier with admissions by this node in the last
// 5 minutes, "tier: p50 / p99" on a line of its own; the tooltip has
// every field.
function waitCell(ws) {
  const lines = []
  const tips = []
  ws.forEach((w, tier) => {
    if (!w.n) return
    lines.push(el('div', { 'data-tier': tier }, `${tier}: ${secs(w.p50_s)} / ${secs(w.p99_s)}`))
    tips.push(`tier ${tier}: ${w.n} waits, p50 ${secs(w.p50_s)}, p90 ${secs(w.p90_s)}, p99 ${secs(w.p99_s)}, max ${secs(w.max_s)}`)
  })
  return el('td', { class: 'waits', title: tips.length ? tips.join('\n') : 'no admission by this node in the last 5 minutes' },
    ...(lines.length ? lines : ['–']))
}

// schedule describes a room's starts_at / ends_at (Unix ms) for a tooltip.
function schedule(x) {
  const at = (ms) => new Date(ms).toISOString().replace('.000Z', 'Z')
  const parts = []
  if (x.starts_at) parts.push('starts ' + at(x.starts_at))
  if (x.ends_at) parts.push('ends ' + at(x.ends_at))
  return parts.join(', ') || 'not scheduled'
}

// rfc3339 turns a datetime-local value (local time) into RFC 3339 UTC;
// undefined (keep the room's value) when empty.
function rfc3339(v) {
  if (!v) return undefined
  const d = new Date(v)
  if (isNaN(d)) throw new Error('bad date: ' + v)
  return d.toISOString().replace(/\.\d{3}Z$/, 'Z')
}

$('room-form').addEventListener('submit', async (ev) => {
  ev.preventDefault()
  $('rooms-error').textContent = ''
  try {
    await api('POST', '/admin/v1/rooms', {
      room: $('r-name').value, max_active: Number($('r-max').value), admit_rate: Number($('r-rate').value),
      starts_at: rfc3339($('r-start').value), ends_at: rfc3339($('r-end').value)
    })
    renderRooms(await api('GET', '/admin/v1/rooms'))
  } catch (e) {
    $('rooms-error').textContent = e.message
  }
})

// --- limits ----------------------------------------------------------------

function limitsMsg(text, ok) {
  const m = $('limits-msg')
  m.textContent = text
  m.className = ok ? 'ok' : 'error'
}

async function loadLimits() {
  try {
    $('limits').value = JSON.stringify(await api('GET', '/admin/v1/limits'), null, 2)
    limitsMsg('', true)
  } catch (e) {
    limitsMsg(e.message, false)
  }
}

async function putLimits(dry) {
  const text = $('limits').value
  try {
    JSON.parse(text)
  } catch (e) {
    limitsMsg(`not JSON: ${e.message}`, false)
    return
  }
  try {
    const out = await api('PUT', '/admin/v1/limits' + (dry ? '?dry_run=true' : ''), text)
    if (!dry) $('limits').value = JSON.stringify(out, null, 2)
    limitsMsg(dry ? 'valid: nothing changed (Apply puts it in force)' : `applied at ${new Date().toLocaleTimeString()}`, true)
  } catch (e) {
    limitsMsg(e.message, false)
  }
}

$('l-reload').addEventListener('click', loadLimits)
$('l-validate').addEventListener('click', () => putLimits(true))
$('l-apply').addEventListener('click', () => putLimits(false))

// --- charts ------------------------------------------------------------------

const charts = {
  deliveries: new Chart($('c-deliveries')),
  sends: new Chart($('c-sends')),
  conns: new Chart($('c-conns')),
  queues: new Chart($('c-queues'), { series: 2 }),
}
let prev = null

function renderStats(s) {
  if (prev && s.ts > prev.ts) {
    const dt = (s.ts - prev.ts) / 1000
    const d = Math.max(0, s.deliveries_total - prev.deliveries_total) / dt
    const n = Math.max(0, s.sends_total - prev.sends_total) / dt
    charts.deliveries.push(d)
    charts.sends.push(n)
    $('v-deliveries').textContent = fmt(d)
    $('v-sends').textContent = fmt(n)
  }
  const rooms = Object.values(s.room_waiting).reduce((a, b) => a + b, 0)
  charts.conns.push(s.connections)
  charts.queues.push(s.shard_queue_depth, rooms)
  $('v-conns').textContent = fmt(s.connections)
  $('v-queues').textContent = `${fmt(s.shard_queue_depth)} / ${fmt(rooms)}`
  prev = s
}

// --- refresh -----------------------------------------------------------------

async function refresh() {
  const parts = [
    ['degrade', '/admin/v1/degrade', renderDegrade],
    ['hot groups', '/admin/v1/hot-groups', renderHot],
    ['online', '/admin/v1/online', renderOnline],
    ['rooms', '/admin/v1/rooms', renderRooms],
  ]
  const results = await Promise.allSettled(parts.map(([, p]) => api('GET', p)))
  const failed = []
  results.forEach((r, i) => {
    if (r.status === 'fulfilled') parts[i][2](r.value)
    else failed.push(`${parts[i][0]}: ${r.reason.message}`)
  })
  if (results.some((r) => r.status === 'rejected' && r.reason.status === 401)) {
    signOut()
    $('signin-error').textContent = 'The node refused the token (restarted with another?). Sign in again.'
    return
  }
  status(failed.length ? failed.join('; ') : `updated ${new Date().toLocaleTimeString()}`, failed.length > 0)
}

async function refreshStats() {
  try {
    renderStats(await api('GET', '/admin/v1/stats'))
  } catch (e) {
    status(`stats: ${e.message}`, true)
  }
}

function start() {
  refresh()
  refreshStats()
  loadLimits()
  timers.push(setInterval(refresh, 2000), setInterval(refreshStats, 1000))
}

if (token) {
  signIn(token).catch(() => signOut())
} else {
  $('token').focus()
}
