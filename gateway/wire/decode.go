package wire

import (
	"encoding/json"
	"errors"
	"strconv"
)

// Decode failures, wrapped by *DecodeError. All of them are the client's
// fault: the server answers bad_request.
var (
	// ErrSyntax: the input is not one well-formed JSON object in UTF-8
	// (or is nested deeper than MaxDepth, or repeats a known key).
	ErrSyntax = errors.New("wire: malformed frame")
	// ErrUnknownType: the type field names no frame of this direction.
	ErrUnknownType = errors.New("wire: unknown frame type")
	// ErrInvalidField: a field is missing, has the wrong JSON type, or is
	// out of range.
	ErrInvalidField = errors.New("wire: invalid field")
)

// DecodeError describes why a frame was refused. Its Message is safe to
// send back to the client.
type DecodeError struct {
	// ID is the request's id when it could be read ("" otherwise): the
	// error frame echoes it.
	ID string
	// Type is the frame type when it could be read.
	Type string
	// Field names the offending field, "" for syntax errors.
	Field string
	// Reason says what is wrong, e.g. "must be a positive integer".
	Reason string
	// Offset is the byte offset of a syntax error, -1 otherwise.
	Offset int
	// Err is ErrSyntax, ErrUnknownType or ErrInvalidField.
	Err error
}

// Message returns the client-facing description, e.g. "gid: required".
func (e *DecodeError) Message() string {
	switch {
	case e.Err == ErrSyntax && e.Offset >= 0:
		return "malformed JSON at offset " + strconv.Itoa(e.Offset) + ": " + e.Reason
	case e.Err == ErrUnknownType:
		return "unknown frame type " + strconv.Quote(e.Type)
	case e.Field != "":
		return e.Field + ": " + e.Reason
	}
	return e.Reason
}

// Error returns "wire: <type>: <message>".
func (e *DecodeError) Error() string {
	if e.Type != "" && e.Err != ErrUnknownType {
		return "wire: " + e.Type + ": " + e.Message()
	}
	return "wire: " + e.Message()
}

// Unwrap returns the sentinel (ErrSyntax, ErrUnknownType, ErrInvalidField).
func (e *DecodeError) Unwrap() error { return e.Err }

// maxEchoType bounds how much of an unknown type string an error repeats.
const maxEchoType = 32

// clientFields holds the raw values of the known keys of a client frame.
type clientFields struct {
	typ, id, gid, seq, fromSeq, toSeq, kind, body []byte
}

// scan reads the top-level object, validating every value, and records the
// known keys. Unknown keys are skipped.
func (v *clientFields) scan(s *scanner) error {
	if err := s.beginObject(); err != nil {
		return err
	}
	for n := 0; ; n++ {
		key, ok, err := s.objectNext(n)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		var dst *[]byte
		switch string(canonKey(key)) {
		case "type":
			dst = &v.typ
		case "id":
			dst = &v.id
		case "gid":
			dst = &v.gid
		case "seq":
			dst = &v.seq
		case "from_seq":
			dst = &v.fromSeq
		case "to_seq":
			dst = &v.toSeq
		case "kind":
			dst = &v.kind
		case "body":
			dst = &v.body
		}
		if dst != nil && *dst != nil {
			return s.fail("duplicate key")
		}
		raw, err := s.value()
		if err != nil {
			return err
		}
		if dst != nil {
			*dst = raw
		}
	}
	if !s.eof() {
		return s.fail("data after the object")
	}
	return nil
}

