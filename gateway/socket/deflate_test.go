package socket

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/flate"
)

// compress deflates msg as a client would for one message (its own
// stream: no context takeover), with the sync-flush tail stripped.
func compress(t testing.TB, msg []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, _ := flate.NewWriter(&buf, flate.BestCompression)
	_, _ = w.Write(msg)
	_ = w.Flush()
	return bytes.TrimSuffix(buf.Bytes(), []byte{0, 0, 0xff, 0xff})
}

// zframe is a compressed final text frame (RSV1) carrying msg.
func zframe(t testing.TB, msg []byte) cframe {
	return cframe{fin: true, rsv: 4, op: opText, payload: compress(t, msg)}
}

// readAnyFrame reads one server frame, allowing RSV1, and returns its
// payload inflated when RSV1 was set.
func (c *wsClient) readAnyFrame(timeout time.Duration) (op byte, payload []byte, compressed bool, wire int, err error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
	var h [2]byte
	if _, err = io.ReadFull(c.br, h[:]); err != nil {
		return 0, nil, false, 0, err
	}
	if h[0]&0x30 != 0 || h[0]&0x80 == 0 || h[1]&0x80 != 0 {
		return 0, nil, false, 0, fmt.Errorf("bad server frame header % x", h)
	}
	wire = 2
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var e [2]byte
		_, err = io.ReadFull(c.br, e[:])
		n, wire = uint64(binary.BigEndian.Uint16(e[:])), 4
	case 127:
		var e [8]byte
		_, err = io.ReadFull(c.br, e[:])
		n, wire = binary.BigEndian.Uint64(e[:]), 10
	}
	if err != nil {
		return 0, nil, false, 0, err
	}
	payload = make([]byte, n)
	if _, err = io.ReadFull(c.br, payload); err != nil {
		return 0, nil, false, 0, err
	}
	wire += int(n)
	if h[0]&0x40 == 0 {
		return h[0] & 0x0f, payload, false, wire, nil
	}
	r := flate.NewReader(io.MultiReader(bytes.NewReader(payload), bytes.NewReader(deflateTail)))
	out, err := io.ReadAll(r)
	return h[0] & 0x0f, out, true, wire, err
}

func TestDeflateNegotiation(t *testing.T) {
	on := startServer(t, Config{Deflate: true, MaxConnsPerUser: -1})
	off := startServer(t, Config{MaxConnsPerUser: -1})
	const pmd = "permessage-deflate"
	tests := []struct {
		name   string
		s      *Server
		offer  string
		answer string // "" = declined
	}{
		{"browser offer", on, pmd + "; client_max_window_bits", pmd + ";server_no_context_takeover;client_max_window_bits=9"},
		{"client keeps no context", on, pmd + "; client_no_context_takeover; client_max_window_bits", pmd + ";server_no_context_takeover;client_no_context_takeover"},
		{"small client window kept", on, pmd + "; client_max_window_bits=8", pmd + ";server_no_context_takeover;client_max_window_bits=8"},
		{"server no context offered", on, pmd + "; server_no_context_takeover; client_max_window_bits=15", pmd + ";server_no_context_takeover;client_max_window_bits=9"},
		{"no window parameter: declined", on, pmd, ""},
		{"small server window: declined", on, pmd + "; server_max_window_bits=10; client_max_window_bits", ""},
		{"malformed: declined", on, pmd + "; client_max_window_bits=99", ""},
		{"second offer taken", on, pmd + "; server_max_window_bits=9, " + pmd + "; client_max_window_bits", pmd + ";server_no_context_takeover;client_max_window_bits=9"},
		{"other extension", on, "x-webkit-deflate-frame", ""},
		{"deflate off", off, pmd + "; client_max_window_bits", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := rawDial(t, tt.s)
			c.write(upgradeRequest("/ws", "alice", "Sec-WebSocket-Extensions: "+tt.offer))
			st, hdr, err := c.readResponse()
			if err != nil || st != http.StatusSwitchingProtocols {
				t.Fatalf("status %d, err %v", st, err)
			}
			got := strings.ReplaceAll(hdr.Get("Sec-WebSocket-Extensions"), " ", "")
			if got != strings.ReplaceAll(tt.answer, " ", "") {
				t.Fatalf("Sec-WebSocket-Extensions: got %q, want %q", got, tt.answer)
			}
			c.sendText("hi") // the connection works either way
			c.expectText("hi")
		})
	}
}

