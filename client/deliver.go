package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// group is the delivery state of one tracked group, guarded by Conn.mu.
//
// Invariants: every seq <= delivered was handed to the app exactly once,
// in order; pending holds distinct seqs > delivered, ascending, at most
// Config.MaxPending; target >= every seq known to exist.
type group struct {
	gid       int64
	delivered int64
	target    int64
	pending   []Message
	probe     bool      // pull [delivered+1, last_seq] to learn what exists
	force     bool      // fill up to target without waiting GapWait
	gapAt     time.Time // when a push revealed the current gap
	retryAt   time.Time // a failed pull is retried from then
	wakeAt    time.Time // queued, but not before then
	busy      bool      // run is delivering or pulling: no inline delivery
	queued    bool      // in Conn.queue
	// provisional: first seen by a push or a resync, not placed yet;
	// nothing is delivered until a sync answer sets where delivery starts
	// (its last_read_seq may be below the push: a member just added
	// misses the messages stored between its join and the first push its
	// node made, and a resync says nothing of where to start). During the
	// sync after connect that answer is the sync's; after it, place asks
	// for the group's own entry (run goroutine, fillLocked).
	provisional bool
	place       bool // provisional after the connect sync: look its entry up
}

// newGroupLocked starts tracking gid with seq delivered as the cursor.
func (c *Conn) newGroupLocked(gid, delivered int64) *group {
	g := &group{gid: gid, delivered: delivered, target: delivered}
	c.groups[gid] = g
	return g
}

// pushedGroupLocked starts tracking gid from a push or resync that says
// delivered is the cursor. With sync available (HTTPURL set, SkipUnread
// not) the group is provisional (see group.provisional): while the sync
// after connect is under way its answer places it, after it the group's
// own sync entry does.
func (c *Conn) pushedGroupLocked(gid, delivered int64) *group {
	g := c.newGroupLocked(gid, delivered)
	if c.cfg.HTTPURL != "" && !c.cfg.SkipUnread {
		g.provisional = true
		if !c.syncing {
			g.place = true
			c.enqueueLocked(g)
		}
	}
	return g
}

// syncedLocked ends the wait for the sync after connect: provisional
// groups the sync did not place start where their first push said.
func (c *Conn) syncedLocked() {
	c.syncing = false
	for _, g := range c.groups {
		if g.provisional && !g.place {
			g.provisional = false
			c.enqueueLocked(g)
		}
	}
}

// placeLocked looks up the sync entry of g, a group first seen after the
// connect sync (GET /v1/sync from its gid: one page), and starts its
// delivery at the entry's last_read_seq, as the connect sync would have.
// Without an entry (no longer a member) or when the lookup fails, the
// group starts where its first push or resync said. It unlocks c.mu for
// the request; g stays busy meanwhile.
func (c *Conn) placeLocked(ctx context.Context, g *group) {
	g.place = false
	c.mu.Unlock()
	sg, err := c.syncEntry(ctx, g.gid)
	c.mu.Lock()
	if err != nil && ctx.Err() == nil {
		c.emit(Event{Kind: EventError, GID: g.gid, Err: err})
	}
	if !g.provisional { // Track placed it meanwhile
		return
	}
	g.provisional = false
	if sg == nil {
		return
	}
	g.delivered = sg.LastReadSeq
	g.gapAt = time.Time{}
	if n := g.trim(); n > 0 { // read already, on another device
		c.st.duplicates.Add(uint64(n))
	}
	if sg.LastSeq > g.target {
		g.target = sg.LastSeq
	}
	g.force = g.target > g.delivered
}

