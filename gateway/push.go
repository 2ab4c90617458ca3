package gateway

import (
	"sync"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// pushScratch is the reusable state of one Push call. Push runs on several
// shard workers at once, so scratch is pooled, not shared.
type pushScratch struct {
	buf    []byte
	conns  []*socket.Conn
	frames []*socket.Frame
	msgs   []wire.Msg
}

var scratchPool = sync.Pool{New: func() any { return new(pushScratch) }}

// Push implements fanout.Pusher: it encodes the push once, broadcasts
// the same frame to every recipient (compressed once for those with
// permessage-deflate) and returns the bytes all recipients are handed.
func (ch *Chat) Push(p *fanout.Push) (bytes int) {
	if ch.srv == nil || len(p.Conns) == 0 || len(p.Msgs) == 0 {
		return 0
	}
	sc := scratchPool.Get().(*pushScratch)
	defer func() {
		clear(sc.conns)
		clear(sc.frames)
		clear(sc.msgs)
		sc.conns, sc.frames, sc.msgs = sc.conns[:0], sc.frames[:0], sc.msgs[:0]
		scratchPool.Put(sc)
	}()
	nz := 0 // recipients with permessage-deflate
	for _, c := range p.Conns {
		conn := c.(*socket.Conn) // the only Conn type the gateway registers
		if conn.Deflate() {
			nz++
		}
		sc.conns = append(sc.conns, conn)
	}
	// wireBytes is f's bytes for all recipients; it compresses f before
	// the broadcast when some recipient takes it compressed.
	n := len(sc.conns)
	wireBytes := func(f *socket.Frame) int {
		b := f.Len() * (n - nz)
		if nz > 0 {
			b += ch.srv.WireBytes(f, true) * nz
		}
		return b
	}
	switch p.Kind {
	case fanout.PushMsgs:
		for i := range p.Msgs {
			m := &p.Msgs[i]
			w := wireMsg(m)
			sc.buf = wire.AppendMsg(sc.buf[:0], &w)
			sc.frames = append(sc.frames, socket.NewPushFrame(p.GID, m.Seq, sc.buf))
		}
		for _, f := range sc.frames {
			bytes += wireBytes(f)
		}
		if len(sc.frames) == 1 {
			ch.srv.Broadcast(sc.frames[0], sc.conns)
		} else {
			ch.srv.BroadcastBatch(sc.frames, sc.conns)
		}
	case fanout.PushBatch:
		// A window of large messages becomes several batch frames of at
		// most PageBytes each: one frame above the outbound bound would
		// be dropped for every recipient (and replaced by a resync and a
		// pull), the busier the group the surer.
		sc.msgs = wireMsgs(sc.msgs[:0], p.Msgs)
		for rest := sc.msgs; len(rest) > 0; {
			var n int
			sc.buf, n = wire.AppendBatchWithin(sc.buf[:0], &wire.Batch{GID: p.GID, Messages: rest}, ch.cfg.PageBytes)
			f := socket.NewPushFrame(p.GID, rest[n-1].Seq, sc.buf)
			bytes += wireBytes(f)
			sc.frames = append(sc.frames, f)
			rest = rest[n:]
		}
		if len(sc.frames) == 1 {
			ch.srv.Broadcast(sc.frames[0], sc.conns)
		} else {
			ch.srv.BroadcastBatch(sc.frames, sc.conns)
		}
	case fanout.PushSummary:
		sc.msgs = wireMsgs(sc.msgs[:0], p.Msgs[:1])
		sc.buf = wire.AppendSummary(sc.buf[:0], &wire.Summary{GID: p.GID, Count: int64(p.Count), First: sc.msgs[0], LastSeq: p.LastSeq})
		f := socket.NewPushFrame(p.GID, p.LastSeq, sc.buf)
		bytes = wireBytes(f)
		ch.srv.Broadcast(f, sc.conns)
	}
	return bytes
}

// Degraded implements fanout.Pusher: it tells conns (every connection when
// gid is 0) the new effective level.
func (ch *Chat) Degraded(gid int64, level fanout.Level, conns []fanout.Conn) {
	if ch.srv == nil {
		return
	}
	f := degradedFrame(gid, level)
	if gid == 0 {
		ch.live.Range(func(_, v any) bool {
			_ = v.(*socket.Conn).Write(f)
			return true
		})
		return
	}
	for _, c := range conns {
		_ = c.(*socket.Conn).Write(f)
	}
}

var _ fanout.Pusher = (*Chat)(nil)
var _ socket.Handler = (*Chat)(nil)
