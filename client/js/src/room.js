// A place in a waiting room (/rooms/{room}/ws, docs/protocol.md §6). The
// Go SDK's Room (client/room.go) is the reference: keep the socket open,
// redial with backoff (a user back within the room's grace keeps its
// place), stop at a rejection.
//
// With httpUrl the room is entered over HTTP first (POST
// /v1/rooms/{room}/enter: a ticket, which in a browser is also the
// fanfare_ticket_<room> cookie), then waited on over the room socket with
// ?ticket=, or, when the socket cannot be opened (a proxy that refuses
// upgrades, no url), by polling GET /v1/rooms/{room}/status at the
// server's poll_after_ms. The ticket is the identity: a page reloaded
// within the grace enters again with the same cookie and keeps its place.

import { FanfareError, httpError } from './errors.js'
import { Emitter, backoff, wakeable, checkOptions, checkWsUrl } from './util.js'
import { resolveWebSocket, withToken, withParam, handshakeError, permanent, abandon } from './socket.js'

/** Defaults of enterRoom()'s options (milliseconds and counts). */
export const roomDefaults = Object.freeze({
  heartbeatMs: 30000,
  backoffMinMs: 250,
  backoffMaxMs: 30000,
  maxReconnectAttempts: Infinity,
  stableAfterMs: 10000,
  pollFallbackAfter: 2,
  minPollMs: 500,
  maxPollMs: 30000,
  requestTimeoutMs: 10000,
})

const numericOptions = {
  heartbeatMs: { min: 1 },
  backoffMinMs: { min: 1 },
  backoffMaxMs: { min: 1 },
  maxReconnectAttempts: { min: 0, allowInfinity: true },
  stableAfterMs: { min: 0 },
  pollFallbackAfter: { min: 1 },
  minPollMs: { min: 1 },
  maxPollMs: { min: 1 },
  requestTimeoutMs: { min: 1 },
}

const ROOM_NAME = /^[A-Za-z0-9_.-]{1,64}$/

/**
 * roomUrl returns the room socket's URL: url may be the node's socket base
 * (ws://host:8081), its chat socket (ws://host:8081/ws) or the room socket
 * itself (ws://host:8081/rooms/sale/ws).
 */
export function roomUrl(url, room) {
  const u = checkWsUrl(url)
  if (/\/rooms\/[^/]+\/ws$/.test(u.pathname)) return u.toString()
  let base = u.pathname.replace(/\/+$/, '')
  if (base.endsWith('/ws')) base = base.slice(0, -3)
  u.pathname = `${base}/rooms/${encodeURIComponent(room)}/ws`
  return u.toString()
}

