// Test harness: builds fanfared once per test process, starts it in
// embedded mode on free ports with a temporary data directory, and talks to
// its admin API. Tokens are HS256 JWTs signed here with node:crypto.

import { spawn, execFile } from 'node:child_process'
import { createHmac } from 'node:crypto'
import { mkdtemp, rm, access } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import WebSocket from 'ws'

export { WebSocket }

export const repoRoot = fileURLToPath(new URL('../../../', import.meta.url))
const execFileP = promisify(execFile)

let built = null

/**
 * fanfaredBinary returns the path of a fanfared built from this checkout:
 * $FANFARED_BIN when set (make test-js builds it once for every file), else
 * a `go build` into a temporary directory, once per process.
 */
export function fanfaredBinary() {
  if (built) return built
  built = (async () => {
    if (process.env.FANFARED_BIN) {
      await access(process.env.FANFARED_BIN)
      return process.env.FANFARED_BIN
    }
    const dir = await mkdtemp(join(tmpdir(), 'fanfare-js-bin-'))
    const bin = join(dir, 'fanfared')
    try {
      await execFileP(process.env.GO || 'go', ['build', '-o', bin, './cmd/fanfared'], { cwd: repoRoot, maxBuffer: 16 << 20 })
    } catch (err) {
      throw new Error(`building fanfared failed (is Go installed?): ${err.stderr || err.message}`)
    }
    process.on('exit', () => { rm(dir, { recursive: true, force: true }) })
    return bin
  })()
  return built
}

export const SECRET = 'js-sdk-test-secret-0123456789abcdef-0123'
export const ADMIN = 'js-sdk-test-admin-token'

function b64url(buf) {
  return Buffer.from(buf).toString('base64url')
}

/** sign returns an HS256 JWT for uid (level lvl) valid for ttlS seconds. */
export function sign(uid, { lvl = 0, ttlS = 3600, secret = SECRET } = {}) {
  const now = Math.floor(Date.now() / 1000)
  const head = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }))
  const claims = { sub: uid, exp: now + ttlS, iat: now - 1 }
  if (lvl) claims.lvl = lvl
  const body = b64url(JSON.stringify(claims))
  const mac = createHmac('sha256', secret).update(`${head}.${body}`).digest()
  return `${head}.${body}.${b64url(mac)}`
}

/**
 * startServer runs a fanfared (embedded mode, temp data dir, ports chosen
 * by the kernel) with extra flags and resolves once its banner names its
 * addresses. Stop it with server.stop() (SIGTERM by PID, SIGKILL after 5 s).
 */
export async function startServer(extra = []) {
  const bin = await fanfaredBinary()
  const dataDir = await mkdtemp(join(tmpdir(), 'fanfare-js-data-'))
  const args = ['-ws-addr', '127.0.0.1:0', '-http-addr', '127.0.0.1:0', '-data-dir', dataDir,
    '-jwt-secret', SECRET, '-admin-token', ADMIN, '-room-token-secret', SECRET,
    '-log-level', 'warn', '-shutdown-timeout', '2s', ...extra]
  const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] })
  let log = ''
  const addrs = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`fanfared did not start within 60 s:\n${log}`)), 60000)
    proc.stderr.setEncoding('utf8')
    proc.stderr.on('data', (chunk) => {
      log = (log + chunk).slice(-20000)
      const ws = /WebSocket:\s+ws:\/\/(\S+)\/ws/.exec(log)
      const http = /HTTP API:\s+http:\/\/(\S+)/.exec(log)
      if (ws && http) {
        clearTimeout(t)
        resolve({ ws: ws[1], http: http[1] })
      }
    })
    proc.on('exit', (code) => {
      clearTimeout(t)
      reject(new Error(`fanfared exited (${code}) before it was up:\n${log}`))
    })
  })
  const server = {
    proc,
    pid: proc.pid,
    wsBase: `ws://${addrs.ws}`,
    wsUrl: `ws://${addrs.ws}/ws`,
    httpUrl: `http://${addrs.http}`,
    log: () => log,
    token: (uid, opts) => sign(uid, opts),
    /** api calls the HTTP API with the admin token; it throws on a status other than want. */
    async api(method, path, body, want = [200, 201, 204]) {
      const resp = await fetch(server.httpUrl + path, {
        method,
        headers: { Authorization: `Bearer ${ADMIN}`, 'Content-Type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      })
      const text = await resp.text()
      if (!want.includes(resp.status)) throw new Error(`${method} ${path}: HTTP ${resp.status}: ${text}`)
      return text ? JSON.parse(text) : null
    },
    /** group creates a group with these members and returns its gid. */
    async group(...uids) {
      const g = await server.api('POST', '/v1/groups', { owner: uids[0] })
      await server.api('POST', `/v1/groups/${g.gid}/members`, { uids })
      return g.gid
    },
    /** adminSend sends body to gid as uid over HTTP (admin sends skip the per-user limits). */
    adminSend(gid, uid, id, body) {
      return server.api('POST', `/v1/groups/${gid}/messages?as=${encodeURIComponent(uid)}`, { id, body })
    },
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        const exited = new Promise((resolve) => proc.once('exit', resolve))
        process.kill(proc.pid, 'SIGTERM')
        const t = setTimeout(() => { try { process.kill(proc.pid, 'SIGKILL') } catch {} }, 5000)
        await exited
        clearTimeout(t)
      }
      await rm(dataDir, { recursive: true, force: true })
    },
  }
  return server
}

