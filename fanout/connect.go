// This file holds connects: a connection's memberships are read and set
// in presence (ConnectReady), ordered against removals
// (connectMemberships, eligibility.go), and cleared on Disconnect.

package fanout

import (
	"context"

	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
)

// Connect registers a connection of uid: it marks the user active (in
// memory: the store gets the time within Config.TouchInterval), loads its
// groups and sets its presence bits. It calls the store (blocking).
func (e *Engine) Connect(ctx context.Context, c Conn) ([]store.Member, error) {
	return e.ConnectReady(ctx, c, nil)
}

// ConnectReady is Connect calling ready (which sends hello) just before c
// is registered in presence, so that every push to c follows what ready
// wrote, and a client that syncs after hello misses nothing.
func (e *Engine) ConnectReady(ctx context.Context, c Conn, ready func()) ([]store.Member, error) {
	uid := c.UID()
	e.touches.touch(uid, e.now())
	// Additions committed after the read below are the feed's (cluster
	// mode): its cursor must be taken before it.
	if err := e.startFeed(ctx); err != nil {
		return nil, err
	}
	// A removal committed after this read cannot have cleared its bits
	// before Connect sets them (connectMemberships reads again).
	ms, err := e.connectMemberships(ctx, uid, func(ms []store.Member) error {
		if ready != nil {
			ready() // hello: no push can reach c before it is registered below
		}
		if e.pres == nil {
			return nil
		}
		bits := make([]presence.Membership, len(ms))
		for i, m := range ms {
			e.connectJoiner(m)
			bits[i] = presence.Membership{GID: m.GID, Ordinal: m.Ordinal}
		}
		// Connect does not evict another member holding one of these
		// ordinals: a membership read above may already be stale.
		return e.pres.Connect(uid, c, bits)
	})
	if err != nil {
		return nil, err
	}
	if e.pres == nil {
		return ms, nil
	}
	// A join or leave committed between the read above and Connect found
	// uid offline and changed no bit: read again and reconcile. Changes
	// committed after this read run their Join/Leave on a registered uid.
	fresh, err := e.st.UserGroups(ctx, uid)
	if err != nil {
		e.Disconnect(c)
		return nil, err
	}
	stale := make(map[int64]uint32, len(ms))
	for _, m := range ms {
		stale[m.GID] = m.Ordinal
	}
	for _, m := range fresh {
		if ord, ok := stale[m.GID]; !ok || ord != m.Ordinal {
			e.connectJoiner(m)
			if err := e.pres.Join(m.GID, uid, m.Ordinal); err != nil {
				e.Disconnect(c)
				return nil, err
			}
		}
		delete(stale, m.GID)
	}
	for gid := range stale {
		e.pres.Leave(gid, uid)
	}
	if e.bus != nil {
		for _, m := range fresh {
			_ = e.bus.Subscribe(m.GID) // at once; the bus also follows presence
		}
	}
	e.emitConn(hooks.EventConnect, uid)
	return fresh, nil
}

// connectJoiner makes m a recent joiner of its group before a connect
// sets m's bit. With a bus the group's window here, or a batch
// still on its way from another node, may hold messages committed before
// m joined (on another node, while m was offline here); on one node every
// commit below join_seq was pushed before the join ran on the group's
// worker (runFunc flushes its window), and no joiner is kept.
func (e *Engine) connectJoiner(m store.Member) {
	if e.bus != nil {
		e.addJoiner(m.GID, m.UID, m.JoinSeq)
	}
}

// Disconnect unregisters a connection.
func (e *Engine) Disconnect(c Conn) {
	if e.pres != nil {
		e.pres.Disconnect(c.UID(), c)
	}
	e.emitConn(hooks.EventDisconnect, c.UID())
}
