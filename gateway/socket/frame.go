package socket

import (
	"encoding/binary"
	"sync/atomic"
	"unicode/utf8"

	"github.com/gobwas/ws"
)

// CloseCode is a WebSocket close status code (RFC 6455 §7.4).
type CloseCode uint16

// Close codes the server sends. Clients see them in the close frame.
const (
	CloseNormal          CloseCode = 1000 // normal closure
	CloseGoingAway       CloseCode = 1001 // server shutdown, idle timeout
	CloseProtocolError   CloseCode = 1002 // RFC 6455 framing violation
	CloseUnsupportedData CloseCode = 1003 // binary message: the protocol is JSON text
	CloseInvalidPayload  CloseCode = 1007 // invalid UTF-8 in a text message or close reason
	ClosePolicyViolation CloseCode = 1008 // expired token, message timeout, slow consumer
	CloseMessageTooBig   CloseCode = 1009 // frame or message over the configured maximum
	CloseInternalError   CloseCode = 1011 // unexpected server condition
	CloseTryAgainLater   CloseCode = 1013 // overloaded; reconnect later
)

// validReceived reports whether a client may send code in a close frame.
// It follows the Autobahn testsuite (cases 7.7 and 7.9): the codes RFC 6455
// defines for endpoints, plus the application (3000-3999) and private
// (4000-4999) ranges. 1004-1006 and 1015 are reserved; 1012-1014 are
// server-only codes registered later and refused from clients.
func (c CloseCode) validReceived() bool {
	switch {
	case c >= 1000 && c <= 1003, c >= 1007 && c <= 1011, c >= 3000 && c <= 4999:
		return true
	}
	return false
}

// Frame is a complete server-to-client WebSocket frame, compiled once and
// immutable: the same Frame is written to every recipient, never encoded per
// recipient. A Frame carries the metadata the outbound bound needs to
// replace dropped pushes with one resync per group.
type Frame struct {
	b       []byte
	gid     int64
	lastSeq int64
	origin  int64 // Unix ns the frame's latency is measured from; 0 none
	// z is the permessage-deflate variant of a text frame (deflate.go),
	// made by the first deflate connection due to get it and shared by
	// all the others; b itself when compressing does not pay.
	z    atomic.Pointer[[]byte]
	text bool // a data frame: may be compressed
}

// NewTextFrame compiles payload (one JSON object, valid UTF-8) into an
// unmasked final text frame. payload is copied; the caller may reuse it.
func NewTextFrame(payload []byte) *Frame {
	return &Frame{b: ws.MustCompileFrame(ws.NewTextFrame(payload)), text: true}
}

// NewPushFrame is NewTextFrame for a group push: gid is the group and
// lastSeq the highest seq the frame carries. If a connection drops the push
// because its outbound bound is exceeded, it later gets one resync frame for
// gid built from the highest lastSeq it missed (Config.Resync).
func NewPushFrame(gid, lastSeq int64, payload []byte) *Frame {
	f := NewTextFrame(payload)
	f.gid, f.lastSeq = gid, lastSeq
	return f
}

// SetOrigin stamps f with the time (Unix nanoseconds) its latency is
// measured from, for Config.OnWritePass. Call it before f is handed to
// Broadcast; 0 (the default) measures nothing.
func (f *Frame) SetOrigin(ns int64) { f.origin = ns }

// GID returns the group of a push frame, 0 for other frames.
func (f *Frame) GID() int64 { return f.gid }

// LastSeq returns the highest seq a push frame carries.
func (f *Frame) LastSeq() int64 { return f.lastSeq }

// Len returns the frame's size on the wire in bytes.
func (f *Frame) Len() int { return len(f.b) }

// Bytes returns the frame as written on the wire to a connection without
// permessage-deflate. It must not be modified.
func (f *Frame) Bytes() []byte { return f.b }

// wireFor returns the bytes of f to write to c: its compressed variant for
// a deflate connection when f is a text frame of at least DeflateMinBytes.
func (f *Frame) wireFor(c *Conn, cfg *Config) []byte {
	if !c.deflate || !f.text || len(f.b) < cfg.DeflateMinBytes {
		return f.b
	}
	return f.deflated(cfg.DeflateLevel)
}

// deflated returns f's compressed variant, compressing it on first use.
// Two loops racing here both compress; the first to store wins.
func (f *Frame) deflated(level int) []byte {
	if p := f.z.Load(); p != nil {
		return *p
	}
	z := deflateFrame(payloadOf(f.b), level)
	if z == nil {
		z = f.b
	}
	f.z.CompareAndSwap(nil, &z)
	return *f.z.Load()
}

// maxCloseReason is the longest close reason that fits a control frame.
const maxCloseReason = maxControlPayload - 2

// appendClose appends a close frame with code and reason (cut to fit at a
// rune boundary) to dst. code 0 makes an empty close frame.
func appendClose(dst []byte, code CloseCode, reason string) []byte {
	if code == 0 {
		return append(dst, 0x80|opClose, 0)
	}
	if len(reason) > maxCloseReason {
		reason = reason[:maxCloseReason]
		for len(reason) > 0 && !utf8.ValidString(reason) {
			reason = reason[:len(reason)-1]
		}
	}
	dst = append(dst, 0x80|opClose, byte(2+len(reason)))
	dst = binary.BigEndian.AppendUint16(dst, uint16(code))
	return append(dst, reason...)
}

// appendControl appends an unmasked control frame with payload (<= 125
// bytes, checked by the decoder) to dst.
func appendControl(dst []byte, op byte, payload []byte) []byte {
	dst = append(dst, 0x80|op, byte(len(payload)))
	return append(dst, payload...)
}
