// The delivery engine: per group, every message exactly once and in seq
// order, whatever mix of pushes (msg, batch, summary), resyncs, pulls and
// reconnects brought it. It knows nothing of sockets: the client feeds it
// frames and gives it a pull function. The rules are the Go SDK's
// (client/deliver.go), step for step, and docs/protocol.md §10's.

import { backoff } from './util.js'

/** Defaults of the delivery options (milliseconds and counts). */
export const trackerDefaults = Object.freeze({
  maxBuffered: 1024,
  gapWaitMs: 50,
  summaryJitterMs: 1000,
  pollIntervalMs: 10000,
  maxCatchUp: 0,
  backoffMinMs: 250,
  backoffMaxMs: 30000,
})

/** Group is one tracked group's delivery state. */
class Group {
  constructor(gid, delivered) {
    this.gid = gid
    this.delivered = delivered // highest seq handed to the app
    this.target = delivered // highest seq known to exist
    this.pending = [] // pushed messages above delivered+1, in seq order, no duplicates
    this.gapAt = 0 // when the current gap was first seen (ms), 0 = none
    this.retryAt = 0 // no pull before this (after a failed one)
    this.probe = false // pull from delivered+1 to learn last_seq
    this.force = false // pull up to target without waiting out gapWaitMs
    this.busy = false // a fill is running (no inline delivery)
    this.timer = null
    this.timerAt = 0
    this.wakeAt = 0 // no fill before this (a summary's jittered pull)
    // provisional: first seen by a push or a resync, not placed yet;
    // nothing is delivered until a sync answer says where delivery starts
    // (its last_read_seq may be below the push: a member just added misses
    // the messages stored between its join and its node's first push, and
    // a resync says nothing of where to start). During the sync after
    // connect that answer is the sync's; after it, the group's own entry
    // (Tracker's place collaborator).
    this.provisional = false
  }

  /** insert adds m to pending in seq order; false when its seq is there. */
  insert(m) {
    const p = this.pending
    let lo = 0
    let hi = p.length
    while (lo < hi) {
      const mid = (lo + hi) >> 1
      if (p[mid].seq < m.seq) lo = mid + 1
      else hi = mid
    }
    if (lo < p.length && p[lo].seq === m.seq) return false
    p.splice(lo, 0, m)
    return true
  }

  /** trim drops pending messages at or below delivered and returns how many. */
  trim() {
    let i = 0
    while (i < this.pending.length && this.pending[i].seq <= this.delivered) i++
    if (i > 0) this.pending.splice(0, i)
    return i
  }

  /** known is what the group knew exists when a pull was sent. */
  known() {
    return { low: this.pending.length ? this.pending[0].seq : 0, target: this.target }
  }
}

function message(m, gid, pulled) {
  return { gid, seq: m.seq, from: m.from, ts: m.ts, kind: m.kind ?? 'text', body: m.body, pulled }
}

/**
 * Tracker delivers messages per group in order and exactly once. Its
 * collaborators: deliver(msg) hands a message to the app, pull(gid, from,
 * to) resolves to one page ({messages, last_seq, next_seq}) or rejects with
 * a FanfareError, emit(event, data) reports resync, degraded, skipped,
 * group_lost and error. place(gid), when given (sync is available),
 * resolves to the group's sync entry ({gid, last_seq, last_read_seq}) or
 * null when the user is not a member: a group first seen by a push or a
 * resync after the connect sync starts where it says.
 */
export class Tracker {
  constructor({ deliver, pull, emit, place = null, options = {}, now = Date.now, random = Math.random }) {
    this.deliverFn = deliver
    this.pullFn = pull
    this.emitFn = emit
    this.placeFn = place
    this.opt = { ...trackerDefaults, ...stripUndefined(options) }
    this.now = now
    this.random = random
    this.groups = new Map()
    this.nodeLevel = 0
    // The groups' own levels, kept apart from the delivery state: the
    // server announces them right after hello, before a sync has told us
    // which groups to track.
    this.groupLevels = new Map()
    this.online = false
    this.closed = false
    // syncing: from a connect until the sync that follows it answered or
    // failed (see Group.provisional).
    this.syncing = false
    this.pollTimer = null
    this.stats = { delivered: 0, pulled: 0, duplicates: 0, gaps: 0, pulls: 0, overflow: 0 }
  }