// chatJSON is a push payload of about n bytes, shaped like a msg frame:
// words drawn pseudo-randomly from a vocabulary of a few hundred, with
// numbers, so it compresses about as well as chat text does (2-3x), not
// as well as a repeated phrase.
func chatJSON(seq, n int) []byte {
	b := fmt.Appendf(nil, `{"type":"msg","gid":4711,"seq":%d,"uid":"user-%d","client_msg_id":"c-%d","ts":1795987226338,"body":{"text":"`, seq, seq%97, seq)
	x := uint32(seq)*2654435761 + 1
	for len(b) < n-3 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		if x%7 == 0 {
			b = strconv.AppendUint(b, uint64(x%10000), 10)
		} else {
			w := chatWords[x%uint32(len(chatWords))]
			b = append(b, w[:1+int(x>>8)%len(w)]...) // prefixes: a vocabulary of several hundred
		}
		b = append(b, " ,. !?"[x>>20%6])
	}
	return append(b, `"}}`...)
}

var chatWords = []string{"stadium", "tonight", "ticket", "anthem", "goalkeeper", "penalty", "referee", "striker",
	"midfield", "corner", "offside", "whistle", "captain", "supporters", "banner", "chorus", "halftime",
	"overtime", "champion", "trophy", "victory", "defeat", "weather", "umbrella", "subway", "station",
	"meeting", "everyone", "somebody", "wonderful", "terrible", "amazing", "finally", "tomorrow"}

func TestDeflatePush(t *testing.T) {
	h := &echoHandler{}
	s := startServer(t, Config{Handler: h, Deflate: true, MaxConnsPerUser: -1})
	z := dialWS(t, s, "/ws", "zed", "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits")
	plain := dialWS(t, s, "/ws", "plain")
	waitFor(t, 5*time.Second, "two connections", func() bool { return h.opened.Load() == 2 })
	conns := h.snapshot()
	zc := conns[0]
	if !zc.Deflate() {
		zc = conns[1]
	}
	if !zc.Deflate() {
		t.Fatal("no connection negotiated deflate")
	}
	big := NewPushFrame(1, 1, chatJSON(1, 2000))
	small := NewPushFrame(1, 2, []byte(`{"type":"msg","seq":2}`))
	zBig, plainBig := s.WireBytes(big, true), s.WireBytes(big, false)
	if zBig >= plainBig*3/4 || plainBig != big.Len() {
		t.Fatalf("WireBytes: compressed %d, plain %d (frame %d): want compressed under 3/4", zBig, plainBig, big.Len())
	}
	if got := s.WireBytes(small, true); got != small.Len() {
		t.Fatalf("a frame under DeflateMinBytes: WireBytes %d, want its plain %d", got, small.Len())
	}
	s.BroadcastBatch([]*Frame{big, small}, conns)
	for _, tc := range []struct {
		c     *wsClient
		wantZ []bool
		wire  []int
	}{{z, []bool{true, false}, []int{zBig, small.Len()}}, {plain, []bool{false, false}, []int{big.Len(), small.Len()}}} {
		for i, f := range []*Frame{big, small} {
			op, p, compressed, wire, err := tc.c.readAnyFrame(5 * time.Second)
			if err != nil || op != opText {
				t.Fatalf("frame %d: op %d, err %v", i, op, err)
			}
			if compressed != tc.wantZ[i] || wire != tc.wire[i] {
				t.Fatalf("frame %d: compressed %v, %d bytes on the wire; want %v, %d", i, compressed, wire, tc.wantZ[i], tc.wire[i])
			}
			if !bytes.Equal(p, payloadOf(f.Bytes())) {
				t.Fatalf("frame %d: payload differs after inflating", i)
			}
		}
	}
	// Replies are compressed too; a second push reuses nothing of the first
	// (no context takeover): each frame inflates on its own above.
	zc.Write(NewTextFrame(chatJSON(3, 1000)))
	if _, p, compressed, _, err := z.readAnyFrame(5 * time.Second); err != nil || !compressed || !bytes.Equal(p, chatJSON(3, 1000)) {
		t.Fatalf("reply: compressed %v, err %v", compressed, err)
	}
}

