// The Server-Sent Events transport (docs/protocol.md §14): for networks
// and proxies that do not pass WebSocket. SSESocket looks to the Client
// like the WebSocket it replaces: it receives the server's frames from
// GET /v1/events (read with fetch streaming, in browsers and in Node 20
// alike: fetch can send the Authorization header, so the token never goes
// into a URL, and no EventSource is needed), and turns the client frames
// handed to send() into HTTP requests whose answers come back through
// onmessage as the frames a socket would have carried.

const MAX_EVENT_BYTES = 16 << 20
const MAX_REQUESTS = 32

/**
 * fallsBack reports whether a failed WebSocket handshake may be a network
 * that blocks WebSocket: anything but the server's own refusals (401 bad
 * token, 429 caps, 503 draining or L4), which the SSE transport would give
 * as well.
 */
export function fallsBack(err) {
  return !(err?.status === 401 || err?.status === 429 || err?.status === 503)
}

/**
 * SSESocket is one event stream. Handlers: onmessage({data}) for every
 * frame, onheartbeat() for every comment line (the server's heartbeats),
 * onerror({message}) when the stream cannot be opened (the message names
 * the status as npm ws does, "Unexpected server response: 401"), and
 * onclose({code, reason}) when an open stream ends.
 */
export class SSESocket {
  #base
  #getToken
  #abort = new AbortController()
  #state = 'connecting'
  #inflight = 0
  #waiting = []

