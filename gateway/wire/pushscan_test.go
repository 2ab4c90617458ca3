package wire

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

// pushed is what a MsgSink was handed: gid, seq and body.
type pushed struct {
	gid, seq int64
	body     string
}

type pushRecord struct{ got []pushed }

func (r *pushRecord) PushedMsg(gid, seq int64, body []byte) {
	r.got = append(r.got, pushed{gid, seq, string(body)})
}

func TestScanPush(t *testing.T) {
	m1 := Msg{GID: 7, Seq: 41, From: "a", TS: 1, Kind: KindText, Body: json.RawMessage(`{"t":1000,"p":"xx"}`)}
	m2 := Msg{GID: 7, Seq: 42, From: "b", TS: 2, Kind: KindAtAll, Body: json.RawMessage(`{"p":"\"t\":5","t":2000}`)}
	p1, p2 := pushed{7, 41, `{"t":1000,"p":"xx"}`}, pushed{7, 42, `{"p":"\"t\":5","t":2000}`}
	tests := []struct {
		name    string
		frame   []byte
		typ     string
		want    []pushed
		wantErr error
	}{
		{"msg", AppendMsg(nil, &m1), TypeMsg, []pushed{p1}, nil},
		{"msg, spaced, fields in another order", []byte(`{ "type" : "msg", "seq": 3, "gid": 9, "body": {"p": [1, {"t": 4}], "t": 12345}, "ts": 1 }`), TypeMsg,
			[]pushed{{9, 3, `{"p": [1, {"t": 4}], "t": 12345}`}}, nil},
		{"msg, type not first", []byte(`{"gid":1,"type":"msg","seq":2,"body":{}}`), TypeMsg, []pushed{{1, 2, `{}`}}, nil},
		{"msg, escaped key", []byte(`{"type":"msg","gid":1,"s\u0065q":2,"body":1}`), TypeMsg, []pushed{{1, 2, `1`}}, nil},
		{"msg without body", []byte(`{"type":"msg","gid":1,"seq":2}`), TypeMsg, []pushed{{1, 2, ""}}, nil},
		{"batch", AppendBatch(nil, &Batch{GID: 7, Messages: []Msg{m1, m2}}), TypeBatch, []pushed{p1, p2}, nil},
		{"empty batch", AppendBatch(nil, &Batch{GID: 7}), TypeBatch, nil, nil},
		{"batch elements without gid", []byte(`{"type":"batch","gid":8,"messages":[{"seq":1,"body":{"t":3}} , {"seq":2,"body":{}}]}`), TypeBatch,
			[]pushed{{8, 1, `{"t":3}`}, {8, 2, `{}`}}, nil},
		{"summary", AppendSummary(nil, &Summary{GID: 7, Count: 9, First: m1, LastSeq: 49}), TypeSummary, []pushed{p1}, nil},
		{"resync", AppendResync(nil, &Resync{GID: 7, LastSeq: 90}), TypeResync, nil, nil},
		{"degraded", AppendDegraded(nil, &Degraded{GID: 7, Level: 1}), TypeDegraded, nil, nil},
		{"ack", AppendAck(nil, &Ack{ID: "a", GID: 7, Seq: 3, TS: 1}), TypeAck, nil, nil},
		{"unknown type, rest not read", []byte(`{"type":"future","x":[}`), "future", nil, nil},
		{"truncated msg", AppendMsg(nil, &m1)[:40], TypeMsg, nil, ErrSyntax},
		{"msg without seq", []byte(`{"type":"msg","gid":1,"body":{}}`), TypeMsg, nil, ErrInvalidField},
		{"msg with string seq", []byte(`{"type":"msg","gid":1,"seq":"2","body":{}}`), TypeMsg, nil, ErrInvalidField},
		{"msg with fractional gid", []byte(`{"type":"msg","gid":1.5,"seq":2,"body":{}}`), TypeMsg, nil, ErrInvalidField},
		{"seq overflow", []byte(`{"type":"msg","gid":1,"seq":99999999999999999999,"body":{}}`), TypeMsg, nil, ErrInvalidField},
		{"no type", []byte(`{"gid":1,"seq":2}`), "", nil, ErrInvalidField},
		{"numeric type", []byte(`{"type":1}`), "", nil, ErrInvalidField},
		{"not an object", []byte(`["msg"]`), "", nil, ErrSyntax},
		{"empty", nil, "", nil, ErrSyntax},
		{"missing comma", []byte(`{"type":"msg" "gid":1,"seq":2}`), TypeMsg, nil, ErrSyntax},
		{"unterminated body string", []byte(`{"type":"msg","gid":1,"seq":2,"body":{"p":"x}}`), TypeMsg, nil, ErrSyntax},
		{"invalid UTF-8 in the body", []byte("{\"type\":\"msg\",\"gid\":1,\"seq\":2,\"body\":\"\xff\"}"), TypeMsg, nil, ErrSyntax},
		{"data after the frame", []byte(`{"type":"msg","gid":1,"seq":2,"body":{}} {}`), TypeMsg, []pushed{{1, 2, `{}`}}, ErrSyntax},
		{"batch, messages not an array", []byte(`{"type":"batch","gid":1,"messages":{}}`), TypeBatch, nil, ErrSyntax},
		{"batch, element without seq", []byte(`{"type":"batch","gid":1,"messages":[{"seq":1},{"body":2}]}`), TypeBatch, []pushed{{1, 1, ""}}, ErrInvalidField},
		{"batch, missing comma between messages", []byte(`{"type":"batch","gid":1,"messages":[{"seq":1}{"seq":2}]}`), TypeBatch, []pushed{{1, 1, ""}}, ErrSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec pushRecord
			typ, err := ScanPush(tt.frame, &rec)
			if typ != tt.typ || !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("got type %q, err %v; want type %q, error %v", typ, err, tt.typ, tt.wantErr)
			}
			var de *DecodeError
			if err != nil && !errors.As(err, &de) {
				t.Fatalf("got error %T, want *DecodeError", err)
			}
			if !slices.Equal(rec.got, tt.want) {
				t.Fatalf("got messages %v, want %v", rec.got, tt.want)
			}
		})
	}
}

