// A place in a waiting room (/rooms/{room}/ws, docs/protocol.md §6). The
// Go SDK's Room (client/room.go) is the reference: keep the socket open,
// redial with backoff (a user back within the room's grace keeps its
// place), stop at a rejection.

import { FanfareError } from './errors.js'
import { Emitter, backoff, wakeable, checkOptions, checkWsUrl } from './util.js'
import { resolveWebSocket, withToken, handshakeError, permanent, abandon } from './socket.js'

/** Defaults of enterRoom()'s options (milliseconds and counts). */
export const roomDefaults = Object.freeze({
  heartbeatMs: 30000,
  backoffMinMs: 250,
  backoffMaxMs: 30000,
  maxReconnectAttempts: Infinity,
  stableAfterMs: 10000,
})

const numericOptions = {
  heartbeatMs: { min: 1 },
  backoffMinMs: { min: 1 },
  backoffMaxMs: { min: 1 },
  maxReconnectAttempts: { min: 0, allowInfinity: true },
  stableAfterMs: { min: 0 },
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

  constructor(options = {}) {
    super()
    const { url, room, token, refreshToken, WebSocket, ...rest } = options
    if (typeof room !== 'string' || !ROOM_NAME.test(room)) throw new TypeError(`fanfare: room ${JSON.stringify(room)} must be 1-64 characters of [A-Za-z0-9_.-]`)
    if (!token && typeof refreshToken !== 'function') throw new TypeError('fanfare: token or refreshToken is required')
    const unknown = Object.keys(rest).filter((k) => !(k in roomDefaults))
    if (unknown.length) throw new TypeError(`fanfare: unknown option${unknown.length > 1 ? 's' : ''} ${unknown.join(', ')}`)
    checkOptions(rest, numericOptions)
    const opt = { ...roomDefaults }
    for (const [k, v] of Object.entries(rest)) if (v !== undefined && k in roomDefaults) opt[k] = v
    if (opt.backoffMaxMs < opt.backoffMinMs) throw new TypeError(`fanfare: backoffMinMs ${opt.backoffMinMs} exceeds backoffMaxMs ${opt.backoffMaxMs}`)
    this.#opt = opt
    this.room = room
    this.#url = roomUrl(url, room)
    this.#token = token || ''
    this.#refreshToken = refreshToken
    this.#WS = resolveWebSocket(WebSocket)
    queueMicrotask(() => this.#run(false)) // listeners added right after enterRoom see every frame
  }

  /** last is the latest queue frame (null before the first). */
  get last() { return this.#last }
  /** closed reports whether the room has ended. */
  get closed() { return this.#closed }

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
          if (permanent(err) && !this.#refreshToken) return this.#end(err)
        }
      }
    }
    try {
      await this.#open(false)
    } catch (err) {
      if (this.#closed) return
      this.emit('error', err)
      if (permanent(err) && !this.#refreshToken) return this.#end(err)
      this.#run(true)
    }
  }

  /** open dials the room socket and resolves once it is open (its frames then arrive through the handlers). */
  async #open(refresh) {
    if ((refresh || !this.#token) && this.#refreshToken) {
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
        ws = new this.#WS(withToken(this.#url, this.#token))
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
    switch (f?.type) {
      case 'queue':
        this.#last = f
        this.emit('queue', f)
        return
      case 'granted':
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