  // --- lifecycle -------------------------------------------------------

  /**
   * connected is called on hello: the server re-announces the levels in
   * force. syncing says a sync follows (endSync ends it): groups first
   * seen before it answers are provisional.
   */
  connected({ syncing = false } = {}) {
    this.online = true
    this.syncing = syncing
    this.nodeLevel = 0
    this.groupLevels.clear()
    this.#stopPolling()
  }

  /** endSync ends the wait for the sync after connect: provisional groups the sync did not place start where their first push said. */
  endSync() {
    this.syncing = false
    for (const g of this.groups.values()) {
      if (g.provisional) {
        g.provisional = false
        this.#schedule(g, 0)
      }
    }
  }

  /** disconnected stops pulling until the next resume. */
  disconnected() {
    this.online = false
    this.#stopPolling()
  }

  /** resume schedules every group after a (re)connect; probe pulls each one to learn its last_seq. */
  resume({ probe = false } = {}) {
    for (const g of this.groups.values()) {
      if (probe) g.probe = true
      this.#schedule(g, 0)
    }
  }

  /** close stops every timer for good. */
  close() {
    this.closed = true
    this.online = false
    this.#stopPolling()
    for (const g of this.groups.values()) {
      clearTimeout(g.timer)
      g.timer = null
    }
  }

  // --- frames ------------------------------------------------------------

  /** onMsg handles a msg push. */
  onMsg(f) {
    const g = this.groups.get(f.gid) ?? this.#pushedGroup(f.gid, f.seq - 1)
    this.#offer(g, f)
  }

  /** onBatch handles a batch push (L1): its messages in order. */
  onBatch(f) {
    const msgs = f.messages
    if (!Array.isArray(msgs) || msgs.length === 0) return
    const g = this.groups.get(f.gid) ?? this.#pushedGroup(f.gid, msgs[0].seq - 1)
    for (const m of msgs) this.#offer(g, m)
  }

  /**
   * onSummary handles a summary push (L2): the window's first message is
   * delivered, the rest up to last_seq pulled after a random wait up to
   * summaryJitterMs (later summaries join the same pull), so that a large
   * group's members do not all pull in the same millisecond.
   */
  onSummary(f) {
    const first = f.first && Number.isSafeInteger(f.first.seq) && f.first.seq > 0 ? f.first : null
    const g = this.groups.get(f.gid) ?? this.#pushedGroup(f.gid, (first ? first.seq : f.last_seq + 1) - 1)
    if (first) this.#offer(g, first)
    if (f.last_seq > g.target) g.target = f.last_seq
    if (g.target > g.delivered) {
      g.force = true
      const j = this.opt.summaryJitterMs
      if (j > 0 && !g.busy && !g.timer) g.wakeAt = this.now() + Math.floor(this.random() * j)
      this.#schedule(g, 0)
    }
  }

  /** onResync handles a resync frame: the server dropped pushes up to last_seq. */
  onResync(f) {
    // A group nothing was delivered of starts from now, unless the sync
    // under way says otherwise.
    const g = this.groups.get(f.gid) ?? this.#pushedGroup(f.gid, f.last_seq)
    if (f.last_seq > g.target) g.target = f.last_seq
    if (g.target > g.delivered) {
      g.force = true
      this.#schedule(g, 0)
    }
    this.emitFn('resync', { gid: f.gid, last_seq: f.last_seq })
  }

  /**
   * onDegraded handles a degraded frame. Entering or leaving level 3 (no
   * pushes) probes the groups concerned; at 3 and above they are polled
   * every pollIntervalMs.
   */
  onDegraded(f) {
    const gid = Number.isSafeInteger(f.gid) && f.gid > 0 ? f.gid : 0
    const was = this.level(gid)
    const lv = Number.isSafeInteger(f.level) && f.level >= 0 ? f.level : 0
    if (gid === 0) this.nodeLevel = lv
    else if (lv > 0) this.groupLevels.set(gid, lv)
    else this.groupLevels.delete(gid)
    const now = this.level(gid)
    if (was >= 3 || now >= 3) {
      for (const g of this.groups.values()) {
        if (gid === 0 || g.gid === gid) {
          g.probe = true
          this.#schedule(g, 0)
        }
      }
    }
    this.#updatePolling()
    this.emitFn('degraded', { gid, level: lv, effective: now, node: this.nodeLevel })
  }

