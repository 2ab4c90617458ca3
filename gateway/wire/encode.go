package wire

import (
	"strconv"
	"unicode/utf8"
)

// The Append functions encode one frame (with its "type") and append it to
// dst. They allocate only when dst lacks capacity. Raw JSON fields (Body)
// are copied verbatim and must be valid JSON; an empty Body is written as
// null so the output stays valid.

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD;
// control characters, '"', '\\', U+2028 and U+2029 are escaped.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendRaw appends a raw JSON value, or null when it is empty.
func appendRaw(dst, raw []byte) []byte {
	if len(raw) == 0 {
		return append(dst, "null"...)
	}
	return append(dst, raw...)
}

// field helpers: each writes `,"name":value`; names are constants that need
// no escaping.

func appendIntField(dst []byte, name string, v int64) []byte {
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return strconv.AppendInt(dst, v, 10)
}

func appendStringField(dst []byte, name, v string) []byte {
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return appendString(dst, v)
}

func appendKind(dst []byte, kind string) []byte {
	if kind == "" {
		kind = KindText
	}
	return appendStringField(dst, "kind", kind)
}

// appendMsgFields writes the fields of a msg after its opening brace and
// optional type (with a leading comma unless first).
func appendMsgFields(dst []byte, m *Msg) []byte {
	dst = appendIntField(dst, "gid", m.GID)
	dst = appendIntField(dst, "seq", m.Seq)
	dst = appendStringField(dst, "from", m.From)
	dst = appendIntField(dst, "ts", m.TS)
	dst = appendKind(dst, m.Kind)
	dst = append(dst, `,"body":`...)
	dst = appendRaw(dst, m.Body)
	return append(dst, '}')
}

// AppendMsgObject appends m as a msg object without "type", the element of
// batch, messages and the HTTP message lists.
func AppendMsgObject(dst []byte, m *Msg) []byte {
	dst = append(dst, `{"gid":`...)
	dst = strconv.AppendInt(dst, m.GID, 10)
	dst = appendIntField(dst, "seq", m.Seq)
	dst = appendStringField(dst, "from", m.From)
	dst = appendIntField(dst, "ts", m.TS)
	dst = appendKind(dst, m.Kind)
	dst = append(dst, `,"body":`...)
	dst = appendRaw(dst, m.Body)
	return append(dst, '}')
}

func appendMsgList(dst []byte, msgs []Msg) []byte {
	dst = append(dst, '[')
	for i := range msgs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendMsgObject(dst, &msgs[i])
	}
	return append(dst, ']')
}

// AppendMsg appends the msg frame of m.
func AppendMsg(dst []byte, m *Msg) []byte {
	dst = append(dst, `{"type":"msg"`...)
	return appendMsgFields(dst, m)
}

// AppendBatch appends the batch frame of b.
func AppendBatch(dst []byte, b *Batch) []byte {
	dst = append(dst, `{"type":"batch","gid":`...)
	dst = strconv.AppendInt(dst, b.GID, 10)
	dst = append(dst, `,"messages":`...)
	dst = appendMsgList(dst, b.Messages)
	return append(dst, '}')
}

// AppendBatchWithin appends the batch frame of the longest prefix of
// b.Messages whose frame stays within budget bytes (0 = no bound), and
// always at least one message; it returns how many it wrote. A merge
// window of large messages is pushed as several such frames, so that no
// single push passes a connection's outbound bound.
func AppendBatchWithin(dst []byte, b *Batch, budget int) ([]byte, int) {
	start := len(dst)
	dst = append(dst, `{"type":"batch","gid":`...)
	dst = strconv.AppendInt(dst, b.GID, 10)
	dst = append(dst, `,"messages":`...)
	dst, n := appendMsgListWithin(dst, start, b.Messages, budget, 2) // "]}"
	return append(dst, ']', '}'), n
}

// appendMsgListWithin writes "[" and the longest prefix of msgs (at least
// one message) that keeps the frame started at dst[start] within budget
// bytes (0 = no bound) once tail more bytes follow; the caller closes the
// list. It returns how many messages it wrote.
func appendMsgListWithin(dst []byte, start int, msgs []Msg, budget, tail int) ([]byte, int) {
	dst = append(dst, '[')
	for i := range msgs {
		mark := len(dst)
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendMsgObject(dst, &msgs[i])
		if i > 0 && budget > 0 && len(dst)-start+tail > budget {
			return dst[:mark], i
		}
	}
	return dst, len(msgs)
}

// AppendSummary appends the summary frame of m.
func AppendSummary(dst []byte, m *Summary) []byte {
	dst = append(dst, `{"type":"summary","gid":`...)
	dst = strconv.AppendInt(dst, m.GID, 10)
	dst = appendIntField(dst, "count", m.Count)
	dst = append(dst, `,"first":`...)
	dst = AppendMsgObject(dst, &m.First)
	dst = appendIntField(dst, "last_seq", m.LastSeq)
	return append(dst, '}')
}