// DecodeClient decodes one client frame (send, read, pull or ping) as the
// package documentation describes. Failures are *DecodeError. The returned
// frame's Body aliases data.
func DecodeClient(data []byte) (ClientFrame, error) {
	var v clientFields
	s := scanner{data: data, pairs: true}
	serr := v.scan(&s)

	var f ClientFrame
	id, idReason := idField(v.id)
	if idReason == "" {
		f.ID = id
	}
	if serr != nil {
		return ClientFrame{}, &DecodeError{ID: f.ID, Reason: s.why, Offset: s.errPos, Err: ErrSyntax}
	}
	fail := func(field, reason string) (ClientFrame, error) {
		return ClientFrame{}, &DecodeError{ID: f.ID, Type: f.Type, Field: field, Reason: reason, Offset: -1, Err: ErrInvalidField}
	}
	if v.typ == nil {
		return fail("type", "required")
	}
	if v.typ[0] != '"' {
		return fail("type", "must be a string")
	}
	switch string(canonKey(v.typ[1 : len(v.typ)-1])) {
	case TypeSend:
		f.Type = TypeSend
	case TypeRead:
		f.Type = TypeRead
	case TypePull:
		f.Type = TypePull
	case TypePing:
		f.Type = TypePing
	default:
		t := unquote(v.typ)
		if len(t) > maxEchoType {
			t = t[:maxEchoType]
		}
		return ClientFrame{}, &DecodeError{ID: f.ID, Type: t, Field: "type", Reason: "unknown frame type", Offset: -1, Err: ErrUnknownType}
	}
	if idReason != "" && f.Type != TypeRead {
		return fail("id", idReason)
	}

	var reason string
	switch f.Type {
	case TypePing:
		return f, nil
	case TypeSend:
		if f.ID == "" {
			return fail("id", "required")
		}
		if f.GID, reason = posInt(v.gid); reason != "" {
			return fail("gid", reason)
		}
		if f.Kind, reason = kindField(v.kind); reason != "" {
			return fail("kind", reason)
		}
		if v.body == nil {
			return fail("body", "required")
		}
		f.Body = v.body
	case TypeRead:
		if f.GID, reason = posInt(v.gid); reason != "" {
			return fail("gid", reason)
		}
		if f.Seq, reason = nonNegInt(v.seq, true); reason != "" {
			return fail("seq", reason)
		}
	case TypePull:
		if f.ID == "" {
			return fail("id", "required")
		}
		if f.GID, reason = posInt(v.gid); reason != "" {
			return fail("gid", reason)
		}
		if f.FromSeq, reason = nonNegInt(v.fromSeq, false); reason != "" {
			return fail("from_seq", reason)
		}
		if f.ToSeq, reason = nonNegInt(v.toSeq, false); reason != "" {
			return fail("to_seq", reason)
		}
		if field, reason := pullRange(f.FromSeq, f.ToSeq); reason != "" {
			return fail(field, reason)
		}
	}
	return f, nil
}

// pullRange checks a pull range whose bounds are non-negative; reason is
// "" when it is valid.
func pullRange(from, to int64) (field, reason string) {
	if to != 0 && to < from {
		return "to_seq", "must not be below from_seq"
	}
	return "", ""
}

// CheckPullRange checks a pull range from another source than a pull frame
// (the query of GET /v1/groups/{gid}/messages) with the rules of the pull
// frame, so that both paths refuse the same range with the same message:
// from_seq and to_seq non-negative, to_seq 0 or at least from_seq. The
// failure is a *DecodeError (ErrInvalidField) like DecodeClient's.
func CheckPullRange(from, to int64) error {
	field, reason := "", ""
	switch {
	case from < 0:
		field, reason = "from_seq", "must be a non-negative integer"
	case to < 0:
		field, reason = "to_seq", "must be a non-negative integer"
	default:
		field, reason = pullRange(from, to)
	}
	if reason == "" {
		return nil
	}
	return &DecodeError{Type: TypePull, Field: field, Reason: reason, Offset: -1, Err: ErrInvalidField}
}

// DecodeSendRequest decodes the body of POST /v1/groups/{gid}/messages
// with the rules of a send frame (id, body required; kind text or at_all).
// Failures are *DecodeError; the returned Body aliases data.
func DecodeSendRequest(data []byte) (SendRequest, error) {
	var v clientFields
	s := scanner{data: data, pairs: true}
	serr := v.scan(&s)
	var r SendRequest
	id, idReason := idField(v.id)
	if idReason == "" {
		r.ID = id
	}
	if serr != nil {
		return SendRequest{}, &DecodeError{ID: r.ID, Reason: s.why, Offset: s.errPos, Err: ErrSyntax}
	}
	fail := func(field, reason string) (SendRequest, error) {
		return SendRequest{}, &DecodeError{ID: r.ID, Field: field, Reason: reason, Offset: -1, Err: ErrInvalidField}
	}
	if idReason != "" {
		return fail("id", idReason)
	}
	if r.ID == "" {
		return fail("id", "required")
	}
	var reason string
	if r.Kind, reason = kindField(v.kind); reason != "" {
		return fail("kind", reason)
	}
	if v.body == nil {
		return fail("body", "required")
	}
	r.Body = v.body
	return r, nil
}