  /** level returns the level in effect for gid (the node's for 0): the higher of the node's and the group's own. */
  level(gid) {
    return Math.max(this.nodeLevel, (gid && this.groupLevels.get(gid)) || 0)
  }

  // --- app calls ---------------------------------------------------------

  /**
   * track starts delivering gid after afterSeq and schedules a catch-up
   * pull; a group tracked already keeps its cursor (it never moves back).
   */
  track(gid, afterSeq = 0) {
    let g = this.groups.get(gid)
    if (!g) g = this.#newGroup(gid, Math.max(afterSeq, 0))
    else if (g.provisional) {
      // Nothing was delivered yet: start where the app says.
      g.provisional = false
      g.delivered = Math.min(g.delivered, Math.max(afterSeq, 0))
    }
    g.probe = true
    this.#schedule(g, 0)
  }

  /** untrack forgets gid. */
  untrack(gid) {
    const g = this.groups.get(gid)
    if (g) {
      clearTimeout(g.timer)
      this.groups.delete(gid)
    }
  }

  /**
   * applySync takes a sync answer: tracked groups behind their last_seq are
   * caught up; untracked ones start at last_read_seq (or last_seq with
   * skipUnread).
   */
  applySync(groups, { skipUnread = false } = {}) {
    for (const sg of groups) {
      let g = this.groups.get(sg.gid)
      if (g && g.provisional) {
        // Nothing of it was delivered: start where a group new to the
        // tracker starts (its pending pushes stay and fill in).
        g.provisional = false
        g.delivered = Math.max(0, skipUnread ? sg.last_seq : (sg.last_read_seq ?? 0))
        g.gapAt = 0
        this.stats.duplicates += g.trim() // read already, on another device
      }
      if (!g) g = this.#newGroup(sg.gid, skipUnread ? sg.last_seq : (sg.last_read_seq ?? 0))
      if (sg.last_seq > g.target) g.target = sg.last_seq
      if (g.target > g.delivered) g.force = true
      this.#schedule(g, 0)
    }
  }

  /** cursors returns {gid: last delivered seq} of every tracked group. */
  cursors() {
    const out = {}
    for (const [gid, g] of this.groups) out[gid] = g.delivered
    return out
  }

  /** pendingCount returns how many pushes gid holds out of order. */
  pendingCount(gid) {
    return this.groups.get(gid)?.pending.length ?? 0
  }

  /** idle reports whether no group has work left (tests, benchmarks). */
  idle() {
    for (const g of this.groups.values()) {
      if (g.busy || g.pending.length > 0 || g.target > g.delivered || g.probe) return false
    }
    return true
  }

  // --- internals -----------------------------------------------------------

