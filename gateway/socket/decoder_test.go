package socket

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"unicode/utf8"
)

// answer maps a decoder event to what the server sends in return.
func answer(ev event) (out, bool) {
	switch ev.kind {
	case evText:
		return echo(string(ev.payload)), true
	case evPing:
		return pongOut(string(ev.payload)), true
	case evClose, evError:
		return closeOut(ev.code), true
	}
	return out{}, false
}

// runDecoder feeds a copy of stream to a fresh decoder, cut at the sorted
// positions in cuts, and returns the server's answers.
func runDecoder(lim limits, stream []byte, cuts []int) []out {
	buf := bytes.Clone(stream)
	d := decoder{}
	var res []out
	prev := 0
	feed := func(p []byte) bool {
		for len(p) > 0 {
			n, ev := d.next(p, &lim)
			if n > len(p) {
				panic("decoder consumed more than it was given")
			}
			p = p[n:]
			if o, ok := answer(ev); ok {
				res = append(res, o)
			}
			if ev.kind == evError || ev.kind == evClose {
				return false
			}
			if ev.kind == evNone && len(p) > 0 {
				panic("decoder returned evNone without consuming everything")
			}
		}
		return true
	}
	for _, c := range cuts {
		if c <= prev || c >= len(buf) {
			continue
		}
		if !feed(buf[prev:c]) {
			d.release()
			return res
		}
		prev = c
	}
	feed(buf[prev:])
	d.release()
	return res
}

func everyByte(n int) []int {
	cuts := make([]int, n)
	for i := range cuts {
		cuts[i] = i
	}
	return cuts
}

func sameOuts(a, b []out) bool { return slices.Equal(a, b) }

func TestDecoderConformance(t *testing.T) {
	for _, c := range conformanceCases() {
		t.Run(c.id, func(t *testing.T) {
			if got := runDecoder(caseLimits, c.in, nil); !sameOuts(got, c.want) {
				t.Fatalf("%s, whole: got %v, want %v", c.desc, got, c.want)
			}
			if got := runDecoder(caseLimits, c.in, everyByte(len(c.in))); !sameOuts(got, c.want) {
				t.Fatalf("%s, byte by byte: got %v, want %v", c.desc, got, c.want)
			}
			cuts := everyByte(len(c.in))
			if len(c.in) > 2048 {
				// Every boundary near the start and end, plus random ones.
				r := rand.New(rand.NewPCG(1, uint64(len(c.in))))
				cuts = cuts[:64]
				for i := len(c.in) - 64; i < len(c.in); i++ {
					cuts = append(cuts, i)
				}
				for range 128 {
					cuts = append(cuts, r.IntN(len(c.in)))
				}
			}
			for _, cut := range cuts {
				if got := runDecoder(caseLimits, c.in, []int{cut}); !sameOuts(got, c.want) {
					t.Fatalf("%s, split at %d: got %v, want %v", c.desc, cut, got, c.want)
				}
			}
			if got := refDecode(caseLimits, c.in); !sameOuts(got, c.want) {
				t.Fatalf("%s, reference decoder: got %v, want %v", c.desc, got, c.want)
			}
		})
	}
}