// idField decodes an id value; reason is "" when it is usable.
func idField(raw []byte) (id, reason string) {
	if raw == nil {
		return "", ""
	}
	if raw[0] != '"' {
		return "", "must be a string"
	}
	if len(raw)-2 > 6*MaxIDBytes { // cannot decode to <= MaxIDBytes
		return "", "longer than " + strconv.Itoa(MaxIDBytes) + " bytes"
	}
	id = unquote(raw)
	if len(id) > MaxIDBytes {
		return "", "longer than " + strconv.Itoa(MaxIDBytes) + " bytes"
	}
	return id, ""
}

func kindField(raw []byte) (string, string) {
	if raw == nil {
		return KindText, ""
	}
	if raw[0] == '"' {
		switch string(canonKey(raw[1 : len(raw)-1])) {
		case KindText:
			return KindText, ""
		case KindAtAll:
			return KindAtAll, ""
		}
	}
	return "", "must be \"text\" or \"at_all\""
}

func posInt(raw []byte) (int64, string) {
	if raw == nil {
		return 0, "required"
	}
	v, ok := parseInt(raw)
	if !ok || v <= 0 {
		return 0, "must be a positive integer"
	}
	return v, ""
}

func nonNegInt(raw []byte, required bool) (int64, string) {
	if raw == nil {
		if required {
			return 0, "required"
		}
		return 0, ""
	}
	v, ok := parseInt(raw)
	if !ok || v < 0 {
		return 0, "must be a non-negative integer"
	}
	return v, ""
}

// DecodeServer decodes one server frame for a client. Unknown fields are
// ignored; an unknown type yields a *DecodeError wrapping ErrUnknownType,
// which a client should skip. Body fields alias data.
func DecodeServer(data []byte) (ServerFrame, error) {
	typ, err := peekType(data)
	if err != nil {
		return nil, err
	}
	var f interface {
		ServerFrame
		decodeField(s *scanner, key []byte) (bool, error)
		check() (field, reason string)
	}
	switch typ {
	case TypeHello:
		f = new(Hello)
	case TypeAck:
		f = new(Ack)
	case TypeMsg:
		f = new(Msg)
	case TypeBatch:
		f = new(Batch)
	case TypeSummary:
		f = new(Summary)
	case TypeDegraded:
		f = new(Degraded)
	case TypeResync:
		f = new(Resync)
	case TypeMessages:
		f = new(Messages)
	case TypePong:
		f = new(Pong)
	case TypeError:
		f = new(Error)
	case TypeQueue:
		f = new(Queue)
	case TypeGranted:
		f = new(Granted)
	case TypeRejected:
		f = new(Rejected)
	case TypePresence:
		f = new(Presence)
	default:
		if len(typ) > maxEchoType {
			typ = typ[:maxEchoType]
		}
		return nil, &DecodeError{Type: typ, Field: "type", Reason: "unknown frame type", Offset: -1, Err: ErrUnknownType}
	}
	s := scanner{data: data}
	if err := decodeObject(&s, f.decodeField); err != nil {
		return nil, toDecodeError(&s, err, typ)
	}
	if field, reason := f.check(); reason != "" {
		return nil, &DecodeError{Type: typ, Field: field, Reason: reason, Offset: -1, Err: ErrInvalidField}
	}
	return f, nil
}

// fieldErr is an invalid server-frame field found while decoding.
type fieldErr struct{ field, reason string }

func (e *fieldErr) Error() string { return e.field + ": " + e.reason }

