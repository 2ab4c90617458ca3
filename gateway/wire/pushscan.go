package wire

// MsgSink receives the messages ScanPush finds, in frame order.
type MsgSink interface {
	// PushedMsg is one pushed message: its gid (the message's own, else
	// the frame's), its seq and its raw body (nil when absent), which
	// aliases the frame.
	PushedMsg(gid, seq int64, body []byte)
}

// ScanPush reads a server frame as a receiver that only counts pushes
// needs it (a load generator's), without decoding it into structs and
// without allocating. It returns the frame's type (TypeMsg, TypeBatch,
// ...; an unknown type as it is written) and, for msg, batch and summary
// frames, hands sink each message (the msg frame itself, every element of
// messages, the summary's first) as soon as it is read, so a frame that
// turns out to be malformed may already have given some.
//
// Other frame types are returned after their "type" is read, without
// reading the rest. A push frame is read with the scanner DecodeServer
// uses (the same JSON grammar, UTF-8 and MaxDepth), but of its fields only
// gid and seq are checked: a seq must be a positive integer, a gid an
// integer. Failures are *DecodeError values, as DecodeServer's.
func ScanPush(frame []byte, sink MsgSink) (string, error) {
	s := scanner{data: frame}
	typ, first := firstType(&s)
	if !first { // the type is not the first key: find it, then start again
		var err error
		if typ, err = peekType(frame); err != nil {
			return "", err
		}
		s = scanner{data: frame}
		_ = s.beginObject() // peekType read the frame as an object
	}
	if typ != TypeMsg && typ != TypeBatch && typ != TypeSummary {
		return typ, nil
	}
	n := 0 // members read
	if first {
		n = 1
	}
	var err error
	if typ == TypeMsg { // the frame is the message with a type key
		err = s.msgMembers(0, n, "", sink)
	} else {
		err = s.windowMembers(typ, n, sink)
	}
	if err == nil && !s.eof() {
		err = s.fail("data after the object")
	}
	if err != nil {
		return typ, toDecodeError(&s, err, typ)
	}
	return typ, nil
}

// firstType reads the frame's first member when it is a string "type", as
// the encoders write every frame, leaving s after it; false otherwise.
func firstType(s *scanner) (string, bool) {
	if s.beginObject() != nil {
		return "", false
	}
	key, ok, err := s.objectNext(0)
	if err != nil || !ok || string(canonKey(key)) != "type" {
		return "", false
	}
	raw, err := s.value()
	if err != nil || raw[0] != '"' {
		return "", false
	}
	return internType(raw), true
}

// windowMembers reads the members of a batch or summary frame from the
// n-th on, handing its messages to sink.
func (s *scanner) windowMembers(typ string, n int, sink MsgSink) error {
	var gid int64
	for ; ; n++ {
		key, ok, err := s.objectNext(n)
		if err != nil || !ok {
			return err
		}
		switch k := canonKey(key); {
		case string(k) == "gid":
			if gid, err = s.intValue(); err == errNotInt {
				err = &fieldErr{"gid", "must be an integer"}
			}
		case string(k) == "messages" && typ == TypeBatch:
			err = s.scanMsgs(gid, sink)
		case string(k) == "first" && typ == TypeSummary:
			err = s.scanMsg(gid, "first.", sink)
		default:
			_, err = s.value()
		}
		if err != nil {
			return err
		}
	}
}

// errNotInt marks a well-formed value that is not an integer within int64.
var errNotInt = &fieldErr{"", "must be an integer"}

// intValue reads an integer value: errNotInt for any other value.
func (s *scanner) intValue() (int64, error) {
	raw, err := s.value()
	if err != nil {
		return 0, err
	}
	v, ok := parseInt(raw)
	if !ok {
		return 0, errNotInt
	}
	return v, nil
}

// scanMsgs reads an array of messages.
func (s *scanner) scanMsgs(gid int64, sink MsgSink) error {
	_, err := s.array(false, func(int) error { return s.scanMsg(gid, "messages[].", sink) })
	return err
}

// scanMsg reads one message object and hands it to sink; gid is the
// frame's, used when the message has none. prefix names the field in
// errors.
func (s *scanner) scanMsg(gid int64, prefix string, sink MsgSink) error {
	if err := s.beginObject(); err != nil {
		return err
	}
	return s.msgMembers(gid, 0, prefix, sink)
}

// msgMembers reads the members of a message object from the n-th on and
// hands the message to sink.
func (s *scanner) msgMembers(gid int64, n int, prefix string, sink MsgSink) error {
	var seq int64
	var body []byte
	for ; ; n++ {
		key, ok, err := s.objectNext(n)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(canonKey(key)) {
		case "gid":
			if gid, err = s.intValue(); err == errNotInt {
				err = &fieldErr{prefix + "gid", "must be an integer"}
			}
		case "seq":
			if seq, err = s.intValue(); err == errNotInt {
				err = &fieldErr{prefix + "seq", "must be an integer"}
			}
		case "body":
			body, err = s.value()
		default:
			_, err = s.value()
		}
		if err != nil {
			return err
		}
	}
	if seq <= 0 {
		return &fieldErr{prefix + "seq", "must be a positive integer"}
	}
	sink.PushedMsg(gid, seq, body)
	return nil
}

// BodyInt returns the integer value of the member key at the top level of
// body, a JSON object (a message body, as ScanPush hands it on). ok is
// false when body is not an object, has no such member, or its value is
// not an integer within int64. It does not allocate (but for keys written
// with escapes) and stops at the member.
func BodyInt(body []byte, key string) (v int64, ok bool) {
	s := scanner{data: body}
	if s.beginObject() != nil {
		return 0, false
	}
	for n := 0; ; n++ {
		k, more, err := s.objectNext(n)
		if err != nil || !more {
			return 0, false
		}
		raw, err := s.value()
		if err != nil {
			return 0, false
		}
		if string(canonKey(k)) == key {
			return parseInt(raw)
		}
	}
}
