package socket

import (
	"encoding/binary"
	"sync"

	"github.com/gobwas/ws"
)

// WebSocket opcodes (RFC 6455 §5.2).
const (
	opContinuation byte = 0x0
	opText         byte = 0x1
	opBinary       byte = 0x2
	opClose        byte = 0x8
	opPing         byte = 0x9
	opPong         byte = 0xa
)

// maxControlPayload is the largest payload of a control frame (§5.5).
const maxControlPayload = 125

// evKind is what the decoder found in the bytes it was fed.
type evKind uint8

const (
	evNone  evKind = iota // more bytes needed
	evText                // one complete, valid text message
	evPing                // a ping; payload is its application data
	evPong                // a pong
	evClose               // the peer's close frame, validated; code 0 = no status
	evError               // a violation; fail the connection with code
)

// event is one result of decoder.next. payload aliases either the bytes fed
// in (unmasked in place) or the decoder's own buffer; it is valid until the
// next call to next or release.
type event struct {
	kind    evKind
	code    CloseCode
	payload []byte
	reason  string
}

// limits are the size caps a decoder enforces, shared by all connections of
// a server.
type limits struct {
	maxFrame   int64 // largest data frame payload
	maxMessage int64 // largest message, all fragments together
}

const (
	decHeader uint8 = iota
	decPayload
)

// decoder is an incremental RFC 6455 server-side frame decoder. It is fed
// whatever bytes arrived, in any split, and consumes them completely as it
// goes: a frame or message that is not complete yet is kept in the decoder,
// never in the caller's buffer. Its verdict (the events it returns, in
// order, including the final error) depends only on the byte stream, never
// on how the stream was cut into calls.
//
// Sizes are checked against the declared length before a byte of payload is
// stored; storage grows only as payload bytes actually arrive. Text is
// validated as it arrives, so invalid UTF-8 fails the connection at the
// first offending byte even in the middle of a frame.
//
// The zero decoder is ready; the limits are passed to each call. A decoder is not safe for
// concurrent use; a connection's decoder runs on its event loop only.
type decoder struct {
	remaining int64 // payload bytes of the current frame not yet seen
	frameLen  int64 // payload length of the current frame
	msgLen    int64 // bytes of the current message stored so far

	msg  *[]byte // pooled: fragments of a text message, or a split text frame
	ctrl *[]byte // pooled: a control frame payload split across calls

	frames uint32 // complete frames decoded so far (idle tracking)

	hdr   [14]byte
	hdrN  uint8
	state uint8
	op    byte
	fin   bool
	mask  [4]byte
	inMsg bool  // a fragmented text message is in progress
	utf8  uint8 // validator state across the current message
	held  bool  // the last event's payload lives in msg/ctrl: recycle on next call
	dead  bool  // an error or close was returned; nothing more is decoded

	// permessage-deflate (deflate.go): deflate = negotiated, noCtx = the
	// client keeps no context (no history needed), compressed = the current
	// message has RSV1; hist is the last deflateHistory bytes the client
	// sent, allocated on its first compressed message.
	deflate, noCtx, compressed bool
	hist                       []byte
}