func toDecodeError(s *scanner, err error, typ string) error {
	var fe *fieldErr
	if errors.As(err, &fe) {
		return &DecodeError{Type: typ, Field: fe.field, Reason: fe.reason, Offset: -1, Err: ErrInvalidField}
	}
	return &DecodeError{Type: typ, Reason: s.why, Offset: s.errPos, Err: ErrSyntax}
}

// peekType returns the top-level "type" of a frame. The encoders put it
// first, so the common case reads one key.
func peekType(data []byte) (string, error) {
	s := scanner{data: data}
	fail := func() (string, error) {
		return "", &DecodeError{Reason: s.why, Offset: s.errPos, Err: ErrSyntax}
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
			return "", &DecodeError{Field: "type", Reason: "required", Offset: -1, Err: ErrInvalidField}
		}
		raw, err := s.value()
		if err != nil {
			return fail()
		}
		if string(canonKey(key)) != "type" {
			continue
		}
		if raw[0] != '"' {
			return "", &DecodeError{Field: "type", Reason: "must be a string", Offset: -1, Err: ErrInvalidField}
		}
		return internType(raw), nil
	}
}

// internType returns the frame type constant for a raw JSON string, so the
// common case does not allocate.
func internType(raw []byte) string {
	switch string(raw[1 : len(raw)-1]) {
	case TypeHello:
		return TypeHello
	case TypeAck:
		return TypeAck
	case TypeMsg:
		return TypeMsg
	case TypeBatch:
		return TypeBatch
	case TypeSummary:
		return TypeSummary
	case TypeDegraded:
		return TypeDegraded
	case TypeResync:
		return TypeResync
	case TypeMessages:
		return TypeMessages
	case TypePong:
		return TypePong
	case TypeError:
		return TypeError
	case TypeQueue:
		return TypeQueue
	case TypeGranted:
		return TypeGranted
	case TypeRejected:
		return TypeRejected
	case TypePresence:
		return TypePresence
	case TypeSend:
		return TypeSend
	case TypeRead:
		return TypeRead
	case TypePull:
		return TypePull
	case TypePing:
		return TypePing
	}
	return unquote(raw)
}

// decodeObject reads one object, handing each key to field; keys field does
// not handle are skipped. Trailing data after a top-level object is an
// error.
func decodeObject(s *scanner, field func(s *scanner, key []byte) (bool, error)) error {
	top := s.depth == 0
	if err := s.beginObject(); err != nil {
		return err
	}
	for n := 0; ; n++ {
		key, ok, err := s.objectNext(n)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		handled, err := field(s, canonKey(key))
		if err != nil {
			return err
		}
		if !handled {
			if _, err := s.value(); err != nil {
				return err
			}
		}
	}
	if top && !s.eof() {
		return s.fail("data after the object")
	}
	return nil
}

func (s *scanner) intField(name string, dst *int64) (bool, error) {
	raw, err := s.value()
	if err != nil {
		return true, err
	}
	if string(raw) == "null" {
		return true, nil
	}
	v, ok := parseInt(raw)
	if !ok {
		return true, &fieldErr{name, "must be an integer"}
	}
	*dst = v
	return true, nil
}

func (s *scanner) smallIntField(name string, dst *int) (bool, error) {
	var v int64
	if _, err := s.intField(name, &v); err != nil {
		return true, err
	}
	if v < -1<<31 || v > 1<<31-1 {
		return true, &fieldErr{name, "out of range"}
	}
	*dst = int(v)
	return true, nil
}

func (s *scanner) stringField(name string, dst *string) (bool, error) {
	raw, err := s.value()
	if err != nil {
		return true, err
	}
	if string(raw) == "null" {
		return true, nil
	}
	if raw[0] != '"' {
		return true, &fieldErr{name, "must be a string"}
	}
	*dst = unquote(raw)
	return true, nil
}

func (s *scanner) boolField(name string, dst *bool) (bool, error) {
	raw, err := s.value()
	if err != nil {
		return true, err
	}
	switch string(raw) {
	case "true":
		*dst = true
	case "false", "null":
		*dst = false
	default:
		return true, &fieldErr{name, "must be a boolean"}
	}
	return true, nil
}

