package wire

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func i64(v int64) *int64 { return &v }

// serverFrameCases is every server frame with the exact bytes it encodes to.
func serverFrameCases() []struct {
	name  string
	frame ServerFrame
	enc   func([]byte) []byte
	want  string
} {
	msg := Msg{GID: 7, Seq: 42, From: "alice", TS: 1700000000123, Kind: KindText, Body: json.RawMessage(`{"text":"hi"}`)}
	msg2 := Msg{GID: 7, Seq: 43, From: "bob", TS: 1700000000124, Kind: KindAtAll, Body: json.RawMessage(`"all"`)}
	hello := &Hello{UID: "alice", Node: "n1", HeartbeatS: 30, MaxMessageBytes: 65536}
	ack := &Ack{ID: "c-1", GID: 7, Seq: 42, TS: 1700000000123}
	batch := &Batch{GID: 7, Messages: []Msg{msg, msg2}}
	summary := &Summary{GID: 7, Count: 2, First: msg, LastSeq: 43}
	degGroup := &Degraded{GID: 7, Level: 2}
	degNode := &Degraded{Level: 3}
	resync := &Resync{GID: 7, LastSeq: 43}
	messages := &Messages{ID: "p-1", GID: 7, Messages: []Msg{msg}, LastSeq: 43}
	messagesEmpty := &Messages{ID: "p-2", GID: 7, Messages: []Msg{}, LastSeq: 0}
	pong := &Pong{ID: "x"}
	pongNoID := &Pong{}
	errFull := &Error{ID: "c-1", Code: CodeRateLimited, Message: "slow down", RetryAfterMS: 250}
	errBare := &Error{Code: CodeBadRequest, Message: "gid: required"}
	queue := &Queue{Room: "sale", Status: QueueWaiting, Position: 3, Ahead: 2, Total: 10, ETAS: i64(0), VIPAheadNotice: true}
	queuePaused := &Queue{Room: "sale", Status: QueuePaused, Position: 1, Ahead: 0, Total: 1}
	queueLocal := &Queue{Room: "sale", Status: QueuePaused, Position: 1, Ahead: 0, Total: 1, Local: true}
	granted := &Granted{Room: "sale", AccessToken: "a.b.c", ExpiresAt: 1700000060000}
	rejected := &Rejected{Room: "sale", Code: CodeRoomFull, RetryAfterMS: 5000}

	const msgObj = `{"gid":7,"seq":42,"from":"alice","ts":1700000000123,"kind":"text","body":{"text":"hi"}}`
	const msg2Obj = `{"gid":7,"seq":43,"from":"bob","ts":1700000000124,"kind":"at_all","body":"all"}`
	return []struct {
		name  string
		frame ServerFrame
		enc   func([]byte) []byte
		want  string
	}{
		{"hello", hello, func(b []byte) []byte { return AppendHello(b, hello) },
			`{"type":"hello","uid":"alice","node":"n1","heartbeat_s":30,"max_message_bytes":65536}`},
		{"ack", ack, func(b []byte) []byte { return AppendAck(b, ack) },
			`{"type":"ack","id":"c-1","gid":7,"seq":42,"ts":1700000000123}`},
		{"msg", &msg, func(b []byte) []byte { return AppendMsg(b, &msg) },
			`{"type":"msg","gid":7,"seq":42,"from":"alice","ts":1700000000123,"kind":"text","body":{"text":"hi"}}`},
		{"batch", batch, func(b []byte) []byte { return AppendBatch(b, batch) },
			`{"type":"batch","gid":7,"messages":[` + msgObj + `,` + msg2Obj + `]}`},
		{"summary", summary, func(b []byte) []byte { return AppendSummary(b, summary) },
			`{"type":"summary","gid":7,"count":2,"first":` + msgObj + `,"last_seq":43}`},
		{"degraded/group", degGroup, func(b []byte) []byte { return AppendDegraded(b, degGroup) },
			`{"type":"degraded","gid":7,"level":2}`},
		{"degraded/node", degNode, func(b []byte) []byte { return AppendDegraded(b, degNode) },
			`{"type":"degraded","level":3}`},
		{"resync", resync, func(b []byte) []byte { return AppendResync(b, resync) },
			`{"type":"resync","gid":7,"last_seq":43}`},
		{"messages", messages, func(b []byte) []byte { return AppendMessages(b, messages) },
			`{"type":"messages","id":"p-1","gid":7,"messages":[` + msgObj + `],"last_seq":43}`},
		{"messages/empty", messagesEmpty, func(b []byte) []byte { return AppendMessages(b, messagesEmpty) },
			`{"type":"messages","id":"p-2","gid":7,"messages":[],"last_seq":0}`},
		{"pong", pong, func(b []byte) []byte { return AppendPong(b, pong) },
			`{"type":"pong","id":"x"}`},
		{"pong/noid", pongNoID, func(b []byte) []byte { return AppendPong(b, pongNoID) },
			`{"type":"pong"}`},
		{"error/full", errFull, func(b []byte) []byte { return AppendError(b, errFull) },
			`{"type":"error","id":"c-1","code":"rate_limited","message":"slow down","retry_after_ms":250}`},
		{"error/bare", errBare, func(b []byte) []byte { return AppendError(b, errBare) },
			`{"type":"error","code":"bad_request","message":"gid: required"}`},
		{"queue", queue, func(b []byte) []byte { return AppendQueue(b, queue) },
			`{"type":"queue","room":"sale","status":"waiting","position":3,"ahead":2,"total":10,"eta_s":0,"vip_ahead_notice":true}`},
		{"queue/paused", queuePaused, func(b []byte) []byte { return AppendQueue(b, queuePaused) },
			`{"type":"queue","room":"sale","status":"paused","position":1,"ahead":0,"total":1,"vip_ahead_notice":false}`},
		{"queue/local", queueLocal, func(b []byte) []byte { return AppendQueue(b, queueLocal) },
			`{"type":"queue","room":"sale","status":"paused","position":1,"ahead":0,"total":1,"vip_ahead_notice":false,"local":true}`},
		{"granted", granted, func(b []byte) []byte { return AppendGranted(b, granted) },
			`{"type":"granted","room":"sale","access_token":"a.b.c","expires_at":1700000060000}`},
		{"rejected", rejected, func(b []byte) []byte { return AppendRejected(b, rejected) },
			`{"type":"rejected","room":"sale","code":"room_full","retry_after_ms":5000}`},
	}
}

