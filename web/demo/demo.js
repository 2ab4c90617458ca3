// The fanfare browser demo, on the JavaScript SDK served by this node at
// /sdk/. In embedded (development) mode it gets its tokens from the
// node's development-only route POST /demo/token, which signs short-lived
// tokens for demo-<name> users and joins them to the demo's groups; on a
// node without that route it takes a token and a gid typed in.

import { connect, enterRoom } from '/sdk/src/index.js'

const $ = (id) => document.getElementById(id)
const help = [
  'every message is pushed as it commits',
  'L1: messages come in batches, one per merge window',
  'L2: a summary per window; the demo pulls the rest',
  'L3: no pushes; the SDK polls the group (every 2 s here)',
  'L4: sends are refused; reads and pulls still work',
]
const names = ['alice', 'bob', 'carol', 'dave', 'erin', 'frank']

let cfg = null
let me = null // {uid, token, expiresAt, gid, user, tier, group}
let client = null
let cursors = null // {gid: seq} kept while offline
let room = null
let offline = false
// While back from offline: the seq the page had, and the note counting
// the messages the catch-up pulled since.
let catchUp = null // {after, until, n, li}

function setLevel(id, n) {
  const b = $(id)
  b.textContent = `L${n}`
  b.className = `lvl l${n}`
}

function wsBase() {
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws'
  return `${scheme}://${location.hostname}:${cfg.ws_port}`
}

function shortUid(uid) {
  return cfg && cfg.uid_prefix && uid.startsWith(cfg.uid_prefix) ? uid.slice(cfg.uid_prefix.length) : uid
}

function note(id, text) { $(id).textContent = text }

function sys(text) {
  const li = document.createElement('li')
  li.className = 'sys'
  li.textContent = text
  $('messages').append(li)
  li.scrollIntoView({ block: 'nearest' })
  return li
}

function countCatchUp(m) {
  if (!catchUp || !m.pulled || m.seq <= catchUp.after || (catchUp.until !== undefined && m.seq > catchUp.until)) return
  catchUp.n++
  catchUp.li.textContent = `online again: caught up ${catchUp.n} message${catchUp.n === 1 ? '' : 's'} by pull`
}

function showMessage(m) {
  const li = document.createElement('li')
  li.dataset.seq = m.seq
  if (me && m.from === me.uid) li.classList.add('mine')
  const seq = document.createElement('span')
  seq.className = 'seq'
  seq.textContent = `#${m.seq}`
  const from = document.createElement('span')
  from.className = 'from'
  from.textContent = shortUid(m.from)
  const body = document.createElement('span')
  body.className = 'body'
  const text = m.body && typeof m.body === 'object' && typeof m.body.text === 'string' ? m.body.text : JSON.stringify(m.body)
  body.textContent = text
  if (m.pulled) {
    const tag = document.createElement('span')
    tag.className = 'tag'
    tag.textContent = 'pulled'
    tag.title = 'not pushed: fetched by the SDK (catch-up, a gap, a summary or a level 3 poll)'
    body.append(tag)
  }
  const ts = document.createElement('span')
  ts.className = 'ts'
  ts.textContent = new Date(m.ts).toLocaleTimeString()
  li.append(seq, from, body, ts)
  $('messages').append(li)
  li.scrollIntoView({ block: 'nearest' })
}

function showLevels() {
  if (!client || !me) return
  const lv = client.levels()
  const group = lv.groups[me.gid] || 0
  const eff = Math.max(lv.node, group)
  setLevel('node-level', lv.node)
  setLevel('group-level', group)
  setLevel('eff-level', eff)
  note('level-help', help[eff] || '')
}

// mint asks the development route for a token (and membership of the group).
async function mint(user, group, tier) {
  const resp = await fetch('/demo/token', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ user, group, tier }),
  })
  const data = await resp.json().catch(() => null)
  if (!resp.ok) throw new Error(data && data.error ? `${data.error.code}: ${data.error.message}` : `HTTP ${resp.status}`)
  return data
}

// freshToken reuses the current token until a minute before it expires.
async function freshToken() {
  if (!cfg.dev || me.expiresAt - Date.now() > 60000) return me.token
  const t = await mint(me.user, me.group, me.tier)
  me.token = t.token
  me.expiresAt = t.expires_at
  return me.token
}

async function goOnline() {
  const opts = {
    url: `${wsBase()}/ws`,
    httpUrl: location.origin,
    token: me.token,
    pollIntervalMs: 2000,
    summaryJitterMs: 0,
  }
  if (cfg.dev) opts.refreshToken = freshToken
  if (cursors) opts.cursors = cursors
  note('conn-state', 'connecting')
  const c = await connect(opts)
  client = c
  c.on('message', (m) => {
    if (m.gid !== me.gid) return
    showMessage(m)
    countCatchUp(m)
  })
  c.on('degraded', showLevels)
  c.on('state', (s) => {
    note('conn-state', s.state)
    if (s.state === 'connected') showLevels()
  })
  c.on('error', (e) => note('chat-note', `error: ${e.message}`))
  if (!cursors) c.track(me.gid)
  note('conn-state', c.state)
  showLevels()
  note('node-id', c.hello ? c.hello.node : cfg.node)
  $('text').disabled = false
  $('send').disabled = false
  $('offline').disabled = false
}

async function goOffline() {
  catchUp = null
  cursors = client.cursors()
  if (!(me.gid in cursors)) cursors[me.gid] = Number($('messages').lastElementChild?.dataset.seq || 0)
  const c = client
  client = null
  await c.close()
  note('conn-state', 'offline (by the button)')
  sys(`offline: messages sent now reach you when you go online again`)
}