func (s *scanner) rawField(dst *json.RawMessage) (bool, error) {
	raw, err := s.value()
	if err != nil {
		return true, err
	}
	*dst = raw
	return true, nil
}

// kind interns the two known kinds so decoding a msg does not allocate
// for them.
func (s *scanner) kindField(dst *string) (bool, error) {
	raw, err := s.value()
	if err != nil {
		return true, err
	}
	if raw[0] != '"' {
		if string(raw) == "null" {
			return true, nil
		}
		return true, &fieldErr{"kind", "must be a string"}
	}
	switch string(raw[1 : len(raw)-1]) {
	case KindText:
		*dst = KindText
	case KindAtAll:
		*dst = KindAtAll
	default:
		*dst = unquote(raw)
	}
	return true, nil
}

func (s *scanner) msgList(dst *[]Msg) (bool, error) {
	msgs := (*dst)[:0]
	null, err := s.array(true, func(n int) error {
		msgs = append(msgs, Msg{})
		m := &msgs[len(msgs)-1]
		if err := decodeObject(s, m.decodeField); err != nil {
			return err
		}
		if field, reason := m.check(); reason != "" {
			return &fieldErr{"messages[" + strconv.Itoa(n) + "]." + field, reason}
		}
		return nil
	})
	if null || err != nil {
		return true, err
	}
	if msgs == nil {
		msgs = []Msg{}
	}
	*dst = msgs
	return true, nil
}

func (h *Hello) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "uid":
		return s.stringField("uid", &h.UID)
	case "node":
		return s.stringField("node", &h.Node)
	case "heartbeat_s":
		return s.intField("heartbeat_s", &h.HeartbeatS)
	case "max_message_bytes":
		return s.intField("max_message_bytes", &h.MaxMessageBytes)
	}
	return false, nil
}

func (h *Hello) check() (string, string) {
	if h.UID == "" {
		return "uid", "required"
	}
	return "", ""
}

func (a *Ack) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "id":
		return s.stringField("id", &a.ID)
	case "gid":
		return s.intField("gid", &a.GID)
	case "seq":
		return s.intField("seq", &a.Seq)
	case "ts":
		return s.intField("ts", &a.TS)
	}
	return false, nil
}

func (a *Ack) check() (string, string) {
	switch {
	case a.ID == "":
		return "id", "required"
	case a.GID <= 0:
		return "gid", "must be a positive integer"
	case a.Seq <= 0:
		return "seq", "must be a positive integer"
	}
	return "", ""
}

func (m *Msg) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "gid":
		return s.intField("gid", &m.GID)
	case "seq":
		return s.intField("seq", &m.Seq)
	case "from":
		return s.stringField("from", &m.From)
	case "ts":
		return s.intField("ts", &m.TS)
	case "kind":
		return s.kindField(&m.Kind)
	case "body":
		return s.rawField(&m.Body)
	}
	return false, nil
}

func (m *Msg) check() (string, string) {
	switch {
	case m.GID <= 0:
		return "gid", "must be a positive integer"
	case m.Seq <= 0:
		return "seq", "must be a positive integer"
	case m.Body == nil:
		return "body", "required"
	}
	if m.Kind == "" {
		m.Kind = KindText
	}
	return "", ""
}

func (b *Batch) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "gid":
		return s.intField("gid", &b.GID)
	case "messages":
		return s.msgList(&b.Messages)
	}
	return false, nil
}

func (b *Batch) check() (string, string) {
	if b.GID <= 0 {
		return "gid", "must be a positive integer"
	}
	return "", ""
}

func (m *Summary) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "gid":
		return s.intField("gid", &m.GID)
	case "count":
		return s.intField("count", &m.Count)
	case "last_seq":
		return s.intField("last_seq", &m.LastSeq)
	case "first":
		if err := decodeObject(s, m.First.decodeField); err != nil {
			return true, err
		}
		if field, reason := m.First.check(); reason != "" {
			return true, &fieldErr{"first." + field, reason}
		}
		return true, nil
	}
	return false, nil
}

func (m *Summary) check() (string, string) {
	switch {
	case m.GID <= 0:
		return "gid", "must be a positive integer"
	case m.First.Body == nil: // decodeField checked a present first
		return "first", "required"
	}
	return "", ""
}