func TestAppendServerFrames(t *testing.T) {
	for _, tc := range serverFrameCases() {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []byte("prefix")
			got := tc.enc(prefix)
			if string(got[:len(prefix)]) != "prefix" {
				t.Fatalf("Append clobbered dst prefix: %q", got)
			}
			got = got[len(prefix):]
			if string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if !json.Valid(got) {
				t.Fatalf("invalid JSON: %s", got)
			}

			// The type discriminator is right.
			var head struct{ Type string }
			if err := json.Unmarshal(got, &head); err != nil {
				t.Fatal(err)
			}
			if head.Type != tc.frame.FrameType() {
				t.Fatalf("got type %q, want %q", head.Type, tc.frame.FrameType())
			}

			// encoding/json reads back the same struct (tags match the encoder).
			back := reflect.New(reflect.TypeOf(tc.frame).Elem()).Interface()
			if err := json.Unmarshal(got, back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, tc.frame) {
				t.Fatalf("encoding/json round trip: got %+v, want %+v", back, tc.frame)
			}

			// json.Marshal of the struct gives the same fields minus type.
			std, err := json.Marshal(tc.frame)
			if err != nil {
				t.Fatal(err)
			}
			var a, b map[string]any
			if err := json.Unmarshal(std, &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(got, &b); err != nil {
				t.Fatal(err)
			}
			delete(b, "type")
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("json.Marshal fields differ:\n got %v\nwant %v", a, b)
			}

			// Our own decoder reads it back.
			dec, err := DecodeServer(got)
			if err != nil {
				t.Fatalf("DecodeServer: %v", err)
			}
			if !reflect.DeepEqual(dec, tc.frame) {
				t.Fatalf("DecodeServer: got %+v, want %+v", dec, tc.frame)
			}
		})
	}
}

