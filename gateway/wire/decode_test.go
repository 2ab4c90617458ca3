package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeClientValid(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want ClientFrame
	}{
		{"send minimal", `{"type":"send","id":"a","gid":1,"body":{}}`,
			ClientFrame{Type: TypeSend, ID: "a", GID: 1, Kind: KindText, Body: json.RawMessage(`{}`)}},
		{"send any order, spaces", " {\n\"body\" : [1, {\"x\":null}] ,\"gid\":9223372036854775807, \"kind\":\"at_all\",\"id\":\"b\",\"type\":\"send\"}\t\r\n",
			ClientFrame{Type: TypeSend, ID: "b", GID: 9223372036854775807, Kind: KindAtAll, Body: json.RawMessage(`[1, {"x":null}]`)}},
		{"send kind text", `{"type":"send","id":"a","gid":1,"kind":"text","body":"s"}`,
			ClientFrame{Type: TypeSend, ID: "a", GID: 1, Kind: KindText, Body: json.RawMessage(`"s"`)}},
		{"send body null", `{"type":"send","id":"a","gid":1,"body":null}`,
			ClientFrame{Type: TypeSend, ID: "a", GID: 1, Kind: KindText, Body: json.RawMessage(`null`)}},
		{"send body number", `{"type":"send","id":"a","gid":1,"body":-1.5e+3}`,
			ClientFrame{Type: TypeSend, ID: "a", GID: 1, Kind: KindText, Body: json.RawMessage(`-1.5e+3`)}},
		{"send unknown fields ignored", `{"type":"send","id":"a","gid":1,"body":1,"extra":{"deep":[true,false]},"v":2}`,
			ClientFrame{Type: TypeSend, ID: "a", GID: 1, Kind: KindText, Body: json.RawMessage(`1`)}},
		{"send escaped id", `{"type":"send","id":"a\"\\\u00e9\ud83c\udf89","gid":1,"body":1}`,
			ClientFrame{Type: TypeSend, ID: "a\"\\é🎉", GID: 1, Kind: KindText, Body: json.RawMessage(`1`)}},
		{"send escaped key", `{"type":"send","\u0069d":"a","gid":1,"body":1}`,
			ClientFrame{Type: TypeSend, ID: "a", GID: 1, Kind: KindText, Body: json.RawMessage(`1`)}},
		{"send id at max", `{"type":"send","id":"` + strings.Repeat("x", MaxIDBytes) + `","gid":1,"body":1}`,
			ClientFrame{Type: TypeSend, ID: strings.Repeat("x", MaxIDBytes), GID: 1, Kind: KindText, Body: json.RawMessage(`1`)}},
		{"read", `{"type":"read","gid":3,"seq":0}`, ClientFrame{Type: TypeRead, GID: 3}},
		{"read ignores id", `{"type":"read","gid":3,"seq":5,"id":7}`, ClientFrame{Type: TypeRead, GID: 3, Seq: 5}},
		{"pull", `{"type":"pull","id":"p","gid":3,"from_seq":5,"to_seq":9}`,
			ClientFrame{Type: TypePull, ID: "p", GID: 3, FromSeq: 5, ToSeq: 9}},
		{"pull open range", `{"type":"pull","id":"p","gid":3,"from_seq":5}`,
			ClientFrame{Type: TypePull, ID: "p", GID: 3, FromSeq: 5}},
		{"pull to_seq 0 means latest", `{"type":"pull","id":"p","gid":3,"from_seq":5,"to_seq":0}`,
			ClientFrame{Type: TypePull, ID: "p", GID: 3, FromSeq: 5}},
		{"pull equal range", `{"type":"pull","id":"p","gid":3,"from_seq":5,"to_seq":5}`,
			ClientFrame{Type: TypePull, ID: "p", GID: 3, FromSeq: 5, ToSeq: 5}},
		{"ping", `{"type":"ping"}`, ClientFrame{Type: TypePing}},
		{"ping id", `{"type":"ping","id":"z"}`, ClientFrame{Type: TypePing, ID: "z"}},
		{"deep body at limit", `{"type":"send","id":"a","gid":1,"body":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `}`,
			ClientFrame{Type: TypeSend, ID: "a", GID: 1, Kind: KindText, Body: json.RawMessage(strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1))}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeClient([]byte(tc.in))
			if err != nil {
				t.Fatalf("DecodeClient(%s): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeClientInvalid(t *testing.T) {
	cases := []struct {
		name   string
		in     string
		err    error
		id     string // echoed id
		field  string
		reason string // substring of Message()
	}{
		{"empty", ``, ErrSyntax, "", "", "end of input"},
		{"not object", `[1]`, ErrSyntax, "", "", "expected an object"},
		{"string", `"send"`, ErrSyntax, "", "", "expected an object"},
		{"truncated", `{"type":"send","id":"a"`, ErrSyntax, "a", "", "end of input"},
		{"trailing comma", `{"type":"ping",}`, ErrSyntax, "", "", "string key"},
		{"trailing data", `{"type":"ping"} {}`, ErrSyntax, "", "", "after the object"},
		{"two objects", `{"type":"ping"}{"type":"ping"}`, ErrSyntax, "", "", "after the object"},
		{"single quotes", `{'type':'ping'}`, ErrSyntax, "", "", "string key"},
		{"bad literal", `{"type":"send","id":"a","gid":1,"body":tru}`, ErrSyntax, "a", "", "literal"},
		{"leading zero", `{"type":"send","id":"a","gid":01,"body":1}`, ErrSyntax, "a", "", "expected ','"},
		{"bad number", `{"type":"send","id":"a","gid":1,"body":1.}`, ErrSyntax, "a", "", "invalid number"},
		{"plus number", `{"type":"send","id":"a","gid":+1,"body":1}`, ErrSyntax, "a", "", "invalid character"},
		{"NaN", `{"type":"send","id":"a","gid":1,"body":NaN}`, ErrSyntax, "a", "", "invalid character"},
		{"control char", "{\"type\":\"send\",\"id\":\"a\",\"gid\":1,\"body\":\"x\ny\"}", ErrSyntax, "a", "", "control character"},
		{"bad escape", `{"type":"send","id":"a","gid":1,"body":"\x"}`, ErrSyntax, "a", "", "escape"},
		{"short unicode escape", `{"type":"send","id":"a","gid":1,"body":"\u12"}`, ErrSyntax, "a", "", "escape"},
		{"invalid utf8", "{\"type\":\"send\",\"id\":\"a\",\"gid\":1,\"body\":\"\xff\"}", ErrSyntax, "a", "", "UTF-8"},
		{"too deep", `{"type":"send","id":"a","gid":1,"body":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`, ErrSyntax, "a", "", "too deep"},
		{"duplicate key", `{"type":"send","id":"a","gid":1,"gid":2,"body":1}`, ErrSyntax, "a", "", "duplicate"},
		{"duplicate escaped key", `{"type":"send","id":"a","gid":1,"g\u0069d":2,"body":1}`, ErrSyntax, "a", "", "duplicate"},
		{"id after syntax error not seen", `{"type":"send","gid":1,"body":x,"id":"a"}`, ErrSyntax, "", "", "invalid character"},

		{"missing type", `{"id":"a","gid":1}`, ErrInvalidField, "a", "type", "required"},
		{"type not string", `{"type":1,"id":"a"}`, ErrInvalidField, "a", "type", "must be a string"},
		{"unknown type", `{"type":"shout","id":"a"}`, ErrUnknownType, "a", "type", `unknown frame type "shout"`},
		{"server type from client", `{"type":"msg","id":"a"}`, ErrUnknownType, "a", "type", "unknown frame type"},

		{"send no id", `{"type":"send","gid":1,"body":1}`, ErrInvalidField, "", "id", "required"},
		{"send empty id", `{"type":"send","id":"","gid":1,"body":1}`, ErrInvalidField, "", "id", "required"},
		{"send id number", `{"type":"send","id":5,"gid":1,"body":1}`, ErrInvalidField, "", "id", "must be a string"},
		{"send id too long", `{"type":"send","id":"` + strings.Repeat("x", MaxIDBytes+1) + `","gid":1,"body":1}`, ErrInvalidField, "", "id", "longer than"},
		{"send no gid", `{"type":"send","id":"a","body":1}`, ErrInvalidField, "a", "gid", "required"},
		{"send gid zero", `{"type":"send","id":"a","gid":0,"body":1}`, ErrInvalidField, "a", "gid", "positive"},
		{"send gid negative", `{"type":"send","id":"a","gid":-3,"body":1}`, ErrInvalidField, "a", "gid", "positive"},
		{"send gid string", `{"type":"send","id":"a","gid":"1","body":1}`, ErrInvalidField, "a", "gid", "positive"},
		{"send gid float", `{"type":"send","id":"a","gid":1.0,"body":1}`, ErrInvalidField, "a", "gid", "positive"},
		{"send gid exponent", `{"type":"send","id":"a","gid":1e3,"body":1}`, ErrInvalidField, "a", "gid", "positive"},
		{"send gid overflow", `{"type":"send","id":"a","gid":9223372036854775808,"body":1}`, ErrInvalidField, "a", "gid", "positive"},
		{"send gid null", `{"type":"send","id":"a","gid":null,"body":1}`, ErrInvalidField, "a", "gid", "positive"},
		{"send no body", `{"type":"send","id":"a","gid":1}`, ErrInvalidField, "a", "body", "required"},
		{"send bad kind", `{"type":"send","id":"a","gid":1,"kind":"shout","body":1}`, ErrInvalidField, "a", "kind", "at_all"},
		{"send kind number", `{"type":"send","id":"a","gid":1,"kind":1,"body":1}`, ErrInvalidField, "a", "kind", "at_all"},
		{"send id after bad gid still echoed", `{"type":"send","gid":-1,"body":1,"id":"late"}`, ErrInvalidField, "late", "gid", "positive"},

		{"read no gid", `{"type":"read","seq":1}`, ErrInvalidField, "", "gid", "required"},
		{"read no seq", `{"type":"read","gid":1}`, ErrInvalidField, "", "seq", "required"},
		{"read negative seq", `{"type":"read","gid":1,"seq":-1}`, ErrInvalidField, "", "seq", "non-negative"},

		{"pull no id", `{"type":"pull","gid":1,"from_seq":1,"to_seq":2}`, ErrInvalidField, "", "id", "required"},
		{"pull no gid", `{"type":"pull","id":"p","from_seq":1}`, ErrInvalidField, "p", "gid", "required"},
		{"pull negative from", `{"type":"pull","id":"p","gid":1,"from_seq":-1}`, ErrInvalidField, "p", "from_seq", "non-negative"},
		{"pull negative to", `{"type":"pull","id":"p","gid":1,"to_seq":-2}`, ErrInvalidField, "p", "to_seq", "non-negative"},
		{"pull inverted", `{"type":"pull","id":"p","gid":1,"from_seq":9,"to_seq":3}`, ErrInvalidField, "p", "to_seq", "below from_seq"},
		{"pull float seq", `{"type":"pull","id":"p","gid":1,"from_seq":1.5}`, ErrInvalidField, "p", "from_seq", "non-negative integer"},

		{"ping id object", `{"type":"ping","id":{}}`, ErrInvalidField, "", "id", "must be a string"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := DecodeClient([]byte(tc.in))
			if err == nil {
				t.Fatalf("DecodeClient(%s) = %+v, want error %v", tc.in, f, tc.err)
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("got error %v, want %v", err, tc.err)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("got %T, want *DecodeError", err)
			}
			if de.ID != tc.id {
				t.Errorf("got ID %q, want %q", de.ID, tc.id)
			}
			if de.Field != tc.field {
				t.Errorf("got Field %q, want %q", de.Field, tc.field)
			}
			if !strings.Contains(de.Message(), tc.reason) {
				t.Errorf("got Message %q, want it to contain %q", de.Message(), tc.reason)
			}
			if !strings.HasPrefix(de.Error(), "wire: ") {
				t.Errorf("got Error %q, want prefix wire:", de.Error())
			}
			if !reflect.DeepEqual(f, ClientFrame{}) {
				t.Errorf("got frame %+v with error, want zero", f)
			}
		})
	}
}

func TestDecodeSendRequest(t *testing.T) {
	got, err := DecodeSendRequest([]byte(`{"id":"h1","body":{"t":"x"},"kind":"at_all"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := SendRequest{ID: "h1", Body: json.RawMessage(`{"t":"x"}`), Kind: KindAtAll}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	got, err = DecodeSendRequest([]byte(`{"id":"h1","body":1}`))
	if err != nil || got.Kind != KindText {
		t.Fatalf("got %+v, %v; want kind text", got, err)
	}
	for _, tc := range []struct {
		in, field string
		err       error
	}{
		{`{"body":1}`, "id", ErrInvalidField},
		{`{"id":"x"}`, "body", ErrInvalidField},
		{`{"id":"x","body":1,"kind":"loud"}`, "kind", ErrInvalidField},
		{`{"id":"x","body":}`, "", ErrSyntax},
	} {
		_, err := DecodeSendRequest([]byte(tc.in))
		var de *DecodeError
		if !errors.As(err, &de) || !errors.Is(err, tc.err) || de.Field != tc.field {
			t.Errorf("DecodeSendRequest(%s): got %v, want %v on field %q", tc.in, err, tc.err, tc.field)
		}
	}
}

func TestDecodeServerErrors(t *testing.T) {
	cases := []struct {
		name  string
		in    string
		err   error
		field string
	}{
		{"unknown type", `{"type":"hologram","x":1}`, ErrUnknownType, "type"},
		{"client type", `{"type":"send","id":"a","gid":1,"body":1}`, ErrUnknownType, "type"},
		{"missing type", `{"gid":1}`, ErrInvalidField, "type"},
		{"type not string", `{"type":[]}`, ErrInvalidField, "type"},
		{"malformed", `{"type":"msg",`, ErrSyntax, ""},
		{"msg without body", `{"type":"msg","gid":1,"seq":2,"from":"a","ts":3,"kind":"text"}`, ErrInvalidField, "body"},
		{"msg gid string", `{"type":"msg","gid":"1","seq":2,"body":1}`, ErrInvalidField, "gid"},
		{"batch bad element", `{"type":"batch","gid":1,"messages":[{"gid":1,"seq":0,"body":1}]}`, ErrInvalidField, "messages[0].seq"},
		{"batch messages not array", `{"type":"batch","gid":1,"messages":{}}`, ErrSyntax, ""},
		{"summary bad first", `{"type":"summary","gid":1,"count":1,"first":{"gid":1,"seq":1},"last_seq":1}`, ErrInvalidField, "first.body"},
		{"ack without id", `{"type":"ack","gid":1,"seq":1,"ts":1}`, ErrInvalidField, "id"},
		{"degraded level range", `{"type":"degraded","level":9}`, ErrInvalidField, "level"},
		{"queue bool", `{"type":"queue","room":"r","vip_ahead_notice":1}`, ErrInvalidField, "vip_ahead_notice"},
		{"error without code", `{"type":"error","message":"x"}`, ErrInvalidField, "code"},
		{"trailing", `{"type":"pong"}x`, ErrSyntax, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := DecodeServer([]byte(tc.in))
			if err == nil {
				t.Fatalf("DecodeServer(%s) = %+v, want error", tc.in, f)
			}
			var de *DecodeError
			if !errors.As(err, &de) || !errors.Is(err, tc.err) {
				t.Fatalf("got %v, want %v", err, tc.err)
			}
			if de.Field != tc.field {
				t.Fatalf("got field %q, want %q (%v)", de.Field, tc.field, err)
			}
		})
	}
}

func TestDecodeServerLenient(t *testing.T) {
	// Type not first, unknown fields, nulls, absent kind.
	in := `{"seq":2,"x":{"y":[1,2]},"gid":1,"from":null,"type":"msg","body":{"a":1},"ts":5}`
	f, err := DecodeServer([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := &Msg{GID: 1, Seq: 2, TS: 5, Kind: KindText, Body: json.RawMessage(`{"a":1}`)}
	if !reflect.DeepEqual(f, want) {
		t.Fatalf("got %+v, want %+v", f, want)
	}
	// eta_s null is the same as absent.
	f, err = DecodeServer([]byte(`{"type":"queue","room":"r","status":"paused","eta_s":null}`))
	if err != nil {
		t.Fatal(err)
	}
	if q := f.(*Queue); q.ETAS != nil {
		t.Fatalf("got eta %v, want nil", *q.ETAS)
	}
}

func TestParseInt(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"-0", 0, true},
		{"7", 7, true},
		{"-42", -42, true},
		{"9223372036854775807", 9223372036854775807, true},
		{"-9223372036854775808", -9223372036854775808, true},
		{"9223372036854775808", 0, false},
		{"-9223372036854775809", 0, false},
		{"99999999999999999999", 0, false},
		{"1.0", 0, false},
		{"1e2", 0, false},
		{"-", 0, false},
		{"", 0, false},
	}
	for _, tc := range cases {
		got, ok := parseInt([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseInt(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestCheckPullRangeMatchesPullFrame: CheckPullRange refuses exactly the
// ranges a pull frame refuses, with the same message.
func TestCheckPullRangeMatchesPullFrame(t *testing.T) {
	for _, tc := range []struct{ from, to int64 }{
		{0, 0}, {1, 0}, {5, 5}, {5, 6}, {9, 3}, {1, 0}, {-1, 0}, {0, -1}, {-2, -3}, {3, 2},
	} {
		_, ferr := DecodeClient(fmt.Appendf(nil, `{"type":"pull","id":"p","gid":1,"from_seq":%d,"to_seq":%d}`, tc.from, tc.to))
		cerr := CheckPullRange(tc.from, tc.to)
		if (ferr == nil) != (cerr == nil) {
			t.Fatalf("[%d, %d]: frame %v, CheckPullRange %v", tc.from, tc.to, ferr, cerr)
		}
		if ferr == nil {
			continue
		}
		var fd, cd *DecodeError
		if !errors.As(ferr, &fd) || !errors.As(cerr, &cd) || fd.Message() != cd.Message() || !errors.Is(cerr, ErrInvalidField) {
			t.Fatalf("[%d, %d]: frame says %v, CheckPullRange %v", tc.from, tc.to, ferr, cerr)
		}
	}
}

// TestLoneSurrogatesRefused: a \u escape of a UTF-16 surrogate that is not
// a high one followed by a low one is refused (bad_request, a syntax error
// at its offset) in a send frame's body, anywhere in a client frame, and in
// the HTTP send body; pairs, and text that only looks like an escape, pass.
// Server frames are read leniently.
func TestLoneSurrogatesRefused(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`"\ud83c\udf89"`, true},
		{`"\uD83C\uDF89 party"`, true},
		{`"\\ud800"`, true}, // an escaped backslash, then text
		{`"\u00e9\u2028"`, true},
		{`{"\ud83c\udf89":["\ud83c\udf89"]}`, true},
		{`"\ud800"`, false},
		{`"\udbff"`, false},
		{`"\udc00"`, false},
		{`"\uDFFF"`, false},
		{`"x\ud800y"`, false},
		{`"\ud800\u0041"`, false},
		{`"\ud800\ud800"`, false},
		{`"\udf89\ud83c"`, false},
		{`"\ud83c\\udf89"`, false},
		{`"\ud83c\udf89\udf89"`, false},
		{`{"a":[1,{"b":"\ud800"}]}`, false},
		{`{"\ud800":1}`, false},
	} {
		frame := `{"type":"send","id":"s","gid":1,"body":` + tc.body + `}`
		_, err := DecodeClient([]byte(frame))
		_, herr := DecodeSendRequest([]byte(`{"id":"s","body":` + tc.body + `}`))
		for _, e := range []error{err, herr} {
			if tc.ok && e != nil {
				t.Errorf("%s: got %v, want accepted", tc.body, e)
			}
			var de *DecodeError
			if !tc.ok && (!errors.As(e, &de) || !errors.Is(e, ErrSyntax) || !strings.Contains(de.Message(), "unpaired UTF-16 surrogate")) {
				t.Errorf("%s: got %v, want a syntax error naming the unpaired surrogate", tc.body, e)
			}
		}
		if !json.Valid([]byte(frame)) {
			t.Fatalf("%s: test frame is not JSON", tc.body)
		}
	}
	if _, err := DecodeClient([]byte(`{"type":"ping","id":"\ud800"}`)); !errors.Is(err, ErrSyntax) {
		t.Errorf("ping with a lone surrogate in its id: got %v, want ErrSyntax", err)
	}
	f, err := DecodeServer([]byte(`{"type":"msg","gid":1,"seq":1,"from":"\ud800","body":"\ud800"}`))
	if err != nil || f.(*Msg).From != "\ufffd" {
		t.Errorf("server frame with a lone surrogate: got %+v, %v; want it read, from U+FFFD", f, err)
	}
}