// bufPool holds message and control payload buffers while a message is
// being assembled; an idle connection holds none.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledBuf = 64 << 10

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > maxPooledBuf {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// midMessage reports whether the decoder holds part of a frame or of a
// fragmented message (the connection is waiting for the rest).
func (d *decoder) midMessage() bool {
	return d.state == decPayload || d.hdrN > 0 || d.inMsg
}

// release returns pooled buffers; the decoder stays usable.
func (d *decoder) release() {
	if d.msg != nil {
		putBuf(d.msg)
		d.msg = nil
	}
	if d.ctrl != nil {
		putBuf(d.ctrl)
		d.ctrl = nil
	}
	d.held = false
}

func fail(code CloseCode, reason string) event {
	return event{kind: evError, code: code, reason: reason}
}

// next consumes bytes from p (unmasking payload in place) and returns how
// many it consumed and the first event found. With evNone it consumed all
// of p. After evError or evClose the decoder is dead and consumes nothing.
func (d *decoder) next(p []byte, lim *limits) (int, event) {
	if d.held {
		d.held = false
		if !d.inMsg && d.msg != nil {
			putBuf(d.msg)
			d.msg = nil
			d.msgLen = 0
		}
		if d.ctrl != nil {
			putBuf(d.ctrl)
			d.ctrl = nil
		}
	}
	if d.dead {
		return 0, event{}
	}
	i := 0
	for {
		if d.state == decHeader {
			if i == len(p) {
				return i, event{}
			}
			if d.hdrN < 2 {
				k := copy(d.hdr[d.hdrN:2], p[i:])
				d.hdrN += uint8(k)
				i += k
				if d.hdrN < 2 {
					return i, event{}
				}
				if ev := d.checkFirst(); ev.kind == evError {
					d.dead = true
					return i, ev
				}
			}
			need := headerSize(d.hdr[1])
			k := copy(d.hdr[d.hdrN:need], p[i:])
			d.hdrN += uint8(k)
			i += k
			if int(d.hdrN) < need {
				return i, event{}
			}
			if ev := d.parseHeader(lim); ev.kind == evError {
				d.dead = true
				return i, ev
			}
			d.hdrN = 0
			d.state = decPayload
		}

		// Payload of the current frame.
		avail := int64(len(p) - i)
		fresh := d.remaining == d.frameLen // nothing of this frame seen before
		k := min(d.remaining, avail)
		if k == 0 && d.remaining > 0 {
			return i, event{}
		}
		chunk := p[i : i+int(k)]
		ws.Cipher(chunk, d.mask, int(d.frameLen-d.remaining))
		i += int(k)
		d.remaining -= k
		whole := fresh && d.remaining == 0 // the entire payload is in chunk

		if d.op&0x8 != 0 { // control frame
			payload := chunk
			if !whole {
				if d.ctrl == nil {
					d.ctrl = getBuf()
				}
				*d.ctrl = append(*d.ctrl, chunk...)
				if d.remaining > 0 {
					return i, event{}
				}
				payload = *d.ctrl
				d.held = true
			}
			d.state = decHeader
			d.frames++
			ev := d.control(payload)
			if ev.kind == evError || ev.kind == evClose {
				d.dead = true
			}
			return i, ev
		}

		// Data frame: text or a continuation of text (binary never gets here).
		// Compressed text is checked once inflated.
		if !d.compressed {
			d.utf8 = utf8Step(d.utf8, chunk)
		}
		if d.utf8 == utf8Reject {
			d.dead = true
			return i, fail(CloseInvalidPayload, "invalid UTF-8 in text message")
		}
		if whole && d.fin && !d.inMsg && d.compressed {
			d.state = decHeader
			d.frames++
			return i, d.inflate(chunk, lim)
		}
		if whole && d.fin && !d.inMsg {
			// Common case: a complete single-frame message in one read,
			// delivered in place without a copy.
			d.state = decHeader
			d.frames++
			if d.utf8 != utf8Accept {
				d.dead = true
				return i, fail(CloseInvalidPayload, "text message ends inside a UTF-8 sequence")
			}
			return i, event{kind: evText, payload: chunk}
		}
		if len(chunk) > 0 || d.msg == nil {
			if d.msg == nil {
				d.msg = getBuf()
			}
			*d.msg = append(*d.msg, chunk...)
			d.msgLen += k
		}
		if d.remaining > 0 {
			return i, event{}
		}
		d.state = decHeader
		d.frames++
		if !d.fin {
			d.inMsg = true
			continue
		}
		d.inMsg = false
		if d.compressed {
			return i, d.inflate(*d.msg, lim)
		}
		if d.utf8 != utf8Accept {
			d.dead = true
			return i, fail(CloseInvalidPayload, "text message ends inside a UTF-8 sequence")
		}
		d.held = true
		return i, event{kind: evText, payload: *d.msg}
	}
}

// headerSize is the full header length implied by the second header byte
// of a masked frame.
func headerSize(b1 byte) int {
	n := 2 + 4
	switch b1 & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	return n
}

// checkFirst validates what the first two header bytes alone decide.
func (d *decoder) checkFirst() event {
	b0, b1 := d.hdr[0], d.hdr[1]
	op := b0 & 0x0f
	switch rsv := b0 & 0x70; {
	case rsv == 0x40 && d.deflate && op != opText:
		return fail(CloseProtocolError, "compression bit on a control frame or a continuation")
	case rsv != 0 && !(rsv == 0x40 && d.deflate):
		return fail(CloseProtocolError, "reserved bits set without a negotiated extension")
	case op > opBinary && op < opClose, op > opPong:
		return fail(CloseProtocolError, "reserved opcode")
	case b1&0x80 == 0:
		return fail(CloseProtocolError, "client frame is not masked")
	}
	if op&0x8 != 0 {
		switch {
		case b0&0x80 == 0:
			return fail(CloseProtocolError, "fragmented control frame")
		case b1&0x7f > maxControlPayload:
			return fail(CloseProtocolError, "control frame payload over 125 bytes")
		}
		return event{}
	}
	switch {
	case op == opContinuation && !d.inMsg:
		return fail(CloseProtocolError, "continuation frame without a message to continue")
	case op != opContinuation && d.inMsg:
		return fail(CloseProtocolError, "new data frame inside a fragmented message")
	case op == opBinary:
		return fail(CloseUnsupportedData, "binary messages are not supported")
	}
	return event{}
}

// parseHeader decodes the complete header in d.hdr and checks lengths.
func (d *decoder) parseHeader(lim *limits) event {
	b0, b1 := d.hdr[0], d.hdr[1]
	var n int64
	off := 2
	switch l := b1 & 0x7f; l {
	case 126:
		n = int64(binary.BigEndian.Uint16(d.hdr[2:]))
		off += 2
		if n < 126 {
			return fail(CloseProtocolError, "payload length not minimally encoded")
		}
	case 127:
		u := binary.BigEndian.Uint64(d.hdr[2:])
		off += 8
		if u>>63 != 0 {
			return fail(CloseProtocolError, "payload length has the most significant bit set")
		}
		if u <= 0xffff {
			return fail(CloseProtocolError, "payload length not minimally encoded")
		}
		n = int64(u)
	default:
		n = int64(l)
	}
	d.op = b0 & 0x0f
	d.fin = b0&0x80 != 0
	copy(d.mask[:], d.hdr[off:off+4])
	if d.op&0x8 == 0 {
		if d.op == opText { // a new message
			d.utf8 = utf8Accept
			d.msgLen = 0
			d.compressed = b0&0x40 != 0
		}
		if n > lim.maxFrame {
			return fail(CloseMessageTooBig, "frame too big")
		}
		if d.msgLen+n > lim.maxMessage {
			return fail(CloseMessageTooBig, "message too big")
		}
	}
	d.frameLen = n
	d.remaining = n
	return event{}
}

// control interprets a complete control frame's payload.
func (d *decoder) control(payload []byte) event {
	switch d.op {
	case opPing:
		return event{kind: evPing, payload: payload}
	case opPong:
		return event{kind: evPong, payload: payload}
	}
	// Close.
	switch len(payload) {
	case 0:
		return event{kind: evClose}
	case 1:
		return fail(CloseProtocolError, "close payload of one byte")
	}
	code := CloseCode(binary.BigEndian.Uint16(payload))
	if !code.validReceived() {
		return fail(CloseProtocolError, "invalid close code")
	}
	reason := payload[2:]
	if utf8Step(utf8Accept, reason) != utf8Accept {
		return fail(CloseInvalidPayload, "close reason is not valid UTF-8")
	}
	return event{kind: evClose, code: code, payload: reason}
}

// inflate decompresses the complete compressed message src into a pooled
// buffer, which the returned event's payload aliases (held until the next
// call), and checks it: at most maxMessage bytes (1009), a valid deflate
// stream and valid UTF-8 (1007).
func (d *decoder) inflate(src []byte, lim *limits) event {
	out := getBuf()
	var err error
	*out, err = inflate((*out)[:0], src, d.hist, int(lim.maxMessage))
	if d.msg != nil {
		putBuf(d.msg)
	}
	d.msg, d.msgLen, d.held = out, 0, true
	switch {
	case err == errInflateTooBig:
		d.dead = true
		return fail(CloseMessageTooBig, "message too big")
	case err != nil:
		d.dead = true
		return fail(CloseInvalidPayload, "invalid compressed data")
	case utf8Step(utf8Accept, *out) != utf8Accept:
		d.dead = true
		return fail(CloseInvalidPayload, "invalid UTF-8 in text message")
	}
	if !d.noCtx {
		if d.hist == nil {
			d.hist = make([]byte, 0, deflateHistory)
		}
		keepHistory(&d.hist, *out)
	}
	return event{kind: evText, payload: *out}
}
