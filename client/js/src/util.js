// Small helpers shared by the client and the room: an event emitter, the
// reconnect backoff, ids, option checking.

/**
 * Emitter is a minimal event emitter (on/off/once/emit) that works the same
 * in browsers and Node. A listener that throws does not stop the others;
 * its exception is reported to the 'error' listeners (or, without any,
 * rethrown asynchronously so it is not lost).
 */
export class Emitter {
  #listeners = new Map()

  /** on adds fn for event and returns a function that removes it. */
  on(event, fn) {
    if (typeof fn !== 'function') throw new TypeError(`fanfare: listener for ${event} is not a function`)
    let set = this.#listeners.get(event)
    if (!set) this.#listeners.set(event, (set = new Set()))
    set.add(fn)
    return () => this.off(event, fn)
  }

  /** off removes fn (or, without fn, every listener of event). */
  off(event, fn) {
    if (fn === undefined) this.#listeners.delete(event)
    else this.#listeners.get(event)?.delete(fn)
    return this
  }

  /** once adds fn for the next event only. */
  once(event, fn) {
    const off = this.on(event, (...args) => {
      off()
      fn(...args)
    })
    return off
  }

  /** listenerCount returns how many listeners event has. */
  listenerCount(event) {
    return this.#listeners.get(event)?.size ?? 0
  }

  emit(event, arg) {
    const set = this.#listeners.get(event)
    if (!set || set.size === 0) return false
    for (const fn of [...set]) {
      try {
        fn(arg)
      } catch (err) {
        if (event !== 'error' && this.listenerCount('error') > 0) this.emit('error', err)
        else queueMicrotask(() => { throw err })
      }
    }
    return true
  }
}

/**
 * backoff returns the jittered wait before attempt n (0-based), in ms: a
 * uniform draw in [d/2, d] with d = min(max, min * 2^n). The same rule as
 * the Go SDK's, so that many clients dropped at once do not come back at
 * once.
 */
export function backoff(minMs, maxMs, n, random = Math.random) {
  let d = minMs
  for (let i = 0; i < n && d < maxMs; i++) d *= 2
  d = Math.min(d, maxMs)
  const half = d / 2
  return Math.round(half + random() * half)
}

/** sleep resolves after ms, or rejects with signal's reason when it aborts. */
export function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason)
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    const onAbort = () => {
      clearTimeout(t)
      reject(signal.reason)
    }
    signal?.addEventListener('abort', onAbort, { once: true })
  })
}

/** wakeable returns a delay of ms ({promise}) that wake() ends early (close() during a reconnect backoff). */
export function wakeable(ms) {
  let wake
  const promise = new Promise((resolve) => {
    const t = setTimeout(resolve, ms)
    wake = () => {
      clearTimeout(t)
      resolve()
    }
  })
  return { promise, wake }
}

/** randomPrefix returns 16 hex digits from the platform's CSPRNG. */
export function randomPrefix() {
  const b = new Uint8Array(8)
  globalThis.crypto.getRandomValues(b)
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('')
}

const utf8 = new TextEncoder()

/** byteLength is the UTF-8 length of s. */
export function byteLength(s) {
  return utf8.encode(s).length
}

/** isGid reports whether v is a valid gid or seq-like positive safe integer. */
export function isPositiveInt(v) {
  return Number.isSafeInteger(v) && v > 0
}

/**
 * checkOptions validates the numeric bounds of opts against spec
 * ({name: {min, int}}) and throws one TypeError naming every bad one.
 */
export function checkOptions(opts, spec) {
  const bad = []
  for (const [name, { min = 0, int = true, allowInfinity = false }] of Object.entries(spec)) {
    const v = opts[name]
    if (v === undefined) continue
    const ok = typeof v === 'number' && !Number.isNaN(v) &&
      (Number.isFinite(v) ? (!int || Number.isInteger(v)) : (allowInfinity && v > 0)) && v >= min
    if (!ok) bad.push(`${name} must be ${int ? 'an integer' : 'a number'} >= ${min}${allowInfinity ? ' (or Infinity)' : ''}, got ${String(v)}`)
  }
  if (bad.length) throw new TypeError('fanfare: ' + bad.join('; '))
}

/** toWsUrl turns http(s) into ws(s) and checks the scheme. */
export function checkWsUrl(url, what = 'url') {
  let u
  try {
    u = new URL(url)
  } catch {
    throw new TypeError(`fanfare: ${what} ${JSON.stringify(url)} is not a URL`)
  }
  if (u.protocol !== 'ws:' && u.protocol !== 'wss:') throw new TypeError(`fanfare: ${what} scheme ${u.protocol} must be ws: or wss:`)
  return u
}
