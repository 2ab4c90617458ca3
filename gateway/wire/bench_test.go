package wire

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// raceEnabled is set by race_test.go: the race detector adds allocations,
// so allocation counts are only asserted without it.
var raceEnabled bool

// body100 is a 100-byte JSON body, the payload size of the broadcast
// measurements.
var body100 = json.RawMessage(`{"text":"` + strings.Repeat("x", 100-11) + `"}`)

func benchMsg(seq int64) Msg {
	return Msg{GID: 1234567, Seq: seq, From: "user-00042", TS: 1700000000123, Kind: KindText, Body: body100}
}

func TestAppendZeroAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector; run without -race")
	}
	m := benchMsg(1)
	msgs := make([]Msg, 32)
	for i := range msgs {
		msgs[i] = benchMsg(int64(i + 1))
	}
	eta := int64(12)
	buf := make([]byte, 0, 64<<10)
	cases := map[string]func(){
		"msg":      func() { buf = AppendMsg(buf[:0], &m) },
		"batch":    func() { buf = AppendBatch(buf[:0], &Batch{GID: 1, Messages: msgs}) },
		"summary":  func() { buf = AppendSummary(buf[:0], &Summary{GID: 1, Count: 32, First: m, LastSeq: 32}) },
		"ack":      func() { buf = AppendAck(buf[:0], &Ack{ID: "client-msg-1", GID: 1, Seq: 2, TS: 3}) },
		"resync":   func() { buf = AppendResync(buf[:0], &Resync{GID: 1, LastSeq: 2}) },
		"degraded": func() { buf = AppendDegraded(buf[:0], &Degraded{GID: 1, Level: 2}) },
		"error": func() {
			buf = AppendError(buf[:0], &Error{ID: "x", Code: CodeOverloaded, Message: "busy", RetryAfterMS: 100})
		},
		"messages": func() { buf = AppendMessages(buf[:0], &Messages{ID: "p", GID: 1, Messages: msgs, LastSeq: 32}) },
		"hello": func() {
			buf = AppendHello(buf[:0], &Hello{UID: "u", Node: "n", HeartbeatS: 30, MaxMessageBytes: 65536})
		},
		"pong": func() { buf = AppendPong(buf[:0], &Pong{ID: "x"}) },
		"queue": func() {
			buf = AppendQueue(buf[:0], &Queue{Room: "r", Status: QueueWaiting, Position: 9, Ahead: 8, Total: 99, ETAS: &eta})
		},
		"granted":  func() { buf = AppendGranted(buf[:0], &Granted{Room: "r", AccessToken: "a.b.c", ExpiresAt: 1}) },
		"rejected": func() { buf = AppendRejected(buf[:0], &Rejected{Room: "r", Code: CodeRoomFull, RetryAfterMS: 1}) },
		"send":     func() { buf = AppendSend(buf[:0], &Send{ID: "c", GID: 1, Body: body100}) },
		"escaped":  func() { buf = AppendMsg(buf[:0], &Msg{GID: 1, Seq: 1, From: "é\"\n\u2028\xff", Body: body100}) },
	}
	for name, fn := range cases {
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Errorf("%s: got %v allocs per call, want 0", name, n)
		}
	}
}

func TestDecodeClientAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector; run without -race")
	}
	cases := []struct {
		in   string
		want float64
	}{
		{`{"type":"send","id":"c-1","gid":7,"body":{"text":"hi"}}`, 1}, // the id string
		{`{"type":"pull","id":"p-1","gid":7,"from_seq":1,"to_seq":9}`, 1},
		{`{"type":"read","gid":7,"seq":3}`, 0},
		{`{"type":"ping"}`, 0},
	}
	for _, tc := range cases {
		data := []byte(tc.in)
		n := testing.AllocsPerRun(100, func() {
			if _, err := DecodeClient(data); err != nil {
				t.Fatal(err)
			}
		})
		if n != tc.want {
			t.Errorf("DecodeClient(%s): got %v allocs, want %v", tc.in, n, tc.want)
		}
	}
}

