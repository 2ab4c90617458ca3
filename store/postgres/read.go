package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fanfare-im/fanfare/store"
)

// messagesSQL reads the member's window in one statement, so last_seq,
// join_seq and the rows come from one snapshot. The LEFT JOIN keeps one row
// (with seq 0) when the window is empty; no row at all means no membership. $4 = 0 means "up to last_seq".
//
// The byte bound ($6, 0 = none) is a running sum of octet_length (which
// reads a TOASTed body's size from its pointer, without fetching it) over
// the page in seq order: a row is kept while the sum up to it stays within
// $6, and the first row always (its sum is its own size). Bodies of the
// rows cut off are never fetched.
const messagesSQL = `
SELECT g.last_seq, coalesce(x.seq, 0), coalesce(x.sender, ''), coalesce(x.client_msg_id, ''),
       coalesce(x.kind, ''), x.body, coalesce(x.created_at, 'epoch')
FROM groups g
JOIN group_members m ON m.gid = g.gid AND m.uid = $2
LEFT JOIN LATERAL (
	SELECT w.seq, w.sender, w.client_msg_id, w.kind, w.body, w.created_at FROM (
		SELECT seq, sender, client_msg_id, kind, body, created_at,
		       octet_length(body) + octet_length(sender) AS size,
		       sum(octet_length(body) + octet_length(sender)) OVER (ORDER BY seq) AS run
		FROM messages
		WHERE gid = $1
		  AND seq >= greatest($3::bigint, m.join_seq)
		  AND seq <= CASE WHEN $4::bigint = 0 THEN g.last_seq ELSE least($4::bigint, g.last_seq) END
		ORDER BY seq
		LIMIT $5
	) w
	WHERE $6::bigint = 0 OR w.run <= $6::bigint OR w.run = w.size
) x ON true
WHERE g.gid = $1
ORDER BY x.seq`

// Messages implements store.Store.
func (s *Store) Messages(ctx context.Context, gid int64, uid string, fromSeq, toSeq int64, limit, maxBytes int) ([]store.Message, int64, error) {
	limit, err := s.lim.CheckRange(fromSeq, toSeq, limit, maxBytes)
	if err != nil {
		return nil, 0, err
	}
	if !storable(uid) {
		return nil, 0, fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
	}
	rows, err := s.pool.Query(ctx, messagesSQL, gid, uid, fromSeq, toSeq, limit, maxBytes)
	if err != nil {
		return nil, 0, dbErr("messages", err)
	}
	defer rows.Close()
	var (
		msgs    []store.Message
		lastSeq int64
		member  bool
		arena   arena
	)
	raw := binaryColumns(rows.FieldDescriptions(), messagesOIDs)
	for rows.Next() {
		member = true
		var m store.Message
		if raw {
			if err := decodeMessage(rows.RawValues(), &lastSeq, &m, &arena); err != nil {
				return nil, 0, fmt.Errorf("store/postgres: messages: %w", err)
			}
		} else if err := rows.Scan(&lastSeq, &m.Seq, &m.Sender, &m.ClientMsgID, &m.Kind, &m.Body, &m.CreatedAt); err != nil {
			return nil, 0, dbErr("messages", err)
		}
		if m.Seq == 0 {
			continue
		}
		m.GID = gid
		if msgs == nil {
			msgs = make([]store.Message, 0, max(1, min(int64(limit), lastSeq-m.Seq+1)))
		}
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, dbErr("messages", err)
	}
	if !member {
		return nil, 0, fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
	}
	return msgs, lastSeq, nil
}

// Sync implements store.Store. Entries come in gid order: a keyset page
// on group_members_uid_idx (uid, gid), at most limit rows read.
func (s *Store) Sync(ctx context.Context, uid string, afterGID int64, limit int) ([]store.SyncEntry, error) {
	if err := store.ValidateSyncPage(afterGID, limit); err != nil {
		return nil, err
	}
	if !storable(uid) {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `
		SELECT m.gid, g.last_seq, m.last_read_seq,
		       greatest(g.last_seq - greatest(m.last_read_seq, m.join_seq - 1), 0)
		FROM group_members m JOIN groups g ON g.gid = m.gid
		WHERE m.uid = $1 AND m.gid > $2 ORDER BY m.gid LIMIT $3`, uid, afterGID, limit)
	if err != nil {
		return nil, dbErr("sync", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.SyncEntry, error) {
		var e store.SyncEntry
		err := r.Scan(&e.GID, &e.LastSeq, &e.LastReadSeq, &e.Unread)
		return e, err
	})
	return out, dbErr("sync", err)
}