// enqueueLocked gives g to run.
func (c *Conn) enqueueLocked(g *group) {
	if !g.queued {
		g.queued = true
		c.queue = append(c.queue, g)
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// insert adds m to pending in seq order; false when m.Seq is there.
func (g *group) insert(m Message) bool {
	i := sort.Search(len(g.pending), func(i int) bool { return g.pending[i].Seq >= m.Seq })
	if i < len(g.pending) && g.pending[i].Seq == m.Seq {
		return false
	}
	g.pending = append(g.pending, Message{})
	copy(g.pending[i+1:], g.pending[i:])
	g.pending[i] = m
	return true
}

// trim drops pending messages at or below delivered.
func (g *group) trim() (dropped int) {
	i := 0
	for i < len(g.pending) && g.pending[i].Seq <= g.delivered {
		i++
	}
	if i > 0 {
		n := copy(g.pending, g.pending[i:])
		clear(g.pending[n:])
		g.pending = g.pending[:n]
	}
	return i
}

// popFront removes and returns pending[0].
func (g *group) popFront() Message {
	m := g.pending[0]
	n := copy(g.pending, g.pending[1:])
	g.pending[n] = Message{}
	g.pending = g.pending[:n]
	return m
}

func message(m *wire.Msg, pulled bool) Message {
	return Message{GID: m.GID, Seq: m.Seq, From: m.From, TS: m.TS, Kind: m.Kind, Body: m.Body, Pulled: pulled}
}

// owned returns m with its body copied out of the read buffer.
func owned(m Message) Message {
	m.Body = append([]byte(nil), m.Body...)
	return m
}

// push handles one pushed message (reader goroutine).
func (c *Conn) push(m *wire.Msg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[m.GID]
	if g == nil {
		// Not tracked: the live stream starts here (Track or Cursors ask
		// for history), unless a sync entry says otherwise (with sync,
		// the group waits for it: pushedGroupLocked).
		g = c.pushedGroupLocked(m.GID, m.Seq-1)
	}
	c.offerLocked(g, m)
}

// pushBatch handles a batch frame (L1): its messages in order.
func (c *Conn) pushBatch(b *wire.Batch) {
	if len(b.Messages) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[b.GID]
	if g == nil {
		g = c.pushedGroupLocked(b.GID, b.Messages[0].Seq-1)
	}
	for i := range b.Messages {
		m := &b.Messages[i]
		m.GID = b.GID
		c.offerLocked(g, m)
	}
}

// summary handles a summary frame (L2): the first message of the window is
// delivered, the rest of the window up to last_seq pulled after a random
// wait up to SummaryJitter (later summaries join the same pull).
func (c *Conn) summary(f *wire.Summary) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[f.GID]
	if g == nil {
		g = c.pushedGroupLocked(f.GID, f.First.Seq-1)
	}
	if f.First.Seq > 0 {
		f.First.GID = f.GID
		c.offerLocked(g, &f.First)
	}
	if f.LastSeq > g.target {
		g.target = f.LastSeq
	}
	if g.target > g.delivered {
		g.force = true
		if !g.queued && c.cfg.SummaryJitter > 0 {
			g.wakeAt = time.Now().Add(rand.N(c.cfg.SummaryJitter))
		}
		c.enqueueLocked(g)
	}
}

// resync handles a resync frame: the server dropped pushes up to last_seq.
func (c *Conn) resync(f *wire.Resync) {
	c.mu.Lock()
	g := c.groups[f.GID]
	if g == nil {
		// Nothing was delivered of it: start from now, unless a sync
		// entry says otherwise (with sync, the group waits for it, during
		// the connect sync or after: pushedGroupLocked).
		g = c.pushedGroupLocked(f.GID, f.LastSeq)
	}
	if f.LastSeq > g.target {
		g.target = f.LastSeq
	}
	if g.target > g.delivered {
		g.force = true
		c.enqueueLocked(g)
	}
	c.mu.Unlock()
	c.emit(Event{Kind: EventResync, GID: f.GID, LastSeq: f.LastSeq})
}

// degraded handles a degraded frame. Entering wire.LevelWriteOnly (no
// pushes, or above) starts polling; leaving it catches up once.
func (c *Conn) degraded(f *wire.Degraded) {
	c.mu.Lock()
	was := c.effectiveLocked(f.GID)
	switch {
	case f.GID == 0:
		c.level = f.Level
	case f.Level == wire.LevelNormal:
		delete(c.levels, f.GID)
	default:
		// Kept whether or not gid is tracked yet: the server announces
		// the levels in force right after hello, before the first sync.
		c.levels[f.GID] = f.Level
	}
	now := c.effectiveLocked(f.GID)
	if was >= wire.LevelWriteOnly || now >= wire.LevelWriteOnly {
		for _, g := range c.groups {
			if f.GID == 0 || g.gid == f.GID {
				g.probe = true
				c.enqueueLocked(g)
			}
		}
	}
	if now >= wire.LevelWriteOnly && c.pollAt.IsZero() {
		c.pollAt = time.Now().Add(c.cfg.PollInterval)
	}
	c.mu.Unlock()
	c.emit(Event{Kind: EventDegraded, GID: f.GID, Level: f.Level})
}

// effectiveLocked returns the level for gid (0: the node's level).
func (c *Conn) effectiveLocked(gid int64) int {
	lv := c.level
	if gl := c.levels[gid]; gid != 0 && gl > lv {
		lv = gl
	}
	return lv
}

// offerLocked takes a pushed message: delivered inline when it is the next
// one and nothing is in the way, else buffered for run.
func (c *Conn) offerLocked(g *group, wm *wire.Msg) {
	if wm.Seq <= g.delivered {
		c.st.duplicates.Add(1)
		return
	}
	if wm.Seq > g.target {
		g.target = wm.Seq
	}
	m := message(wm, false)
	if !g.busy && !g.provisional && len(g.pending) == 0 && m.Seq == g.delivered+1 && c.tryEmitLocked(m, true) {
		g.delivered = m.Seq
		return
	}
	if !g.insert(owned(m)) {
		c.st.duplicates.Add(1)
		return
	}
	if len(g.pending) > c.cfg.MaxPending {
		// Drop the highest: it is <= target, so it will be pulled.
		g.pending[len(g.pending)-1] = Message{}
		g.pending = g.pending[:len(g.pending)-1]
		c.st.overflow.Add(1)
	}
	if len(g.pending) > 0 && g.pending[0].Seq > g.delivered+1 && g.gapAt.IsZero() {
		g.gapAt = time.Now()
		c.st.gaps.Add(1)
	}
	c.enqueueLocked(g)
}

// tryEmitLocked delivers m if that does not block. aliased says m's body
// is in the read buffer: OnMessage may see it, the channel gets a copy.
func (c *Conn) tryEmitLocked(m Message, aliased bool) bool {
	if c.cfg.OnMessage != nil {
		c.cfg.OnMessage(m)
		c.countDelivered(m)
		return true
	}
	if aliased {
		if len(c.msgs) == cap(c.msgs) {
			return false
		}
		m = owned(m)
	}
	select {
	case c.msgs <- m:
		c.countDelivered(m)
		return true
	default:
		return false
	}
}

// emitLocked delivers m, waiting for room in Messages (without c.mu) until
// ctx ends. m's body must be owned.
func (c *Conn) emitLocked(ctx context.Context, m Message) bool {
	if c.tryEmitLocked(m, false) {
		return true
	}
	c.mu.Unlock()
	defer c.mu.Lock()
	select {
	case c.msgs <- m:
		c.countDelivered(m)
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *Conn) countDelivered(m Message) {
	c.st.delivered.Add(1)
	if m.Pulled {
		c.st.pulled.Add(1)
	}
}

// work does the queued delivery work (run goroutine): it returns when only
// deferred groups are left, with the earliest time one is due, or with
// ok false when the session failed or ctx ended.
func (c *Conn) work(ctx context.Context, s *session) (next time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		now := time.Now()
		next = time.Time{}
		if !c.pollAt.IsZero() && !now.Before(c.pollAt) {
			c.pollAt = time.Time{}
			polling := false
			for _, g := range c.groups {
				if c.effectiveLocked(g.gid) >= wire.LevelWriteOnly {
					g.probe = true
					c.enqueueLocked(g)
					polling = true
				}
			}
			if polling {
				c.pollAt = now.Add(c.cfg.PollInterval)
			}
		}
		if !c.pollAt.IsZero() {
			next = c.pollAt
		}
		progressed := false
		for i := 0; i < len(c.queue); {
			g := c.queue[i]
			if c.groups[g.gid] != g {
				c.removeQueuedLocked(i)
				continue
			}
			if g.wakeAt.After(now) {
				next = earliest(next, g.wakeAt)
				i++
				continue
			}
			progressed = true
			wakeAt, err := c.fillLocked(ctx, s, g)
			if err != nil {
				return next, false
			}
			// fillLocked may have unlocked: find g again (the queue only
			// grows meanwhile, and only this goroutine removes).
			for i >= len(c.queue) || c.queue[i] != g {
				i--
			}
			if wakeAt.IsZero() {
				c.removeQueuedLocked(i)
				continue
			}
			g.wakeAt = wakeAt
			next = earliest(next, wakeAt)
			i++
		}
		if !progressed {
			return next, true
		}
	}
}

func (c *Conn) removeQueuedLocked(i int) {
	c.queue[i].queued = false
	c.queue[i].wakeAt = time.Time{}
	copy(c.queue[i:], c.queue[i+1:])
	c.queue[len(c.queue)-1] = nil
	c.queue = c.queue[:len(c.queue)-1]
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// fillLocked delivers what g has pending in order and pulls what is
// missing, page by page. It returns a time to come back (a gap still in
// its GapWait, a pull to retry), zero when g is complete, or an error when
// the session failed or ctx ended.
func (c *Conn) fillLocked(ctx context.Context, s *session, g *group) (time.Time, error) {
	g.busy = true
	defer func() { g.busy = false }()
	if g.place {
		c.placeLocked(ctx, g)
	}
	if g.provisional {
		return time.Time{}, nil // the connect sync places it
	}
	for {
		if n := g.trim(); n > 0 {
			c.st.duplicates.Add(uint64(n))
		}
		if len(g.pending) > 0 && g.pending[0].Seq == g.delivered+1 {
			m := g.pending[0]
			if !c.emitLocked(ctx, m) {
				return time.Time{}, ctx.Err()
			}
			// emitLocked may have unlocked; nothing else removes pending
			// while g is busy.
			g.popFront()
			g.delivered = m.Seq
			continue
		}
		now := time.Now()
		if now.Before(g.retryAt) {
			return g.retryAt, nil
		}
		if g.probe {
			from := g.delivered + 1
			sent := g.known()
			// Cleared before the pull (which unlocks c.mu): a probe asked
			// for while it is out (Track, a level change) learns of
			// messages its answer may not hold, and runs after it.
			g.probe = false
			page, err := c.pullLocked(ctx, s, g.gid, from, 0)
			if err != nil {
				g.probe = true
				return c.pullFailedLocked(g, err)
			}
			if page.LastSeq > g.target {
				g.target = page.LastSeq
			}
			g.force = true
			if !c.acceptLocked(ctx, g, from, page, sent) {
				return time.Time{}, ctx.Err()
			}
			continue
		}
		hi := g.target
		if len(g.pending) > 0 {
			hi = g.pending[0].Seq - 1
		}
		if hi <= g.delivered {
			g.force, g.gapAt = false, time.Time{}
			return time.Time{}, nil
		}
		if !g.force && c.cfg.GapWait > 0 {
			if g.gapAt.IsZero() {
				g.gapAt = now
			}
			if due := g.gapAt.Add(c.cfg.GapWait); now.Before(due) {
				return due, nil
			}
		}
		from := g.delivered + 1
		if limit := c.cfg.MaxCatchUp; limit > 0 && g.force && hi-from+1 > limit {
			to := hi - limit
			g.delivered = to
			g.trim()
			c.emit(Event{Kind: EventSkipped, GID: g.gid, From: from, To: to})
			continue
		}
		sent := g.known()
		page, err := c.pullLocked(ctx, s, g.gid, from, hi)
		if err != nil {
			return c.pullFailedLocked(g, err)
		}
		if !c.acceptLocked(ctx, g, from, page, sent) {
			return time.Time{}, ctx.Err()
		}
	}
}

// pullLocked pulls one page over s without holding c.mu.
func (c *Conn) pullLocked(ctx context.Context, s *session, gid, from, to int64) (*wire.Messages, error) {
	c.mu.Unlock()
	defer c.mu.Lock()
	return c.pullWS(ctx, s, gid, from, to)
}

// pullFailedLocked decides what a failed background pull means for g.
func (c *Conn) pullFailedLocked(g *group, err error) (time.Time, error) {
	var se *Error
	switch {
	case errors.As(err, &se) && (se.Code == wire.CodeForbidden || se.Code == wire.CodeNotFound):
		delete(c.groups, g.gid)
		c.emit(Event{Kind: EventGroupLost, GID: g.gid, Err: err})
		return time.Time{}, nil
	case errors.As(err, &se):
		wait := se.RetryAfter
		if wait <= 0 {
			wait = backoff(c.cfg.BackoffMin, c.cfg.BackoffMax, 3)
		}
		g.retryAt = time.Now().Add(wait)
		c.emit(Event{Kind: EventError, GID: g.gid, Err: err})
		return g.retryAt, nil
	case errors.Is(err, ErrTimeout):
		g.retryAt = time.Now().Add(backoff(c.cfg.BackoffMin, c.cfg.BackoffMax, 2))
		return g.retryAt, nil
	}
	return time.Time{}, err // the session is gone or ctx ended
}

// knownSeqs is what a group knew exists when a pull was sent: its lowest
// pending seq (0: none) and its target.
type knownSeqs struct{ low, target int64 }

func (g *group) known() knownSeqs {
	k := knownSeqs{target: g.target}
	if len(g.pending) > 0 {
		k.low = g.pending[0].Seq
	}
	return k
}

// acceptLocked delivers a pulled page for a request from from, sent when g
// knew sent. A page that starts above from means [from, first) lies below
// the member's join_seq; an empty page either means the same for the whole
// range or that nothing exists there. The server read the page after it
// stored everything g had been pushed when the pull was sent, but not
// necessarily what was pushed since: an empty page only speaks for the
// former. False when ctx ended.
func (c *Conn) acceptLocked(ctx context.Context, g *group, from int64, page *wire.Messages, sent knownSeqs) bool {
	c.st.pulls.Add(1)
	if g.delivered >= from {
		return true // cannot happen while g is busy; stay safe
	}
	msgs := page.Messages
	if len(msgs) == 0 {
		switch {
		case page.LastSeq < from && len(g.pending) > 0:
			// The server says pushed seqs do not exist: trust it, skip,
			// unless they were pushed after the pull went out (the page
			// may predate them: pull again).
			if sent.low == 0 || g.pending[0].Seq != sent.low {
				return true
			}
			to := g.pending[0].Seq - 1
			if to >= from {
				g.delivered = to
				c.emit(Event{Kind: EventSkipped, GID: g.gid, From: from, To: to})
			}
		case page.LastSeq < from:
			// Nothing exists past delivered, as of the pull: unless a
			// resync or summary raised the target since.
			if g.target == sent.target {
				g.target = g.delivered
			}
		default:
			// [from, to] is all below join_seq: not ours to see.
			to := g.target
			if len(g.pending) > 0 {
				to = g.pending[0].Seq - 1
			}
			g.delivered = max(g.delivered, min(to, page.LastSeq))
		}
		return true
	}
	for i := range msgs {
		wm := &msgs[i]
		wm.GID = g.gid
		if wm.Seq <= g.delivered {
			c.st.duplicates.Add(1)
			continue
		}
		if wm.Seq != g.delivered+1 {
			if i > 0 {
				break // a hole in the page: pull again from there
			}
			g.delivered = wm.Seq - 1 // below join_seq
		}
		if wm.Seq > g.target {
			g.target = wm.Seq
		}
		if !c.emitLocked(ctx, message(wm, true)) {
			return false
		}
		g.delivered = wm.Seq
	}
	return true
}

// Track starts delivering gid's messages after seq afterSeq and schedules
// a catch-up pull up to the group's last_seq. For a group tracked already
// it only schedules the catch-up (its cursor never moves back).
func (c *Conn) Track(gid, afterSeq int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[gid]
	if g == nil {
		g = c.newGroupLocked(gid, max(afterSeq, 0))
	} else if g.provisional {
		// Nothing was delivered yet: start where the app says.
		g.provisional, g.place = false, false
		g.delivered = min(g.delivered, max(afterSeq, 0))
	}
	g.probe = true
	c.enqueueLocked(g)
}

// Cursors returns the last delivered seq of every tracked group, to be
// persisted and passed back as Config.Cursors.
func (c *Conn) Cursors() map[int64]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int64]int64, len(c.groups))
	for gid, g := range c.groups {
		out[gid] = g.delivered
	}
	return out
}

// applySync updates the cursors from a sync answer: tracked groups behind
// their last_seq are caught up; untracked ones start at last_read_seq (or
// last_seq with SkipUnread).
func (c *Conn) applySync(groups []wire.SyncGroup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, sg := range groups {
		g := c.groups[sg.GID]
		if g != nil && g.provisional {
			// Nothing of it was delivered: start where a group new to
			// the Conn starts (its pending pushes stay and fill in).
			g.provisional, g.place = false, false
			g.delivered = sg.LastReadSeq
			if n := g.trim(); n > 0 { // read already, on another device
				c.st.duplicates.Add(uint64(n))
			}
		}
		if g == nil {
			start := sg.LastReadSeq
			if c.cfg.SkipUnread {
				start = sg.LastSeq
			}
			g = c.newGroupLocked(sg.GID, start)
		}
		if sg.LastSeq > g.target {
			g.target = sg.LastSeq
		}
		if g.target > g.delivered {
			g.force = true
			c.enqueueLocked(g)
		}
	}
}

// probeAllLocked schedules a catch-up pull of every tracked group.
func (c *Conn) probeAllLocked() {
	for _, g := range c.groups {
		g.probe = true
		c.enqueueLocked(g)
	}
}