// TestDecoderGrowsWithArrivingBytes checks that a declared length never
// allocates by itself: a frame that announces 60 KiB and sends 10 bytes
// holds about 10 bytes.
func TestDecoderGrowsWithArrivingBytes(t *testing.T) {
	lim := caseLimits
	d := decoder{}
	f := cframe{fin: true, op: opText, payload: bytes.Repeat([]byte("a"), 60<<10)}.encode()
	// The buffer comes from a pool that earlier tests may have filled
	// with larger ones: measure what this call allocates, not the cap.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n, ev := d.next(f[:8+10], &lim) // header (2+2+4) and 10 payload bytes
	runtime.ReadMemStats(&after)
	if n != 18 || ev.kind != evNone {
		t.Fatalf("got n=%d kind=%d, want 18 and evNone", n, ev.kind)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; d.msg == nil || grew > 8<<10 {
		t.Fatalf("got %d bytes allocated for a frame declaring 60 KiB with 10 bytes present, want a small buffer", grew)
	}
	if !d.midMessage() {
		t.Fatalf("got midMessage false in the middle of a frame, want true")
	}
	d.release()
}

func TestDecoderReleasesIdleBuffers(t *testing.T) {
	lim := caseLimits
	d := decoder{}
	in := frames(frag(opText, "abc"), cont("def", true))
	runOne := func(p []byte) event {
		var last event
		for len(p) > 0 {
			n, ev := d.next(p, &lim)
			p = p[n:]
			if ev.kind != evNone {
				last = ev
			}
		}
		return last
	}
	if ev := runOne(in); ev.kind != evText || string(ev.payload) != "abcdef" {
		t.Fatalf("got %v %q, want text abcdef", ev.kind, ev.payload)
	}
	d.next(nil, &lim)
	if d.msg != nil || d.ctrl != nil || d.midMessage() {
		t.Fatalf("got buffers held after the message was delivered, want none")
	}
}

func TestUTF8Exhaustive(t *testing.T) {
	var b [4]byte
	check := func(p []byte) {
		got := utf8Step(utf8Accept, p)
		if (got == utf8Accept) != utf8.Valid(p) {
			t.Fatalf("utf8Step(% x) = %d, utf8.Valid = %v", p, got, utf8.Valid(p))
		}
		if (got != utf8Reject) != validPrefix(p) {
			t.Fatalf("utf8Step(% x) = %d, validPrefix = %v", p, got, validPrefix(p))
		}
	}
	for i := range 256 {
		b[0] = byte(i)
		check(b[:1])
		for j := range 256 {
			b[1] = byte(j)
			check(b[:2])
			if testing.Short() {
				continue
			}
			for k := 0x70; k < 0xc8; k++ { // the interesting third bytes
				b[2] = byte(k)
				check(b[:3])
			}
		}
	}
	r := rand.New(rand.NewPCG(2, 3))
	for range 200000 {
		n := 1 + r.IntN(12)
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(r.IntN(256))
			if r.IntN(3) == 0 {
				p[i] = 0x80 | byte(r.IntN(64))
			}
		}
		check(p)
		// Split anywhere: the state carries across calls.
		cut := r.IntN(n + 1)
		if whole, split := utf8Step(0, p), utf8StepSplit(p, cut); (whole == utf8Accept) != (split == utf8Accept) || (whole == utf8Reject) != (split == utf8Reject) {
			t.Fatalf("% x: whole state %d, split at %d state %d", p, whole, cut, split)
		}
	}
}

func utf8StepSplit(p []byte, cut int) uint8 {
	s := utf8Step(utf8Accept, p[:cut])
	if s == utf8Reject {
		return s
	}
	return utf8Step(s, p[cut:])
}

// prefixes of valid encodings that are not complete characters.
var incompletePrefixes = func() map[string]bool {
	m := map[string]bool{}
	for r := rune(0x80); r <= utf8.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		e := utf8.AppendRune(nil, r)
		for k := 1; k < len(e); k++ {
			m[string(e[:k])] = true
		}
	}
	return m
}()

// validPrefix reports whether b can be extended to valid UTF-8, computed
// without the DFA.
func validPrefix(b []byte) bool {
	if utf8.Valid(b) {
		return true
	}
	for k := 1; k <= 3 && k <= len(b); k++ {
		if utf8.Valid(b[:len(b)-k]) && incompletePrefixes[string(b[len(b)-k:])] {
			return true
		}
	}
	return false
}

// refDecode is an independent, whole-buffer reading of RFC 6455 used as the
// oracle for the incremental decoder: plain code, no state machine.
func refDecode(lim limits, in []byte) []out {
	p := bytes.Clone(in)
	var res []out
	var msg []byte
	inMsg := false
	failWith := func(c CloseCode) []out { return append(res, closeOut(c)) }
	for {
		if len(p) < 2 {
			return res
		}
		fin, rsv, op := p[0]&0x80 != 0, p[0]>>4&7, p[0]&15
		masked, l7 := p[1]&0x80 != 0, int(p[1]&127)
		ctrl := op >= 8
		switch {
		case rsv != 0:
			return failWith(CloseProtocolError)
		case op != 0 && op != 1 && op != 2 && op != 8 && op != 9 && op != 10:
			return failWith(CloseProtocolError)
		case !masked:
			return failWith(CloseProtocolError)
		case ctrl && !fin, ctrl && l7 > 125:
			return failWith(CloseProtocolError)
		case !ctrl && op == 0 && !inMsg, !ctrl && op != 0 && inMsg:
			return failWith(CloseProtocolError)
		case op == 2:
			return failWith(CloseUnsupportedData)
		}
		ext := map[int]int{126: 2, 127: 8}[l7]
		if len(p) < 2+ext+4 {
			return res
		}
		n := uint64(l7)
		switch l7 {
		case 126:
			n = uint64(binary.BigEndian.Uint16(p[2:]))
			if n < 126 {
				return failWith(CloseProtocolError)
			}
		case 127:
			n = binary.BigEndian.Uint64(p[2:])
			if n>>63 != 0 || n <= 0xffff {
				return failWith(CloseProtocolError)
			}
		}
		if !ctrl {
			if op == 1 {
				msg = nil
			}
			if n > uint64(lim.maxFrame) || uint64(len(msg))+n > uint64(lim.maxMessage) {
				return failWith(CloseMessageTooBig)
			}
		}
		mask := p[2+ext : 6+ext]
		body := p[6+ext:]
		avail := min(n, uint64(len(body)))
		pl := make([]byte, avail)
		for i := range pl {
			pl[i] = body[i] ^ mask[i%4]
		}
		if !ctrl {
			if !validPrefix(append(slices.Clone(msg), pl...)) {
				return failWith(CloseInvalidPayload)
			}
			if avail < n {
				return res
			}
			msg = append(msg, pl...)
			if fin {
				if !utf8.Valid(msg) {
					return failWith(CloseInvalidPayload)
				}
				res = append(res, echo(string(msg)))
				msg, inMsg = nil, false
			} else {
				inMsg = true
			}
		} else {
			if avail < n {
				return res
			}
			switch op {
			case 9:
				res = append(res, pongOut(string(pl)))
			case 8:
				if len(pl) == 0 {
					return append(res, closeOut(0))
				}
				if len(pl) == 1 {
					return failWith(CloseProtocolError)
				}
				code := CloseCode(binary.BigEndian.Uint16(pl))
				ok := code >= 1000 && code <= 1003 || code >= 1007 && code <= 1011 || code >= 3000 && code <= 4999
				if !ok {
					return failWith(CloseProtocolError)
				}
				if !utf8.Valid(pl[2:]) {
					return failWith(CloseInvalidPayload)
				}
				return append(res, closeOut(code))
			}
		}
		p = body[n:]
	}
}