func TestDeflateInbound(t *testing.T) {
	const offer = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits"
	s := startServer(t, Config{Deflate: true, MaxConnsPerUser: -1, MaxMessageBytes: 4096, MaxFrameBytes: 4096})
	dial := func() *wsClient { return dialWS(t, s, "/ws", "alice", offer) }
	echoOf := func(c *wsClient) string {
		t.Helper()
		_, p, _, _, err := c.readAnyFrame(5 * time.Second)
		if err != nil {
			t.Fatalf("read echo: %v", err)
		}
		return string(p)
	}

	t.Run("messages, one frame and fragmented", func(t *testing.T) {
		c := dial()
		msg := chatJSON(1, 900)
		c.write(zframe(t, msg).encode())
		if got := echoOf(c); got != string(msg) {
			t.Fatalf("echo %q, want %q", got, msg)
		}
		zb := compress(t, msg)
		c.write(append(append(cframe{rsv: 4, op: opText, payload: zb[:10]}.encode(),
			cont(string(zb[10:20]), false).encode()...), cont(string(zb[20:]), true).encode()...))
		if got := echoOf(c); got != string(msg) {
			t.Fatalf("fragmented echo %q", got)
		}
		c.sendText("plain still works")
		if got := echoOf(c); got != "plain still works" {
			t.Fatalf("plain echo %q", got)
		}
	})

	t.Run("context takeover within the window", func(t *testing.T) {
		// One compressor across messages, as a browser does: later
		// messages refer back into earlier ones (all within 512 bytes).
		c := dial()
		var buf bytes.Buffer
		w, _ := flate.NewWriter(&buf, flate.BestCompression)
		for i, m := range []string{`{"type":"send","gid":1,"body":"hello hello"}`, `{"type":"send","gid":1,"body":"hello hello again"}`, `{"type":"send","gid":1,"body":"hello"}`} {
			buf.Reset()
			_, _ = w.Write([]byte(m))
			_ = w.Flush()
			p := bytes.TrimSuffix(buf.Bytes(), []byte{0, 0, 0xff, 0xff})
			c.write(cframe{fin: true, rsv: 4, op: opText, payload: p}.encode())
			if got := echoOf(c); got != m {
				t.Fatalf("message %d: echo %q, want %q", i, got, m)
			}
		}
	})

	t.Run("history kept at its bound", func(t *testing.T) {
		var h []byte
		for i := range 50 {
			keepHistory(&h, []byte(strconv.Itoa(i)+strings.Repeat("x", i*7)))
			if len(h) > deflateHistory {
				t.Fatalf("history %d bytes, over %d", len(h), deflateHistory)
			}
		}
		keepHistory(&h, []byte("tail"))
		if !bytes.HasSuffix(h, []byte("tail")) || len(h) != deflateHistory {
			t.Fatalf("history does not end with the latest bytes: len %d", len(h))
		}
	})

	for _, tc := range []struct {
		name  string
		frame []byte
		code  CloseCode
	}{
		{"deflate bomb", zframe(t, bytes.Repeat([]byte("a"), 1<<20)).encode(), CloseMessageTooBig},
		{"just over the message bound", zframe(t, bytes.Repeat([]byte("b"), 4097)).encode(), CloseMessageTooBig},
		{"corrupt stream", cframe{fin: true, rsv: 4, op: opText, payload: []byte{0xff, 0xfe, 0xfd, 0x00}}.encode(), CloseInvalidPayload},
		{"invalid UTF-8 inside", zframe(t, []byte("ok \xff\xfe")).encode(), CloseInvalidPayload},
		{"RSV1 on a continuation", append(frag(opText, "a").encode(), cframe{fin: true, rsv: 4, op: opContinuation, payload: []byte("b")}.encode()...), CloseProtocolError},
		{"RSV1 on a ping", cframe{fin: true, rsv: 4, op: opPing}.encode(), CloseProtocolError},
		{"RSV2", cframe{fin: true, rsv: 2, op: opText, payload: []byte("x")}.encode(), CloseProtocolError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial()
			c.writeTolerant(tc.frame)
			code, reason, err := c.expectClose(5 * time.Second)
			if err != nil || code != tc.code {
				t.Fatalf("close %d %q (err %v), want %d", code, reason, err, tc.code)
			}
		})
	}
	t.Run("exactly the message bound", func(t *testing.T) {
		c := dial()
		msg := bytes.Repeat([]byte("c"), 4096)
		c.write(zframe(t, msg).encode())
		if got := echoOf(c); got != string(msg) {
			t.Fatalf("echo of %d bytes: got %d", len(msg), len(got))
		}
	})
	t.Run("RSV1 without deflate negotiated", func(t *testing.T) {
		c := dialWS(t, s, "/ws", "alice")
		c.write(zframe(t, []byte("hi")).encode())
		if code, _, err := c.expectClose(5 * time.Second); err != nil || code != CloseProtocolError {
			t.Fatalf("close %d (err %v), want 1002", code, err)
		}
	})
}