  #newGroup(gid, delivered) {
    const g = new Group(gid, Math.max(0, delivered))
    this.groups.set(gid, g)
    return g
  }

  /**
   * pushedGroup starts tracking gid from a push or resync: provisional while
   * a sync is under way (its answer places the group), or until the group's
   * own sync entry places it after the sync (place).
   */
  #pushedGroup(gid, delivered) {
    const g = this.#newGroup(gid, delivered)
    g.provisional = this.syncing || this.placeFn !== null
    if (!this.syncing && this.placeFn !== null) this.#place(g)
    return g
  }

  /** place starts g where its sync entry says (last_read_seq), or where its first push said when there is none or the lookup failed. */
  async #place(g) {
    let sg = null
    try {
      sg = await this.placeFn(g.gid)
    } catch (err) {
      this.emitFn('error', err)
    }
    // Track or a sync answer may have placed it meanwhile.
    if (this.groups.get(g.gid) !== g || !g.provisional) return
    g.provisional = false
    if (sg) {
      g.delivered = Math.max(0, sg.last_read_seq ?? 0)
      g.gapAt = 0
      this.stats.duplicates += g.trim() // read already, on another device
      if (sg.last_seq > g.target) g.target = sg.last_seq
      if (g.target > g.delivered) g.force = true
    }
    this.#schedule(g, 0)
  }

  #deliver(m) {
    this.stats.delivered++
    if (m.pulled) this.stats.pulled++
    this.deliverFn(m)
  }

  /** offer takes a pushed message: delivered at once when it is the next one and nothing is in the way, else held. */
  #offer(g, wm) {
    if (!Number.isSafeInteger(wm.seq) || wm.seq <= g.delivered) {
      this.stats.duplicates++
      return
    }
    if (wm.seq > g.target) g.target = wm.seq
    const m = message(wm, g.gid, false)
    if (!g.busy && !g.provisional && g.pending.length === 0 && m.seq === g.delivered + 1) {
      g.delivered = m.seq
      this.#deliver(m)
      return
    }
    if (!g.insert(m)) {
      this.stats.duplicates++
      return
    }
    if (g.pending.length > this.opt.maxBuffered) {
      // Drop the highest: it is at most target, so it will be pulled.
      g.pending.pop()
      this.stats.overflow++
    }
    if (g.pending.length > 0 && g.pending[0].seq > g.delivered + 1 && g.gapAt === 0) {
      g.gapAt = this.now()
      this.stats.gaps++
    }
    this.#schedule(g, 0)
  }

  /**
   * schedule runs g's fill after delay ms, but not before g.wakeAt (a
   * summary's jittered pull: what arrives meanwhile joins it); an earlier
   * run already scheduled wins. A running fill sees every change itself.
   */
  #schedule(g, delay) {
    if (this.closed || g.busy) return
    const at = Math.max(this.now() + delay, g.wakeAt)
    if (g.timer) {
      if (g.timerAt <= at) return
      clearTimeout(g.timer)
    }
    g.timerAt = at
    g.timer = setTimeout(() => {
      g.timer = null
      this.#run(g)
    }, Math.max(0, at - this.now()))
  }

  async #run(g) {
    if (!this.online || this.closed || g.busy || g.provisional || this.groups.get(g.gid) !== g) return
    g.busy = true
    g.wakeAt = 0
    let next
    try {
      next = await this.#fill(g)
    } catch (err) {
      // A listener's exception reached here; report it and retry later.
      this.emitFn('error', err)
      next = this.now() + this.opt.backoffMinMs
    } finally {
      g.busy = false
    }
    if (next > 0 && this.groups.get(g.gid) === g) this.#schedule(g, Math.max(0, next - this.now()))
  }

  /**
   * fill delivers what g has pending in order and pulls what is missing,
   * page by page. It returns when to come back (a gap within gapWaitMs, a
   * pull to retry), 0 when g is complete, -1 when the connection is gone.
   */
  async #fill(g) {
    for (;;) {
      this.stats.duplicates += g.trim()
      while (g.pending.length > 0 && g.pending[0].seq === g.delivered + 1) {
        const m = g.pending.shift()
        g.delivered = m.seq
        this.#deliver(m)
        this.stats.duplicates += g.trim()
      }
      if (!this.online || this.closed) return -1
      const now = this.now()
      if (now < g.retryAt) return g.retryAt
      if (g.probe) {
        const from = g.delivered + 1
        const sent = g.known()
        let page
        try {
          page = await this.#pull(g, from, 0)
        } catch (err) {
          return this.#pullFailed(g, err)
        }
        if (this.groups.get(g.gid) !== g) return 0
        g.probe = false
        if (page.last_seq > g.target) g.target = page.last_seq
        g.force = true
        this.#accept(g, from, page, sent)
        continue
      }
      const hi = g.pending.length > 0 ? g.pending[0].seq - 1 : g.target
      if (hi <= g.delivered) {
        g.force = false
        g.gapAt = 0
        return 0
      }
      if (!g.force && this.opt.gapWaitMs > 0) {
        if (g.gapAt === 0) g.gapAt = now
        const due = g.gapAt + this.opt.gapWaitMs
        if (now < due) return due
      }
      const from = g.delivered + 1
      const limit = this.opt.maxCatchUp
      if (limit > 0 && g.force && hi - from + 1 > limit) {
        const to = hi - limit
        g.delivered = to
        g.trim()
        this.emitFn('skipped', { gid: g.gid, from, to })
        continue
      }
      const sent = g.known()
      let page
      try {
        page = await this.#pull(g, from, hi)
      } catch (err) {
        return this.#pullFailed(g, err)
      }
      if (this.groups.get(g.gid) !== g) return 0
      this.#accept(g, from, page, sent)
    }
  }

  async #pull(g, from, to) {
    const page = await this.pullFn(g.gid, from, to)
    this.stats.pulls++
    return page
  }

  /** pullFailed decides what a failed background pull means for g. */
  #pullFailed(g, err) {
    const code = err && err.code
    if (code === 'forbidden' || code === 'not_found') {
      this.groups.delete(g.gid)
      this.emitFn('group_lost', { gid: g.gid, error: err })
      return 0
    }
    if (code === 'timeout') {
      g.retryAt = this.now() + backoff(this.opt.backoffMinMs, this.opt.backoffMaxMs, 2, this.random)
      return g.retryAt
    }
    if (err && err.fromServer) {
      const wait = err.retryAfterMs > 0 ? err.retryAfterMs : backoff(this.opt.backoffMinMs, this.opt.backoffMaxMs, 3, this.random)
      g.retryAt = this.now() + wait
      this.emitFn('error', err)
      return g.retryAt
    }
    return -1 // the connection is gone (resume schedules g again) or the client closed
  }

  /**
   * accept delivers a pulled page for a request from `from`, sent when g
   * knew `sent`. A page that starts above from means [from, first) lies
   * below the member's join_seq (or expired); an empty page means the same
   * for the whole range, or that nothing exists there. The page was read
   * after everything g had been pushed when the pull went out was stored,
   * but not necessarily what was pushed since: an empty page speaks only
   * for the former.
   */
  #accept(g, from, page, sent) {
    if (g.delivered >= from) return // cannot happen while g is busy; stay safe
    const msgs = Array.isArray(page.messages) ? page.messages : []
    const lastSeq = Number.isSafeInteger(page.last_seq) ? page.last_seq : 0
    if (msgs.length === 0) {
      if (lastSeq < from && g.pending.length > 0) {
        // The server says pushed seqs do not exist: trust it and skip,
        // unless they were pushed after the pull went out.
        if (sent.low === 0 || g.pending[0].seq !== sent.low) return
        const to = g.pending[0].seq - 1
        if (to >= from) {
          g.delivered = to
          this.emitFn('skipped', { gid: g.gid, from, to })
        }
      } else if (lastSeq < from) {
        // Nothing exists past delivered, as of the pull, unless a resync or
        // summary raised the target since.
        if (g.target === sent.target) g.target = g.delivered
      } else {
        // [from, to] is all below join_seq: not ours to see.
        const to = g.pending.length > 0 ? g.pending[0].seq - 1 : g.target
        g.delivered = Math.max(g.delivered, Math.min(to, lastSeq))
      }
      return
    }
    for (let i = 0; i < msgs.length; i++) {
      const wm = msgs[i]
      if (!Number.isSafeInteger(wm.seq) || wm.seq <= g.delivered) {
        this.stats.duplicates++
        continue
      }
      if (wm.seq !== g.delivered + 1) {
        if (i > 0) break // a hole in the page: pull again from there
        g.delivered = wm.seq - 1 // below join_seq, or expired
      }
      if (wm.seq > g.target) g.target = wm.seq
      g.delivered = wm.seq
      this.#deliver(message(wm, g.gid, true))
    }
  }

  /** updatePolling polls while the node or any group is at level 3 or above (nothing is pushed there). */
  #updatePolling() {
    let any = this.nodeLevel >= 3
    for (const lv of this.groupLevels.values()) if (lv >= 3) any = true
    if (!any) return this.#stopPolling()
    if (this.pollTimer) return
    this.pollTimer = setInterval(() => {
      for (const g of this.groups.values()) {
        if (this.level(g.gid) >= 3) {
          g.probe = true
          this.#schedule(g, 0)
        }
      }
    }, this.opt.pollIntervalMs)
  }

  #stopPolling() {
    clearInterval(this.pollTimer)
    this.pollTimer = null
  }
}

function stripUndefined(o) {
  const out = {}
  for (const [k, v] of Object.entries(o)) if (v !== undefined) out[k] = v
  return out
}