// AppendAck appends the ack frame of a.
func AppendAck(dst []byte, a *Ack) []byte {
	dst = append(dst, `{"type":"ack"`...)
	dst = appendStringField(dst, "id", a.ID)
	dst = appendIntField(dst, "gid", a.GID)
	dst = appendIntField(dst, "seq", a.Seq)
	dst = appendIntField(dst, "ts", a.TS)
	return append(dst, '}')
}

// AppendHello appends the hello frame of h.
func AppendHello(dst []byte, h *Hello) []byte {
	dst = append(dst, `{"type":"hello"`...)
	dst = appendStringField(dst, "uid", h.UID)
	dst = appendStringField(dst, "node", h.Node)
	dst = appendIntField(dst, "heartbeat_s", h.HeartbeatS)
	dst = appendIntField(dst, "max_message_bytes", h.MaxMessageBytes)
	return append(dst, '}')
}

// AppendDegraded appends the degraded frame of d; gid is omitted when 0
// (node-wide).
func AppendDegraded(dst []byte, d *Degraded) []byte {
	dst = append(dst, `{"type":"degraded"`...)
	if d.GID != 0 {
		dst = appendIntField(dst, "gid", d.GID)
	}
	dst = appendIntField(dst, "level", int64(d.Level))
	return append(dst, '}')
}

// AppendResync appends the resync frame of r.
func AppendResync(dst []byte, r *Resync) []byte {
	dst = append(dst, `{"type":"resync","gid":`...)
	dst = strconv.AppendInt(dst, r.GID, 10)
	dst = appendIntField(dst, "last_seq", r.LastSeq)
	return append(dst, '}')
}

// AppendMessages appends the messages frame (the answer to a pull) of m;
// next_seq is omitted when 0.
func AppendMessages(dst []byte, m *Messages) []byte {
	dst, _ = AppendMessagesWithin(dst, m, 0)
	return dst
}

// AppendMessagesWithin appends the messages frame of m holding the longest
// prefix of m.Messages that keeps the frame within budget bytes (0 = no
// bound), and always at least one message, so that a client paging through
// a range always progresses. It returns how many messages it wrote. When
// it left messages out, next_seq is the seq after the last one written;
// otherwise it is m.NextSeq.
func AppendMessagesWithin(dst []byte, m *Messages, budget int) ([]byte, int) {
	start := len(dst)
	dst = append(dst, `{"type":"messages"`...)
	dst = appendStringField(dst, "id", m.ID)
	dst = appendIntField(dst, "gid", m.GID)
	dst = append(dst, `,"messages":`...)
	return appendPageTail(dst, start, m.Messages, m.LastSeq, m.NextSeq, budget)
}

// pageTailMax is the most bytes appendPageTail writes after the list of
// messages: `]`, last_seq, next_seq and `}`.
const pageTailMax = len(`],"last_seq":`) + 20 + len(`,"next_seq":`) + 20 + 1

// appendPageTail writes the message list of a page whose frame started at
// dst[start], then last_seq, next_seq (when not 0) and the closing brace,
// keeping the frame within budget bytes (0 = no bound) as AppendMessagesWithin
// describes.
func appendPageTail(dst []byte, start int, msgs []Msg, lastSeq, nextSeq int64, budget int) ([]byte, int) {
	dst, n := appendMsgListWithin(dst, start, msgs, budget, pageTailMax)
	if n < len(msgs) {
		nextSeq = msgs[n-1].Seq + 1
	}
	dst = append(dst, ']')
	dst = appendIntField(dst, "last_seq", lastSeq)
	if nextSeq != 0 {
		dst = appendIntField(dst, "next_seq", nextSeq)
	}
	return append(dst, '}'), n
}

// AppendPong appends the pong frame of p; id is omitted when "".
func AppendPong(dst []byte, p *Pong) []byte {
	dst = append(dst, `{"type":"pong"`...)
	if p.ID != "" {
		dst = appendStringField(dst, "id", p.ID)
	}
	return append(dst, '}')
}

// AppendError appends the error frame of e; id is omitted when "" and
// retry_after_ms when 0.
func AppendError(dst []byte, e *Error) []byte {
	dst = append(dst, `{"type":"error"`...)
	if e.ID != "" {
		dst = appendStringField(dst, "id", e.ID)
	}
	dst = appendStringField(dst, "code", e.Code)
	dst = appendStringField(dst, "message", e.Message)
	if e.RetryAfterMS != 0 {
		dst = appendIntField(dst, "retry_after_ms", e.RetryAfterMS)
	}
	return append(dst, '}')
}