func TestAppendClientFrames(t *testing.T) {
	send := &Send{ID: "c-1", GID: 7, Body: json.RawMessage(`{"text":"hi"}`)}
	sendAll := &Send{ID: "c-2", GID: 7, Kind: KindAtAll, Body: json.RawMessage(`[1,2]`)}
	read := &Read{GID: 7, Seq: 40}
	pull := &Pull{ID: "p-1", GID: 7, FromSeq: 10, ToSeq: 20}
	ping := &Ping{ID: "k"}
	cases := []struct {
		name string
		got  []byte
		want string
		dec  ClientFrame
	}{
		{"send", AppendSend(nil, send), `{"type":"send","id":"c-1","gid":7,"body":{"text":"hi"}}`,
			ClientFrame{Type: TypeSend, ID: "c-1", GID: 7, Kind: KindText, Body: json.RawMessage(`{"text":"hi"}`)}},
		{"send/at_all", AppendSend(nil, sendAll), `{"type":"send","id":"c-2","gid":7,"kind":"at_all","body":[1,2]}`,
			ClientFrame{Type: TypeSend, ID: "c-2", GID: 7, Kind: KindAtAll, Body: json.RawMessage(`[1,2]`)}},
		{"read", AppendRead(nil, read), `{"type":"read","gid":7,"seq":40}`,
			ClientFrame{Type: TypeRead, GID: 7, Seq: 40}},
		{"pull", AppendPull(nil, pull), `{"type":"pull","id":"p-1","gid":7,"from_seq":10,"to_seq":20}`,
			ClientFrame{Type: TypePull, ID: "p-1", GID: 7, FromSeq: 10, ToSeq: 20}},
		{"ping", AppendPing(nil, ping), `{"type":"ping","id":"k"}`, ClientFrame{Type: TypePing, ID: "k"}},
		{"ping/noid", AppendPing(nil, &Ping{}), `{"type":"ping"}`, ClientFrame{Type: TypePing}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if string(tc.got) != tc.want {
				t.Fatalf("got  %s\nwant %s", tc.got, tc.want)
			}
			f, err := DecodeClient(tc.got)
			if err != nil {
				t.Fatalf("DecodeClient: %v", err)
			}
			if !reflect.DeepEqual(f, tc.dec) {
				t.Fatalf("got %+v, want %+v", f, tc.dec)
			}
		})
	}
}

