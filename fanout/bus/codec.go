package bus

import (
	"encoding/binary"
	"math"
	"time"
	"unsafe"

	"github.com/fanfare-im/fanfare/store"
)

// Wire format of one published payload, all integers varint unless said.
// The first byte is the frame type: 3, a message batch (published on the
// group's channel), or 4, a membership change (published on ControlGID).
// (Types 1 and 2 were the same frames without the membership version: a
// node of another release drops them as corrupt, counted, instead of
// misreading them.) A message batch:
//
//	byte     frame type (3)
//	uint32   message count, little endian (patched in place when Publish
//	         coalesces into a pending payload)
//	uint64   membership version, little endian: the group's
//	         (store.AppendResult.MemberVersion) when the last message was
//	         stored (patched in place too, to the highest)
//	uvarint  len(origin), origin bytes
//	varint   gid
//	count x record:
//	  varint   seq
//	  varint   created_at, unix milliseconds
//	  byte     kind: 0 text, 1 at_all, 2 other (uvarint len + bytes follow)
//	  uvarint  len(sender), sender
//	  uvarint  len(client_msg_id), client_msg_id
//	  uvarint  len(body), body (raw JSON)
//
// Records are self-contained, so appending records to a pending payload
// and patching the count is the whole cost of coalescing.
//
// A membership change has the same header (frame type 4, the version its
// change made), then:
//
//	byte     op: 0 members added, 1 members removed
//	count x record:
//	  uvarint  len(uid), uid
//	  added only: uvarint ordinal, varint join_seq
//
// Membership changes are never coalesced.
//
// A tail hint (Batch.Tail) is frame type 5 on the group's channel: the
// batch header with count 0 (its version the group's highest published),
// then one varint, the seq.
const (
	frameBatch      = 3
	frameMembers    = 4
	frameTail       = 5
	countOff        = 1
	versionOff      = 5
	fixedHeader     = 13 // frame type + count + version
	minRecord       = 6  // seq, ts, kind, three empty lengths
	minMemberRecord = 1  // an empty uid (removed)
	kindText        = 0
	kindAtAll       = 1
	kindOther       = 2
	opAdded         = 0
	opRemoved       = 1
)

// AppendBatch appends the encoding of one batch (origin's messages of gid,
// in seq order, stored at membership version) to dst. CreatedAt keeps
// millisecond precision.
func AppendBatch(dst []byte, origin string, gid, version int64, msgs []store.Message) []byte {
	dst = appendHeader(dst, origin, gid, version)
	start := len(dst) - headerLen(origin, gid)
	for i := range msgs {
		dst = appendRecord(dst, &msgs[i])
	}
	setCount(dst[start:], len(msgs))
	return dst
}

func headerLen(origin string, gid int64) int {
	return fixedHeader + uvarintLen(uint64(len(origin))) + len(origin) + varintLen(gid)
}

func appendHeader(dst []byte, origin string, gid, version int64) []byte {
	return appendFrameHeader(dst, frameBatch, origin, gid, version)
}

func appendFrameHeader(dst []byte, frame byte, origin string, gid, version int64) []byte {
	dst = append(dst, frame, 0, 0, 0, 0)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(version))
	dst = binary.AppendUvarint(dst, uint64(len(origin)))
	dst = append(dst, origin...)
	return binary.AppendVarint(dst, gid)
}

func setCount(p []byte, n int) { binary.LittleEndian.PutUint32(p[countOff:], uint32(n)) }

// raiseVersion sets the version of payload p to v if v is higher.
func raiseVersion(p []byte, v int64) {
	if v > int64(binary.LittleEndian.Uint64(p[versionOff:])) {
		binary.LittleEndian.PutUint64(p[versionOff:], uint64(v))
	}
}

func recordSize(m *store.Message) int {
	n := varintLen(m.Seq) + varintLen(m.CreatedAt.UnixMilli()) + 1
	switch m.Kind {
	case store.KindText, "", store.KindAtAll:
	default:
		n += uvarintLen(uint64(len(m.Kind))) + len(m.Kind)
	}
	n += uvarintLen(uint64(len(m.Sender))) + len(m.Sender)
	n += uvarintLen(uint64(len(m.ClientMsgID))) + len(m.ClientMsgID)
	n += uvarintLen(uint64(len(m.Body))) + len(m.Body)
	return n
}

