// Errors of the fanfare SDK: one class, FanfareError, whose `code` is either
// one of the server's error codes (docs/protocol.md §7.1 and the waiting
// room's §6.4) or one of the SDK's own codes below.

/** Error codes the server sends (docs/protocol.md §7.1, §6.4). */
export const ServerCodes = Object.freeze({
  BAD_REQUEST: 'bad_request',
  UNAUTHORIZED: 'unauthorized',
  FORBIDDEN: 'forbidden',
  NOT_FOUND: 'not_found',
  GROUP_CLOSED: 'group_closed',
  TOO_LARGE: 'too_large',
  RATE_LIMITED: 'rate_limited',
  OVERLOADED: 'overloaded',
  UNAVAILABLE: 'unavailable',
  INTERNAL: 'internal',
  /** The application's before-send hook refused the message (§13.2). */
  REJECTED: 'rejected',
  ROOM_FULL: 'room_full',
  ROOM_CLOSED: 'room_closed',
})

/** Error codes the SDK itself produces; they never come from the server. */
export const LocalCodes = Object.freeze({
  /** The client or room was closed (close(), or it gave up reconnecting). */
  CLOSED: 'closed',
  /** The connection dropped before the answer came (retried by send). */
  CONNECTION_LOST: 'connection_lost',
  /** No answer within requestTimeoutMs (retried by send). */
  TIMEOUT: 'timeout',
  /** More sends outstanding than maxQueuedSends. */
  QUEUE_FULL: 'queue_full',
  /** The server broke the protocol (e.g. its first frame is not hello). */
  PROTOCOL: 'protocol',
  /** The WebSocket upgrade was refused (status in `status` when known). */
  HANDSHAKE: 'handshake',
  /** sync() needs the HTTP API: pass httpUrl to connect(). */
  NO_HTTP: 'no_http',
  /** The caller aborted the request through its AbortSignal. */
  ABORTED: 'aborted',
})

/** Codes for which the same request may succeed later (docs/protocol.md §7.1). */
const retryableServer = new Set(['rate_limited', 'overloaded', 'unavailable'])
const retryableLocal = new Set(['connection_lost', 'timeout'])

/**
 * FanfareError is every error the SDK rejects with or emits. `code` is a
 * server code (ServerCodes) or a local one (LocalCodes); `retryAfterMs` is
 * the server's retry hint (0 when absent); `status` the HTTP status of an
 * HTTP answer or refused upgrade (0 otherwise).
 */
export class FanfareError extends Error {
  constructor(code, message, { retryAfterMs = 0, status = 0, cause } = {}) {
    super(message ? `fanfare: ${code}: ${message}` : `fanfare: ${code}`, cause ? { cause } : undefined)
    this.name = 'FanfareError'
    this.code = code
    this.serverMessage = message || ''
    this.retryAfterMs = retryAfterMs
    this.status = status
  }

  /** True for the codes a retry can cure: rate_limited, overloaded, unavailable, connection_lost, timeout. */
  get retryable() {
    return retryableServer.has(this.code) || retryableLocal.has(this.code)
  }

  /** True when the error came from the server (an error frame, an HTTP error body or a rejection). */
  get fromServer() {
    return !Object.values(LocalCodes).includes(this.code)
  }
}

/** errorFromFrame turns an `error` frame (or `rejected` frame) into a FanfareError. */
export function errorFromFrame(f) {
  return new FanfareError(String(f.code || 'internal'), f.message || '', { retryAfterMs: toInt(f.retry_after_ms) })
}

/** codeForStatus maps an HTTP status without a JSON error body to a code. */
export function codeForStatus(status) {
  switch (status) {
    case 400: return 'bad_request'
    case 401: return 'unauthorized'
    case 403: return 'forbidden'
    case 404: return 'not_found'
    case 409: return 'group_closed'
    case 413: return 'too_large'
    case 422: return 'rejected'
    case 429: return 'rate_limited'
    case 503: return 'unavailable'
    default: return 'internal'
  }
}

function toInt(v) {
  return Number.isSafeInteger(v) && v > 0 ? v : 0
}
