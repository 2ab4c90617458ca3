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
	buf     []byte
	conns   []*socket.Conn
	streams []*stream
	frames  []*socket.Frame
	msgs    []wire.Msg
}

var scratchPool = sync.Pool{New: func() any { return new(pushScratch) }}

// split sorts conns into sc's sockets and event streams (sse.go), the two
// kinds the gateway registers; it returns how many of the sockets take
// permessage-deflate.
func (sc *pushScratch) split(conns []fanout.Conn) (deflate int) {
	for _, c := range conns {
		if st, ok := c.(*stream); ok {
			sc.streams = append(sc.streams, st)
			continue
		}
		conn := c.(*socket.Conn)
		if conn.Deflate() {
			deflate++
		}
		sc.conns = append(sc.conns, conn)
	}
	return deflate
}

// release clears sc (no references kept) and returns it to the pool.
func (sc *pushScratch) release() {
	clear(sc.conns)
	clear(sc.streams)
	clear(sc.frames)
	clear(sc.msgs)
	sc.conns, sc.streams, sc.frames, sc.msgs = sc.conns[:0], sc.streams[:0], sc.frames[:0], sc.msgs[:0]
	scratchPool.Put(sc)
}

// Push implements fanout.Pusher: it encodes the push once, broadcasts
// the same frame to every recipient (compressed once for those with
// permessage-deflate) and returns the bytes all recipients are handed.
func (ch *Chat) Push(p *fanout.Push) (bytes int) {
	if (ch.srv == nil && ch.events == nil) || len(p.Conns) == 0 || (len(p.Msgs) == 0 && p.Kind != fanout.PushResync) {
		return 0
	}
	sc := scratchPool.Get().(*pushScratch)
	defer sc.release()
	nz := sc.split(p.Conns) // recipients with permessage-deflate
	// wireBytes is f's bytes for all recipients; it compresses f before
	// the broadcast when some recipient takes it compressed. A stream is
	// handed the payload with its data line (its id is not counted).
	n := len(sc.conns)
	wireBytes := func(f *socket.Frame) int {
		b := f.Len()*(n-nz) + (len(f.Payload())+sseOverhead)*len(sc.streams)
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
			f := socket.NewPushFrame(p.GID, m.Seq, sc.buf)
			f.SetOrigin(p.Origin)
			sc.frames = append(sc.frames, f)
		}
		for _, f := range sc.frames {
			bytes += wireBytes(f)
		}
		ch.broadcast(sc)
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
		ch.broadcast(sc)
	case fanout.PushSummary:
		sc.msgs = wireMsgs(sc.msgs[:0], p.Msgs[:1])
		sc.buf = wire.AppendSummary(sc.buf[:0], &wire.Summary{GID: p.GID, Count: int64(p.Count), First: sc.msgs[0], LastSeq: p.LastSeq})
		f := socket.NewPushFrame(p.GID, p.LastSeq, sc.buf)
		bytes = wireBytes(f)
		sc.frames = append(sc.frames, f)
		ch.broadcast(sc)
	case fanout.PushResync:
		// A push frame: a connection over its outbound bound drops it and
		// gets the socket layer's own resync for the group instead; an
		// event stream's cursor moves to LastSeq, as for its own resyncs.
		f := sseResyncFrame(p.GID, p.LastSeq)
		bytes = wireBytes(f)
		sc.frames = append(sc.frames, f)
		ch.broadcast(sc)
	}
	return bytes
}

// broadcast hands sc's frames to its sockets and its event streams.
func (ch *Chat) broadcast(sc *pushScratch) {
	if len(sc.conns) > 0 {
		if len(sc.frames) == 1 {
			ch.srv.Broadcast(sc.frames[0], sc.conns)
		} else {
			ch.srv.BroadcastBatch(sc.frames, sc.conns)
		}
	}
	if len(sc.streams) > 0 {
		ch.events.deliver(sc.frames, sc.streams)
	}
}

// Degraded implements fanout.Pusher: it tells conns (every connection when
// gid is 0) the new effective level.
func (ch *Chat) Degraded(gid int64, level fanout.Level, conns []fanout.Conn) {
	if ch.srv == nil && ch.events == nil {
		return
	}
	f := degradedFrame(gid, level)
	if ch.events != nil {
		ch.events.degraded(f, gid == 0, conns)
	}
	if gid == 0 {
		ch.liveMu.Lock()
		for _, c := range ch.live {
			_ = c.Write(f)
		}
		ch.liveMu.Unlock()
		return
	}
	for _, c := range conns {
		if sc, ok := c.(*socket.Conn); ok {
			_ = sc.Write(f)
		}
	}
}

var _ fanout.Pusher = (*Chat)(nil)
var _ socket.Handler = (*Chat)(nil)
