package client

import (
	"encoding/json"
	"testing"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// newOffline returns a Conn with no connection, for exercising the
// delivery path alone.
func newOffline(cfg Config) *Conn {
	cfg.URL, cfg.Token = "ws://127.0.0.1:1/ws", "t"
	cfg = cfg.withDefaults()
	c := &Conn{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1), groups: map[int64]*group{}, calls: map[string]*call{}}
	if cfg.OnMessage == nil {
		c.msgs = make(chan Message, cfg.MessageBuffer)
	}
	return c
}

// BenchmarkPushInOrder is the reader's per-message work after decoding:
// dedup, order check and delivery to OnMessage.
func BenchmarkPushInOrder(b *testing.B) {
	var n int
	c := newOffline(Config{OnMessage: func(Message) { n++ }, OnEvent: func(Event) {}})
	m := wire.Msg{GID: 1, From: "bob", TS: 1, Kind: wire.KindText, Body: json.RawMessage(`{"t":1}`)}
	b.ReportAllocs()
	for b.Loop() {
		m.Seq++
		c.push(&m)
	}
	if n != int(m.Seq) {
		b.Fatalf("delivered %d, want %d", n, m.Seq)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")
}

// BenchmarkDecodeAndPush adds the wire decoding of each msg frame.
func BenchmarkDecodeAndPush(b *testing.B) {
	c := newOffline(Config{OnMessage: func(Message) {}, OnEvent: func(Event) {}})
	m := wire.Msg{GID: 1, From: "bob", TS: 1, Kind: wire.KindText, Body: json.RawMessage(`{"t":1234567890123,"p":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		m.Seq++
		buf = wire.AppendMsg(buf[:0], &m)
		f, err := wire.DecodeServer(buf)
		if err != nil {
			b.Fatal(err)
		}
		c.dispatch(f)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")
}

func TestDuplicateOnOfflineConnCounted(t *testing.T) {
	var got []int64
	c := newOffline(Config{OnMessage: func(m Message) { got = append(got, m.Seq) }})
	for _, s := range []int64{1, 2, 2, 3, 1} {
		c.push(&wire.Msg{GID: 1, Seq: s, Body: json.RawMessage(`1`)})
	}
	if len(got) != 3 || c.Stats().Duplicates != 2 {
		t.Fatalf("got %v and %d duplicates, want [1 2 3] and 2", got, c.Stats().Duplicates)
	}
}