func appendRecord(dst []byte, m *store.Message) []byte {
	dst = binary.AppendVarint(dst, m.Seq)
	dst = binary.AppendVarint(dst, m.CreatedAt.UnixMilli())
	switch m.Kind {
	case store.KindText, "":
		dst = append(dst, kindText)
	case store.KindAtAll:
		dst = append(dst, kindAtAll)
	default:
		dst = append(dst, kindOther)
		dst = appendString(dst, m.Kind)
	}
	dst = appendString(dst, m.Sender)
	dst = appendString(dst, m.ClientMsgID)
	dst = binary.AppendUvarint(dst, uint64(len(m.Body)))
	return append(dst, m.Body...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// header is the decoded fixed part of a payload; origin aliases the payload.
type header struct {
	frame   byte
	count   int
	version int64
	origin  string
	gid     int64
	n       int // header bytes
}

func decodeHeader(p []byte) (header, error) {
	var h header
	if len(p) < fixedHeader || (p[0] != frameBatch && p[0] != frameMembers && p[0] != frameTail) {
		return h, ErrCorrupt
	}
	h.frame = p[0]
	h.count = int(binary.LittleEndian.Uint32(p[countOff:]))
	h.version = int64(binary.LittleEndian.Uint64(p[versionOff:]))
	i := fixedHeader
	l, k := binary.Uvarint(p[i:])
	if k <= 0 || l > uint64(len(p)-i-k) {
		return h, ErrCorrupt
	}
	i += k
	h.origin = aliasString(p[i : i+int(l)])
	i += int(l)
	gid, k := binary.Varint(p[i:])
	if k <= 0 {
		return h, ErrCorrupt
	}
	h.gid = gid
	h.n = i + k
	// Every record takes at least minRecord bytes: a forged count cannot
	// make the decoder allocate more than the payload justifies.
	minRec := minRecord
	if h.frame == frameMembers {
		minRec = minMemberRecord
	}
	if h.count < 0 || h.count > (len(p)-h.n)/minRec || h.version < 0 || (h.frame == frameTail && h.count != 0) {
		return h, ErrCorrupt
	}
	return h, nil
}

// AppendTail appends the encoding of a tail hint of gid (seq, at
// membership version version) to dst.
func AppendTail(dst []byte, origin string, gid, version, seq int64) []byte {
	dst = appendFrameHeader(dst, frameTail, origin, gid, version)
	return binary.AppendVarint(dst, seq)
}

// DecodeBatch decodes payload p into dst, reusing dst.Msgs. It allocates
// nothing once dst.Msgs has room: Origin, the strings of every message and
// their bodies alias p, which must therefore never be modified afterwards
// (received payloads are immutable). maxMsgs bounds the message count (0 =
// no bound beyond the payload size); a larger count is ErrCorrupt.
func DecodeBatch(dst *Batch, p []byte, maxMsgs int) error {
	h, err := decodeHeader(p)
	if err != nil {
		return err
	}
	if (h.frame != frameBatch && h.frame != frameTail) || (maxMsgs > 0 && h.count > maxMsgs) {
		return ErrCorrupt
	}
	dst.GID, dst.Origin, dst.MemberVersion, dst.Tail = h.gid, h.origin, h.version, 0
	if h.frame == frameTail {
		d := decoder{p: p, i: h.n}
		seq := d.varint()
		if d.bad || d.i != len(p) || seq <= 0 {
			return ErrCorrupt
		}
		dst.Msgs, dst.Tail = dst.Msgs[:0], seq
		return nil
	}
	msgs := dst.Msgs[:0]
	if cap(msgs) < h.count {
		msgs = make([]store.Message, 0, h.count)
	}
	d := decoder{p: p, i: h.n}
	for range h.count {
		var m store.Message
		m.GID = h.gid
		m.Seq = d.varint()
		m.CreatedAt = time.UnixMilli(d.varint())
		switch d.byte() {
		case kindText:
			m.Kind = store.KindText
		case kindAtAll:
			m.Kind = store.KindAtAll
		case kindOther:
			m.Kind = aliasString(d.bytes())
		default:
			d.bad = true
		}
		m.Sender = aliasString(d.bytes())
		m.ClientMsgID = aliasString(d.bytes())
		m.Body = d.bytes()
		if d.bad {
			clear(msgs)
			dst.Msgs = msgs[:0]
			return ErrCorrupt
		}
		msgs = append(msgs, m)
	}
	dst.Msgs = msgs
	if d.i != len(p) {
		clear(msgs)
		dst.Msgs = msgs[:0]
		return ErrCorrupt
	}
	return nil
}

// AppendMembers appends the encoding of one membership change of gid,
// which made the group's membership version version, to dst: ms were
// added (UID, Ordinal and JoinSeq are encoded) or, when removed, removed
// (UID only).
func AppendMembers(dst []byte, origin string, gid, version int64, removed bool, ms []store.Member) []byte {
	start := len(dst)
	dst = appendFrameHeader(dst, frameMembers, origin, gid, version)
	dst = append(dst, memberOp(removed))
	for i := range ms {
		dst = appendMemberRecord(dst, &ms[i], removed)
	}
	setCount(dst[start:], len(ms))
	return dst
}

func memberOp(removed bool) byte {
	if removed {
		return opRemoved
	}
	return opAdded
}

func memberRecordSize(m *store.Member, removed bool) int {
	n := uvarintLen(uint64(len(m.UID))) + len(m.UID)
	if !removed {
		n += uvarintLen(uint64(m.Ordinal)) + varintLen(m.JoinSeq)
	}
	return n
}

func appendMemberRecord(dst []byte, m *store.Member, removed bool) []byte {
	dst = appendString(dst, m.UID)
	if !removed {
		dst = binary.AppendUvarint(dst, uint64(m.Ordinal))
		dst = binary.AppendVarint(dst, m.JoinSeq)
	}
	return dst
}

// DecodeMembers decodes a membership change from p into dst, reusing
// dst.Members; like DecodeBatch, Origin and the uids alias p. maxMembers
// bounds the record count (0 = no bound beyond the payload size).
func DecodeMembers(dst *MemberChange, p []byte, maxMembers int) error {
	h, err := decodeHeader(p)
	if err != nil {
		return err
	}
	if h.frame != frameMembers || (maxMembers > 0 && h.count > maxMembers) {
		return ErrCorrupt
	}
	d := decoder{p: p, i: h.n}
	op := d.byte()
	if d.bad || (op != opAdded && op != opRemoved) {
		return ErrCorrupt
	}
	removed := op == opRemoved
	ms := dst.Members[:0]
	if cap(ms) < h.count {
		ms = make([]store.Member, 0, h.count)
	}
	for range h.count {
		m := store.Member{GID: h.gid, UID: aliasString(d.bytes())}
		if !removed {
			ord := d.uvarint()
			m.Ordinal = uint32(ord)
			d.bad = d.bad || ord > math.MaxUint32
			m.JoinSeq = d.varint()
		}
		if d.bad {
			break
		}
		ms = append(ms, m)
	}
	if d.bad || d.i != len(p) {
		clear(ms)
		dst.Members = ms[:0]
		return ErrCorrupt
	}
	dst.GID, dst.Origin, dst.Version, dst.Removed, dst.Members = h.gid, h.origin, h.version, removed, ms
	return nil
}

type decoder struct {
	p   []byte
	i   int
	bad bool
}

func (d *decoder) varint() int64 {
	v, k := binary.Varint(d.p[d.i:])
	if k <= 0 {
		d.bad = true
		return 0
	}
	d.i += k
	return v
}

func (d *decoder) uvarint() uint64 {
	v, k := binary.Uvarint(d.p[d.i:])
	if k <= 0 {
		d.bad = true
		return 0
	}
	d.i += k
	return v
}

func (d *decoder) byte() byte {
	if d.i >= len(d.p) {
		d.bad = true
		return 0
	}
	d.i++
	return d.p[d.i-1]
}

// bytes reads a length-prefixed field; the result aliases p with its
// capacity clipped, so an append by the receiver cannot overwrite the next
// field.
func (d *decoder) bytes() []byte {
	l, k := binary.Uvarint(d.p[d.i:])
	if k <= 0 || l > uint64(len(d.p)-d.i-k) {
		d.bad = true
		return nil
	}
	start := d.i + k
	d.i = start + int(l)
	return d.p[start:d.i:d.i]
}

// aliasString returns b's bytes as a string without copying. b must never
// change afterwards.
func aliasString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// AliasBytes returns s's bytes as a read-only slice without copying; for
// transports whose client hands payloads over as strings.
func AliasBytes(s string) []byte {
	if s == "" {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func varintLen(v int64) int {
	u := uint64(v) << 1
	if v < 0 {
		u = ^u
	}
	return uvarintLen(u)
}