// MarkRead implements store.Store. The UPDATE's WHERE re-checks
// last_read_seq on the locked row, so concurrent calls never move it
// backwards.
func (s *Store) MarkRead(ctx context.Context, gid int64, uid string, seq int64) error {
	if seq < 0 {
		return fmt.Errorf("%w: negative seq %d", store.ErrBadRequest, seq)
	}
	if !storable(uid) {
		return fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
	}
	var n int
	err := s.pool.QueryRow(ctx, `
		WITH t AS (
			SELECT m.gid, m.uid, least($3::bigint, g.last_seq) AS s
			FROM group_members m JOIN groups g ON g.gid = m.gid
			WHERE m.gid = $1 AND m.uid = $2
		), u AS (
			UPDATE group_members m SET last_read_seq = t.s FROM t
			WHERE m.gid = t.gid AND m.uid = t.uid AND m.last_read_seq < t.s
			RETURNING 1
		)
		SELECT count(*) FROM t`, gid, uid, seq).Scan(&n)
	if err != nil {
		return dbErr("mark read", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
	}
	return nil
}

// AdvanceConversations implements store.Store: one INSERT ... ON CONFLICT
// over the distinct member uids, in uid order (so concurrent calls lock
// rows in the same order), updating only rows that move forward.
func (s *Store) AdvanceConversations(ctx context.Context, gid int64, uids []string, lastSeq int64) error {
	if lastSeq < 0 {
		return fmt.Errorf("%w: negative last_seq %d", store.ErrBadRequest, lastSeq)
	}
	for i, u := range uids {
		if !storable(u) { // no member: drop it (copying the slice once)
			kept := slices.Clone(uids[:i])
			for _, u := range uids[i:] {
				if storable(u) {
					kept = append(kept, u)
				}
			}
			uids = kept
			break
		}
	}
	if len(uids) == 0 {
		return nil
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO conversations AS c (uid, gid, last_seq, updated_at)
		SELECT DISTINCT m.uid, m.gid, $3::bigint, now()
		FROM unnest($2::text[]) AS u(uid)
		JOIN group_members m ON m.gid = $1 AND m.uid = u.uid
		ORDER BY m.uid
		ON CONFLICT (uid, gid) DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at
		WHERE c.last_seq < excluded.last_seq`, gid, uids, lastSeq)
	return dbErr("advance conversations", err)
}

// Conversations implements store.Store.
func (s *Store) Conversations(ctx context.Context, uid string) (map[int64]int64, error) {
	if !storable(uid) {
		return map[int64]int64{}, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT gid, last_seq FROM conversations WHERE uid = $1`, uid)
	if err != nil {
		return nil, dbErr("conversations", err)
	}
	defer rows.Close()
	out := make(map[int64]int64)
	for rows.Next() {
		var gid, seq int64
		if err := rows.Scan(&gid, &seq); err != nil {
			return nil, dbErr("conversations", err)
		}
		out[gid] = seq
	}
	return out, dbErr("conversations", rows.Err())
}

// Column types of messagesSQL, for the allocation-free decoder.
var messagesOIDs = []uint32{pgtype.Int8OID, pgtype.Int8OID, pgtype.TextOID, pgtype.TextOID,
	pgtype.TextOID, pgtype.ByteaOID, pgtype.TimestamptzOID}

// binaryColumns reports whether the result has exactly the column types
// oids, in binary format (pgx asks for binary except for text, whose text
// and binary formats are the same bytes).
func binaryColumns(fds []pgconn.FieldDescription, oids []uint32) bool {
	if len(fds) != len(oids) {
		return false
	}
	for i, fd := range fds {
		if fd.DataTypeOID != oids[i] || (fd.Format != pgtype.BinaryFormatCode && fd.DataTypeOID != pgtype.TextOID) {
			return false
		}
	}
	return true
}

// pgEpochMicros is 2000-01-01 UTC, Postgres' timestamp epoch, in Unix µs.
const pgEpochMicros = 946684800000000

// decodeMessage decodes one binary row of messagesSQL. Strings and bodies
// are carved out of a shared arena: a page of 200 messages costs a few
// allocations instead of several per message.
func decodeMessage(vals [][]byte, lastSeq *int64, m *store.Message, a *arena) error {
	if len(vals) != 7 || len(vals[0]) != 8 || len(vals[1]) != 8 || len(vals[6]) != 8 {
		return errors.New("unexpected row shape")
	}
	*lastSeq = int64(binary.BigEndian.Uint64(vals[0]))
	m.Seq = int64(binary.BigEndian.Uint64(vals[1]))
	if m.Seq == 0 {
		return nil
	}
	m.Sender = a.string(vals[2])
	m.ClientMsgID = a.string(vals[3])
	switch string(vals[4]) {
	case store.KindText:
		m.Kind = store.KindText
	case store.KindAtAll:
		m.Kind = store.KindAtAll
	default:
		m.Kind = a.string(vals[4])
	}
	m.Body = a.bytes(vals[5])
	m.CreatedAt = time.UnixMicro(int64(binary.BigEndian.Uint64(vals[6])) + pgEpochMicros)
	return nil
}

// arena hands out immutable copies of byte slices from large chunks.
type arena struct{ buf []byte }

const arenaChunk = 32 << 10

func (a *arena) alloc(n int) []byte {
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]byte, 0, max(arenaChunk, n))
	}
	off := len(a.buf)
	a.buf = a.buf[:off+n]
	return a.buf[off : off+n : off+n]
}

func (a *arena) string(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	c := a.alloc(len(b))
	copy(c, b)
	return unsafe.String(&c[0], len(c))
}

func (a *arena) bytes(b []byte) []byte {
	c := a.alloc(len(b))
	copy(c, b)
	return c
}