func BenchmarkAppend(b *testing.B) {
	m := benchMsg(1)
	buf := make([]byte, 0, 256<<10)
	for _, n := range []int{1, 32, 200} {
		msgs := make([]Msg, n)
		for i := range msgs {
			msgs[i] = benchMsg(int64(i + 1))
		}
		b.Run(fmt.Sprintf("frame=batch/messages=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendBatch(buf[:0], &Batch{GID: 1234567, Messages: msgs})
			}
			b.SetBytes(int64(len(buf)))
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
	frames := []struct {
		name string
		fn   func()
	}{
		{"msg", func() { buf = AppendMsg(buf[:0], &m) }},
		{"summary", func() { buf = AppendSummary(buf[:0], &Summary{GID: 1234567, Count: 500, First: m, LastSeq: 600}) }},
		{"ack", func() {
			buf = AppendAck(buf[:0], &Ack{ID: "0f8c2a1e-client-msg", GID: 1234567, Seq: 99, TS: 1700000000123})
		}},
		{"resync", func() { buf = AppendResync(buf[:0], &Resync{GID: 1234567, LastSeq: 99}) }},
		{"degraded", func() { buf = AppendDegraded(buf[:0], &Degraded{GID: 1234567, Level: 2}) }},
		{"error", func() {
			buf = AppendError(buf[:0], &Error{ID: "0f8c2a1e", Code: CodeRateLimited, Message: "rate limited", RetryAfterMS: 250})
		}},
		{"queue", func() {
			eta := int64(95)
			buf = AppendQueue(buf[:0], &Queue{Room: "launch", Status: QueueWaiting, Position: 1234, Ahead: 1233, Total: 50000, ETAS: &eta})
		}},
	}
	for _, f := range frames {
		b.Run("frame="+f.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				f.fn()
			}
			b.SetBytes(int64(len(buf)))
		})
	}
}

func BenchmarkDecodeClient(b *testing.B) {
	frames := []struct{ name, in string }{
		{"send/body=100B", string(AppendSend(nil, &Send{ID: "0f8c2a1e-client-msg", GID: 1234567, Body: body100}))},
		{"pull", `{"type":"pull","id":"p-17","gid":1234567,"from_seq":1000,"to_seq":1200}`},
		{"read", `{"type":"read","gid":1234567,"seq":1200}`},
		{"ping", `{"type":"ping","id":"hb"}`},
	}
	for _, f := range frames {
		data := []byte(f.in)
		b.Run("frame="+f.name+"/decoder=wire", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := DecodeClient(data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
		})
		b.Run("frame="+f.name+"/decoder=encoding-json", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				var v struct {
					Type    string          `json:"type"`
					ID      string          `json:"id"`
					GID     int64           `json:"gid"`
					Seq     int64           `json:"seq"`
					FromSeq int64           `json:"from_seq"`
					ToSeq   int64           `json:"to_seq"`
					Kind    string          `json:"kind"`
					Body    json.RawMessage `json:"body"`
				}
				if err := json.Unmarshal(data, &v); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
		})
	}
}

func BenchmarkDecodeServer(b *testing.B) {
	m := benchMsg(7)
	msgs := make([]Msg, 32)
	for i := range msgs {
		msgs[i] = benchMsg(int64(i + 1))
	}
	frames := []struct {
		name string
		data []byte
	}{
		{"msg", AppendMsg(nil, &m)},
		{"batch/messages=32", AppendBatch(nil, &Batch{GID: 1234567, Messages: msgs})},
		{"ack", AppendAck(nil, &Ack{ID: "0f8c2a1e-client-msg", GID: 1234567, Seq: 99, TS: 1700000000123})},
	}
	for _, f := range frames {
		b.Run("frame="+f.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(f.data)))
			for b.Loop() {
				if _, err := DecodeServer(f.data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
		})
	}
}