func TestBodyInt(t *testing.T) {
	tests := []struct {
		body string
		v    int64
		ok   bool
	}{
		{`{"t":1000,"p":"xx"}`, 1000, true},
		{`{"p":"\"t\":5","t":-2000}`, -2000, true},
		{`{"p":[1,{"t":4}],"t":12345}`, 12345, true},
		{`{"\u0074":7}`, 7, true},
		{`{"t":1.5}`, 0, false},
		{`{"t":"1"}`, 0, false},
		{`{"t":99999999999999999999}`, 0, false},
		{`{"p":1}`, 0, false},
		{`"hi"`, 0, false},
		{`{"p":`, 0, false},
		{``, 0, false},
	}
	for _, tt := range tests {
		if v, ok := BodyInt([]byte(tt.body), "t"); v != tt.v || ok != tt.ok {
			t.Errorf("BodyInt(%s, t) = %d, %v; want %d, %v", tt.body, v, ok, tt.v, tt.ok)
		}
	}
}

// countSink counts messages without keeping them.
type countSink struct{ n, sent int64 }

func (c *countSink) PushedMsg(_, _ int64, body []byte) {
	c.n++
	if t, ok := BodyInt(body, "t"); ok {
		c.sent += t
	}
}

func TestScanPushNoAllocs(t *testing.T) {
	m := Msg{GID: 7, Seq: 41, From: "s0", TS: 1, Kind: KindText, Body: json.RawMessage(`{"t":1000,"p":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)}
	frames := [][]byte{
		AppendMsg(nil, &m),
		AppendBatch(nil, &Batch{GID: 7, Messages: []Msg{m, m, m}}),
		AppendSummary(nil, &Summary{GID: 7, Count: 3, First: m, LastSeq: 43}),
		AppendResync(nil, &Resync{GID: 7, LastSeq: 43}),
		AppendDegraded(nil, &Degraded{GID: 7, Level: 2}),
	}
	var sink countSink
	allocs := testing.AllocsPerRun(100, func() {
		for _, f := range frames {
			if _, err := ScanPush(f, &sink); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("got %.1f allocations per run, want 0", allocs)
	}
	if sink.n != 101*5 || sink.sent != 101*5*1000 {
		t.Fatalf("got %d messages, t sum %d; want %d, %d", sink.n, sink.sent, 101*5, 101*5*1000)
	}
}

// FuzzScanPush: whatever push frame DecodeServer accepts, ScanPush accepts
// too and hands on the same messages (ScanPush checks fewer fields, so it
// may accept more). A repeated messages or first key gives ScanPush both
// lists where DecodeServer keeps the last: the decoded messages are then
// the end of what ScanPush gave.
func FuzzScanPush(f *testing.F) {
	for _, tc := range serverFrameCases() {
		f.Add(tc.enc(nil))
	}
	f.Add([]byte(`{"seq":2,"gid":1,"type":"msg","body":{"a":1},"extra":[1]}`))
	f.Add([]byte(`{"type":"batch","gid":8,"messages":[{"gid":8,"seq":1,"body":{"t":3}}],"messages":[{"gid":8,"seq":2,"body":{}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var rec pushRecord
		typ, scanErr := ScanPush(data, &rec)
		if scanErr != nil {
			var de *DecodeError
			if !errors.As(scanErr, &de) {
				t.Fatalf("error %T is not *DecodeError", scanErr)
			}
		}
		fr, err := DecodeServer(data)
		if err != nil {
			return
		}
		if typ != fr.FrameType() {
			t.Fatalf("ScanPush read type %q, DecodeServer %q", typ, fr.FrameType())
		}
		var want []pushed
		add := func(m *Msg) { want = append(want, pushed{m.GID, m.Seq, string(m.Body)}) }
		switch f := fr.(type) {
		case *Msg:
			add(f)
		case *Batch:
			for i := range f.Messages {
				add(&f.Messages[i])
			}
		case *Summary:
			add(&f.First)
		default:
			return
		}
		if scanErr != nil {
			t.Fatalf("DecodeServer accepted %q, ScanPush failed: %v", data, scanErr)
		}
		if len(rec.got) < len(want) || !slices.Equal(rec.got[len(rec.got)-len(want):], want) {
			t.Fatalf("ScanPush gave %v, DecodeServer decoded %v", rec.got, want)
		}
	})
}
