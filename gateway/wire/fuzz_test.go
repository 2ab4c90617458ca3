package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
)

// clientSeeds are valid and invalid client frames; the committed corpus in
// testdata/fuzz holds the same and more.
var clientSeeds = []string{
	`{"type":"send","id":"c-1","gid":7,"body":{"text":"hi"}}`,
	`{"type":"send","id":"c-2","gid":7,"kind":"at_all","body":[1,"x",null,true,{"a":-1.5e3}]}`,
	`{"type":"read","gid":7,"seq":40}`,
	`{"type":"pull","id":"p-1","gid":7,"from_seq":10,"to_seq":20}`,
	`{"type":"ping","id":"k"}`,
	`{"type":"ping"}`,
	`{"type":"send","id":"\u00e9\ud83c\udf89","gid":1,"body":"\u2028"}`,
	`{"type":"send","gid":-1,"body":1,"id":"late"}`,
	`{"type":"send","id":"a","gid":1,"gid":2,"body":1}`,
	`{"type":"send","id":"a","gid":1,"body":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
	`{"type":"nope"}`,
	`{"type":"send","id":"a","gid":1.0,"body":1}`,
	"{\"type\":\"send\",\"id\":\"a\",\"gid\":1,\"body\":\"\xff\"}",
	`{"type":"pull","id":"p","gid":1,"from_seq":9,"to_seq":3}`,
	`{"type":"send","id":"s","gid":1,"body":"\ud800"}`,
	`{"type":"send","id":"s","gid":1,"body":["\udc00\ud800"]}`,
	`{"type":"send","id":"s","gid":1,"body":{"\ud83c\udf89":"\\ud800"}}`,
	` {"type" : "ping" } `,
	`{}`,
	`[]`,
	``,
}

// FuzzDecodeClient checks that DecodeClient never panics, accepts only
// what encoding/json also accepts with the same meaning, and that accepted
// frames survive a re-encode unchanged.
func FuzzDecodeClient(f *testing.F) {
	for _, s := range clientSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeClient(data)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T is not *DecodeError", err)
			}
			if !errors.Is(err, ErrSyntax) && !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrUnknownType) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			if !json.Valid(data) && !errors.Is(err, ErrSyntax) {
				t.Fatalf("invalid JSON %q refused with %v, want ErrSyntax", data, err)
			}
			if len(de.ID) > MaxIDBytes {
				t.Fatalf("echoed id of %d bytes", len(de.ID))
			}
			_ = de.Error()
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		if unpairedSurrogate(data) {
			t.Fatalf("accepted an unpaired UTF-16 surrogate escape in %q", data)
		}
		// encoding/json reads the same values (keys match exactly, unlike
		// encoding/json's struct field matching).
		var m map[string]json.RawMessage
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatalf("accepted %q but encoding/json says %v", data, err)
		}
		var std struct {
			Type, ID, Kind           string
			GID, Seq, FromSeq, ToSeq int64
			Body                     json.RawMessage
		}
		for key, dst := range map[string]any{"type": &std.Type, "id": &std.ID, "kind": &std.Kind,
			"gid": &std.GID, "seq": &std.Seq, "from_seq": &std.FromSeq, "to_seq": &std.ToSeq} {
			if raw, ok := m[key]; ok {
				_ = json.Unmarshal(raw, dst) // type errors show up as mismatches below
			}
		}
		std.Body = m["body"]
		switch fr.Type {
		case TypeSend:
			if std.ID != fr.ID || std.GID != fr.GID || !bytes.Equal(std.Body, fr.Body) {
				t.Fatalf("send: got %+v, encoding/json %+v", fr, std)
			}
			if std.Kind != "" && std.Kind != fr.Kind {
				t.Fatalf("kind: got %q, encoding/json %q", fr.Kind, std.Kind)
			}
			if fr.GID <= 0 || fr.ID == "" || len(fr.Body) == 0 {
				t.Fatalf("accepted send violating requirements: %+v", fr)
			}
			again, err := DecodeClient(AppendSend(nil, &Send{ID: fr.ID, GID: fr.GID, Kind: fr.Kind, Body: fr.Body}))
			if err != nil || fmt.Sprint(again) != fmt.Sprint(fr) {
				t.Fatalf("re-encode: got %+v, %v; want %+v", again, err, fr)
			}
		case TypeRead:
			if std.GID != fr.GID || std.Seq != fr.Seq || fr.GID <= 0 || fr.Seq < 0 {
				t.Fatalf("read: got %+v, encoding/json %+v", fr, std)
			}
		case TypePull:
			if std.ID != fr.ID || std.GID != fr.GID || std.FromSeq != fr.FromSeq || std.ToSeq != fr.ToSeq {
				t.Fatalf("pull: got %+v, encoding/json %+v", fr, std)
			}
			if fr.ToSeq != 0 && fr.ToSeq < fr.FromSeq {
				t.Fatalf("accepted inverted range %+v", fr)
			}
			again, err := DecodeClient(AppendPull(nil, &Pull{ID: fr.ID, GID: fr.GID, FromSeq: fr.FromSeq, ToSeq: fr.ToSeq}))
			if err != nil || fmt.Sprint(again) != fmt.Sprint(fr) {
				t.Fatalf("re-encode: got %+v, %v; want %+v", again, err, fr)
			}
		case TypePing:
			if std.ID != fr.ID {
				t.Fatalf("ping id: got %q, encoding/json %q", fr.ID, std.ID)
			}
		default:
			t.Fatalf("accepted type %q", fr.Type)
		}
	})
}

// unpairedSurrogate is the fuzz target's reference: whether valid JSON
// data holds a \u escape of a surrogate that is not a high one directly
// followed by an escaped low one.
func unpairedSurrogate(data []byte) bool {
	esc := func(i int) (rune, bool) { // the \uXXXX at data[i:], if any
		if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 16)
		return rune(v), err == nil
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		r, ok := esc(i)
		switch {
		case !ok:
			i++ // another escape: skip its second byte (it may be a backslash)
		case r >= 0xd800 && r <= 0xdbff:
			if lo, ok := esc(i + 6); !ok || lo < 0xdc00 || lo > 0xdfff {
				return true
			}
			i += 11
		case r >= 0xdc00 && r <= 0xdfff:
			return true
		default:
			i += 5
		}
	}
	return false
}

// appendServerFrame encodes any server frame (test helper).
func appendServerFrame(dst []byte, f ServerFrame) []byte {
	switch f := f.(type) {
	case *Hello:
		return AppendHello(dst, f)
	case *Ack:
		return AppendAck(dst, f)
	case *Msg:
		return AppendMsg(dst, f)
	case *Batch:
		return AppendBatch(dst, f)
	case *Summary:
		return AppendSummary(dst, f)
	case *Degraded:
		return AppendDegraded(dst, f)
	case *Resync:
		return AppendResync(dst, f)
	case *Messages:
		return AppendMessages(dst, f)
	case *Pong:
		return AppendPong(dst, f)
	case *Error:
		return AppendError(dst, f)
	case *Queue:
		return AppendQueue(dst, f)
	case *Granted:
		return AppendGranted(dst, f)
	case *Rejected:
		return AppendRejected(dst, f)
	}
	panic(fmt.Sprintf("unknown frame %T", f))
}

// FuzzDecodeServer checks that DecodeServer never panics and that what it
// accepts re-encodes to valid JSON that decodes to the same frame.
func FuzzDecodeServer(f *testing.F) {
	for _, tc := range serverFrameCases() {
		f.Add(tc.enc(nil))
	}
	f.Add([]byte(`{"seq":2,"gid":1,"type":"msg","body":{"a":1},"extra":[1]}`))
	f.Add([]byte(`{"type":"queue","room":"r","status":"paused","eta_s":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeServer(data)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T is not *DecodeError", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		if unpairedSurrogate(data) {
			t.Fatalf("accepted an unpaired UTF-16 surrogate escape in %q", data)
		}
		enc := appendServerFrame(nil, fr)
		if !json.Valid(enc) {
			t.Fatalf("re-encoded to invalid JSON %s", enc)
		}
		fr2, err := DecodeServer(enc)
		if err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", enc, err)
		}
		if enc2 := appendServerFrame(nil, fr2); !bytes.Equal(enc, enc2) {
			t.Fatalf("unstable round trip:\n%s\n%s", enc, enc2)
		}
	})
}
