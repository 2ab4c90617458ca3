package embedded

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"

	"github.com/fanfare-im/fanfare/store"
)

// Messages implements store.Store. The member row, last_seq and the
// messages come from one snapshot, so it never returns a message above the
// last_seq it reports, and seqs are dense (no holes) up to it. The byte
// bound stops the iteration: at most one value past it is read.
//
// All strings and bodies of the answer share one allocation (an arena the
// messages keep alive): a 200-message read costs a handful of allocations.
func (s *Store) Messages(ctx context.Context, gid int64, uid string, fromSeq, toSeq int64, limit, maxBytes int) ([]store.Message, int64, error) {
	limit, err := s.lim.CheckRange(fromSeq, toSeq, limit, maxBytes)
	if err != nil {
		return nil, 0, err
	}
	var (
		msgs    []store.Message
		lastSeq int64
	)
	err = s.view(ctx, "messages", func(snap *pebble.Snapshot) error {
		kb := make([]byte, 0, 32+len(uid))
		var joinSeq int64
		found, err := get(snap, memberKey(kb, gid, uid), func(v []byte) error {
			if len(v) < 12 {
				return errCorrupt
			}
			joinSeq = int64(binary.BigEndian.Uint64(v[4:]))
			return nil
		})
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
		}
		if _, err := get(snap, groupKey(kb[:0], gid), func(v []byte) (err error) {
			_, lastSeq, err = groupHead(v)
			return err
		}); err != nil {
			return err
		}
		from := max(fromSeq, joinSeq, 1)
		to := lastSeq
		if toSeq != 0 {
			to = min(to, toSeq)
		}
		if from > to {
			return nil
		}
		msgs, err = readRange(snap, gid, from, to, min(int64(limit), to-from+1), maxBytes)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	return msgs, lastSeq, nil
}

// readRange reads the first n stored messages of gid in [from, to], in one
// pass (expired ones are gone: the page starts at the oldest one left),
// stopping before the first one that takes the sum of their sizes past
// maxBytes (0 = no bound) unless it is the first. The arena is sized from
// the first value; if it must grow, the messages decoded so far keep
// aliasing the old array, which nothing writes again.
func readRange(snap *pebble.Snapshot, gid, from, to, n int64, maxBytes int) ([]store.Message, error) {
	lo := msgKey(make([]byte, 0, 34), gid, from)
	hi := msgKey(lo[len(lo):], gid, to+1)
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	var (
		arena []byte
		msgs  []store.Message
		size  int
	)
	for ok := it.First(); ok && int64(len(msgs)) < n; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return nil, err
		}
		if msgs == nil {
			msgs = make([]store.Message, 0, n)
			c := int64(len(v))*n + int64(len(v))*n/4
			if maxBytes > 0 {
				c = min(c, int64(len(v)+maxBytes)+int64(len(v)+maxBytes)/4)
			}
			arena = make([]byte, 0, c)
		}
		k := it.Key()
		off := len(arena)
		arena = append(arena, v...)
		m, err := decMsg(arena[off:len(arena):len(arena)])
		if err != nil {
			it.Close()
			return nil, err
		}
		if size += m.Size(); maxBytes > 0 && size > maxBytes && len(msgs) > 0 {
			arena = arena[:off]
			break
		}
		m.GID = gid
		m.Seq = int64(binary.BigEndian.Uint64(k[len(k)-8:]))
		msgs = append(msgs, m)
	}
	return msgs, errors.Join(it.Error(), it.Close())
}

// decMsg decodes a message record in place: Sender, ClientMsgID and Body
// alias v, which must never be written again (the strings are views of it).
func decMsg(v []byte) (store.Message, error) {
	r := reader{b: v}
	var m store.Message
	m.CreatedAt = decTime(r.i64())
	m.Kind = decKind(r.u8())
	m.Sender = aliasString(r.bytes())
	m.ClientMsgID = aliasString(r.bytes())
	m.Body = r.b
	return m, r.err
}

