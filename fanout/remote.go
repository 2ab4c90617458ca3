// This file holds the input from the bus: batches another node committed
// (Remote, pushed on the group's worker by pushRemote through deliver.go)
// and its membership changes (RemoteMembers, applied as members.go applies
// a local one). Membership is in members.go.

package fanout

import (
	"context"
	"errors"
	"time"

	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/store"
)

// Remote takes a batch another node committed and pushes it to this
// node's online members on the group's worker, in order with local
// commits. It never blocks: when the worker's queue is full the batch is
// dropped and clients pull the gap.
func (e *Engine) Remote(b *bus.Batch) {
	if e.closing.Load() || (len(b.Msgs) == 0 && b.Tail == 0) {
		b.Release()
		return
	}
	t := taskPool.Get().(*task)
	t.kind = taskRemote
	t.gid = b.GID
	t.remote = b
	t.enq = time.Now()
	e.routeMu.RLock()
	ok, err := e.route(b.GID).tryEnqueueControl(t)
	e.routeMu.RUnlock()
	if !ok || err != nil {
		e.cfg.Metrics.remoteDropped()
		b.Release()
		releaseTask(t)
	}
}

// BusReconnected is bus.Config.Reconnected: the bus lost its backend and
// subscribed again, so batches of gids published meanwhile, and their tail
// hints, may never have arrived here. Each group's last seq is read from
// the store (one group at a time, on the caller's goroutine) and handled as
// a tail hint: a group whose last seq is above what this node pushed sends
// its online members here a resync. Membership changes published
// meanwhile were lost too: removals show as version holes at the groups'
// next batches, and the feed of additions is read at once for the
// additions (members.go).
func (e *Engine) BusReconnected(gids []int64) {
	e.kickFeed()
	for _, gid := range gids {
		if e.closing.Load() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.CommitTimeout)
		g, err := e.st.Group(ctx, gid)
		cancel()
		if err != nil || g.LastSeq == 0 {
			continue
		}
		e.Remote(&bus.Batch{GID: gid, Tail: g.LastSeq})
	}
}

// RemoteMembers takes a membership change another node committed and
// applies it to this node with the code of a local change (joined, left),
// on the group's worker, in order with the group's pushes. An addition
// matters here only if one of the added members is online here: else it
// is skipped (their connect reads the membership), so that a node does not
// keep recent joiners for every group of the cluster. An addition is checked
// against the store on the worker first: a removal made since (here or on
// a third node, whose change may arrive first) wins, so a late addition
// never revives a removed member. Only the origin's own batches are
// ordered with its change: a batch of a third node committed after the
// addition may have been pushed here already, so the new members get a
// resync up to what this node pushed (resyncJoined). It never blocks: when the worker's queue
// is full, a removal is applied at once from the caller's goroutine
// (earlier than its turn, which can only cost the member a push it could
// still have had) without advancing the group's view (the next batch
// re-reads the members), an addition is dropped (counted) and left to the feed
// of additions (members.go), which is asked to read at once.
func (e *Engine) RemoteMembers(c *bus.MemberChange) {
	if e.closing.Load() || e.pres == nil || len(c.Members) == 0 {
		return
	}
	if !c.Removed && !e.anyOnline(c.Members) {
		e.applied(c.GID, c.Version) // nothing to set here
		return
	}
	t := taskPool.Get().(*task)
	t.kind = taskFunc
	t.gid = c.GID
	t.fn = func(ctx context.Context, seen int64) error {
		if c.Removed {
			e.left(c.GID, c.Members)
		} else {
			gens := e.leaveGens()
			ms := e.stillMembers(ctx, c.GID, c.Members)
			if err := e.joined(ctx, c.GID, ms, &gens); err != nil {
				return err
			}
			// Batches of other nodes are not ordered with this change (only
			// the origin's are): one committed after the addition may have
			// been pushed here already, to the members as they were.
			e.resyncJoined(c.GID, ms, seen)
		}
		e.applied(c.GID, c.Version)
		return nil
	}
	t.enq = time.Now()
	e.routeMu.RLock()
	ok, err := e.route(c.GID).tryEnqueueControl(t)
	e.routeMu.RUnlock()
	if ok && err == nil {
		return
	}
	releaseTask(t)
	if c.Removed {
		// Not applied(): applied out of turn, the removal may fall between
		// the store read and the join of a re-read or a feed repair
		// running on the worker now; the view stays behind, so the next
		// batch re-reads the members from the store (and joined re-checks
		// the stripe).
		e.left(c.GID, c.Members)
		return
	}
	e.cfg.Metrics.remoteMembersDropped()
	e.kickFeed()
	e.cfg.Logger.Warn("remote membership change dropped: group worker queue full; the feed of additions repairs it",
		"gid", c.GID, "origin", c.Origin, "members", len(c.Members))
}