/** waitFor polls cond every 10 ms until it is true, or throws after timeoutMs naming what. */
export async function waitFor(what, cond, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await cond()
    if (v) return v
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 10))
  }
}

/**
 * collect records every message event of client per group and checks the
 * SDK's promise as they come: per group, seqs strictly increasing by one
 * from the first one seen (no duplicate, no gap, no reorder).
 */
export function collect(client) {
  const byGid = new Map()
  const violations = []
  client.on('message', (m) => {
    let list = byGid.get(m.gid)
    if (!list) byGid.set(m.gid, (list = []))
    const prev = list.at(-1)
    if (prev && m.seq !== prev.seq + 1) violations.push(`gid ${m.gid}: seq ${m.seq} after ${prev.seq}`)
    list.push(m)
  })
  return {
    of: (gid) => byGid.get(gid) ?? [],
    seqs: (gid) => (byGid.get(gid) ?? []).map((m) => m.seq),
    violations,
  }
}

/**
 * flaky returns a WebSocket class (a subclass of npm ws) the test can cut
 * off the network: while `offline` is true new sockets dial a closed port
 * (connection refused, as with no network), drop() kills the current
 * socket's TCP connection, pause() stops reading it (a slow consumer: the
 * server's outbound bytes pile up), resume() reads again.
 */
export function flaky() {
  const ctl = {
    offline: false,
    sockets: [],
    last: () => ctl.sockets.at(-1),
    drop: () => ctl.last().terminate(),
    pause: () => ctl.last()._socket.pause(),
    resume: () => ctl.last()._socket.resume(),
  }
  ctl.WebSocket = class FlakyWebSocket extends WebSocket {
    constructor(url, ...rest) {
      super(ctl.offline ? String(url).replace(/^ws:\/\/[^/]+/, 'ws://127.0.0.1:1') : url, ...rest)
      ctl.sockets.push(this)
    }
  }
  return ctl
}

/** pullAll reads every message of gid over HTTP as uid (the server's view, for checks). */
export async function pullAll(server, uid, gid) {
  const out = []
  let from = 1
  for (;;) {
    const resp = await fetch(`${server.httpUrl}/v1/groups/${gid}/messages?from_seq=${from}`, { headers: { Authorization: `Bearer ${sign(uid)}` } })
    if (resp.status === 429) {
      await new Promise((r) => setTimeout(r, 200))
      continue
    }
    if (resp.status !== 200) throw new Error(`pull ${gid}: HTTP ${resp.status}: ${await resp.text()}`)
    const page = await resp.json()
    out.push(...page.messages)
    if (page.messages.length === 0) return out
    from = page.next_seq ?? page.messages.at(-1).seq + 1
    if (from > page.last_seq) return out
  }
}
