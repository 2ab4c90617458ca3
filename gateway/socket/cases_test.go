package socket

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf8"
)

// This file holds the conformance cases shared by the decoder tests (pure,
// every split of the input) and the socket tests (real connections against
// the gnet server with an echo handler). The cases cover the categories of
// the Autobahn testsuite: 1 framing, 2 pings/pongs, 3 reserved bits,
// 4 opcodes, 5 fragmentation, 6 UTF-8, 7 close handling, 9 limits.

// testMask is the masking key of every generated client frame; any value
// works, this one is not symmetric so unmasking bugs show.
var testMask = [4]byte{0x37, 0xfa, 0x21, 0x3d}

// cframe is one client frame to encode.
type cframe struct {
	fin      bool
	rsv      byte // the three RSV bits, 0-7
	op       byte
	payload  []byte
	unmasked bool
	// lenOverride, if non-zero, replaces the length encoding: 1 = force the
	// 16-bit form, 2 = force the 64-bit form, 3 = declare declared64 in the
	// 64-bit form with no payload following.
	lenOverride int
	declared64  uint64
}

func (f cframe) encode() []byte {
	b0 := f.op | f.rsv<<4
	if f.fin {
		b0 |= 0x80
	}
	var out []byte
	n := len(f.payload)
	var mbit byte = 0x80
	if f.unmasked {
		mbit = 0
	}
	switch {
	case f.lenOverride == 3:
		out = append(out, b0, mbit|127)
		out = binary.BigEndian.AppendUint64(out, f.declared64)
	case f.lenOverride == 2 || n > 0xffff:
		out = append(out, b0, mbit|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	case f.lenOverride == 1 || n > 125:
		out = append(out, b0, mbit|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, b0, mbit|byte(n))
	}
	if f.unmasked {
		return append(out, f.payload...)
	}
	out = append(out, testMask[:]...)
	start := len(out)
	out = append(out, f.payload...)
	for i := range f.payload {
		out[start+i] ^= testMask[i%4]
	}
	return out
}

func text(s string) cframe           { return cframe{fin: true, op: opText, payload: []byte(s)} }
func textBytes(b []byte) cframe      { return cframe{fin: true, op: opText, payload: b} }
func frag(op byte, s string) cframe  { return cframe{op: op, payload: []byte(s)} }
func cont(s string, fin bool) cframe { return cframe{fin: fin, op: opContinuation, payload: []byte(s)} }
func ping(s string) cframe           { return cframe{fin: true, op: opPing, payload: []byte(s)} }
func pong(s string) cframe           { return cframe{fin: true, op: opPong, payload: []byte(s)} }
func closeRaw(p []byte) cframe       { return cframe{fin: true, op: opClose, payload: p} }
func closeCode(code uint16, r string) cframe {
	return closeRaw(append(binary.BigEndian.AppendUint16(nil, code), r...))
}

// out is one thing the server does in answer: echo a text message, answer a
// ping with a pong, or send a close frame (code 0 = empty close payload).
type out struct {
	op   byte
	data string
	code CloseCode
}

func (o out) String() string {
	switch o.op {
	case opText:
		if len(o.data) > 40 {
			return fmt.Sprintf("text(%d bytes)", len(o.data))
		}
		return fmt.Sprintf("text(%q)", o.data)
	case opPong:
		return fmt.Sprintf("pong(%q)", o.data)
	case opClose:
		return fmt.Sprintf("close(%d)", o.code)
	}
	return fmt.Sprintf("op%d", o.op)
}

func echo(s string) out               { return out{op: opText, data: s} }
func pongOut(s string) out            { return out{op: opPong, data: s} }
func closeOut(c CloseCode) out        { return out{op: opClose, code: c} }
func fails(c CloseCode) []out         { return []out{closeOut(c)} }
func then(o []out, more ...out) []out { return append(o, more...) }

// wsCase is one conformance case: the client's frames after the handshake
// and the server's complete answer.
type wsCase struct {
	id   string
	desc string
	in   []byte
	want []out
}

func frames(fs ...cframe) []byte {
	var b []byte
	for _, f := range fs {
		b = append(b, f.encode()...)
	}
	return b
}

// caseLimits are the limits the cases assume (the package defaults).
var caseLimits = limits{maxFrame: 64 << 10, maxMessage: 64 << 10}

// utf8Vectors are Autobahn 6.x style inputs: valid and invalid UTF-8.
var utf8Vectors = []struct {
	name  string
	b     []byte
	valid bool
}{
	{"hello-world", []byte("Hello-µ@ßöäüàá-UTF-8!!"), true},
	{"kosme", []byte("\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5"), true},
	{"first 1-byte", []byte{0x00}, true},
	{"first 2-byte", []byte{0xc2, 0x80}, true},
	{"first 3-byte", []byte{0xe0, 0xa0, 0x80}, true},
	{"first 4-byte", []byte{0xf0, 0x90, 0x80, 0x80}, true},
	{"last 1-byte", []byte{0x7f}, true},
	{"last 2-byte", []byte{0xdf, 0xbf}, true},
	{"last 3-byte", []byte{0xef, 0xbf, 0xbf}, true},
	{"last 4-byte U+10FFFF", []byte{0xf4, 0x8f, 0xbf, 0xbf}, true},
	{"U+D7FF", []byte{0xed, 0x9f, 0xbf}, true},
	{"U+E000", []byte{0xee, 0x80, 0x80}, true},
	{"U+FFFD", []byte{0xef, 0xbf, 0xbd}, true},
	{"U+FFFE noncharacter", []byte{0xef, 0xbf, 0xbe}, true},
	{"U+FFFF noncharacter", []byte{0xef, 0xbf, 0xbf}, true},
	{"kosme + surrogate", []byte("\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80\x65\x64\x69\x74\x65\x64"), false},
	{"over U+10FFFF", []byte{0xf4, 0x90, 0x80, 0x80}, false},
	{"5-byte form", []byte{0xf8, 0x88, 0x80, 0x80, 0x80}, false},
	{"6-byte form", []byte{0xfc, 0x84, 0x80, 0x80, 0x80, 0x80}, false},
	{"lone continuation 0x80", []byte{0x80}, false},
	{"lone continuation 0xbf", []byte{0xbf}, false},
	{"two continuations", []byte{0x80, 0xbf}, false},
	{"continuation after ascii", []byte("ab\x80cd"), false},
	{"lonely start 0xc0 space", []byte{0xc0, 0x20}, false},
	{"lonely start 0xe0 space", []byte{0xe0, 0x20}, false},
	{"lonely start 0xf0 space", []byte{0xf0, 0x20}, false},
	{"2-byte missing last", []byte{0xc2}, false},
	{"3-byte missing last", []byte{0xe0, 0xa0}, false},
	{"4-byte missing last", []byte{0xf0, 0x90, 0x80}, false},
	{"concatenated incomplete", []byte{0xc2, 0xe0, 0xa0, 0xf0, 0x90, 0x80}, false},
	{"0xfe", []byte{0xfe}, false},
	{"0xff", []byte{0xff}, false},
	{"0xfe 0xfe 0xff 0xff", []byte{0xfe, 0xfe, 0xff, 0xff}, false},
	{"overlong slash 2-byte", []byte{0xc0, 0xaf}, false},
	{"overlong slash 3-byte", []byte{0xe0, 0x80, 0xaf}, false},
	{"overlong slash 4-byte", []byte{0xf0, 0x80, 0x80, 0xaf}, false},
	{"max overlong 2-byte", []byte{0xc1, 0xbf}, false},
	{"max overlong 3-byte", []byte{0xe0, 0x9f, 0xbf}, false},
	{"max overlong 4-byte", []byte{0xf0, 0x8f, 0xbf, 0xbf}, false},
	{"overlong NUL", []byte{0xc0, 0x80}, false},
	{"surrogate U+D800", []byte{0xed, 0xa0, 0x80}, false},
	{"surrogate U+DBFF", []byte{0xed, 0xaf, 0xbf}, false},
	{"surrogate U+DC00", []byte{0xed, 0xb0, 0x80}, false},
	{"surrogate U+DFFF", []byte{0xed, 0xbf, 0xbf}, false},
	{"surrogate pair", []byte{0xed, 0xa0, 0x80, 0xed, 0xb0, 0x80}, false},
	{"valid then invalid tail", []byte("valid text \xff"), false},
}

// conformanceCases builds the case table.
func conformanceCases() []wsCase {
	var cs []wsCase
	add := func(id, desc string, in []byte, want ...out) {
		cs = append(cs, wsCase{id: id, desc: desc, in: in, want: want})
	}
	addv := func(id, desc string, in []byte, want []out) {
		cs = append(cs, wsCase{id: id, desc: desc, in: in, want: want})
	}
	closeOK := closeCode(1000, "")
	bye := closeOut(CloseNormal)

	// 1. Framing: text messages of every length class; binary is refused.
	for _, n := range []int{0, 1, 125, 126, 127, 128, 1000, 65535, 65536} {
		s := strings.Repeat("*", n)
		add(fmt.Sprintf("1.1.len%d", n), fmt.Sprintf("text message of %d bytes", n),
			frames(text(s), closeOK), echo(s), bye)
	}
	add("1.1.16bit-form", "16-bit length form for 200 bytes",
		frames(cframe{fin: true, op: opText, payload: bytes.Repeat([]byte("a"), 200), lenOverride: 1}, closeOK),
		echo(strings.Repeat("a", 200)), bye)
	add("1.1.nonminimal16", "16-bit length form for a 5-byte payload",
		frames(cframe{fin: true, op: opText, payload: []byte("short"), lenOverride: 1}), closeOut(CloseProtocolError))
	add("1.1.nonminimal64", "64-bit length form for a 5-byte payload",
		frames(cframe{fin: true, op: opText, payload: []byte("short"), lenOverride: 2}), closeOut(CloseProtocolError))
	add("1.2.binary", "binary message is unsupported data",
		frames(cframe{fin: true, op: opBinary, payload: []byte{1, 2, 3}}), closeOut(CloseUnsupportedData))
	add("1.2.binary-empty", "empty binary message",
		frames(cframe{fin: true, op: opBinary}), closeOut(CloseUnsupportedData))
	add("1.3.unmasked", "unmasked client text frame",
		frames(cframe{fin: true, op: opText, payload: []byte("x"), unmasked: true}), closeOut(CloseProtocolError))
	add("1.3.unmasked-ping", "unmasked client ping",
		frames(cframe{fin: true, op: opPing, unmasked: true}), closeOut(CloseProtocolError))
	add("1.4.many", "several messages back to back",
		frames(text("a"), text("bb"), text("ccc"), closeOK), echo("a"), echo("bb"), echo("ccc"), bye)

	// 2. Pings and pongs.
	add("2.1", "ping without payload", frames(ping(""), closeOK), pongOut(""), bye)
	add("2.2", "ping with small text payload", frames(ping("Hello, world!"), closeOK), pongOut("Hello, world!"), bye)
	add("2.3", "ping with binary payload",
		frames(cframe{fin: true, op: opPing, payload: []byte{0x00, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0x00, 0xff}}, closeOK),
		pongOut("\x00\xff\xfe\xfd\xfc\xfb\x00\xff"), bye)
	add("2.4", "ping with 125 byte payload", frames(ping(strings.Repeat("\xfe", 125)), closeOK),
		pongOut(strings.Repeat("\xfe", 125)), bye)
	add("2.5", "ping with 126 byte payload", frames(cframe{fin: true, op: opPing, payload: bytes.Repeat([]byte{0xfe}, 126)}),
		closeOut(CloseProtocolError))
	add("2.7", "unsolicited pong without payload", frames(pong(""), closeOK), bye)
	add("2.8", "unsolicited pong with payload", frames(pong("unsolicited pong payload"), closeOK), bye)
	add("2.9", "unsolicited pong then ping", frames(pong("unsolicited"), ping("ping payload"), closeOK),
		pongOut("ping payload"), bye)
	var tenPings []cframe
	var tenPongs []out
	for i := range 10 {
		p := fmt.Sprintf("payload-%d", i)
		tenPings = append(tenPings, ping(p))
		tenPongs = append(tenPongs, pongOut(p))
	}
	addv("2.10", "ten pings", frames(append(tenPings, closeOK)...), then(tenPongs, bye))
	add("2.11.fragmented-ping", "ping with FIN clear",
		frames(cframe{op: opPing, payload: []byte("x")}), closeOut(CloseProtocolError))

	// 3. Reserved bits.
	for rsv := byte(1); rsv <= 7; rsv++ {
		add(fmt.Sprintf("3.%d.text", rsv), fmt.Sprintf("text with RSV=%d after a valid message", rsv),
			frames(text("Hello"), cframe{fin: true, rsv: rsv, op: opText, payload: []byte("Hello")}, ping("")),
			echo("Hello"), closeOut(CloseProtocolError))
	}
	add("3.ping", "ping with RSV=3", frames(cframe{fin: true, rsv: 3, op: opPing, payload: []byte("x")}),
		closeOut(CloseProtocolError))
	add("3.close", "close with RSV=7", frames(cframe{fin: true, rsv: 7, op: opClose}), closeOut(CloseProtocolError))
	add("3.binary", "binary with RSV=5", frames(cframe{fin: true, rsv: 5, op: opBinary, payload: []byte{1}}),
		closeOut(CloseProtocolError))

	// 4. Opcodes.
	for _, op := range []byte{3, 4, 5, 6, 7, 0xb, 0xc, 0xd, 0xe, 0xf} {
		add(fmt.Sprintf("4.op%x", op), fmt.Sprintf("reserved opcode %d after a valid message", op),
			frames(text("Hello"), cframe{fin: true, op: op, payload: []byte("x")}, ping("")),
			echo("Hello"), closeOut(CloseProtocolError))
	}

	// 5. Fragmentation.
	add("5.1", "fragmented ping", frames(cframe{op: opPing, payload: []byte("frag1")}, cframe{fin: true, op: opContinuation, payload: []byte("frag2")}),
		closeOut(CloseProtocolError))
	add("5.2", "fragmented pong", frames(cframe{op: opPong, payload: []byte("frag1")}, cframe{fin: true, op: opContinuation, payload: []byte("frag2")}),
		closeOut(CloseProtocolError))
	add("5.3", "text in two fragments", frames(frag(opText, "frag1"), cont("frag2", true), closeOK), echo("frag1frag2"), bye)
	add("5.6", "text in two fragments with a ping between",
		frames(frag(opText, "frag1"), ping("pongme!"), cont("frag2", true), closeOK),
		pongOut("pongme!"), echo("frag1frag2"), bye)
	add("5.9", "continuation without a message, then text",
		frames(cont("non-continuation payload", true), text("Hello, world!")), closeOut(CloseProtocolError))
	add("5.10", "non-final continuation without a message",
		frames(cont("non-continuation payload", false), text("Hello, world!")), closeOut(CloseProtocolError))
	add("5.15", "text fragments, then a new text start before the end",
		frames(frag(opText, "fragment1"), cont("fragment2", true), cont("fragment3", false), text("fragment4")),
		echo("fragment1fragment2"), closeOut(CloseProtocolError))
	add("5.16", "repeated continuation misuse",
		frames(cont("fragment1", false), frag(opText, "fragment2"), cont("fragment3", true)), closeOut(CloseProtocolError))
	add("5.18", "text start then a second text start", frames(frag(opText, "fragment1"), text("fragment2")),
		closeOut(CloseProtocolError))
	add("5.19", "text in 5 fragments with pings between",
		frames(frag(opText, "fragment1"), cont("fragment2", false), ping("pongme 1!"), cont("fragment3", false),
			ping("pongme 2!"), cont("fragment4", false), cont("fragment5", true), closeOK),
		pongOut("pongme 1!"), pongOut("pongme 2!"), echo("fragment1fragment2fragment3fragment4fragment5"), bye)
	add("5.empty", "empty fragments", frames(frag(opText, ""), cont("", false), cont("", true), closeOK), echo(""), bye)
	add("5.binary-fragments", "binary message in fragments",
		frames(cframe{op: opBinary, payload: []byte{1}}, cframe{fin: true, op: opContinuation, payload: []byte{2}}),
		closeOut(CloseUnsupportedData))
	add("5.close-in-message", "close between fragments", frames(frag(opText, "part"), closeOK), bye)

	// 6. UTF-8: each vector as one frame, as one fragment per byte, and with
	// the frame boundary at every position.
	for vi, v := range utf8Vectors {
		var want []out
		if v.valid {
			want = []out{echo(string(v.b)), bye}
		} else {
			want = fails(CloseInvalidPayload)
		}
		addv(fmt.Sprintf("6.%d.frame", vi), "utf-8 "+v.name+" in one frame", frames(textBytes(v.b), closeOK), want)
		var fs []cframe
		for i := range v.b {
			op := opContinuation
			if i == 0 {
				op = opText
			}
			fs = append(fs, cframe{fin: i == len(v.b)-1, op: op, payload: v.b[i : i+1]})
		}
		addv(fmt.Sprintf("6.%d.per-byte", vi), "utf-8 "+v.name+" one fragment per byte", frames(append(fs, closeOK)...), want)
		for cut := 1; cut < len(v.b); cut++ {
			addv(fmt.Sprintf("6.%d.cut%d", vi, cut), fmt.Sprintf("utf-8 %s in two fragments cut at %d", v.name, cut),
				frames(cframe{op: opText, payload: v.b[:cut]}, cframe{fin: true, op: opContinuation, payload: v.b[cut:]}, closeOK), want)
		}
	}
	// Fail-fast: the invalid fragment closes the connection even though the
	// message never finishes (Autobahn 6.4.1-6.4.4).
	add("6.4.1", "invalid fragment, message never finished",
		frames(frag(opText, "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5"), cont("\xf4\x90\x80\x80", false)),
		closeOut(CloseInvalidPayload))
	add("6.4.3", "invalid bytes in the middle of a frame whose end never comes",
		cframe{fin: true, op: opText, payload: append([]byte("\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xf4\x90\x80\x80"), make([]byte, 20)...)}.encode()[:6+15],
		closeOut(CloseInvalidPayload))

	// 7. Close handling.
	add("7.1.1", "close after an echo", frames(text("Hello World!"), closeOK), echo("Hello World!"), bye)
	add("7.1.2", "close twice", frames(closeOK, closeOK), bye)
	add("7.1.3", "ping after close is ignored", frames(closeOK, ping("x")), bye)
	add("7.1.4", "text after close is ignored", frames(closeOK, text("x")), bye)
	add("7.1.5", "text fragment then close then continuation", frames(frag(opText, "fragment1"), closeOK, cont("fragment2", true)), bye)
	add("7.3.1", "close with empty payload", frames(closeRaw(nil)), closeOut(0))
	add("7.3.2", "close with one byte payload", frames(closeRaw([]byte{0x03})), closeOut(CloseProtocolError))
	add("7.3.3", "close with code only", frames(closeCode(1000, "")), bye)
	add("7.3.4", "close with code and reason", frames(closeCode(1000, "Hello World!")), bye)
	add("7.3.5", "close with 123 byte reason", frames(closeCode(1000, strings.Repeat("*", 123))), bye)
	add("7.3.6", "close with 126 byte payload", frames(cframe{fin: true, op: opClose, payload: append([]byte{0x03, 0xe8}, bytes.Repeat([]byte("*"), 124)...)}),
		closeOut(CloseProtocolError))
	for _, c := range []uint16{1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999} {
		add(fmt.Sprintf("7.7.%d", c), fmt.Sprintf("close with valid code %d", c), frames(closeCode(c, "")), closeOut(CloseCode(c)))
	}
	for _, c := range []uint16{0, 999, 1004, 1005, 1006, 1012, 1013, 1014, 1015, 1016, 1100, 2000, 2999, 5000, 65535} {
		add(fmt.Sprintf("7.9.%d", c), fmt.Sprintf("close with invalid code %d", c), frames(closeCode(c, "")), closeOut(CloseProtocolError))
	}
	add("7.5.1", "close reason with invalid UTF-8",
		frames(closeCode(1000, "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80\x65\x64\x69\x74\x65\x64")),
		closeOut(CloseInvalidPayload))
	add("7.fragmented-close", "close with FIN clear", frames(cframe{op: opClose}), closeOut(CloseProtocolError))

	// 9. Limits: caps are checked from the declared length, before any
	// payload arrives or is stored.
	big := strings.Repeat("x", 64<<10)
	add("9.1.max", "text message of exactly the maximum", frames(text(big), closeOK), echo(big), bye)
	add("9.1.over", "text frame one byte over the maximum, declared only",
		frames(cframe{fin: true, op: opText, lenOverride: 3, declared64: 64<<10 + 1}), closeOut(CloseMessageTooBig))
	add("9.1.huge", "declared length 2^62",
		frames(cframe{fin: true, op: opText, lenOverride: 3, declared64: 1 << 62}), closeOut(CloseMessageTooBig))
	add("9.1.msb", "declared length with the most significant bit set",
		frames(cframe{fin: true, op: opText, lenOverride: 3, declared64: 1 << 63}), closeOut(CloseProtocolError))
	var fr []cframe
	for i := range 64 {
		op := opContinuation
		if i == 0 {
			op = opText
		}
		fr = append(fr, cframe{fin: i == 63, op: op, payload: []byte(big[:1024])})
	}
	addv("9.2.fragments-max", "maximum message in 64 fragments of 1 KiB", frames(append(fr, closeOK)...), []out{echo(big), bye})
	fr[63].fin = false
	addv("9.2.fragments-over", "message over the maximum across fragments",
		frames(append(fr, cont("y", true))...), fails(CloseMessageTooBig))
	var many []cframe
	var manyOut []out
	for i := range 200 {
		s := fmt.Sprintf("message %d", i)
		many = append(many, text(s))
		manyOut = append(manyOut, echo(s))
	}
	addv("9.3.many", "200 small messages", frames(append(many, closeOK)...), then(manyOut, bye))
	return cs
}

// mustValid panics if a generated case is inconsistent (a harness bug).
func init() {
	for _, v := range utf8Vectors {
		if utf8.Valid(v.b) != v.valid {
			panic("utf8Vectors: wrong validity for " + v.name)
		}
	}
}
