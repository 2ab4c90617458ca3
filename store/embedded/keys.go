package embedded

import (
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// Key layout (formatVersion 1). One byte of prefix, then big-endian
// integers so that byte order is numeric order and ranges are plain
// iterator scans. Strings that are followed by more key bytes carry a
// uvarint length, so one uid's prefix never matches another uid.
//
//	g gid                          -> group record
//	m gid uid                      -> member record
//	o gid ordinal(4)               -> (empty) freed ordinal, reused smallest first
//	U len(uid) uid gid             -> (empty) uid's memberships, in gid order
//	M gid seq                      -> message record
//	i gid len(sender) sender cmid  -> seq, created_at (idempotency index)
//	u uid                          -> user record
//	c len(uid) uid gid             -> conversation: last_seq, updated_at
//	a mark gid uid                 -> (empty) an addition, in commit order (Store.MembersAdded)
//	w key                          -> waiting-room journal record (rooms.go)
//	x "format"                     -> formatVersion
//	x "gid"                        -> last assigned gid (8, big-endian)
//	x "added"                      -> last addition mark (8, big-endian)
//
// Keys added since formatVersion 1 was first written, readable by the
// older code (which ignores them): the addition index (a), its counter,
// and the addition mark at the end of a member record. This code keeps
// exactly one index key per member record with a mark (AddMembers writes
// both and the counter in one batch, MarkRead and SetMemberMuted keep the
// mark, RemoveMember deletes both), so the index holds one key per
// membership added since, read or not. The older code does not keep it:
// run on this data (a rollback), its RemoveMember leaves the key and its
// rewrites of a record drop the mark (so a later removal leaves the key
// too). Such keys never reach the feed: the older code does not move the
// counter, so their marks are at or below it, and a cursor is taken from
// the counter by the process reading the feed (cursors are not stored),
// after the older code's last write. They only take their bytes.
const (
	pGroup   = 'g'
	pMember  = 'm'
	pFreeOrd = 'o'
	pUserGrp = 'U'
	pMsg     = 'M'
	pIdem    = 'i'
	pUser    = 'u'
	pConv    = 'c'
	pAdded   = 'a'
)

var (
	metaFormatKey = []byte("xformat")
	gidCounterKey = []byte("xgid")
	addedMarkKey  = []byte("xadded")
)

// errCorrupt reports a record that does not decode.
var errCorrupt = errors.New("embedded: corrupt record")

func putI64(b []byte, v int64) []byte { return binary.BigEndian.AppendUint64(b, uint64(v)) }

func putStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func groupKey(b []byte, gid int64) []byte {
	return putI64(append(b, pGroup), gid)
}

func memberKey(b []byte, gid int64, uid string) []byte {
	return append(putI64(append(b, pMember), gid), uid...)
}

// memberPrefix is the prefix of every member key of gid.
func memberPrefix(b []byte, gid int64) []byte {
	return putI64(append(b, pMember), gid)
}

func freeOrdKey(b []byte, gid int64, ord uint32) []byte {
	return binary.BigEndian.AppendUint32(putI64(append(b, pFreeOrd), gid), ord)
}

func freeOrdPrefix(b []byte, gid int64) []byte {
	return putI64(append(b, pFreeOrd), gid)
}

func userGroupKey(b []byte, uid string, gid int64) []byte {
	return putI64(putStr(append(b, pUserGrp), uid), gid)
}

func userGroupPrefix(b []byte, uid string) []byte {
	return putStr(append(b, pUserGrp), uid)
}

func msgKey(b []byte, gid, seq int64) []byte {
	return putI64(putI64(append(b, pMsg), gid), seq)
}

func idemKey(b []byte, gid int64, sender, cmid string) []byte {
	return append(putStr(putI64(append(b, pIdem), gid), sender), cmid...)
}

func userKey(b []byte, uid string) []byte {
	return append(append(b, pUser), uid...)
}

// addedKey indexes the addition of uid to gid that got mark: the marks
// count additions under wmu, so key order is commit order.
func addedKey(b []byte, mark, gid int64, uid string) []byte {
	return append(putI64(putI64(append(b, pAdded), mark), gid), uid...)
}

func convKey(b []byte, uid string, gid int64) []byte {
	return putI64(putStr(append(b, pConv), uid), gid)
}

func convPrefix(b []byte, uid string) []byte {
	return putStr(append(b, pConv), uid)
}

// prefixEnd returns the smallest key greater than every key with prefix p
// (p is never all 0xff here: it starts with a letter).
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// Times are stored as Unix microseconds (Postgres timestamptz precision,
// so both backends return the same instants); noTime is the zero time.
const noTime = math.MinInt64

func encTime(t time.Time) int64 {
	if t.IsZero() {
		return noTime
	}
	return t.UnixMicro()
}

func decTime(v int64) time.Time {
	if v == noTime {
		return time.Time{}
	}
	return time.UnixMicro(v).UTC()
}

// reader decodes a record field by field; the first short read sets err.
type reader struct {
	b   []byte
	err error
}

func (r *reader) u8() byte {
	if len(r.b) < 1 {
		r.err = errCorrupt
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u32() uint32 {
	if len(r.b) < 4 {
		r.err = errCorrupt
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) i64() int64 {
	if len(r.b) < 8 {
		r.err = errCorrupt
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return int64(v)
}

// bytes returns a length-prefixed field without copying.
func (r *reader) bytes() []byte {
	n, k := binary.Uvarint(r.b)
	if k <= 0 || uint64(len(r.b)-k) < n {
		r.err = errCorrupt
		return nil
	}
	v := r.b[k : k+int(n)]
	r.b = r.b[k+int(n):]
	return v
}

// Group record: state(1) last_seq(8) member_count(8) next_ordinal(4)
// created_at(8) name owner.
type groupRec struct {
	store.Group
	NextOrdinal   uint32
	MemberVersion int64 // see store.Store.MembersOf
}

const (
	stActive byte = iota
	stMutedAll
	stDissolved
)

func encState(s store.GroupState) byte {
	switch s {
	case store.StateMutedAll:
		return stMutedAll
	case store.StateDissolved:
		return stDissolved
	}
	return stActive
}

func decState(b byte) store.GroupState {
	switch b {
	case stMutedAll:
		return store.StateMutedAll
	case stDissolved:
		return store.StateDissolved
	}
	return store.StateActive
}

func encGroup(b []byte, g *groupRec) []byte {
	b = append(b, encState(g.State))
	b = putI64(b, g.LastSeq)
	b = putI64(b, g.MemberCount)
	b = binary.BigEndian.AppendUint32(b, g.NextOrdinal)
	b = putI64(b, encTime(g.CreatedAt))
	b = putStr(b, g.Name)
	b = putStr(b, g.Owner)
	return putI64(b, g.MemberVersion)
}

func decGroup(gid int64, v []byte) (groupRec, error) {
	r := reader{b: v}
	var g groupRec
	g.GID = gid
	g.State = decState(r.u8())
	g.LastSeq = r.i64()
	g.MemberCount = r.i64()
	g.NextOrdinal = r.u32()
	g.CreatedAt = decTime(r.i64())
	g.Name = string(r.bytes())
	g.Owner = string(r.bytes())
	if len(r.b) > 0 { // records written before the membership version have none: 0
		g.MemberVersion = r.i64()
	}
	return g, r.err
}

// groupMemberVersion decodes only the membership version of a group
// record, without allocating (Append).
func groupMemberVersion(v []byte) (int64, error) {
	const fixed = 1 + 8 + 8 + 4 + 8 // state, last_seq, member_count, next_ordinal, created_at
	if len(v) < fixed {
		return 0, errCorrupt
	}
	r := reader{b: v[fixed:]}
	r.bytes() // name
	r.bytes() // owner
	if r.err != nil || len(r.b) == 0 {
		return 0, r.err
	}
	return r.i64(), r.err
}

// groupHead decodes only the fields Append needs, without allocating.
func groupHead(v []byte) (state byte, lastSeq int64, err error) {
	if len(v) < 9 {
		return 0, 0, errCorrupt
	}
	return v[0], int64(binary.BigEndian.Uint64(v[1:])), nil
}

// setGroupLastSeq rewrites last_seq in an encoded group record in place.
func setGroupLastSeq(v []byte, lastSeq int64) {
	binary.BigEndian.PutUint64(v[1:], uint64(lastSeq))
}

// Member record: ordinal(4) join_seq(8) last_read_seq(8) muted(1)
// joined_at(8) role [added mark(8)]. The mark (addedKey) is absent from
// records written before the feed of additions, and 0 there.
func encMember(b []byte, m *store.Member, mark int64) []byte {
	b = binary.BigEndian.AppendUint32(b, m.Ordinal)
	b = putI64(b, m.JoinSeq)
	b = putI64(b, m.LastReadSeq)
	muted := byte(0)
	if m.Muted {
		muted = 1
	}
	b = append(b, muted)
	b = putI64(b, encTime(m.JoinedAt))
	b = putStr(b, m.Role)
	if mark > 0 {
		b = putI64(b, mark)
	}
	return b
}

// memberMark reads the addition mark of an encoded member record (0 when
// it has none).
func memberMark(v []byte) (int64, error) {
	const fixed = 4 + 8 + 8 + 1 + 8 // ordinal, join_seq, last_read_seq, muted, joined_at
	if len(v) < fixed {
		return 0, errCorrupt
	}
	r := reader{b: v[fixed:]}
	r.bytes() // role
	if r.err != nil || len(r.b) == 0 {
		return 0, r.err
	}
	return r.i64(), r.err
}

func decMember(gid int64, uid string, v []byte) (store.Member, error) {
	r := reader{b: v}
	m := store.Member{GID: gid, UID: uid}
	m.Ordinal = r.u32()
	m.JoinSeq = r.i64()
	m.LastReadSeq = r.i64()
	m.Muted = r.u8() != 0
	m.JoinedAt = decTime(r.i64())
	m.Role = internRole(r.bytes())
	return m, r.err
}

// memberMuted reads the muted flag of an encoded member record.
func memberMuted(v []byte) (bool, error) {
	if len(v) < 21 {
		return false, errCorrupt
	}
	return v[20] != 0, nil
}

func internRole(b []byte) string {
	switch string(b) {
	case store.RoleMember:
		return store.RoleMember
	case store.RoleOwner:
		return store.RoleOwner
	}
	return string(b)
}

// Message record: created_at(8) kind(1) sender client_msg_id body(rest).
const (
	kText byte = iota
	kAtAll
)

func encKind(k string) byte {
	if k == store.KindAtAll {
		return kAtAll
	}
	return kText
}

func decKind(b byte) string {
	if b == kAtAll {
		return store.KindAtAll
	}
	return store.KindText
}

func encMsg(b []byte, created int64, r *store.AppendRequest) []byte {
	b = putI64(b, created)
	b = append(b, encKind(r.Kind))
	b = putStr(b, r.Sender)
	b = putStr(b, r.ClientMsgID)
	return append(b, r.Body...)
}

// Idempotency value: seq(8) created_at(8).
func encIdem(b []byte, seq, created int64) []byte {
	return putI64(putI64(b, seq), created)
}

func decIdem(v []byte) (seq int64, created time.Time, err error) {
	if len(v) < 16 {
		return 0, time.Time{}, errCorrupt
	}
	return int64(binary.BigEndian.Uint64(v)), decTime(int64(binary.BigEndian.Uint64(v[8:]))), nil
}

// User record: level(1) last_active_at(8).
func encUser(b []byte, u *store.User) []byte {
	return putI64(append(b, byte(u.Tier)), encTime(u.LastActiveAt))
}

func decUser(uid string, v []byte) (store.User, error) {
	r := reader{b: v}
	u := store.User{UID: uid}
	u.Tier = int(r.u8())
	u.LastActiveAt = decTime(r.i64())
	return u, r.err
}

// Conversation value: last_seq(8) updated_at(8).
func encConv(b []byte, lastSeq int64, updated time.Time) []byte {
	return putI64(putI64(b, lastSeq), encTime(updated))
}

func convLastSeq(v []byte) (int64, error) {
	if len(v) < 8 {
		return 0, errCorrupt
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// gidSuffix reads the big-endian gid at the end of a key.
func gidSuffix(k []byte) int64 {
	return int64(binary.BigEndian.Uint64(k[len(k)-8:]))
}

// seqSuffix is the seq of a message key.
func seqSuffix(k []byte) int64 {
	return int64(binary.BigEndian.Uint64(k[len(k)-8:]))
}