// raceEnabled: the race detector makes sync.Pool drop items, so pooled
// paths allocate under it (race_test.go sets it).
var raceEnabled bool

func TestDeflateFrameAllocs(t *testing.T) {
	s := startServer(t, Config{Deflate: true})
	f := NewPushFrame(1, 1, chatJSON(1, 1000))
	s.WireBytes(f, true)
	if n := testing.AllocsPerRun(100, func() { s.WireBytes(f, true) }); n != 0 {
		t.Fatalf("a compressed frame's later uses allocate %v times, want 0", n)
	}
	src := compress(t, chatJSON(2, 1000))
	dst := make([]byte, 0, 4096)
	hist := make([]byte, 0, deflateHistory)
	inflate(dst, src, hist, 4096)
	if n := testing.AllocsPerRun(100, func() { _, _ = inflate(dst, src, hist, 4096) }); n != 0 && !raceEnabled {
		t.Fatalf("inflate allocates %v times per message, want 0", n)
	}
}

// BenchmarkDeflateFrame is the cost of compressing one push frame (paid
// once per frame, whatever the number of recipients) and of inflating one
// client message of the same size.
func BenchmarkDeflateFrame(b *testing.B) {
	for _, size := range []int{256, 1024, 4096} {
		payload := chatJSON(7, size)
		b.Run(fmt.Sprintf("compress/bytes=%d", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			var out int
			for b.Loop() {
				out = len(deflateFrame(payload, DefaultDeflateLevel))
			}
			b.ReportMetric(float64(out)/float64(len(payload)), "ratio")
		})
		b.Run(fmt.Sprintf("inflate/bytes=%d", size), func(b *testing.B) {
			src := compress(b, payload)
			dst := make([]byte, 0, 2*size)
			b.SetBytes(int64(size))
			for b.Loop() {
				_, _ = inflate(dst, src, nil, 1<<20)
			}
		})
	}
}
