// The chat client: one logical connection to a fanfare node that survives
// reconnects. It sends with retries under a stable id, hands every group's
// messages to the app exactly once and in seq order (the Tracker), and
// catches up by sync and pulls after every (re)connect. The Go SDK
// (client/conn.go, client/request.go) is the reference for every rule here.

import { FanfareError, errorFromFrame, httpError } from './errors.js'
import { Tracker, trackerDefaults } from './tracker.js'
import { Emitter, backoff, wakeable, sleep, randomPrefix, byteLength, isPositiveInt, checkOptions, checkWsUrl } from './util.js'
import { resolveWebSocket, withToken, handshakeError, permanent, abandon, jwtExp } from './socket.js'
import { SSESocket, fallsBack } from './sse.js'

/** transports are the values of the transport option. */
const transports = ['auto', 'websocket', 'sse']

/** SSE_STICK_MS is how long a client that fell back to SSE redials with it before trying a WebSocket again. */
const SSE_STICK_MS = 5 * 60 * 1000

/** Defaults of connect()'s options (milliseconds and counts). */
export const clientDefaults = Object.freeze({
  ...trackerDefaults,
  requestTimeoutMs: 10000,
  handshakeTimeoutMs: 10000,
  heartbeatMs: 0, // 0 = the server's heartbeat_s from hello
  maxRetries: 10,
  maxRetryAfterMs: 30000,
  maxQueuedSends: 1000,
  maxPullRange: 10000,
  maxReconnectAttempts: Infinity,
  stableAfterMs: 10000,
  maxSyncPages: 1000,
})

const numericOptions = {
  maxBuffered: { min: 1 },
  gapWaitMs: { min: 0 },
  summaryJitterMs: { min: 0 },
  pollIntervalMs: { min: 1 },
  maxCatchUp: { min: 0 },
  backoffMinMs: { min: 1 },
  backoffMaxMs: { min: 1 },
  requestTimeoutMs: { min: 1 },
  handshakeTimeoutMs: { min: 1 },
  heartbeatMs: { min: 0 },
  maxRetries: { min: 0 },
  maxRetryAfterMs: { min: 0 },
  maxQueuedSends: { min: 1 },
  maxPullRange: { min: 1 },
  maxReconnectAttempts: { min: 0, allowInfinity: true },
  stableAfterMs: { min: 0 },
  maxSyncPages: { min: 1 },
}

const MAX_ID_BYTES = 128

/**
 * connect opens a client: it resolves once the first connection is up (its
 * hello frame arrived) and rejects with a FanfareError when that first
 * attempt fails. From then on the client keeps itself connected until
 * close().
 */
export async function connect(options) {
  const c = new Client(options)
  await c._start()
  return c
}

/**
 * Client is a connection to a fanfare node that survives reconnects. Events
 * (client.on(name, fn)):
 *   message   {gid, seq, from, ts, kind, body, pulled}: in seq order per group, once
 *   state     {state: 'connected'|'disconnected'|'reconnecting'|'closed', ...}
 *   degraded  {gid, level, effective, node}: a level changed (gid 0: the node)
 *   presence  {gid, online, ts, joined, left, more}: a group's online count (and, in
 *             small groups, who came online and went offline) changed; see online()
 *   resync    {gid, lastSeq}: the server dropped pushes; the client pulls them
 *   skipped   {gid, from, to}: seqs that will not be delivered (maxCatchUp, expired)
 *   group_lost {gid, error}: a pull was refused forbidden: no longer a member
 *   error     FanfareError: an error frame without a request, a failed background pull or sync
 *   frame     any server frame of a type this SDK does not know (protocol additions)
 *   close     {error?}: the client stopped (close(), or it gave up reconnecting)
 */
export class Client extends Emitter {
  #opt
  #WS
  #url
  #transport
  #sseUntil = 0
  #wsOK = false
  #httpUrl
  #token
  #refreshToken
  #session = null
  #state = 'connecting'
  #closed = false
  #closeError = null
  #hello = null
  #calls = new Map()
  #waiters = new Set()
  #idPrefix = randomPrefix() + '-'
  #ids = 0
  #outstanding = 0
  #attempt = 0
  #reads = new Map()
  #wake = null
  #counters = { reconnects: 0, sends: 0, retries: 0 }
  #tracker
  #online = new Map() // gid -> the latest presence event