$('offline').addEventListener('click', async () => {
  const b = $('offline')
  b.disabled = true
  try {
    if (!offline) {
      await goOffline()
      offline = true
      b.textContent = 'Go online'
      b.setAttribute('aria-pressed', 'true')
      $('send').disabled = true
      $('text').disabled = true
    } else {
      catchUp = { after: cursors[me.gid] || 0, n: 0, li: sys('online again: caught up 0 messages by pull') }
      await goOnline()
      cursors = null
      // What the catch-up brings is what was committed up to now; later
      // pulled messages (a level 3 poll) are not counted.
      client.sync().then((groups) => {
        const g = groups.find((x) => x.gid === me.gid)
        if (catchUp && g) catchUp.until = g.last_seq
      }).catch(() => {})
      offline = false
      b.textContent = 'Go offline'
      b.setAttribute('aria-pressed', 'false')
    }
  } catch (e) {
    note('chat-note', `error: ${e.message}`)
  } finally {
    b.disabled = false
  }
})

$('send-form').addEventListener('submit', async (ev) => {
  ev.preventDefault()
  const text = $('text').value.trim()
  if (!text || !client) return
  $('text').value = ''
  try {
    const ack = await client.send(me.gid, { text })
    note('chat-note', `acked: seq ${ack.seq}`)
  } catch (e) {
    note('chat-note', `not sent (${e.code || 'error'}): ${e.message}`)
  }
})

$('join-form').addEventListener('submit', async (ev) => {
  ev.preventDefault()
  note('setup-error', '')
  $('join').disabled = true
  try {
    if (client) {
      await client.close()
      client = null
    }
    if (cfg.dev) {
      const user = $('user').value.trim()
      const group = $('group').value
      const tier = Number($('vip').value)
      const t = await mint(user, group, tier)
      me = { uid: t.uid, token: t.token, expiresAt: t.expires_at, gid: t.gid, user, group, tier }
      sessionStorage.setItem('fanfare.demo-user', user)
    } else {
      me = { uid: '', token: $('m-token').value.trim(), expiresAt: Infinity, gid: Number($('m-gid').value) }
    }
    cursors = null
    $('messages').replaceChildren()
    await goOnline()
    me.uid = client.uid
    note('chat-title', `· ${cfg.dev ? me.group : ''} gid ${me.gid} · you are ${shortUid(me.uid)}`)
    sys(`joined gid ${me.gid} as ${me.uid}; open this page in another tab as another user to chat`)
    $('enter').disabled = !cfg.room
    $('text').focus()
  } catch (e) {
    note('setup-error', e.message)
  } finally {
    $('join').disabled = false
  }
})

// --- waiting room ------------------------------------------------------------

function roomField(id, v) { $(id).textContent = v }

$('enter').addEventListener('click', async () => {
  $('enter').disabled = true
  $('leave').disabled = false
  const s = $('r-status')
  s.className = ''
  roomField('r-status', 'entering…')
  note('room-note', '')
  try {
    room = enterRoom({ url: wsBase(), room: cfg.room, token: await freshToken(), refreshToken: cfg.dev ? freshToken : undefined })
  } catch (e) {
    note('room-note', e.message)
    $('enter').disabled = false
    return
  }
  room.on('queue', (q) => {
    roomField('r-status', q.status)
    roomField('r-position', q.position)
    roomField('r-ahead', q.ahead)
    roomField('r-total', q.total)
    roomField('r-eta', q.eta_s === undefined ? 'unknown (paused)' : `${q.eta_s} s` + (q.ahead === 0 ? ' (next in line)' : ''))
    note('room-note', q.vip_ahead_notice ? 'VIPs were just placed ahead of you' : '')
  })
  room.on('granted', (g) => {
    s.className = 'granted'
    roomField('r-status', 'granted: you are in')
    roomField('r-position', '–')
    roomField('r-ahead', '–')
    roomField('r-total', '–')
    roomField('r-eta', '–')
    note('room-note', `access token until ${new Date(g.expires_at).toLocaleTimeString()}; Leave lets the next user in`)
  })
  room.on('rejected', (r) => {
    s.className = 'rejected'
    roomField('r-status', `rejected: ${r.code}`)
    note('room-note', r.retry_after_ms ? `try again in ${Math.ceil(r.retry_after_ms / 1000)} s` : '')
    $('enter').disabled = false
    $('leave').disabled = true
  })
  room.on('error', (e) => note('room-note', `error: ${e.message}`))
})

$('leave').addEventListener('click', () => {
  if (room) room.close()
  room = null
  $('r-status').className = ''
  for (const id of ['r-status', 'r-position', 'r-ahead', 'r-total', 'r-eta']) roomField(id, '–')
  note('room-note', 'left the room')
  $('leave').disabled = true
  $('enter').disabled = false
})

// --- start -------------------------------------------------------------------

async function init() {
  try {
    const resp = await fetch('/demo/config.json', { cache: 'no-store' })
    cfg = await resp.json()
  } catch (e) {
    note('setup-error', `cannot read /demo/config.json: ${e.message}`)
    return
  }
  note('node-id', cfg.node)
  if (cfg.dev) {
    for (const g of cfg.groups) $('group').append(new Option(g, g))
    $('user').value = sessionStorage.getItem('fanfare.demo-user') || names[Math.floor(Math.random() * names.length)]
    note('setup-note', `Development mode: the node signs a ${Math.round(cfg.token_ttl_s / 60)}-minute token for user ${cfg.uid_prefix}<name> and adds it to the group. Open this page in a second tab with another name to chat.`)
    note('room-name', `· ${cfg.room}`)
  } else {
    $('dev-fields').hidden = true
    $('manual-fields').hidden = false
    note('setup-note', 'This node signs no demo tokens (cluster mode): paste a user token of a member and the group\'s gid.')
    $('room').hidden = true
  }
  $('user').focus()
}

init()