func TestAppendHTTPBodies(t *testing.T) {
	page := &MessagesPage{GID: 7, Messages: []Msg{{GID: 7, Seq: 1, From: "a", TS: 5, Body: json.RawMessage(`1`)}}, LastSeq: 9}
	got := AppendMessagesPage(nil, page)
	want := `{"gid":7,"messages":[{"gid":7,"seq":1,"from":"a","ts":5,"kind":"text","body":1}],"last_seq":9}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	var back MessagesPage
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	if back.Messages[0].Kind != KindText || back.LastSeq != 9 {
		t.Fatalf("got %+v", back)
	}

	for _, tc := range []struct {
		in   ErrorBody
		want string
	}{
		{ErrorBody{Code: CodeOverloaded, Message: "busy", RetryAfterMS: 1500},
			`{"error":{"code":"overloaded","message":"busy","retry_after_ms":1500}}`},
		{ErrorBody{Code: CodeNotFound, Message: "group not found"},
			`{"error":{"code":"not_found","message":"group not found"}}`},
	} {
		got := AppendErrorResponse(nil, &tc.in)
		if string(got) != tc.want {
			t.Fatalf("got  %s\nwant %s", got, tc.want)
		}
		var back ErrorResponse
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatal(err)
		}
		if back.Error != tc.in {
			t.Fatalf("got %+v, want %+v", back.Error, tc.in)
		}
	}
}

func TestAppendEmptyBodyIsNull(t *testing.T) {
	got := AppendMsg(nil, &Msg{GID: 1, Seq: 1, From: "a"})
	if !json.Valid(got) || !strings.HasSuffix(string(got), `"body":null}`) {
		t.Fatalf("got %s, want valid JSON ending in body null", got)
	}
}

func TestAppendStringEscaping(t *testing.T) {
	cases := []struct {
		in      string
		want    string // encoded
		decoded string // what a JSON parser reads back
	}{
		{"plain", `"plain"`, "plain"},
		{"", `""`, ""},
		{`q"uote`, `"q\"uote"`, `q"uote`},
		{`back\slash`, `"back\\slash"`, `back\slash`},
		{"nl\nrt\r\ttab", `"nl\nrt\r\ttab"`, "nl\nrt\r\ttab"},
		{"\x00\x01\x1f\x7f", `"\u0000\u0001\u001f` + "\x7f" + `"`, "\x00\x01\x1f\x7f"},
		{"\b\f", `"\u0008\u000c"`, "\b\f"},
		{"héllo 世界 🎉", `"héllo 世界 🎉"`, "héllo 世界 🎉"},
		{"bad\xffutf8", `"bad\ufffdutf8"`, "bad\ufffdutf8"},
		{"trunc\xe4\xb8", `"trunc\ufffd\ufffd"`, "trunc\ufffd\ufffd"},
		{"ls\u2028ps\u2029", `"ls\u2028ps\u2029"`, "ls\u2028ps\u2029"},
		{"</script>&", `"</script>&"`, "</script>&"},
	}
	for _, tc := range cases {
		got := appendString(nil, tc.in)
		if string(got) != tc.want {
			t.Errorf("appendString(%q): got %s, want %s", tc.in, got, tc.want)
			continue
		}
		if !json.Valid(got) || !utf8.Valid(got) {
			t.Errorf("appendString(%q) = %s: not valid JSON/UTF-8", tc.in, got)
		}
		var back string
		if err := json.Unmarshal(got, &back); err != nil || back != tc.decoded {
			t.Errorf("appendString(%q) read back %q (%v), want %q", tc.in, back, err, tc.decoded)
		}
		// Our own unquote agrees with encoding/json.
		if u := unquote(got); u != tc.decoded {
			t.Errorf("unquote(%s) = %q, want %q", got, u, tc.decoded)
		}
	}
}

// TestHostileUIDInFrames checks that uids from tokens (arbitrary strings)
// cannot break out of their field.
func TestHostileUIDInFrames(t *testing.T) {
	uid := `x","type":"ack","gid":1,"seq":9,"evil":"` + "\x00\xff\u2028"
	got := AppendMsg(nil, &Msg{GID: 3, Seq: 4, From: uid, Body: json.RawMessage(`{}`)})
	f, err := DecodeServer(got)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := f.(*Msg)
	if !ok {
		t.Fatalf("got %T, want *Msg", f)
	}
	want := strings.ToValidUTF8(uid, "\ufffd")
	if m.From != want || m.GID != 3 || m.Seq != 4 {
		t.Fatalf("got from=%q gid=%d seq=%d, want from=%q gid=3 seq=4", m.From, m.GID, m.Seq, want)
	}
}

