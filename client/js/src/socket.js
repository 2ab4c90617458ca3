// Opening a WebSocket the same way in browsers and in Node (any
// implementation with the browser's WebSocket interface, such as npm ws),
// and reading what little a refused upgrade tells us.

import { FanfareError } from './errors.js'

/** resolveWebSocket returns the WebSocket constructor to use, or throws. */
export function resolveWebSocket(WS) {
  const ctor = WS ?? globalThis.WebSocket
  if (typeof ctor !== 'function') {
    throw new TypeError('fanfare: no WebSocket implementation: pass one as the WebSocket option (e.g. the default export of npm ws)')
  }
  return ctor
}

/** withToken returns url with ?token= set (browsers cannot set headers on a WebSocket). */
export function withToken(url, token) {
  return withParam(url, 'token', token)
}

/** withParam returns url with the query parameter name set to value (when not empty). */
export function withParam(url, name, value) {
  const u = new URL(url)
  if (value) u.searchParams.set(name, value)
  return u.toString()
}

const statusCodes = { 401: 'unauthorized', 403: 'forbidden', 404: 'not_found', 429: 'rate_limited', 503: 'unavailable' }

/**
 * handshakeError describes a socket that closed before it opened. Browsers
 * say nothing about why; npm ws reports the HTTP status in its error
 * message ("Unexpected server response: 401"), which becomes `status`.
 */
export function handshakeError(errorEvent, closeEvent) {
  const text = String(errorEvent?.message ?? errorEvent?.error?.message ?? '')
  const m = /Unexpected server response: (\d{3})/.exec(text)
  const status = m ? Number(m[1]) : 0
  const code = statusCodes[status] ?? 'handshake'
  const retryAfterMs = status === 429 || status === 503 ? 1000 : 0
  const detail = status ? `upgrade refused: HTTP ${status}` : `connection failed${text ? ': ' + text : ''}${closeEvent?.code ? ` (close ${closeEvent.code})` : ''}`
  return new FanfareError(code, detail, { status, retryAfterMs })
}

/** permanent reports whether redialing cannot help without a new token or URL. */
export function permanent(err) {
  return err.status === 401 || err.status === 403 || err.status === 404
}

/** abandon stops listening to ws and closes it without waiting for the peer. */
export function abandon(ws, code = 1000, reason = '') {
  ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null
  try {
    if (typeof ws.terminate === 'function') ws.terminate() // npm ws: drop the TCP connection now
    else ws.close(code, reason)
  } catch {
    // already closed
  }
}

/** jwtExp returns a JWT's exp claim in ms, or 0 when it cannot be read. */
export function jwtExp(token) {
  try {
    const part = String(token).split('.')[1]
    const json = atob(part.replace(/-/g, '+').replace(/_/g, '/').padEnd(Math.ceil(part.length / 4) * 4, '='))
    const exp = JSON.parse(json).exp
    return Number.isFinite(exp) ? exp * 1000 : 0
  } catch {
    return 0
  }
}