/** checkHttpUrl returns httpUrl without its trailing slashes, or throws. */
function checkHttpUrl(httpUrl) {
  let u
  try {
    u = new URL(httpUrl)
  } catch {
    throw new TypeError(`fanfare: httpUrl ${JSON.stringify(httpUrl)} is not a URL`)
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new TypeError(`fanfare: httpUrl scheme ${u.protocol} must be http: or https:`)
  return u.toString().replace(/\/+$/, '')
}

/**
 * roomSite fetches a room's public site document (GET
 * /v1/rooms/{room}/site): its theme, strings and phase, for a page to
 * render. Rejects with a FanfareError (not_found for an unknown room).
 */
export async function roomSite({ httpUrl, room, requestTimeoutMs = 10000 } = {}) {
  if (typeof room !== 'string' || !ROOM_NAME.test(room)) throw new TypeError(`fanfare: room ${JSON.stringify(room)} must be 1-64 characters of [A-Za-z0-9_.-]`)
  const base = checkHttpUrl(httpUrl)
  const path = `/v1/rooms/${encodeURIComponent(room)}/site`
  let resp
  try {
    resp = await fetch(base + path, { signal: AbortSignal.timeout(requestTimeoutMs) })
  } catch (err) {
    throw new FanfareError('connection_lost', `GET ${path}: ${err.message}`, { cause: err })
  }
  const text = await resp.text()
  if (resp.status !== 200) throw httpError(resp, text)
  try {
    const doc = JSON.parse(text)
    const date = Date.parse(resp.headers.get('Date') ?? '')
    // The server's clock, for a countdown that does not trust the visitor's.
    if (Number.isFinite(date)) Object.defineProperty(doc, 'serverDate', { value: date, enumerable: false })
    return doc
  } catch {
    throw new FanfareError('protocol', `GET ${path}: the answer is not JSON`)
  }
}

/**
 * enterRoom joins the waiting room `room` and returns the Room at once (the
 * socket opens in the background). Listen for 'queue' (the server's frame:
 * room, status, position, ahead, total, eta_s, vip_ahead_notice, local),
 * 'granted' (room, access_token, expires_at) and 'rejected' (room, code,
 * retry_after_ms); or await room.granted().
 */
export function enterRoom(options) {
  return new Room(options)
}

/**
 * Room is a place in a waiting room. Events:
 *   queue     the queue frame, as the server sends it
 *   granted   the granted frame: admitted, with the access token
 *   rejected  the rejected frame; the room ends (no redial)
 *   state     {state: 'connecting'|'open'|'disconnected'|'reconnecting'|'closed', ...}
 *   error     FanfareError: a failed dial, an error frame
 *   close     {error?}: the room ended (close(), a rejection, a session end, or redialing cannot help)
 */
export class Room extends Emitter {
  #opt
  #WS
  #url
  #token
  #refreshToken
  #ws = null
  #closed = false
  #attempt = 0
  #hb = null
  #wake = null
  #last = null
  #grantedFrame = null
  #endError = null
  #grantWaiters = []
  #ticket = ''
  #httpUrl = ''
  #transport = null
  #dialFailures = 0
  #pollAfterMs = 0
  #lastKey = ''

  constructor(options = {}) {
    super()
    const { url, room, token, refreshToken, ticket, httpUrl, WebSocket, ...rest } = options
    if (typeof room !== 'string' || !ROOM_NAME.test(room)) throw new TypeError(`fanfare: room ${JSON.stringify(room)} must be 1-64 characters of [A-Za-z0-9_.-]`)
    if (ticket !== undefined && (typeof ticket !== 'string' || ticket.length > 4096)) throw new TypeError('fanfare: ticket must be a string of at most 4096 characters')
    if (!url && !httpUrl) throw new TypeError('fanfare: url (the room socket) or httpUrl (enter and poll over HTTP) is required')
    // Over HTTP the credential may be the ticket cookie, or none at all
    // for a room that takes anonymous visitors: the server decides.
    if (!httpUrl && !token && !ticket && typeof refreshToken !== 'function') throw new TypeError('fanfare: token, refreshToken or ticket is required')
    const unknown = Object.keys(rest).filter((k) => !(k in roomDefaults))
    if (unknown.length) throw new TypeError(`fanfare: unknown option${unknown.length > 1 ? 's' : ''} ${unknown.join(', ')}`)
    checkOptions(rest, numericOptions)
    const opt = { ...roomDefaults }
    for (const [k, v] of Object.entries(rest)) if (v !== undefined && k in roomDefaults) opt[k] = v
    if (opt.backoffMaxMs < opt.backoffMinMs) throw new TypeError(`fanfare: backoffMinMs ${opt.backoffMinMs} exceeds backoffMaxMs ${opt.backoffMaxMs}`)
    if (opt.maxPollMs < opt.minPollMs) throw new TypeError(`fanfare: minPollMs ${opt.minPollMs} exceeds maxPollMs ${opt.maxPollMs}`)
    this.#opt = opt
    this.room = room
    this.#url = url ? roomUrl(url, room) : ''
    this.#httpUrl = httpUrl ? checkHttpUrl(httpUrl) : ''
    this.#token = token || ''
    this.#ticket = ticket || ''
    this.#refreshToken = refreshToken
    if (this.#url) {
      // Without a WebSocket (and with httpUrl) the room polls.
      try {
        this.#WS = resolveWebSocket(WebSocket)
      } catch (err) {
        if (!this.#httpUrl) throw err
        this.#url = ''
      }
    }
    queueMicrotask(() => this.#start()) // listeners added right after enterRoom see every frame
  }

  /** last is the latest queue frame (null before the first). */
  get last() { return this.#last }
  /** closed reports whether the room has ended. */
  get closed() { return this.#closed }
  /** ticket is the room's ticket once entered over HTTP (or the ticket option), '' before. */
  get ticket() { return this.#ticket }
  /** transport is how the room waits: 'socket', 'poll', or null before either. */
  get transport() { return this.#transport }

  /**
   * granted resolves to the granted frame once the user is admitted, or
   * rejects with a FanfareError: the rejection's code (room_full,
   * room_closed) with retryAfterMs, or 'closed'.
   */
  granted() {
    if (this.#grantedFrame) return Promise.resolve(this.#grantedFrame)
    if (this.#closed) return Promise.reject(this.#endError ?? new FanfareError('closed', 'left the room'))
    return new Promise((resolve, reject) => this.#grantWaiters.push({ resolve, reject }))
  }

  /**
   * close leaves the room: a waiting user keeps its place for the room's
   * grace period, an admitted user's session ends (the next user is
   * admitted).
   */
  close() {
    this.#end(null)
    this.#dropSocket()
  }

  /**
   * leave gives the place up (or ends the admitted session) at once: POST
   * /v1/rooms/{room}/leave with the ticket when the room was entered over
   * HTTP, then close(). Without httpUrl it is close() (the room socket has
   * no leave frame: a waiting user's place then lasts the grace).
   */
  async leave() {
    const entered = this.#httpUrl && (this.#ticket || this.#transport)
    this.close()
    if (!entered) return
    await this.#request('POST', 'leave')
  }

  #dropSocket() {
    const ws = this.#ws
    this.#ws = null
    if (ws) {
      ws.onmessage = ws.onerror = ws.onclose = null
      try {
        ws.close(1000, 'left the room')
      } catch {
        // already closed
      }
    }
  }

  /** start enters over HTTP when httpUrl is set, then waits on the socket or by polling. */
  async #start() {
    if (this.#httpUrl) {
      if (!(await this.#enter())) return
      if (!this.#url) return this.#poll()
    }
    this.#run(false)
  }

  /**
   * enter is POST /v1/rooms/{room}/enter, retried with backoff while the
   * error is retryable; it resolves false when the room ended.
   */
  async #enter() {
    for (let attempt = 0; ; attempt++) {
      if (this.#closed) return false
      try {
        const r = await this.#request('POST', 'enter', true)
        if (typeof r?.ticket === 'string' && r.ticket) this.#ticket = r.ticket
        this.#setPollAfter(r?.poll_after_ms)
        this.#onFrame(r?.frame)
        return !this.#closed
      } catch (err) {
        if (this.#closed) return false
        this.emit('error', err)
        if (!err.retryable && err.code !== 'internal') {
          this.#end(err)
          return false
        }
        if (attempt >= this.#opt.maxReconnectAttempts) {
          this.#end(new FanfareError('closed', `gave up after ${attempt} attempts to enter`))
          return false
        }
        await this.#sleep(Math.max(backoff(this.#opt.backoffMinMs, this.#opt.backoffMaxMs, attempt), err.retryAfterMs || 0))
      }
    }
  }

  /**
   * poll waits by GET /v1/rooms/{room}/status every poll_after_ms (within
   * minPollMs..maxPollMs). A 401 (the ticket expired or was refused) enters
   * again; other errors back off; a rejection or a permanent error ends.
   */
  async #poll() {
    if (this.#closed) return
    this.#transport = 'poll'
    this.emit('state', { state: 'polling' })
    let failures = 0
    let wait = this.#pollAfterMs
    for (;;) {
      await this.#sleep(wait)
      if (this.#closed) return
      try {
        const r = await this.#request('GET', 'status')
        failures = 0
        this.#setPollAfter(r?.poll_after_ms)
        this.#onFrame(r?.frame)
        wait = this.#pollAfterMs
        continue
      } catch (err) {
        if (this.#closed) return
        this.emit('error', err)
        if (err.status === 401) {
          if (!(await this.#enter())) return
          wait = this.#pollAfterMs
          continue
        }
        if (!err.retryable && err.code !== 'internal') return this.#end(err)
        if (++failures > this.#opt.maxReconnectAttempts) return this.#end(new FanfareError('closed', `gave up after ${failures - 1} failed polls`))
        wait = Math.max(this.#pollAfterMs, backoff(this.#opt.backoffMinMs, this.#opt.backoffMaxMs, failures - 1), err.retryAfterMs || 0)
      }
    }
  }

  #setPollAfter(ms) {
    const v = Number.isFinite(ms) && ms > 0 ? ms : 2000
    this.#pollAfterMs = Math.min(this.#opt.maxPollMs, Math.max(this.#opt.minPollMs, v))
  }

  /** sleep waits ms unless close() wakes it. */
  async #sleep(ms) {
    const delay = wakeable(ms)
    this.#wake = delay.wake
    await delay.promise
    this.#wake = null
  }

  /** request calls /v1/rooms/{room}/<what> with the ticket (header; a browser also sends the cookie) and the token. */
  async #request(method, what, auth = false) {
    const headers = {}
    if (this.#ticket) headers['X-Fanfare-Ticket'] = this.#ticket
    if (auth) {
      if (!this.#token && this.#refreshToken) {
        let t
        try {
          t = await this.#refreshToken()
        } catch (err) {
          throw new FanfareError('unauthorized', `refreshToken failed: ${err?.message ?? err}`, { cause: err })
        }
        if (typeof t === 'string' && t) this.#token = t
      }
      if (this.#token) headers.Authorization = 'Bearer ' + this.#token
    }
    const path = `/v1/rooms/${encodeURIComponent(this.room)}/${what}`
    const timeout = AbortSignal.timeout(this.#opt.requestTimeoutMs)
    let resp
    try {
      resp = await fetch(this.#httpUrl + path, { method, headers, credentials: 'same-origin', signal: timeout })
    } catch (err) {
      throw new FanfareError(timeout.aborted ? 'timeout' : 'connection_lost', `${method} ${path}: ${err.message}`, { cause: err })
    }
    const text = await resp.text()
    if (resp.status < 200 || resp.status > 299) throw httpError(resp, text)
    if (!text) return null
    try {
      return JSON.parse(text)
    } catch {
      throw new FanfareError('protocol', `${method} ${path}: the answer is not JSON`)
    }
  }

  /** failedDial counts a socket that did not open; with httpUrl, enough of them in a row switch to polling. */
  #failedDial(err) {
    if (!this.#httpUrl) return false
    this.#dialFailures++
    if (this.#dialFailures < this.#opt.pollFallbackAfter && !permanent(err)) return false
    this.#poll()
    return true
  }

  async #run(redial) {
    if (redial) {
      for (;;) {
        if (this.#closed) return
        if (this.#attempt >= this.#opt.maxReconnectAttempts) return this.#end(new FanfareError('closed', `gave up after ${this.#attempt} reconnect attempts`))
        const wait = backoff(this.#opt.backoffMinMs, this.#opt.backoffMaxMs, this.#attempt)
        this.emit('state', { state: 'reconnecting', attempt: this.#attempt + 1, delayMs: wait })
        const delay = wakeable(wait)
        this.#wake = delay.wake
        await delay.promise
        this.#wake = null
        if (this.#closed) return
        this.#attempt++
        try {
          await this.#open(true)
          return
        } catch (err) {
          if (this.#closed) return
          this.emit('error', err)
          if (this.#failedDial(err)) return
          if (permanent(err) && !this.#refreshToken) return this.#end(err)
        }
      }
    }
    try {
      await this.#open(false)
    } catch (err) {
      if (this.#closed) return
      this.emit('error', err)
      if (this.#failedDial(err)) return
      if (permanent(err) && !this.#refreshToken) return this.#end(err)
      this.#run(true)
    }
  }

  /** open dials the room socket and resolves once it is open (its frames then arrive through the handlers). */
  async #open(refresh) {
    if (!this.#ticket && (refresh || !this.#token) && this.#refreshToken) {
      let t
      try {
        t = await this.#refreshToken()
      } catch (err) {
        throw new FanfareError('unauthorized', `refreshToken failed: ${err?.message ?? err}`, { cause: err })
      }
      if (typeof t !== 'string' || !t) throw new FanfareError('unauthorized', 'refreshToken returned no token')
      this.#token = t
    }
    if (this.#closed) return
    this.emit('state', { state: 'connecting' })
    return new Promise((resolve, reject) => {
      let ws
      try {
        ws = new this.#WS(this.#ticket ? withParam(this.#url, 'ticket', this.#ticket) : withToken(this.#url, this.#token))
      } catch (err) {
        reject(new FanfareError('handshake', err.message, { cause: err }))
        return
      }
      let settled = false // opened, or failed
      let lastError = null
      let recv = 0
      let seen = -1
      // Some WebSockets (Node 20's built-in one) fire no close event after
      // an error: the error ends the attempt or the socket by itself.
      ws.onerror = (ev) => {
        lastError = ev
        if (!settled) {
          settled = true
          abandon(ws)
          reject(handshakeError(ev, null))
        } else if (this.#ws === ws) {
          abandon(ws)
          this.#lost(ws, { code: 1006, reason: String(ev?.message ?? 'connection error') })
        }
      }
      ws.onopen = () => {
        settled = true
        this.#ws = ws
        this.#dialFailures = 0
        this.#transport = 'socket'
        const openedAt = Date.now()
        ws._fanfareOpenedAt = openedAt
        clearInterval(this.#hb)
        this.#hb = setInterval(() => {
          if (recv === seen) {
            abandon(ws)
            this.#lost(ws, { code: 0, reason: 'no frames for two heartbeats' })
            return
          }
          seen = recv
          try {
            ws.send('{"type":"ping"}')
          } catch {
            // the close event follows
          }
        }, this.#opt.heartbeatMs)
        this.emit('state', { state: 'open' })
        resolve()
      }
      ws.onmessage = (ev) => {
        recv++
        let f
        try {
          f = JSON.parse(typeof ev.data === 'string' ? ev.data : String(ev.data))
        } catch {
          return
        }
        this.#onFrame(f)
      }
      ws.onclose = (ev) => {
        if (!settled) {
          settled = true
          reject(handshakeError(lastError, ev))
          return
        }
        this.#lost(ws, { code: ev.code, reason: ev.reason })
      }
    })
  }

  #onFrame(f) {
    if (this.#closed) return
    // Polls repeat an unchanged place: only a change is an event.
    if (this.#transport !== 'socket') {
      const key = JSON.stringify(f)
      if (key === this.#lastKey) return
      this.#lastKey = key
    }
    switch (f?.type) {
      case 'queue':
        this.#last = f
        this.emit('queue', f)
        return
      case 'granted':
        if (this.#grantedFrame && this.#grantedFrame.access_token === f.access_token) return
        this.#grantedFrame = f
        for (const w of this.#grantWaiters.splice(0)) w.resolve(f)
        this.emit('granted', f)
        return
      case 'rejected': {
        const err = new FanfareError(String(f.code || 'room_full'), `rejected by room ${f.room}`, { retryAfterMs: Number.isSafeInteger(f.retry_after_ms) ? f.retry_after_ms : 0 })
        this.emit('rejected', f)
        this.#end(err)
        return
      }
      case 'error':
        this.emit('error', new FanfareError(String(f.code || 'internal'), f.message || '', { retryAfterMs: f.retry_after_ms > 0 ? f.retry_after_ms : 0 }))
        return
      default:
        // pong, and frames of types this SDK does not know
    }
  }

  /** lost handles the end of an open socket: 1000 ends the room (rejected, or an admitted session ended), anything else redials. */
  #lost(ws, { code, reason }) {
    clearInterval(this.#hb)
    this.#hb = null
    if (this.#ws === ws) this.#ws = null
    if (this.#closed) return
    this.emit('state', { state: 'disconnected', code, reason })
    if (code === 1000) {
      // docs/protocol.md §6.5: do not reconnect blindly; act on the last frame.
      this.#end(this.#grantedFrame ? null : new FanfareError('closed', `room socket closed: ${reason || 'normal closure'}`))
      return
    }
    if (Date.now() - (ws._fanfareOpenedAt ?? 0) >= this.#opt.stableAfterMs) this.#attempt = 0
    this.#run(true)
  }

  #end(err) {
    if (this.#closed) return
    this.#closed = true
    this.#endError = err
    clearInterval(this.#hb)
    this.#hb = null
    if (this.#wake) this.#wake()
    const waitErr = err ?? new FanfareError('closed', 'left the room')
    for (const w of this.#grantWaiters.splice(0)) w.reject(waitErr)
    this.emit('state', { state: 'closed', error: err ?? undefined })
    this.emit('close', { error: err ?? undefined })
  }
}