  constructor(options = {}) {
    super()
    const { url, token, refreshToken, httpUrl, WebSocket, cursors, skipUnread, transport = 'auto', ...rest } = options
    if (!transports.includes(transport)) throw new TypeError(`fanfare: transport ${JSON.stringify(transport)} must be one of ${transports.join(', ')}`)
    if (transport === 'sse' && !httpUrl) throw new TypeError('fanfare: transport sse needs httpUrl')
    if (transport !== 'sse' || url !== undefined) checkWsUrl(url)
    this.#transport = transport
    if (!token && typeof refreshToken !== 'function') throw new TypeError('fanfare: token or refreshToken is required')
    if (refreshToken !== undefined && typeof refreshToken !== 'function') throw new TypeError('fanfare: refreshToken must be a function')
    if (httpUrl !== undefined && httpUrl !== null && httpUrl !== '') {
      let u
      try {
        u = new URL(httpUrl)
      } catch {
        throw new TypeError(`fanfare: httpUrl ${JSON.stringify(httpUrl)} is not a URL`)
      }
      if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new TypeError(`fanfare: httpUrl scheme ${u.protocol} must be http: or https:`)
      this.#httpUrl = String(httpUrl).replace(/\/+$/, '')
    }
    const unknown = Object.keys(rest).filter((k) => !(k in clientDefaults))
    if (unknown.length) throw new TypeError(`fanfare: unknown option${unknown.length > 1 ? 's' : ''} ${unknown.join(', ')}`)
    checkOptions(rest, numericOptions)
    const opt = { ...clientDefaults }
    for (const [k, v] of Object.entries(rest)) if (v !== undefined && k in clientDefaults) opt[k] = v
    if (opt.backoffMaxMs < opt.backoffMinMs) throw new TypeError(`fanfare: backoffMinMs ${opt.backoffMinMs} exceeds backoffMaxMs ${opt.backoffMaxMs}`)
    opt.skipUnread = Boolean(skipUnread)
    this.#opt = opt
    this.#WS = transport === 'sse' ? null : resolveWebSocket(WebSocket)
    this.#url = url
    this.#token = token || ''
    this.#refreshToken = refreshToken
    this.#tracker = new Tracker({
      deliver: (m) => this.emit('message', m),
      pull: (gid, from, to) => this.#backgroundPull(gid, from, to),
      emit: (ev, data) => this.#emitTracker(ev, data),
      place: this.#httpUrl && !opt.skipUnread ? (gid) => this.#syncEntry(gid) : null,
      options: opt,
    })
    if (cursors) {
      for (const [gid, seq] of Object.entries(cursors)) {
        const g = Number(gid)
        if (!isPositiveInt(g) || !Number.isSafeInteger(seq) || seq < 0) throw new TypeError(`fanfare: cursors[${gid}] = ${seq}: want a positive gid and a non-negative seq`)
        this.#tracker.track(g, seq)
      }
    }
  }

  // --- public state --------------------------------------------------------

  /** hello is the hello frame of the latest connection ({uid, node, heartbeat_s, max_message_bytes}). */
  get hello() { return this.#hello }
  /** uid is the user id the server authenticated. */
  get uid() { return this.#hello?.uid ?? '' }
  /** connected reports whether a connection is up now. */
  get connected() { return this.#session !== null }
  /** state is 'connecting', 'connected', 'reconnecting', 'disconnected' or 'closed'. */
  get state() { return this.#state }
  /** transport is the transport of the current connection: 'websocket', 'sse', or '' while disconnected. */
  get transport() { return this.#session?.kind ?? '' }
  /** options are the options in force, defaults filled in. */
  get options() { return { ...this.#opt } }

  /** level returns the degradation level in effect for gid (the higher of the node's and the group's); level() the node's. */
  level(gid = 0) { return this.#tracker.level(gid) }

  /** levels returns {node, groups: {gid: level}} as the server last announced them. */
  levels() {
    const groups = {}
    for (const [gid, lv] of this.#tracker.groupLevels) groups[gid] = lv
    return { node: this.#tracker.nodeLevel, groups }
  }

  /** cursors returns {gid: last delivered seq}; pass it back as the cursors option to resume a session. */
  cursors() { return this.#tracker.cursors() }

  /** stats returns the client's counters since connect. */
  stats() {
    return { ...this.#tracker.stats, ...this.#counters, outstandingSends: this.#outstanding }
  }

  // --- lifecycle -----------------------------------------------------------

  async _start() {
    try {
      await this.#dial()
    } catch (err) {
      this.#closed = true
      this.#state = 'closed'
      this.#tracker.close()
      throw err
    }
  }

  /**
   * close closes the connection (code 1000), stops reconnecting and rejects
   * outstanding sends and pulls with code 'closed'. It resolves once the
   * socket has closed (at most after a second).
   */
  async close() {
    if (this.#closed) return
    const s = this.#session
    this.#finish(null)
    if (s) await closeGracefully(s.ws)
  }

  /**
   * reconnect drops the current connection at once (without a close
   * handshake) and reconnects, as after a network change. Outstanding
   * sends are retried on the new connection under the same id.
   */
  reconnect() {
    const s = this.#session
    if (s) this.#end(s, { code: 0, reason: 'reconnect requested' }, true)
    else if (this.#wake) this.#wake()
  }

  // --- requests ------------------------------------------------------------

  /**
   * send stores body (any JSON value) in group gid and resolves to its ack
   * {id, gid, seq, ts}. Retryable failures (connection loss, timeouts,
   * overloaded, unavailable, rate_limited after its retry_after_ms) are
   * retried under the same id up to maxRetries times, so the server stores
   * the message once; other refusals reject with a FanfareError whose code
   * is the server's (forbidden, too_large, group_closed, bad_request...).
   * opts: {id} a client message id of your own (1-128 bytes, for retries
   * across app restarts), {kind} 'text' or 'at_all', {signal} an AbortSignal.
   */
  async send(gid, body, opts = {}) {
    if (this.#closed) throw this.#closedError()
    if (!isPositiveInt(gid)) throw new FanfareError('bad_request', `gid must be a positive integer, got ${String(gid)}`)
    const { id = this.#newId(), kind, signal } = opts
    if (typeof id !== 'string' || id.length === 0 || byteLength(id) > MAX_ID_BYTES) {
      throw new FanfareError('bad_request', `id must be a string of 1-${MAX_ID_BYTES} bytes`)
    }
    if (kind !== undefined && kind !== 'text' && kind !== 'at_all') throw new FanfareError('bad_request', `kind must be "text" or "at_all", got ${JSON.stringify(kind)}`)
    let frame
    try {
      frame = JSON.stringify({ type: 'send', id, gid, ...(kind ? { kind } : {}), body })
    } catch (err) {
      throw new FanfareError('bad_request', `body: ${err.message}`)
    }
    if (body === undefined || frame === undefined || !frame.includes('"body":')) throw new FanfareError('bad_request', 'body must be a JSON value')
    if (this.#outstanding >= this.#opt.maxQueuedSends) {
      throw new FanfareError('queue_full', `${this.#outstanding} sends outstanding, at most maxQueuedSends ${this.#opt.maxQueuedSends}`)
    }
    this.#outstanding++
    this.#counters.sends++
    try {
      return await this.#sendLoop(id, frame, signal)
    } finally {
      this.#outstanding--
    }
  }

  async #sendLoop(id, frame, signal) {
    const size = byteLength(frame)
    let lastErr
    for (let attempt = 0; ; attempt++) {
      if (attempt > this.#opt.maxRetries) throw lastErr
      if (attempt > 0) this.#counters.retries++
      const s = await this.#waitSession(signal)
      const most = s.hello.max_message_bytes
      if (Number.isSafeInteger(most) && most > 0 && size > most) {
        throw new FanfareError('too_large', `send frame is ${size} bytes, the server takes at most ${most}`)
      }
      let f
      try {
        f = await this.#request(s, id, frame, signal)
      } catch (err) {
        if (err.code === 'connection_lost' || err.code === 'timeout') {
          lastErr = err
          continue
        }
        throw err
      }
      if (f.type === 'ack') return { id, gid: f.gid, seq: f.seq, ts: f.ts }
      if (f.type !== 'error') throw new FanfareError('protocol', `a ${f.type} frame answers a send`)
      const e = errorFromFrame(f)
      if (!e.retryable) throw e
      lastErr = e
      const wait = e.retryAfterMs > 0 ? e.retryAfterMs : backoff(this.#opt.backoffMinMs, this.#opt.backoffMaxMs, attempt)
      if (wait > this.#opt.maxRetryAfterMs || attempt >= this.#opt.maxRetries) throw e
      await this.#sleep(wait, signal)
    }
  }

  /**
   * pull resolves to {gid, messages, lastSeq}: gid's stored messages in
   * [fromSeq, toSeq] (toSeq 0 = up to last_seq) that the user may see (the
   * server starts at the member's join_seq), paging through next_seq, at
   * most maxPullRange of them: when they end below toSeq (or lastSeq), pull
   * again from after the last one. It reads over the socket, or over HTTP
   * while disconnected when httpUrl is set; retryable failures are retried
   * like send's. pull does not emit 'message' and does not move the cursors.
   */
  async pull(gid, fromSeq = 0, toSeq = 0, opts = {}) {
    if (this.#closed) throw this.#closedError()
    if (!isPositiveInt(gid) || !Number.isSafeInteger(fromSeq) || fromSeq < 0 || !Number.isSafeInteger(toSeq) || toSeq < 0 || (toSeq !== 0 && toSeq < fromSeq)) {
      throw new FanfareError('bad_request', `bad range: gid ${gid} [${fromSeq}, ${toSeq}]`)
    }
    const { signal } = opts
    const max = this.#opt.maxPullRange
    let from = Math.max(fromSeq, 1)
    const out = { gid, messages: [], lastSeq: 0 }
    while (out.messages.length < max) {
      const page = await this.#pullPage(gid, from, toSeq, signal)
      out.lastSeq = page.last_seq
      const msgs = page.messages ?? []
      for (const m of msgs) {
        if (m.seq < from || out.messages.length === max) continue
        out.messages.push({ gid, seq: m.seq, from: m.from, ts: m.ts, kind: m.kind ?? 'text', body: m.body, pulled: true })
      }
      if (msgs.length === 0) break // nothing visible in [from, toSeq]
      from = msgs[msgs.length - 1].seq + 1
      if (Number.isSafeInteger(page.next_seq) && page.next_seq > 0) {
        from = Math.max(from, page.next_seq)
        continue
      }
      const end = toSeq !== 0 && toSeq < page.last_seq ? toSeq : page.last_seq
      if (from > end) break
    }
    return out
  }

  async #pullPage(gid, from, to, signal) {
    let lastErr
    for (let attempt = 0; attempt <= this.#opt.maxRetries; attempt++) {
      try {
        if (!this.#session && this.#httpUrl) return await this.#pullHTTP(gid, from, to, signal)
        const s = await this.#waitSession(signal)
        return await this.#pullWS(s, gid, from, to, signal)
      } catch (err) {
        await this.#again(err, attempt, signal)
        lastErr = err
      }
    }
    throw lastErr
  }

  /**
   * again decides whether a failed request (attempt counts from 0) is
   * tried again: it resolves after waiting when it is (a retryable server
   * answer within maxRetryAfterMs, or a lost connection or answer: the
   * first retry at once, later ones after a backoff) and rethrows err
   * when it is not.
   */
  async #again(err, attempt, signal) {
    if (!(err instanceof FanfareError) || !err.retryable) throw err
    if (err.fromServer) {
      const wait = err.retryAfterMs > 0 ? err.retryAfterMs : backoff(this.#opt.backoffMinMs, this.#opt.backoffMaxMs, attempt)
      if (wait > this.#opt.maxRetryAfterMs) throw err
      await this.#sleep(wait, signal)
    } else if (attempt > 0) {
      await this.#sleep(backoff(this.#opt.backoffMinMs, this.#opt.backoffMaxMs, attempt - 1), signal)
    }
  }

  /** getRetrying is #httpGet tried again as a pull is (#again): a GET is idempotent, so a connection closed under it or a 503 costs a retry, not an error. */
  async #getRetrying(path, signal) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.#httpGet(path, signal)
      } catch (err) {
        if (attempt >= this.#opt.maxRetries) throw err
        await this.#again(err, attempt, signal)
      }
    }
  }

  async #pullWS(s, gid, from, to, signal) {
    const id = this.#newId()
    const frame = JSON.stringify({ type: 'pull', id, gid, from_seq: from, ...(to ? { to_seq: to } : {}) })
    const f = await this.#request(s, id, frame, signal)
    if (f.type === 'messages') return f
    if (f.type === 'error') throw errorFromFrame(f)
    throw new FanfareError('protocol', `a ${f.type} frame answers a pull`)
  }

  #pullHTTP(gid, from, to, signal) {
    const q = new URLSearchParams({ from_seq: String(from) })
    if (to) q.set('to_seq', String(to))
    return this.#httpGet(`/v1/groups/${gid}/messages?${q}`, signal)
  }

  /** backgroundPull is the Tracker's pull: one page over the current socket. */
  #backgroundPull(gid, from, to) {
    const s = this.#session
    if (!s) return Promise.reject(new FanfareError('connection_lost', 'not connected'))
    return this.#pullWS(s, gid, from, to)
  }

  /**
   * sync asks the server (GET /v1/sync, following next_after to the last
   * page) for every group of the user with last_seq, last_read_seq and
   * unread, and schedules the catch-up of tracked groups behind their
   * last_seq and of untracked ones (from last_read_seq, or nothing with
   * skipUnread). The client syncs by itself after every (re)connect when
   * httpUrl is set; without it, this rejects with code 'no_http'.
   */
  async sync(opts = {}) {
    if (this.#closed) throw this.#closedError()
    const groups = await this.#syncHTTP(opts.signal)
    this.#tracker.applySync(groups, { skipUnread: this.#opt.skipUnread })
    return groups
  }

  async #syncHTTP(signal) {
    if (!this.#httpUrl) throw new FanfareError('no_http', 'sync needs the HTTP API: pass httpUrl to connect()')
    const groups = []
    let after = 0
    for (let pages = 0; pages < this.#opt.maxSyncPages; pages++) {
      const path = after > 0 ? `/v1/sync?after_gid=${after}` : '/v1/sync'
      const resp = await this.#getRetrying(path, signal)
      const page = Array.isArray(resp.groups) ? resp.groups : []
      groups.push(...page)
      if (!resp.next_after) return groups
      // The cursor must move forward past a non-empty page, or a faulty
      // server would keep this loop going forever.
      if (resp.next_after <= after || page.length === 0) {
        throw new FanfareError('protocol', `GET ${path}: next_after ${resp.next_after} does not move past after_gid ${after}`)
      }
      after = resp.next_after
    }
    throw new FanfareError('protocol', `GET /v1/sync: more than maxSyncPages ${this.#opt.maxSyncPages} pages`)
  }

  /** syncEntry resolves to gid's sync entry (GET /v1/sync from gid: one page), null when the user is not a member. */
  async #syncEntry(gid) {
    const resp = await this.#getRetrying(gid > 1 ? `/v1/sync?after_gid=${gid - 1}` : '/v1/sync')
    const page = Array.isArray(resp.groups) ? resp.groups : []
    return page.find((sg) => sg.gid === gid) ?? null
  }

  /**
   * track starts delivering gid's messages after afterSeq and pulls what
   * the group holds after it; for a group tracked already it only catches
   * up (a cursor never moves back).
   */
  track(gid, afterSeq = 0) {
    if (!isPositiveInt(gid) || !Number.isSafeInteger(afterSeq) || afterSeq < 0) throw new FanfareError('bad_request', `track: bad gid ${gid} or seq ${afterSeq}`)
    this.#tracker.track(gid, afterSeq)
  }

  /** untrack stops delivering gid (until its next push or sync). */
  untrack(gid) { this.#tracker.untrack(gid) }

  /**
   * read marks gid read up to seq (the read frame; no answer). While
   * disconnected the mark is kept and written after the reconnect.
   */
  read(gid, seq) {
    if (!isPositiveInt(gid) || !Number.isSafeInteger(seq) || seq < 0) throw new FanfareError('bad_request', `bad read mark: gid ${gid} seq ${seq}`)
    const s = this.#session
    if (s) {
      try {
        s.ws.send(JSON.stringify({ type: 'read', gid, seq }))
        return
      } catch {
        // kept below for the next connection
      }
    }
    if (seq > (this.#reads.get(gid) ?? -1)) this.#reads.set(gid, seq)
  }

  /** ping sends an application ping and resolves to the round trip in ms. */
  async ping(opts = {}) {
    const s = await this.#waitSession(opts.signal)
    const id = this.#newId()
    const t0 = Date.now()
    const f = await this.#request(s, id, JSON.stringify({ type: 'ping', id }), opts.signal)
    if (f.type === 'error') throw errorFromFrame(f)
    return Date.now() - t0
  }

  // --- connection ------------------------------------------------------------

  #newId() {
    return this.#idPrefix + (++this.#ids).toString(36)
  }

  /** dial opens one connection and resolves once its hello arrived and it is attached; refresh asks refreshToken for a new token first. */
  async #dial(refresh = false) {
    if (refresh && this.#refreshToken) this.#token = ''
    const token = await this.#currentToken()
    const sse = () => this.#open('sse', () => new SSESocket(this.#httpUrl, () => this.#currentToken()))
    if (this.#transport === 'sse' || (this.#transport === 'auto' && this.#httpUrl && Date.now() < this.#sseUntil)) return sse()
    try {
      const s = await this.#open('websocket', () => new this.#WS(withToken(this.#url, token)))
      this.#wsOK = true
      return s
    } catch (err) {
      if (this.#transport !== 'auto' || !this.#httpUrl || !fallsBack(err) || this.#closed) throw err
      // A client whose WebSocket worked before takes a failure without an
      // HTTP answer for an outage (the stream would fail as well); an
      // answer that is not fanfare's own refusal (a proxy's) still falls
      // back. Browsers never tell the status: there only the first
      // connection falls back.
      if (this.#wsOK && !err.status) throw err
      const s = await sse()
      this.#sseUntil = Date.now() + SSE_STICK_MS
      return s
    }
  }

  /** open opens one connection of kind with make() and resolves once its hello arrived and it is attached. */
  #open(kind, make) {
    return new Promise((resolve, reject) => {
      let ws
      try {
        ws = make()
      } catch (err) {
        reject(new FanfareError('handshake', err.message, { cause: err }))
        return
      }
      // held: frames that arrive with hello in one read, kept until the
      // app's code after `await connect()` has run (npm ws emits them in
      // the same tick, before any listener could be added).
      const s = { ws, kind, hello: null, openedAt: 0, recv: 0, seen: 0, hb: null, every: 0, ended: false, held: null }
      ws.onheartbeat = () => { s.recv++ } // SSE comments: the server's heartbeats
      let lastError = null
      let settled = false
      const fail = (err) => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        abandon(ws)
        reject(err)
      }
      const timer = setTimeout(() => fail(new FanfareError('timeout', `no hello within ${this.#opt.handshakeTimeoutMs} ms`)), this.#opt.handshakeTimeoutMs)
      // An error event means the connection failed; some WebSockets
      // (Node 20's built-in one) fire no close event after it, so it ends
      // the attempt or the session by itself.
      ws.onerror = (ev) => {
        lastError = ev
        if (!settled) fail(handshakeError(ev, null))
        else this.#end(s, { code: 1006, reason: String(ev?.message ?? 'connection error') }, true)
      }
      ws.onclose = (ev) => {
        if (!settled) fail(handshakeError(lastError, ev))
        else this.#end(s, { code: ev.code, reason: ev.reason })
      }
      ws.onmessage = (ev) => {
        s.recv++
        let f
        try {
          f = JSON.parse(typeof ev.data === 'string' ? ev.data : String(ev.data))
        } catch {
          return // not JSON: skip, like any frame we cannot read
        }
        if (!f || typeof f !== 'object') return
        if (s.hello === null) {
          if (f.type !== 'hello') {
            fail(new FanfareError('protocol', `first frame is ${JSON.stringify(f.type)}, want hello`))
            return
          }
          settled = true
          clearTimeout(timer)
          s.hello = f
          if (this.#closed) {
            abandon(ws)
            reject(this.#closedError())
            return
          }
          s.held = []
          this.#attach(s) // before the next frame is read: levels reset, then announced
          resolve(s)
          setTimeout(() => {
            const held = s.held
            s.held = null
            for (const h of held) if (!s.ended) this.#onFrame(h)
          }, 0)
          return
        }
        if (s.held) s.held.push(f)
        else if (!s.ended) this.#onFrame(f)
      }
    })
  }

  #attach(s) {
    s.openedAt = Date.now()
    this.#session = s
    this.#hello = s.hello
    this.#state = 'connected'
    // A sync follows (#resume): groups first seen by a push before it
    // answers wait for it to say where delivery starts.
    this.#tracker.connected({ syncing: Boolean(this.#httpUrl) && !this.#opt.skipUnread })
    s.every = this.#opt.heartbeatMs > 0 ? this.#opt.heartbeatMs : (s.hello.heartbeat_s > 0 ? s.hello.heartbeat_s * 1000 : 30000)
    // Over SSE the server writes a comment after heartbeat_s of silence
    // (checked every second) and takes no pings: allow two of them.
    if (s.kind === 'sse') s.every = Math.max(s.every, 2 * (s.hello.heartbeat_s || 15) * 1000 + 1000)
    s.hb = setInterval(() => this.#heartbeat(s), s.every)
    for (const w of this.#waiters) w.resolve(s)
    this.#waiters.clear()
    this.emit('state', { state: 'connected', hello: s.hello })
    this.#resume(s)
  }

  /** heartbeat pings every interval and drops a connection from which nothing arrived for one whole interval since the last ping. */
  #heartbeat(s) {
    if (s.ended) return
    if (s.recv === s.seen) {
      this.#end(s, { code: 0, reason: `no frames for two heartbeats (${s.every} ms)` }, true)
      return
    }
    s.seen = s.recv
    try {
      s.ws.send('{"type":"ping"}')
    } catch {
      // the close event follows
    }
  }

  /** resume runs after every connect: read marks, then sync (or probes), so that what was missed is pulled. */
  async #resume(s) {
    const reads = [...this.#reads]
    this.#reads.clear()
    for (const [gid, seq] of reads) this.read(gid, seq)
    if (this.#httpUrl) {
      try {
        const groups = await this.#syncHTTP()
        if (s !== this.#session) return
        this.#tracker.applySync(groups, { skipUnread: this.#opt.skipUnread })
        this.#tracker.endSync()
        this.#tracker.resume()
        return
      } catch (err) {
        if (s !== this.#session) return
        this.emit('error', err)
      }
    }
    this.#tracker.endSync()
    this.#tracker.resume({ probe: true })
  }

  /** end retires session s (closed by the server, the network, the heartbeat, or reconnect()) and starts redialing. */
  #end(s, { code, reason }, drop = false) {
    if (s.ended) return
    s.ended = true
    clearInterval(s.hb)
    if (drop) abandon(s.ws)
    if (this.#session !== s) return
    this.#session = null
    this.#tracker.disconnected()
    const lost = new FanfareError('connection_lost', `connection closed${code ? ` (${code}${reason ? ' ' + reason : ''})` : reason ? ` (${reason})` : ''}`)
    for (const [id, call] of this.#calls) {
      if (call.s === s) {
        this.#calls.delete(id)
        clearTimeout(call.timer)
        call.reject(lost)
      }
    }
    if (this.#closed) return
    this.#state = 'disconnected'
    this.emit('state', { state: 'disconnected', code, reason })
    this.#redial(s, code, reason)
  }

  /** redial reconnects with jittered exponential backoff until it succeeds, the client closes, or retrying cannot help. */
  async #redial(prev, code, reason) {
    if (Date.now() - prev.openedAt >= this.#opt.stableAfterMs) this.#attempt = 0
    const tokenExpired = code === 1008 && /token expired/.test(reason ?? '')
    for (;;) {
      if (this.#closed) return
      if (this.#attempt >= this.#opt.maxReconnectAttempts) {
        this.#finish(new FanfareError('closed', `gave up after ${this.#attempt} reconnect attempts`))
        return
      }
      const wait = backoff(this.#opt.backoffMinMs, this.#opt.backoffMaxMs, this.#attempt)
      this.#state = 'reconnecting'
      this.emit('state', { state: 'reconnecting', attempt: this.#attempt + 1, delayMs: wait })
      const delay = wakeable(wait)
      this.#wake = delay.wake
      await delay.promise
      this.#wake = null
      if (this.#closed) return
      this.#attempt++
      if (!this.#refreshToken && this.#token) {
        const exp = jwtExp(this.#token)
        if ((tokenExpired || (exp > 0 && exp + 30000 < Date.now()))) {
          this.#finish(new FanfareError('unauthorized', 'the token expired and there is no refreshToken callback'))
          return
        }
      }
      try {
        await this.#dial(true) // a fresh token before every reconnect
        this.#counters.reconnects++
        return
      } catch (err) {
        if (this.#closed) return
        this.emit('error', err)
        if (permanent(err) && !this.#refreshToken) {
          this.#finish(err)
          return
        }
      }
    }
  }

  /** finish stops the client for good: by close() (err null) or because reconnecting cannot succeed. */
  #finish(err) {
    if (this.#closed) return
    this.#closed = true
    this.#closeError = err
    this.#state = 'closed'
    this.#tracker.close()
    if (this.#wake) this.#wake()
    const s = this.#session
    this.#session = null
    if (s) {
      s.ended = true
      clearInterval(s.hb)
    }
    const closedErr = this.#closedError()
    for (const [, call] of this.#calls) {
      clearTimeout(call.timer)
      call.reject(closedErr)
    }
    this.#calls.clear()
    for (const w of this.#waiters) w.reject(closedErr)
    this.#waiters.clear()
    this.emit('state', { state: 'closed', error: err ?? undefined })
    this.emit('close', { error: err ?? undefined })
  }

  #closedError() {
    if (this.#closeError) return new FanfareError('closed', this.#closeError.message, { cause: this.#closeError })
    return new FanfareError('closed', 'the client is closed')
  }

  #waitSession(signal) {
    if (this.#closed) return Promise.reject(this.#closedError())
    if (this.#session) return Promise.resolve(this.#session)
    if (signal?.aborted) return Promise.reject(aborted(signal))
    return new Promise((resolve, reject) => {
      const w = {
        resolve: (s) => { signal?.removeEventListener('abort', onAbort); resolve(s) },
        reject: (e) => { signal?.removeEventListener('abort', onAbort); reject(e) },
      }
      const onAbort = () => {
        this.#waiters.delete(w)
        reject(aborted(signal))
      }
      signal?.addEventListener('abort', onAbort, { once: true })
      this.#waiters.add(w)
    })
  }

  async #sleep(ms, signal) {
    try {
      await sleep(ms, signal)
    } catch {
      throw aborted(signal)
    }
    if (this.#closed) throw this.#closedError()
  }

  /** request writes frame (whose id is id) over s and resolves to its answer frame. */
  #request(s, id, frame, signal) {
    if (this.#calls.has(id)) return Promise.reject(new FanfareError('bad_request', `a request with id ${id} is in flight`))
    if (signal?.aborted) return Promise.reject(aborted(signal))
    return new Promise((resolve, reject) => {
      const done = () => {
        this.#calls.delete(id)
        clearTimeout(call.timer)
        signal?.removeEventListener('abort', onAbort)
      }
      const onAbort = () => {
        done()
        reject(aborted(signal))
      }
      const call = {
        s,
        resolve: (f) => { done(); resolve(f) },
        reject: (e) => { done(); reject(e) },
        timer: setTimeout(() => {
          done()
          reject(new FanfareError('timeout', `no answer to ${id} within ${this.#opt.requestTimeoutMs} ms`))
        }, this.#opt.requestTimeoutMs),
      }
      signal?.addEventListener('abort', onAbort, { once: true })
      this.#calls.set(id, call)
      try {
        s.ws.send(frame)
      } catch (err) {
        call.reject(new FanfareError('connection_lost', err.message, { cause: err }))
        this.#end(s, { code: 0, reason: 'write failed' }, true)
      }
    })
  }

  /** onFrame routes one server frame of the attached session. */
  #onFrame(f) {
    switch (f.type) {
      case 'ack':
      case 'messages':
      case 'pong':
        if (typeof f.id === 'string') this.#calls.get(f.id)?.resolve(f)
        return
      case 'error': {
        const call = typeof f.id === 'string' ? this.#calls.get(f.id) : undefined
        if (call) call.resolve(f)
        else this.emit('error', errorFromFrame(f))
        return
      }
      case 'msg':
        return this.#tracker.onMsg(f)
      case 'batch':
        return this.#tracker.onBatch(f)
      case 'summary':
        return this.#tracker.onSummary(f)
      case 'resync':
        return this.#tracker.onResync(f)
      case 'degraded':
        return this.#tracker.onDegraded(f)
      case 'presence':
        return this.#onPresence(f)
      case 'hello':
        return
      default:
        this.emit('frame', f)
    }
  }

  /** onPresence keeps and emits a presence frame (docs/protocol.md §4.16); a malformed one is dropped. */
  #onPresence(f) {
    const list = (v) => (Array.isArray(v) ? v.filter((u) => typeof u === 'string') : [])
    if (!isPositiveInt(f.gid) || !Number.isSafeInteger(f.online) || f.online < 0) return
    const p = { gid: f.gid, online: f.online, ts: Number.isSafeInteger(f.ts) ? f.ts : 0, joined: list(f.joined), left: list(f.left), more: f.more === true }
    this.#online.set(f.gid, p)
    this.emit('presence', p)
  }

  /**
   * online returns the latest presence event of gid ({gid, online, ts,
   * joined, left, more}), undefined before the first one. The server pushes
   * one per interval only when the count changed: onlineMembers() reads the
   * current count.
   */
  online(gid) { return this.#online.get(gid) }

  /**
   * onlineMembers reads one page of gid's online members (GET
   * /v1/groups/{gid}/online, docs/protocol.md §8.6): {gid, online, ts,
   * listed, members, nextCursor}. members is in uid order after cursor, at
   * most limit (1..500, default 100); listed is false for groups above the
   * server's list threshold (count only). Needs httpUrl.
   */
  async onlineMembers(gid, { cursor = '', limit = 0, signal } = {}) {
    if (this.#closed) throw this.#closedError()
    if (!this.#httpUrl) throw new FanfareError('no_http', 'onlineMembers needs the HTTP API: pass httpUrl to connect()')
    if (!isPositiveInt(gid)) throw new FanfareError('bad_request', `onlineMembers: bad gid ${gid}`)
    if (typeof cursor !== 'string') throw new FanfareError('bad_request', 'onlineMembers: cursor must be a string')
    if (limit !== 0 && (!Number.isSafeInteger(limit) || limit < 1 || limit > 500)) throw new FanfareError('bad_request', `onlineMembers: limit ${limit} not in 1..500`)
    const q = new URLSearchParams()
    if (cursor) q.set('cursor', cursor)
    if (limit) q.set('limit', String(limit))
    const qs = q.toString()
    const path = `/v1/groups/${gid}/online` + (qs ? `?${qs}` : '')
    const r = await this.#httpGet(path, signal)
    const next = typeof r.next_cursor === 'string' ? r.next_cursor : ''
    if (next && next <= cursor) throw new FanfareError('protocol', `GET ${path}: next_cursor does not move past cursor`)
    return { gid: r.gid, online: r.online, ts: r.ts, listed: r.listed === true, members: Array.isArray(r.members) ? r.members : [], nextCursor: next }
  }

  /**
   * allOnlineMembers follows onlineMembers' cursor to the last page (at
   * most 100 pages: the server lists groups of at most 10,000 members) and
   * resolves {online, listed, members}.
   */
  async allOnlineMembers(gid, { signal } = {}) {
    const members = []
    let cursor = ''
    for (let pages = 0; pages < 100; pages++) {
      const p = await this.onlineMembers(gid, { cursor, limit: 500, signal })
      members.push(...p.members)
      if (!p.nextCursor) return { online: p.online, listed: p.listed, members }
      cursor = p.nextCursor
    }
    throw new FanfareError('protocol', `GET /v1/groups/${gid}/online: more than 100 pages`)
  }

  #emitTracker(ev, data) {
    if (ev === 'resync') this.emit('resync', { gid: data.gid, lastSeq: data.last_seq })
    else this.emit(ev, data)
  }

  async #httpGet(path, signal, retried = false) {
    const token = await this.#currentToken()
    const timeout = AbortSignal.timeout(this.#opt.requestTimeoutMs)
    const sig = signal && typeof AbortSignal.any === 'function' ? AbortSignal.any([signal, timeout]) : timeout
    let resp
    try {
      resp = await fetch(this.#httpUrl + path, { headers: { Authorization: 'Bearer ' + token }, signal: sig })
    } catch (err) {
      if (signal?.aborted) throw aborted(signal)
      const code = timeout.aborted ? 'timeout' : 'connection_lost'
      throw new FanfareError(code, `GET ${path}: ${err.message}`, { cause: err })
    }
    let text
    try {
      text = await resp.text()
    } catch (err) {
      if (signal?.aborted) throw aborted(signal)
      const code = timeout.aborted ? 'timeout' : 'connection_lost'
      throw new FanfareError(code, `GET ${path}: ${err.message}`, { cause: err })
    }
    if (resp.status === 200) {
      try {
        return JSON.parse(text)
      } catch {
        throw new FanfareError('protocol', `GET ${path}: the answer is not JSON`)
      }
    }
    if (resp.status === 401 && this.#refreshToken && !retried) {
      this.#token = ''
      return this.#httpGet(path, signal, true)
    }
    throw httpError(resp, text)
  }

  /** currentToken returns the token, asking refreshToken for one when there is none (start, after a 401, before a reconnect). */
  async #currentToken() {
    if (!this.#token && this.#refreshToken) {
      let t
      try {
        t = await this.#refreshToken()
      } catch (err) {
        throw new FanfareError('unauthorized', `refreshToken failed: ${err?.message ?? err}`, { cause: err })
      }
      if (typeof t !== 'string' || t === '') throw new FanfareError('unauthorized', 'refreshToken returned no token')
      this.#token = t
    }
    return this.#token
  }
}

function aborted(signal) {
  return new FanfareError('aborted', String(signal?.reason?.message ?? signal?.reason ?? 'aborted'), { cause: signal?.reason })
}

/** closeGracefully closes ws with 1000 and resolves on its close event, or after a second. */
function closeGracefully(ws) {
  return new Promise((resolve) => {
    const t = setTimeout(() => {
      abandon(ws)
      resolve()
    }, 1000)
    ws.onclose = () => {
      clearTimeout(t)
      resolve()
    }
    ws.onmessage = ws.onerror = null
    try {
      ws.close(1000, 'client closed')
    } catch {
      clearTimeout(t)
      resolve()
    }
  })
}