// AppendQueue appends the queue frame of q; eta_s is omitted when q.ETAS
// is nil (paused). With status scheduled it has total, starts_at and
// starts_in_s instead of a position.
func AppendQueue(dst []byte, q *Queue) []byte {
	dst = append(dst, `{"type":"queue"`...)
	dst = appendStringField(dst, "room", q.Room)
	dst = appendStringField(dst, "status", q.Status)
	if q.Status == QueueScheduled {
		dst = appendIntField(dst, "total", q.Total)
		dst = appendIntField(dst, "starts_at", q.StartsAt)
		if q.StartsInS != nil {
			dst = appendIntField(dst, "starts_in_s", *q.StartsInS)
		}
		return append(dst, '}')
	}
	dst = appendIntField(dst, "position", q.Position)
	dst = appendIntField(dst, "ahead", q.Ahead)
	dst = appendIntField(dst, "total", q.Total)
	if q.ETAS != nil {
		dst = appendIntField(dst, "eta_s", *q.ETAS)
	}
	if q.VIPAheadNotice {
		dst = append(dst, `,"vip_ahead_notice":true`...)
	} else {
		dst = append(dst, `,"vip_ahead_notice":false`...)
	}
	if q.Local {
		dst = append(dst, `,"local":true`...)
	}
	return append(dst, '}')
}

// AppendGranted appends the granted frame of g.
func AppendGranted(dst []byte, g *Granted) []byte {
	dst = append(dst, `{"type":"granted"`...)
	dst = appendStringField(dst, "room", g.Room)
	dst = appendStringField(dst, "access_token", g.AccessToken)
	dst = appendIntField(dst, "expires_at", g.ExpiresAt)
	return append(dst, '}')
}

// AppendRejected appends the rejected frame of r.
func AppendRejected(dst []byte, r *Rejected) []byte {
	dst = append(dst, `{"type":"rejected"`...)
	dst = appendStringField(dst, "room", r.Room)
	dst = appendStringField(dst, "code", r.Code)
	dst = appendIntField(dst, "retry_after_ms", r.RetryAfterMS)
	return append(dst, '}')
}

// AppendSend appends the send client frame of m; kind is omitted when "".
func AppendSend(dst []byte, m *Send) []byte {
	dst = append(dst, `{"type":"send"`...)
	dst = appendStringField(dst, "id", m.ID)
	dst = appendIntField(dst, "gid", m.GID)
	if m.Kind != "" {
		dst = appendStringField(dst, "kind", m.Kind)
	}
	dst = append(dst, `,"body":`...)
	dst = appendRaw(dst, m.Body)
	return append(dst, '}')
}

// AppendRead appends the read client frame of r.
func AppendRead(dst []byte, r *Read) []byte {
	dst = append(dst, `{"type":"read","gid":`...)
	dst = strconv.AppendInt(dst, r.GID, 10)
	dst = appendIntField(dst, "seq", r.Seq)
	return append(dst, '}')
}

// AppendPull appends the pull client frame of p.
func AppendPull(dst []byte, p *Pull) []byte {
	dst = append(dst, `{"type":"pull"`...)
	dst = appendStringField(dst, "id", p.ID)
	dst = appendIntField(dst, "gid", p.GID)
	dst = appendIntField(dst, "from_seq", p.FromSeq)
	dst = appendIntField(dst, "to_seq", p.ToSeq)
	return append(dst, '}')
}

// AppendPing appends the ping client frame of p; id is omitted when "".
func AppendPing(dst []byte, p *Ping) []byte {
	dst = append(dst, `{"type":"ping"`...)
	if p.ID != "" {
		dst = appendStringField(dst, "id", p.ID)
	}
	return append(dst, '}')
}

// AppendMessagesPage appends the JSON body of GET
// /v1/groups/{gid}/messages; next_seq is omitted when 0.
func AppendMessagesPage(dst []byte, p *MessagesPage) []byte {
	dst, _ = AppendMessagesPageWithin(dst, p, 0)
	return dst
}

// AppendMessagesPageWithin is AppendMessagesWithin for the HTTP page: the
// body holds the longest prefix of p.Messages within budget bytes (0 = no
// bound), at least one message.
func AppendMessagesPageWithin(dst []byte, p *MessagesPage, budget int) ([]byte, int) {
	start := len(dst)
	dst = append(dst, `{"gid":`...)
	dst = strconv.AppendInt(dst, p.GID, 10)
	dst = append(dst, `,"messages":`...)
	return appendPageTail(dst, start, p.Messages, p.LastSeq, p.NextSeq, budget)
}

// AppendErrorResponse appends the JSON body of an HTTP error:
// {"error":{"code","message","retry_after_ms"?}}.
func AppendErrorResponse(dst []byte, e *ErrorBody) []byte {
	dst = append(dst, `{"error":{"code":`...)
	dst = appendString(dst, e.Code)
	dst = appendStringField(dst, "message", e.Message)
	if e.RetryAfterMS != 0 {
		dst = appendIntField(dst, "retry_after_ms", e.RetryAfterMS)
	}
	return append(dst, '}', '}')
}