// stillMembers returns the memberships of ms that the store still holds,
// as it holds them now. A member whose row cannot be read (store failing)
// is kept as announced: a push too many beats a member left out.
func (e *Engine) stillMembers(ctx context.Context, gid int64, ms []store.Member) []store.Member {
	out := ms[:0:0]
	for _, m := range ms {
		cur, err := e.st.Member(ctx, gid, m.UID)
		switch {
		case err == nil:
			out = append(out, cur)
		case errors.Is(err, store.ErrNotMember):
			// removed since: skip
		default:
			e.cfg.Logger.Warn("remote membership addition not checked: store failing", "gid", gid, "uid", m.UID, "err", err)
			out = append(out, m)
		}
	}
	return out
}

func (e *Engine) anyOnline(ms []store.Member) bool {
	for _, m := range ms {
		if e.pres.UserOnline(m.UID) {
			return true
		}
	}
	return false
}

// pushRemote pushes a batch another node committed to this node's online
// members, through the same levels and merge windows as a local commit
// (pushNow cuts it for recent joiners).
func (s *shard) pushRemote(t *task, now time.Time) {
	b := t.remote
	if b.Tail > 0 {
		s.tailHint(b, now)
		b.Release()
		releaseTask(t)
		return
	}
	if !s.e.membersCurrent(b.GID, b.MemberVersion) {
		b.Msgs = b.Msgs[:0] // members unknown: pushed nothing (clients pull)
	}
	// Members here receive every node's commits: the downlink trigger
	// counts them all.
	gs := s.group(b.GID, now)
	gs.commits.add(now, s.bucketWidth(), len(b.Msgs))
	// A group that only gets remote batches here keeps its state (its
	// seenSeq, see tailHint) while they come, as local sends keep it.
	gs.lastSeen = now
	if len(b.Msgs) > 0 && s.e.pres != nil && s.e.push != nil {
		s.deliver(gs, b.Msgs)
	}
	b.Release()
	releaseTask(t)
}

// tailHint handles a quiet group's tail hint (bus.Batch.Tail): when this
// node pushed less of the group than the origin published (a batch lost on
// the bus, dropped by a full queue here, or not pushed for members unknown),
// the group's online members here get a resync up to the hint's seq and
// pull what they miss. Without it only the group's next message would show
// them the gap. At L3 and L4 the members poll; nothing is sent.
func (s *shard) tailHint(b *bus.Batch, now time.Time) {
	gs := s.group(b.GID, now)
	gs.lastSeen = now // kept while hints come: a new gstate would resync everyone
	if b.Tail <= gs.seenSeq {
		return
	}
	if s.e.pres != nil && s.e.push != nil && s.pushLevel(gs) <= L2Summary &&
		!s.e.membersCurrent(b.GID, b.MemberVersion) {
		return // the members are not known (store failing): not settled
	}
	gs.seenSeq = b.Tail
	if s.e.pres == nil || s.e.push == nil || s.pushLevel(gs) > L2Summary {
		return
	}
	s.conns = s.e.pres.AppendConns(s.conns[:0], b.GID)
	if len(s.conns) > 0 {
		s.push = Push{GID: b.GID, Kind: PushResync, LastSeq: b.Tail, Conns: s.conns}
		s.e.egress.Add(int64(s.e.push.Push(&s.push)))
		s.push = Push{}
		s.e.cfg.Metrics.tailResyncs(len(s.conns))
	}
	clear(s.conns)
}