// structuredStream turns fuzz bytes into mostly well-formed masked frames so
// the fuzzer spends its time past the header checks: each frame takes a
// flags byte, a length byte and that many payload bytes.
func structuredStream(data []byte) []byte {
	var outb []byte
	for len(data) >= 2 {
		flags, n := data[0], int(data[1])
		data = data[2:]
		n = min(n, len(data))
		payload := data[:n]
		data = data[n:]
		ops := []byte{opText, opContinuation, opPing, opPong, opClose, opBinary, 3, 0xb}
		f := cframe{
			fin:     flags&0x80 != 0,
			op:      ops[flags&7],
			payload: payload,
		}
		if flags&0x08 != 0 && flags&0x07 < 2 {
			// Make long data frames sometimes: repeat the payload.
			f.payload = bytes.Repeat(payload, 1+int(flags>>4&7)*40)
		}
		if flags&0x40 != 0 && flags&0x30 == 0x30 {
			f.rsv = 1
		}
		outb = append(outb, f.encode()...)
	}
	return outb
}

func fuzzLimits() limits { return limits{maxFrame: 4096, maxMessage: 8192} }

func FuzzDecoder(f *testing.F) {
	for _, c := range conformanceCases() {
		if len(c.in) <= 4096 {
			f.Add(c.in, false, uint64(len(c.in)))
		}
	}
	f.Add([]byte{0x81, 5, 'h', 'e', 'l', 'l', 'o', 0x01, 3, 'a', 'b', 'c'}, true, uint64(7))
	f.Fuzz(func(t *testing.T, data []byte, structured bool, seed uint64) {
		stream := data
		if structured {
			stream = structuredStream(data)
		}
		lim := fuzzLimits()
		whole := runDecoder(lim, stream, nil)
		for _, o := range whole {
			if o.op == opText && (!utf8.ValidString(o.data) || int64(len(o.data)) > lim.maxMessage) {
				t.Fatalf("delivered an invalid message %v", o)
			}
		}
		if ref := refDecode(lim, stream); !sameOuts(whole, ref) {
			t.Fatalf("whole: got %v, reference %v", whole, ref)
		}
		if got := runDecoder(lim, stream, everyByte(len(stream))); !sameOuts(got, whole) {
			t.Fatalf("byte by byte: got %v, whole %v", got, whole)
		}
		r := rand.New(rand.NewPCG(seed, seed>>7))
		for range 4 {
			var cuts []int
			for range 1 + r.IntN(8) {
				if len(stream) > 0 {
					cuts = append(cuts, r.IntN(len(stream)))
				}
			}
			slices.Sort(cuts)
			if got := runDecoder(lim, stream, cuts); !sameOuts(got, whole) {
				t.Fatalf("split at %v: got %v, whole %v", cuts, got, whole)
			}
		}
	})
}

func BenchmarkDecoder(b *testing.B) {
	for _, size := range []int{16, 128, 1024, 16 << 10} {
		b.Run(fmt.Sprintf("payload=%d", size), func(b *testing.B) {
			one := text(string(bytes.Repeat([]byte("a"), size))).encode()
			var stream []byte
			for range 64 {
				stream = append(stream, one...)
			}
			work := make([]byte, len(stream))
			lim := caseLimits
			d := decoder{}
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			msgs := 0
			for b.Loop() {
				copy(work, stream)
				p := work
				for len(p) > 0 {
					n, ev := d.next(p, &lim)
					p = p[n:]
					if ev.kind == evText {
						msgs++
					} else if ev.kind != evNone {
						b.Fatalf("unexpected event %d", ev.kind)
					}
				}
			}
			b.ReportMetric(float64(msgs)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