func (d *Degraded) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "gid":
		return s.intField("gid", &d.GID)
	case "level":
		return s.smallIntField("level", &d.Level)
	}
	return false, nil
}

func (d *Degraded) check() (string, string) {
	if d.Level < 0 || d.Level > MaxLevel {
		return "level", "out of range"
	}
	return "", ""
}

func (r *Resync) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "gid":
		return s.intField("gid", &r.GID)
	case "last_seq":
		return s.intField("last_seq", &r.LastSeq)
	}
	return false, nil
}

func (r *Resync) check() (string, string) {
	if r.GID <= 0 {
		return "gid", "must be a positive integer"
	}
	return "", ""
}

func (m *Messages) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "id":
		return s.stringField("id", &m.ID)
	case "gid":
		return s.intField("gid", &m.GID)
	case "messages":
		return s.msgList(&m.Messages)
	case "last_seq":
		return s.intField("last_seq", &m.LastSeq)
	case "next_seq":
		return s.intField("next_seq", &m.NextSeq)
	}
	return false, nil
}

func (m *Messages) check() (string, string) {
	if m.GID <= 0 {
		return "gid", "must be a positive integer"
	}
	return "", ""
}

func (p *Pong) decodeField(s *scanner, key []byte) (bool, error) {
	if string(key) == "id" {
		return s.stringField("id", &p.ID)
	}
	return false, nil
}

func (p *Pong) check() (string, string) { return "", "" }

func (e *Error) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "id":
		return s.stringField("id", &e.ID)
	case "code":
		return s.stringField("code", &e.Code)
	case "message":
		return s.stringField("message", &e.Message)
	case "retry_after_ms":
		return s.intField("retry_after_ms", &e.RetryAfterMS)
	}
	return false, nil
}

func (e *Error) check() (string, string) {
	if e.Code == "" {
		return "code", "required"
	}
	return "", ""
}

func (q *Queue) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "room":
		return s.stringField("room", &q.Room)
	case "status":
		return s.stringField("status", &q.Status)
	case "position":
		return s.intField("position", &q.Position)
	case "ahead":
		return s.intField("ahead", &q.Ahead)
	case "total":
		return s.intField("total", &q.Total)
	case "eta_s":
		var v int64 = -1
		s.ws()
		if s.pos < len(s.data) && s.data[s.pos] == 'n' {
			_, err := s.literal("null")
			return true, err
		}
		if _, err := s.intField("eta_s", &v); err != nil {
			return true, err
		}
		q.ETAS = &v
		return true, nil
	case "vip_ahead_notice":
		return s.boolField("vip_ahead_notice", &q.VIPAheadNotice)
	case "local":
		return s.boolField("local", &q.Local)
	case "starts_at":
		return s.intField("starts_at", &q.StartsAt)
	case "starts_in_s":
		var v int64
		if _, err := s.intField("starts_in_s", &v); err != nil {
			return true, err
		}
		q.StartsInS = &v
		return true, nil
	}
	return false, nil
}

func (q *Queue) check() (string, string) {
	if q.Room == "" {
		return "room", "required"
	}
	return "", ""
}

func (g *Granted) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "room":
		return s.stringField("room", &g.Room)
	case "access_token":
		return s.stringField("access_token", &g.AccessToken)
	case "expires_at":
		return s.intField("expires_at", &g.ExpiresAt)
	case "redirect_url":
		return s.stringField("redirect_url", &g.RedirectURL)
	}
	return false, nil
}

func (g *Granted) check() (string, string) {
	if g.AccessToken == "" {
		return "access_token", "required"
	}
	return "", ""
}

func (r *Rejected) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "room":
		return s.stringField("room", &r.Room)
	case "code":
		return s.stringField("code", &r.Code)
	case "retry_after_ms":
		return s.intField("retry_after_ms", &r.RetryAfterMS)
	}
	return false, nil
}

func (r *Rejected) check() (string, string) {
	if r.Code == "" {
		return "code", "required"
	}
	return "", ""
}
