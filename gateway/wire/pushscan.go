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
	typ, first, err := scanType(&s)
	if err != nil {
		return "", err
	}
	if typ != TypeMsg && typ != TypeBatch && typ != TypeSummary {
		return typ, nil
	}
	if !first { // "type" was not the first key: read the frame again
		s = scanner{data: frame}
		if err := s.beginObject(); err != nil {
			return typ, toDecodeError(&s, err, typ)
		}
	}
	if err := scanPushFields(&s, typ, !first, sink); err != nil {
		return typ, toDecodeError(&s, err, typ)
	}
	return typ, nil
}

// scanType reads the frame's "type". When it is the first key (as the
// encoders write it) s is left after it and first is true; otherwise the
// frame was read as far as the key.
func scanType(s *scanner) (typ string, first bool, err error) {
	fail := func() (string, bool, error) {
		return "", false, &DecodeError{Reason: s.why, Offset: s.errPos, Err: ErrSyntax}
	}
	if s.beginObject() != nil {
		return fail()
	}
	for n := 0; ; n++ {
		key, ok, err := s.objectNext(n)
		if err != nil {
			return fail()
		}
		if !ok {
			return "", false, &DecodeError{Field: "type", Reason: "required", Offset: -1, Err: ErrInvalidField}
		}
		raw, err := s.value()
		if err != nil {
			return fail()
		}
		if string(canonKey(key)) != "type" {
			continue
		}
		if raw[0] != '"' {
			return "", false, &DecodeError{Field: "type", Reason: "must be a string", Offset: -1, Err: ErrInvalidField}
		}
		return internType(raw), n == 0, nil
	}
}

// scanPushFields reads the members of a push frame whose '{' (and, unless
// fromStart, whose first member, the type) was consumed.
func scanPushFields(s *scanner, typ string, fromStart bool, sink MsgSink) error {
	n := 1
	if fromStart {
		n = 0
	}
	var gid, seq int64
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
			gid, err = s.scanInt("gid")
		case "seq":
			if typ == TypeMsg {
				seq, err = s.scanInt("seq")
			} else {
				_, err = s.value()
			}
		case "body":
			if typ == TypeMsg {
				body, err = s.value()
			} else {
				_, err = s.value()
			}
		case "messages":
			if typ == TypeBatch {
				err = s.scanMsgs(gid, sink)
			} else {
				_, err = s.value()
			}
		case "first":
			if typ == TypeSummary {
				err = s.scanMsg(gid, "first.", sink)
			} else {
				_, err = s.value()
			}
		default:
			_, err = s.value()
		}
		if err != nil {
			return err
		}
	}
	if !s.eof() {
		return s.fail("data after the object")
	}
	if typ == TypeMsg {
		if seq <= 0 {
			return &fieldErr{"seq", "must be a positive integer"}
		}
		sink.PushedMsg(gid, seq, body)
	}
	return nil
}

// scanInt reads an integer value; field names it in the error.
func (s *scanner) scanInt(field string) (int64, error) {
	v, err := s.intValue()
	if err == errNotInt {
		return 0, &fieldErr{field, "must be an integer"}
	}
	return v, err
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
	if err := s.beginArray(); err != nil {
		return err
	}
	for n := 0; ; n++ {
		ok, err := s.arrayNext(n)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		if err := s.scanMsg(gid, "messages[].", sink); err != nil {
			return err
		}
	}
}

// scanMsg reads one message object and hands it to sink; gid is the
// frame's, used when the message has none. prefix names the field in
// errors.
func (s *scanner) scanMsg(gid int64, prefix string, sink MsgSink) error {
	if err := s.beginObject(); err != nil {
		return err
	}
	var seq int64
	var body []byte
	for n := 0; ; n++ {
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