// aliasString returns b as a string without copying; b must be immutable
// from now on (arena bytes that nothing writes after decoding).
func aliasString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// Sync implements store.Store. Entries come in gid order: a range scan
// of uid's user-group keys from afterGID+1 that stops after limit groups.
func (s *Store) Sync(ctx context.Context, uid string, afterGID int64, limit int) ([]store.SyncEntry, error) {
	if err := store.ValidateSyncPage(afterGID, limit); err != nil {
		return nil, err
	}
	if afterGID == math.MaxInt64 {
		return nil, nil // no gid above it
	}
	var out []store.SyncEntry
	err := s.view(ctx, "sync", func(snap *pebble.Snapshot) error {
		kb := make([]byte, 0, 32+len(uid))
		return eachUserGroupFrom(snap, uid, afterGID+1, func(gid int64) (bool, error) {
			if len(out) == limit {
				return false, nil
			}
			e := store.SyncEntry{GID: gid}
			var joinSeq int64
			found, err := get(snap, memberKey(kb[:0], gid, uid), func(v []byte) error {
				if len(v) < 20 {
					return errCorrupt
				}
				joinSeq = int64(binary.BigEndian.Uint64(v[4:]))
				e.LastReadSeq = int64(binary.BigEndian.Uint64(v[12:]))
				return nil
			})
			if err != nil || !found {
				return true, err
			}
			if _, err := get(snap, groupKey(kb[:0], gid), func(v []byte) (err error) {
				_, e.LastSeq, err = groupHead(v)
				return err
			}); err != nil {
				return false, err
			}
			e.Unread = max(e.LastSeq-max(e.LastReadSeq, joinSeq-1), 0)
			out = append(out, e)
			return true, nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// MarkRead implements store.Store. Like TouchUser it does not wait for an
// fsync: a read marker is carried to disk by the next synced commit, and a
// crash can only move it back to an earlier value.
func (s *Store) MarkRead(ctx context.Context, gid int64, uid string, seq int64) error {
	if seq < 0 {
		return fmt.Errorf("%w: negative seq %d", store.ErrBadRequest, seq)
	}
	return s.update(ctx, "mark read", false, func(b *pebble.Batch) error {
		m, mark, found, err := readMemberMark(s.db, gid, uid)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
		}
		g, found, err := readGroup(s.db, gid)
		if err != nil {
			return err
		}
		if !found {
			return errCorrupt // a member row without its group
		}
		to := min(seq, g.LastSeq)
		if to <= m.LastReadSeq {
			return nil
		}
		m.LastReadSeq = to
		return b.Set(memberKey(nil, gid, uid), encMember(nil, &m, mark), nil)
	})
}

// AdvanceConversations implements store.Store, in one batch. Like MarkRead
// it does not wait for an fsync: the tier-2 index is a hint that a crash
// may move back, never forward.
func (s *Store) AdvanceConversations(ctx context.Context, gid int64, uids []string, lastSeq int64) error {
	if lastSeq < 0 {
		return fmt.Errorf("%w: negative last_seq %d", store.ErrBadRequest, lastSeq)
	}
	if len(uids) == 0 {
		return nil
	}
	return s.update(ctx, "advance conversations", false, func(b *pebble.Batch) error {
		now := encConv(nil, lastSeq, s.nowMicro())
		kb := make([]byte, 0, 64)
		for _, uid := range uids {
			member, err := get(s.db, memberKey(kb[:0], gid, uid), func([]byte) error { return nil })
			if err != nil {
				return err
			}
			if !member {
				continue
			}
			kb = convKey(kb[:0], uid, gid)
			behind := true
			if _, err := get(s.db, kb, func(v []byte) error {
				cur, err := convLastSeq(v)
				behind = cur < lastSeq
				return err
			}); err != nil {
				return err
			}
			if behind {
				if err := b.Set(kb, now, nil); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Conversations implements store.Store.
func (s *Store) Conversations(ctx context.Context, uid string) (map[int64]int64, error) {
	out := make(map[int64]int64)
	err := s.view(ctx, "conversations", func(snap *pebble.Snapshot) error {
		lo := convPrefix(nil, uid)
		it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: prefixEnd(lo)})
		if err != nil {
			return err
		}
		for ok := it.First(); ok; ok = it.Next() {
			v, err := it.ValueAndErr()
			if err == nil {
				out[gidSuffix(it.Key())], err = convLastSeq(v)
			}
			if err != nil {
				it.Close()
				return err
			}
		}
		return errors.Join(it.Error(), it.Close())
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
