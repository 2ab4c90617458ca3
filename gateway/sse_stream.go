// This file holds one event stream: its bounded queue (filled by Chat.Push
// and the replies, emptied by the stream's request goroutine) and the
// encoding of frames as events.

package gateway

import (
	"bytes"
	"context"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/gateway/socket"
)

// sseItem is one frame queued for a stream.
type sseItem struct {
	f     *socket.Frame
	reply bool // hello, degraded, resync: never dropped for slowness
}

// sseOverhead is what an event adds to a frame's payload besides its id:
// "data: " and the blank line.
const sseOverhead = len("data: ") + 2

// stream is one GET /v1/events response: a fanout.Conn like a socket.
// Fields under mu are touched by the pushing goroutines (shard workers,
// the level changers, the sweeper); the rest by the request's goroutine.
type stream struct {
	ev        *Events
	id        uint64
	uid       string
	tier      int
	ip        netip.Addr
	ipCounted bool
	expires   int64 // token expiry, Unix ns; 0 = none
	deadline  int64 // end of the stream's lifetime, Unix ns; 0 = none
	lastWrite atomic.Int64
	wake      chan struct{} // one pending signal: something to write

	mu       sync.Mutex
	q        []sseItem
	spare    []sseItem
	pend     int // bytes queued or being written
	overflow bool
	drops    map[int64]int64 // gid -> highest seq dropped, while overflowing
	hb       bool            // a heartbeat is due
	finCode  socket.CloseCode
	finWhy   string // set: write the close event and end

	// Owned by the request goroutine.
	cur cursor
	buf []byte
}

// UID implements fanout.Conn.
func (s *stream) UID() string { return s.uid }