// TestAppendMessagesWithin: a page holds the longest prefix of its
// messages whose frame, with room for its tail, fits the budget; at the
// exact edge the last message is in, one byte less and it is out (and
// next_seq points at it); one message is always written; both the frame
// and the HTTP page decode back with next_seq.
func TestAppendMessagesWithin(t *testing.T) {
	var msgs []Msg
	for i := range 10 {
		msgs = append(msgs, Msg{GID: 7, Seq: int64(40 + i), From: "a\u2028b", TS: 5, Body: json.RawMessage(`"` + strings.Repeat("x", 100*i) + `"`)})
	}
	m := &Messages{ID: "p-1", GID: 7, Messages: msgs, LastSeq: 60}
	full := AppendMessages(nil, m)
	if got, n := AppendMessagesWithin(nil, m, 0); n != 10 || string(got) != string(full) {
		t.Fatalf("no budget: got %d messages", n)
	}
	// edge(k) is the smallest budget that holds the first k messages.
	edge := func(k int) int {
		frame := AppendMessages(nil, &Messages{ID: m.ID, GID: m.GID, Messages: msgs[:k], LastSeq: m.LastSeq})
		tail := len(`],"last_seq":60}`)
		return len(frame) - tail + pageTailMax
	}
	for k := 1; k <= 10; k++ {
		for _, tc := range []struct {
			budget, want int
		}{{edge(k), k}, {edge(k) - 1, max(k-1, 1)}, {edge(k) + 1, k}} {
			got, n := AppendMessagesWithin([]byte("prefix"), m, tc.budget)
			if n != tc.want {
				t.Fatalf("budget %d (edge of %d): got %d messages, want %d", tc.budget, k, n, tc.want)
			}
			frame := got[len("prefix"):]
			if n > 1 && len(frame) > tc.budget {
				t.Fatalf("budget %d: frame of %d bytes", tc.budget, len(frame))
			}
			f, err := DecodeServer(frame)
			if err != nil {
				t.Fatalf("budget %d: %v", tc.budget, err)
			}
			back := f.(*Messages)
			wantNext := int64(0)
			if n < 10 {
				wantNext = msgs[n].Seq
			}
			if len(back.Messages) != n || back.NextSeq != wantNext || back.LastSeq != 60 {
				t.Fatalf("budget %d: decoded %d messages, next_seq %d, last_seq %d; want %d, %d, 60", tc.budget, len(back.Messages), back.NextSeq, back.LastSeq, n, wantNext)
			}
		}
	}
	// A next_seq the caller knows (the store cut the page) is kept when
	// everything fits, and replaced when the budget cuts sooner.
	m.NextSeq = 50
	if got, _ := AppendMessagesWithin(nil, m, 0); !strings.HasSuffix(string(got), `,"last_seq":60,"next_seq":50}`) {
		t.Fatalf("got tail %s", got[len(got)-40:])
	}
	page := &MessagesPage{GID: 7, Messages: msgs, LastSeq: 60, NextSeq: 50}
	got, n := AppendMessagesPageWithin(nil, page, 1)
	var back MessagesPage
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	if n != 1 || len(back.Messages) != 1 || back.NextSeq != 41 {
		t.Fatalf("HTTP page of budget 1: got %d messages, next_seq %d; want 1, 41", len(back.Messages), back.NextSeq)
	}
}

// TestAppendBatchWithin: consecutive calls split a batch into frames of at
// most the budget (one message each at least), which decode back to every
// message once, in order; without a budget the frame equals AppendBatch's.
func TestAppendBatchWithin(t *testing.T) {
	var msgs []Msg
	for i := range 30 {
		msgs = append(msgs, Msg{GID: 7, Seq: int64(i + 1), From: "a", TS: 5, Body: json.RawMessage(`"` + strings.Repeat("x", 50*i) + `"`)})
	}
	b := &Batch{GID: 7, Messages: msgs}
	if got, n := AppendBatchWithin(nil, b, 0); n != 30 || string(got) != string(AppendBatch(nil, b)) {
		t.Fatalf("no budget: got %d messages", n)
	}
	for _, budget := range []int{1, 500, 1000, 4000, 100000} {
		var seqs []int64
		for rest := msgs; len(rest) > 0; {
			got, n := AppendBatchWithin(nil, &Batch{GID: 7, Messages: rest}, budget)
			if n < 1 || (n > 1 && len(got) > budget) {
				t.Fatalf("budget %d: frame of %d bytes with %d messages", budget, len(got), n)
			}
			if n < len(rest) && len(got)+len(AppendMsgObject(nil, &rest[n]))+1 <= budget {
				t.Fatalf("budget %d: frame of %d bytes stopped before a message that fits", budget, len(got))
			}
			f, err := DecodeServer(got)
			if err != nil {
				t.Fatalf("budget %d: %v", budget, err)
			}
			for _, m := range f.(*Batch).Messages {
				seqs = append(seqs, m.Seq)
			}
			rest = rest[n:]
		}
		for i, s := range seqs {
			if s != int64(i+1) || len(seqs) != 30 {
				t.Fatalf("budget %d: decoded seqs %v, want 1..30", budget, seqs)
			}
		}
	}
}