  constructor(httpUrl, getToken) {
    this.#base = httpUrl
    this.#getToken = getToken
    this.onmessage = this.onerror = this.onclose = this.onopen = this.onheartbeat = null
    queueMicrotask(() => this.#run())
  }

  async #run() {
    let resp
    try {
      const token = await this.#getToken()
      resp = await fetch(this.#base + '/v1/events', {
        headers: { Authorization: 'Bearer ' + token, Accept: 'text/event-stream', 'Cache-Control': 'no-cache' },
        signal: this.#abort.signal,
        cache: 'no-store',
      })
    } catch (err) {
      this.#fail(String(err?.message ?? err))
      return
    }
    if (resp.status !== 200) {
      try { await resp.body?.cancel() } catch {}
      this.#fail(`Unexpected server response: ${resp.status}`)
      return
    }
    if (!String(resp.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
      try { await resp.body?.cancel() } catch {}
      this.#fail(`GET /v1/events answered ${resp.headers.get('content-type')}, want text/event-stream`)
      return
    }
    this.#state = 'open'
    this.onopen?.({})
    let why = { code: 1006, reason: 'event stream ended' }
    try {
      why = (await this.#read(resp.body)) ?? why
    } catch (err) {
      if (this.#state === 'closed') return
      why = { code: 1006, reason: String(err?.message ?? err) }
    }
    this.#closed(why)
  }

  /** read parses the stream (text/event-stream, any line ending) until it ends; a close event ends it with its code. */
  async #read(body) {
    const reader = body.getReader()
    const dec = new TextDecoder()
    let buf = ''
    let data = null
    let event = ''
    for (;;) {
      const { value, done } = await reader.read()
      if (done) return null
      buf += dec.decode(value, { stream: true })
      if (buf.length > MAX_EVENT_BYTES) throw new Error(`event over ${MAX_EVENT_BYTES} bytes`)
      let i
      while ((i = buf.search(/\r\n|\r|\n/)) >= 0) {
        // A lone CR at the end may be the first half of CRLF: wait for more.
        if (buf[i] === '\r' && i === buf.length - 1) break
        const line = buf.slice(0, i)
        buf = buf.slice(i + (buf[i] === '\r' && buf[i + 1] === '\n' ? 2 : 1))
        if (line === '') {
          if (event === 'close') {
            let f = {}
            try { f = JSON.parse(data ?? '{}') } catch {}
            try { reader.cancel() } catch {}
            return { code: Number(f.code) || 1006, reason: String(f.reason ?? '') }
          }
          if (data !== null && event === '' && this.#state === 'open') this.onmessage?.({ data })
          data = null
          event = ''
          continue
        }
        if (line[0] === ':') {
          this.onheartbeat?.()
          continue
        }
        const c = line.indexOf(':')
        const field = c < 0 ? line : line.slice(0, c)
        let v = c < 0 ? '' : line.slice(c + 1)
        if (v[0] === ' ') v = v.slice(1)
        if (field === 'data') data = data === null ? v : data + '\n' + v
        else if (field === 'event') event = v
        // id and retry: the Client resumes by sync and pulls.
      }
      if (this.#state !== 'open') return null
    }
  }

  #fail(message) {
    if (this.#state === 'closed') return
    this.#state = 'closed'
    this.onerror?.({ message })
  }

  #closed(why) {
    if (this.#state === 'closed') return
    this.#state = 'closed'
    this.#abort.abort()
    this.onclose?.(why)
  }

  /** send hands over one client frame (a JSON string); it throws once the stream is closed. */
  send(text) {
    if (this.#state !== 'open') throw new Error('event stream not open')
    const f = JSON.parse(text)
    if (f.type === 'ping') return // the stream's heartbeats show it is alive
    this.#queue(() => this.#request(f))
  }

  #queue(fn) {
    if (this.#inflight >= MAX_REQUESTS) {
      this.#waiting.push(fn)
      return
    }
    this.#inflight++
    fn().finally(() => {
      this.#inflight--
      const next = this.#waiting.shift()
      if (next && this.#state === 'open') this.#queue(next)
    })
  }

  async #request(f) {
    let out
    try {
      switch (f.type) {
        case 'send': {
          const body = { id: f.id, body: f.body, ...(f.kind ? { kind: f.kind } : {}) }
          const r = await this.#http('POST', `/v1/groups/${f.gid}/messages`, body, f.id)
          out = r.error ?? { type: 'ack', id: f.id, gid: r.json.gid, seq: r.json.seq, ts: r.json.ts }
          break
        }
        case 'pull': {
          const q = new URLSearchParams({ from_seq: String(f.from_seq ?? 0) })
          if (f.to_seq) q.set('to_seq', String(f.to_seq))
          const r = await this.#http('GET', `/v1/groups/${f.gid}/messages?${q}`, undefined, f.id)
          out = r.error ?? { ...r.json, type: 'messages', id: f.id }
          break
        }
        case 'read': {
          const r = await this.#http('POST', `/v1/groups/${f.gid}/read`, { seq: f.seq }, undefined)
          out = r.error
          break
        }
        default:
          return
      }
    } catch (err) {
      // As a lost socket: the Client retries what waited on the next one.
      if (this.#state === 'open') this.#closed({ code: 1006, reason: `request failed: ${err?.message ?? err}` })
      return
    }
    if (out && this.#state === 'open') this.onmessage?.({ data: JSON.stringify(out) })
  }

  /** http makes one request; an answer that is not 2xx becomes the error frame of id. */
  async #http(method, path, body, id) {
    const token = await this.#getToken()
    const headers = { Authorization: 'Bearer ' + token }
    if (body !== undefined) headers['Content-Type'] = 'application/json'
    const resp = await fetch(this.#base + path, {
      method, headers, signal: this.#abort.signal, cache: 'no-store',
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    })
    const text = await resp.text()
    if (resp.status >= 200 && resp.status < 300) return { json: text ? JSON.parse(text) : null }
    let e = null
    try { e = JSON.parse(text).error } catch {}
    const frame = { type: 'error', code: e?.code ?? statusCode(resp.status), message: e?.message ?? text.slice(0, 200) }
    if (id !== undefined) frame.id = id
    let retry = Number.isSafeInteger(e?.retry_after_ms) ? e.retry_after_ms : 0
    if (!retry) {
      const s = Number(resp.headers.get('Retry-After'))
      if (Number.isSafeInteger(s) && s > 0) retry = s * 1000
    }
    if (retry) frame.retry_after_ms = retry
    return { error: frame }
  }

  /** close ends the stream; onclose follows with code. */
  close(code = 1000, reason = '') {
    if (this.#state === 'closed') return
    queueMicrotask(() => this.#closed({ code, reason }))
    this.#abort.abort()
  }

  /** terminate ends the stream without any event. */
  terminate() {
    this.#state = 'closed'
    this.#abort.abort()
  }
}

function statusCode(status) {
  return { 400: 'bad_request', 401: 'unauthorized', 403: 'forbidden', 404: 'not_found', 413: 'too_large', 429: 'rate_limited', 503: 'unavailable' }[status] ?? 'internal'
}