func (s *stream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// push queues the frames of one push, or drops them (and records the
// highest seq per group for the resync) while the stream is over its
// bound; it returns how many it dropped.
func (s *stream) push(frames []*socket.Frame) (queued, dropped uint64) {
	bound := s.ev.cfg.OutboundBound
	s.mu.Lock()
	if s.finWhy != "" { // ending: the client reconnects and resumes
		s.mu.Unlock()
		return 0, 0
	}
	for _, f := range frames {
		size := len(f.Payload()) + sseOverhead
		if !s.overflow && s.pend+size > bound {
			s.overflow = true
		}
		if s.overflow {
			s.recordDropLocked(f.GID(), f.LastSeq())
			dropped++
			continue
		}
		s.q = append(s.q, sseItem{f: f})
		s.pend += size
		queued++
	}
	s.mu.Unlock()
	s.signal()
	return queued, dropped
}

func (s *stream) recordDropLocked(gid, seq int64) {
	if gid == 0 {
		return
	}
	if s.drops == nil {
		s.drops = make(map[int64]int64, 1)
	}
	if old, ok := s.drops[gid]; !ok || seq > old {
		s.drops[gid] = seq
	}
}

// reply queues f, never dropped; a stream whose queue would pass the hard
// bound is ended as a slow consumer instead.
func (s *stream) reply(f *socket.Frame) {
	size := len(f.Payload()) + sseOverhead
	s.mu.Lock()
	switch {
	case s.finWhy != "":
	case s.pend+size > s.ev.cfg.OutboundHardBound:
		s.finishLocked(socket.ClosePolicyViolation, "slow consumer")
	default:
		s.q = append(s.q, sseItem{f: f, reply: true})
		s.pend += size
	}
	s.mu.Unlock()
	s.signal()
}

// beat asks for a heartbeat comment.
func (s *stream) beat() {
	s.mu.Lock()
	s.hb = true
	s.mu.Unlock()
	s.signal()
}

// finish ends the stream after what is queued, with a close event.
func (s *stream) finish(code socket.CloseCode, why string) {
	s.mu.Lock()
	s.finishLocked(code, why)
	s.mu.Unlock()
	s.signal()
}

func (s *stream) finishLocked(code socket.CloseCode, why string) {
	if s.finWhy == "" {
		s.finCode, s.finWhy = code, why
	}
}

// write writes b and flushes it within the write timeout.
func (s *stream) write(rc *http.ResponseController, w http.ResponseWriter, b []byte, now time.Time) bool {
	_ = rc.SetWriteDeadline(now.Add(s.ev.cfg.WriteTimeout))
	if _, err := w.Write(b); err != nil {
		return false
	}
	if err := rc.Flush(); err != nil {
		return false
	}
	s.lastWrite.Store(time.Now().UnixNano())
	return true
}

// run writes what is queued until the client goes, the stream is
// finished, or a write fails; it returns why it ended.
func (s *stream) run(ctx context.Context, rc *http.ResponseController, w http.ResponseWriter) string {
	done := ctx.Done()
	for {
		select {
		case <-s.wake:
		case <-done:
			return "client gone"
		}
		s.mu.Lock()
		batch := s.q
		s.q, s.spare = s.spare[:0], nil
		hb := s.hb
		s.hb = false
		code, why := s.finCode, s.finWhy
		s.mu.Unlock()

		b := s.appendEvents(s.buf[:0], batch)
		if why != "" {
			b = appendCloseEvent(b, code, why)
		} else if len(b) == 0 && hb {
			b = append(b, ":\n\n"...)
		}
		size := 0
		for _, it := range batch {
			size += len(it.f.Payload()) + sseOverhead
		}
		ok := len(b) == 0 || s.write(rc, w, b, time.Now())
		if cap(b) <= sseMaxKeptBuffer {
			s.buf = b[:0]
		} else {
			s.buf = nil // a burst's buffer is not kept by an idle stream
		}
		if !ok {
			s.finish(socket.ClosePolicyViolation, "slow consumer")
			return "slow consumer"
		}

		s.mu.Lock()
		s.pend -= size
		clear(batch)
		s.spare = batch[:0]
		if s.overflow && len(s.q) == 0 && s.pend == 0 && s.finWhy == "" {
			s.resyncLocked()
		}
		more := len(s.q) > 0
		s.mu.Unlock()
		if why != "" {
			return why
		}
		if more {
			s.signal()
		}
	}
}

// resyncLocked ends an overflow once the stream drained: one resync per
// group whose pushes were dropped, queued before any later push.
func (s *stream) resyncLocked() {
	gids := make([]int64, 0, len(s.drops))
	for gid := range s.drops {
		gids = append(gids, gid)
	}
	slices.Sort(gids)
	for _, gid := range gids {
		f := sseResyncFrame(gid, s.drops[gid])
		s.q = append(s.q, sseItem{f: f, reply: true})
		s.pend += len(f.Payload()) + sseOverhead
		s.ev.resyncs.Add(1)
	}
	s.drops = nil
	s.overflow = false
}

// appendEvents appends one event per frame. Every frame of a group moves
// the cursor, and the last such frame of the batch carries it as its id:
// a client cut in the middle of a batch resumes from the id before it and
// is told again about what it already has (it skips seqs it has), never
// less.
func (s *stream) appendEvents(b []byte, batch []sseItem) []byte {
	last := -1
	for i, it := range batch {
		if gid := it.f.GID(); gid != 0 {
			s.cur.set(gid, it.f.LastSeq())
			last = i
		}
	}
	for i, it := range batch {
		if i == last {
			b = append(b, "id: "...)
			b = appendCursor(b, &s.cur)
			b = append(b, '\n')
		}
		b = appendData(b, it.f.Payload())
	}
	return b
}

// appendData appends payload as one event's data. The wire's JSON has no
// line breaks except as whitespace in a message body (a body is stored as
// the client sent it): each one becomes a new data line, which the client
// joins with "\n", still the same JSON.
func appendData(b, p []byte) []byte {
	b = append(b, "data: "...)
	for {
		i := indexLineBreak(p)
		if i < 0 {
			break
		}
		b = append(b, p[:i]...)
		b = append(b, "\ndata: "...)
		p = p[i+1:]
	}
	b = append(b, p...)
	return append(b, "\n\n"...)
}

func indexLineBreak(p []byte) int {
	i := bytes.IndexByte(p, '\n')
	j := bytes.IndexByte(p, '\r')
	switch {
	case i < 0:
		return j
	case j < 0 || i < j:
		return i
	}
	return j
}

// appendCloseEvent appends the close event (docs/protocol.md §14.3): the
// stream ends after it, for the reason given (fixed strings, no escaping
// needed).
func appendCloseEvent(b []byte, code socket.CloseCode, why string) []byte {
	b = append(b, "event: close\ndata: {\"type\":\"close\",\"code\":"...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ",\"reason\":\""...)
	b = append(b, why...)
	return append(b, "\"}\n\n"...)
}
