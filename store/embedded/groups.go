package embedded

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/fanfare-im/fanfare/store"
)

// getter is what db, snapshots and batches have in common for point reads.
type getter interface {
	Get(key []byte) ([]byte, io.Closer, error)
}

// get looks key up and calls fn with the value (valid only during fn).
// found is false, with a nil error, when the key is absent.
func get(r getter, key []byte, fn func(v []byte) error) (found bool, err error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	err = fn(v)
	if cerr := closer.Close(); err == nil {
		err = cerr
	}
	return true, err
}

// dbErr wraps an engine failure: retryable, nothing was stored. Typed store
// errors and corruption pass through unchanged.
func dbErr(op string, err error) error {
	if err == nil || isStoreErr(err) || errors.Is(err, errCorrupt) {
		return err
	}
	return store.Unavailable(fmt.Errorf("embedded: %s: %w", op, err))
}

func isStoreErr(err error) bool {
	for _, e := range []error{store.ErrGroupNotFound, store.ErrGroupExists, store.ErrGIDExhausted, store.ErrNotMember,
		store.ErrMuted, store.ErrGroupClosed, store.ErrTooLarge, store.ErrBadRequest, store.ErrUserNotFound,
		store.ErrUnavailable} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// update runs fn under wmu with a fresh batch and commits what it wrote,
// with an fsync when sync is set. fn reads the committed state through
// s.db (under wmu that is all durable state) and must not read back its
// own batch. Errors from fn are returned as they are.
func (s *Store) update(ctx context.Context, op string, sync bool, fn func(b *pebble.Batch) error) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	b := s.db.NewBatch()
	defer b.Close()
	if err := fn(b); err != nil {
		return dbErr(op, err)
	}
	if b.Empty() {
		return nil
	}
	wo := pebble.NoSync
	if sync {
		wo = pebble.Sync
	}
	if err := b.Commit(wo); err != nil {
		return dbErr(op+": commit", err)
	}
	s.publish()
	return nil
}

// view runs fn on the current read view.
func (s *Store) view(ctx context.Context, op string, fn func(snap *pebble.Snapshot) error) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave()
	v := s.acquire()
	defer v.release()
	return dbErr(op, fn(v.snap))
}

// nowMicro is the store clock at the precision it stores.
func (s *Store) nowMicro() time.Time {
	return s.now().Truncate(time.Microsecond).UTC()
}

func readGroup(r getter, gid int64) (g groupRec, found bool, err error) {
	var kb [16]byte
	found, err = get(r, groupKey(kb[:0], gid), func(v []byte) error {
		g, err = decGroup(gid, v)
		return err
	})
	return g, found, err
}

func readMember(r getter, gid int64, uid string) (m store.Member, found bool, err error) {
	m, _, found, err = readMemberMark(r, gid, uid)
	return m, found, err
}

// readMemberMark is readMember with the record's addition mark, which a
// rewrite of the record keeps.
func readMemberMark(r getter, gid int64, uid string) (m store.Member, mark int64, found bool, err error) {
	kb := make([]byte, 0, 16+len(uid))
	found, err = get(r, memberKey(kb, gid, uid), func(v []byte) error {
		if m, err = decMember(gid, uid, v); err != nil {
			return err
		}
		mark, err = memberMark(v)
		return err
	})
	return m, mark, found, err
}

// CreateGroup implements store.Store. Assigned gids count up from a stored
// counter (gidCounterKey) that explicit gids do not move; groups are never
// deleted, so gids are never reused.
func (s *Store) CreateGroup(ctx context.Context, g store.Group) (store.Group, error) {
	g, err := s.lim.CheckNewGroup(g)
	if err != nil {
		return store.Group{}, err
	}
	rec := groupRec{Group: store.Group{GID: g.GID, Name: g.Name, Owner: g.Owner, State: g.State}}
	err = s.update(ctx, "create group", true, func(b *pebble.Batch) error {
		rec.CreatedAt = s.nowMicro()
		if rec.GID == 0 {
			gid, err := s.nextGID()
			if err != nil {
				return err
			}
			rec.GID = gid
			if err := b.Set(gidCounterKey, binary.BigEndian.AppendUint64(nil, uint64(gid)), nil); err != nil {
				return err
			}
		} else {
			_, found, err := readGroup(s.db, rec.GID)
			if err != nil {
				return err
			}
			if found {
				return fmt.Errorf("%w: gid %d", store.ErrGroupExists, rec.GID)
			}
		}
		return b.Set(groupKey(nil, rec.GID), encGroup(nil, &rec), nil)
	})
	if err != nil {
		return store.Group{}, err
	}
	return rec.Group, nil
}

// nextGID returns the gid to assign: the first one after the counter that
// no group holds, or ErrGIDExhausted past MaxGID. Callers hold wmu. A
// store without a counter (written by an older version, which assigned
// the largest gid in use plus one) starts from its largest gid up to
// MaxGID: one explicit gid near the end no longer moves the counter there.
func (s *Store) nextGID() (int64, error) {
	var last int64
	found, err := get(s.db, gidCounterKey, func(v []byte) error {
		if len(v) != 8 {
			return errCorrupt
		}
		last = int64(binary.BigEndian.Uint64(v))
		return nil
	})
	if err != nil {
		return 0, err
	}
	if !found {
		if last, err = lastGIDUpTo(s.db, s.lim.MaxGID); err != nil {
			return 0, err
		}
	}
	for gid := last + 1; gid > 0 && gid <= s.lim.MaxGID; gid++ {
		_, taken, err := readGroup(s.db, gid)
		if err != nil {
			return 0, err
		}
		if !taken {
			return gid, nil
		}
	}
	return 0, fmt.Errorf("%w: every gid up to %d is assigned", store.ErrGIDExhausted, s.lim.MaxGID)
}

// lastGIDUpTo returns the largest gid in use that is at most max, 0 if none.
func lastGIDUpTo(db *pebble.DB, max int64) (int64, error) {
	hi := []byte{pGroup + 1}
	if max < math.MaxInt64 {
		hi = groupKey(nil, max+1)
	}
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{pGroup}, UpperBound: hi})
	if err != nil {
		return 0, err
	}
	var gid int64
	if it.Last() {
		gid = gidSuffix(it.Key())
	}
	return gid, errors.Join(it.Error(), it.Close())
}

// Group implements store.Store.
func (s *Store) Group(ctx context.Context, gid int64) (store.Group, error) {
	var g groupRec
	err := s.view(ctx, "group", func(snap *pebble.Snapshot) error {
		var found bool
		var err error
		g, found, err = readGroup(snap, gid)
		if err == nil && !found {
			err = fmt.Errorf("%w: gid %d", store.ErrGroupNotFound, gid)
		}
		return err
	})
	return g.Group, err
}

// SetGroupState implements store.Store.
func (s *Store) SetGroupState(ctx context.Context, gid int64, state store.GroupState) (store.Group, error) {
	if !state.Valid() {
		return store.Group{}, fmt.Errorf("%w: unknown group state %q", store.ErrBadRequest, state)
	}
	var g groupRec
	err := s.update(ctx, "set group state", true, func(b *pebble.Batch) error {
		var found bool
		var err error
		g, found, err = readGroup(s.db, gid)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w: gid %d", store.ErrGroupNotFound, gid)
		}
		if g.State == state {
			return nil
		}
		g.State = state
		s.meta.forgetGroup(gid)
		return b.Set(groupKey(nil, gid), encGroup(nil, &g), nil)
	})
	return g.Group, err
}

// AddMembers implements store.Store. It runs under the write lock, so
// ordinals and join_seq are exact with respect to concurrent Appends.
func (s *Store) AddMembers(ctx context.Context, gid int64, uids []string) ([]store.Member, error) {
	distinct, err := s.lim.DistinctUIDs(uids)
	if err != nil {
		return nil, err
	}
	var out []store.Member
	err = s.update(ctx, "add members", true, func(b *pebble.Batch) error {
		g, found, err := readGroup(s.db, gid)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w: gid %d", store.ErrGroupNotFound, gid)
		}
		if g.State == store.StateDissolved {
			return fmt.Errorf("%w: gid %d is dissolved", store.ErrGroupClosed, gid)
		}
		if len(distinct) == 0 {
			return nil
		}
		members := make([]store.Member, len(distinct))
		var fresh []int
		for i, u := range distinct {
			m, found, err := readMember(s.db, gid, u)
			if err != nil {
				return err
			}
			if found {
				members[i] = m
			} else {
				fresh = append(fresh, i)
			}
		}
		if len(fresh) == 0 {
			out = members
			return nil
		}
		s.meta.forgetGroup(gid)
		ords, err := takeFreeOrdinals(s.db, b, gid, len(fresh))
		if err != nil {
			return err
		}
		mark, err := s.lastAddedMark()
		if err != nil {
			return err
		}
		now := s.nowMicro()
		kb := make([]byte, 0, 64)
		vb := make([]byte, 0, 64)
		for j, i := range fresh {
			ord := g.NextOrdinal
			if j < len(ords) {
				ord = ords[j]
			} else {
				g.NextOrdinal++
			}
			u := distinct[i]
			role := store.RoleMember
			if u == g.Owner {
				role = store.RoleOwner
			}
			m := store.Member{GID: gid, UID: u, Ordinal: ord, JoinSeq: g.LastSeq + 1, Role: role, JoinedAt: now}
			members[i] = m
			s.meta.forgetMember(gid, u)
			mark++
			kb = memberKey(kb[:0], gid, u)
			vb = encMember(vb[:0], &m, mark)
			if err := b.Set(kb, vb, nil); err != nil {
				return err
			}
			kb = userGroupKey(kb[:0], u, gid)
			if err := b.Set(kb, nil, nil); err != nil {
				return err
			}
			if err := b.Set(addedKey(kb[:0], mark, gid, u), nil, nil); err != nil {
				return err
			}
		}
		if err := b.Set(addedMarkKey, binary.BigEndian.AppendUint64(kb[:0], uint64(mark)), nil); err != nil {
			return err
		}
		g.MemberCount += int64(len(fresh))
		g.MemberVersion++
		if err := b.Set(groupKey(kb[:0], gid), encGroup(vb[:0], &g), nil); err != nil {
			return err
		}
		for i := range members {
			members[i].MemberVersion = g.MemberVersion
		}
		out = members
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// takeFreeOrdinals deletes (in b) and returns up to n freed ordinals of gid,
// smallest first.
func takeFreeOrdinals(db *pebble.DB, b *pebble.Batch, gid int64, n int) ([]uint32, error) {
	lo := freeOrdPrefix(nil, gid)
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: prefixEnd(lo)})
	if err != nil {
		return nil, err
	}
	var ords []uint32
	for ok := it.First(); ok && len(ords) < n; ok = it.Next() {
		k := it.Key()
		if len(k) != len(lo)+4 {
			it.Close()
			return nil, errCorrupt
		}
		ords = append(ords, uint32(k[len(k)-4])<<24|uint32(k[len(k)-3])<<16|uint32(k[len(k)-2])<<8|uint32(k[len(k)-1]))
		if err := b.Delete(k, nil); err != nil {
			it.Close()
			return nil, err
		}
	}
	return ords, errors.Join(it.Error(), it.Close())
}

// RemoveMember implements store.Store. It also drops uid's conversation
// entry for gid.
func (s *Store) RemoveMember(ctx context.Context, gid int64, uid string) (store.Member, error) {
	var m store.Member
	err := s.update(ctx, "remove member", true, func(b *pebble.Batch) error {
		g, found, err := readGroup(s.db, gid)
		if err != nil {
			return err
		}
		var mark int64
		if found {
			m, mark, found, err = readMemberMark(s.db, gid, uid)
			if err != nil {
				return err
			}
		}
		if !found {
			return fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
		}
		s.meta.forgetGroup(gid)
		s.meta.forgetMember(gid, uid)
		kb := make([]byte, 0, 32+len(uid))
		g.MemberCount--
		g.MemberVersion++
		m.MemberVersion = g.MemberVersion
		for _, op := range []struct {
			key []byte
			del bool
		}{
			{memberKey(nil, gid, uid), true},
			{userGroupKey(nil, uid, gid), true},
			{convKey(nil, uid, gid), true},
			{freeOrdKey(nil, gid, m.Ordinal), false},
		} {
			if op.del {
				err = b.Delete(op.key, nil)
			} else {
				err = b.Set(op.key, nil, nil)
			}
			if err != nil {
				return err
			}
		}
		if mark > 0 { // records from before the feed of additions have none
			if err := b.Delete(addedKey(nil, mark, gid, uid), nil); err != nil {
				return err
			}
		}
		return b.Set(groupKey(kb, gid), encGroup(nil, &g), nil)
	})
	if err != nil {
		return store.Member{}, err
	}
	return m, nil
}

// SetMemberMuted implements store.Store.
func (s *Store) SetMemberMuted(ctx context.Context, gid int64, uid string, muted bool) error {
	return s.update(ctx, "set member muted", true, func(b *pebble.Batch) error {
		m, mark, found, err := readMemberMark(s.db, gid, uid)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
		}
		if m.Muted == muted {
			return nil
		}
		m.Muted = muted
		s.meta.forgetMember(gid, uid)
		return b.Set(memberKey(nil, gid, uid), encMember(nil, &m, mark), nil)
	})
}

// Member implements store.Store.
func (s *Store) Member(ctx context.Context, gid int64, uid string) (store.Member, error) {
	var m store.Member
	err := s.view(ctx, "member", func(snap *pebble.Snapshot) error {
		var found bool
		var err error
		m, found, err = readMember(snap, gid, uid)
		if err == nil && !found {
			err = fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
		}
		return err
	})
	return m, err
}

// MembersOf implements store.Store, from one snapshot.
func (s *Store) MembersOf(ctx context.Context, gid int64, uids []string) ([]store.Member, int64, error) {
	if len(uids) > s.lim.MaxAddMembers {
		return nil, 0, fmt.Errorf("%w: %d uids, max %d", store.ErrTooLarge, len(uids), s.lim.MaxAddMembers)
	}
	var (
		ms      []store.Member
		version int64
	)
	err := s.view(ctx, "members of", func(snap *pebble.Snapshot) error {
		g, found, err := readGroup(snap, gid)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w: gid %d", store.ErrGroupNotFound, gid)
		}
		version = g.MemberVersion
		seen := make(map[string]struct{}, len(uids))
		for _, u := range uids {
			if _, dup := seen[u]; dup {
				continue
			}
			seen[u] = struct{}{}
			m, found, err := readMember(snap, gid, u)
			if err != nil {
				return err
			}
			if found {
				ms = append(ms, m)
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return ms, version, nil
}

// lastAddedMark returns the mark of the last addition (0: none yet).
// Callers hold wmu.
func (s *Store) lastAddedMark() (int64, error) {
	var mark int64
	_, err := get(s.db, addedMarkKey, func(v []byte) error {
		if len(v) != 8 {
			return errCorrupt
		}
		mark = int64(binary.BigEndian.Uint64(v))
		return nil
	})
	return mark, err
}

// MembersAdded implements store.Store: a scan of the addition index
// after the cursor's mark, from one snapshot. Marks are counted under
// wmu and a snapshot holds a prefix of the commits, so a cursor's mark
// is exact: every addition after it has a larger mark.
func (s *Store) MembersAdded(ctx context.Context, cursor store.AddedCursor, limit int) ([]store.Member, store.AddedCursor, error) {
	if limit < 1 {
		return nil, cursor, fmt.Errorf("%w: limit %d, want at least 1", store.ErrBadRequest, limit)
	}
	limit = min(limit, s.lim.MaxAddMembers)
	var ms []store.Member
	next := cursor
	err := s.view(ctx, "members added", func(snap *pebble.Snapshot) error {
		if !cursor.Set {
			var mark int64
			_, err := get(snap, addedMarkKey, func(v []byte) error {
				if len(v) != 8 {
					return errCorrupt
				}
				mark = int64(binary.BigEndian.Uint64(v))
				return nil
			})
			next = store.AddedCursor{Set: true, Mark: mark}
			return err
		}
		lo := putI64([]byte{pAdded}, cursor.Mark+1)
		it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: []byte{pAdded + 1}})
		if err != nil {
			return err
		}
		for ok := it.First(); ok && len(ms) < limit; ok = it.Next() {
			k := it.Key()
			if len(k) < 1+16 {
				it.Close()
				return errCorrupt
			}
			mark := int64(binary.BigEndian.Uint64(k[1:]))
			gid := int64(binary.BigEndian.Uint64(k[9:]))
			uid := string(k[17:])
			m, found, err := readMember(snap, gid, uid)
			if err != nil {
				it.Close()
				return err
			}
			if !found {
				it.Close()
				return errCorrupt // the index key is deleted with its member (keys.go)
			}
			ms = append(ms, m)
			next.Mark = mark
		}
		return errors.Join(it.Error(), it.Close())
	})
	if err != nil {
		return nil, cursor, err
	}
	return ms, next, nil
}

// UserGroups implements store.Store. Memberships come in gid order.
func (s *Store) UserGroups(ctx context.Context, uid string) ([]store.Member, error) {
	var out []store.Member
	err := s.view(ctx, "user groups", func(snap *pebble.Snapshot) error {
		return eachUserGroup(snap, uid, func(gid int64) error {
			m, found, err := readMember(snap, gid, uid)
			if err != nil || !found {
				return err
			}
			out = append(out, m)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachUserGroup calls fn with every gid uid is a member of, in gid order.
func eachUserGroup(snap *pebble.Snapshot, uid string, fn func(gid int64) error) error {
	return eachUserGroupFrom(snap, uid, 0, func(gid int64) (bool, error) { return true, fn(gid) })
}

// eachUserGroupFrom calls fn with the gids at or above fromGID uid is a
// member of, in gid order, until fn returns false or an error: the scan
// starts at fromGID's key and reads no key past the one fn stopped at.
func eachUserGroupFrom(snap *pebble.Snapshot, uid string, fromGID int64, fn func(gid int64) (bool, error)) error {
	prefix := userGroupPrefix(nil, uid)
	lo := userGroupKey(nil, uid, fromGID)
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		if len(it.Key()) != len(prefix)+8 {
			it.Close()
			return errCorrupt
		}
		more, err := fn(gidSuffix(it.Key()))
		if err != nil {
			it.Close()
			return err
		}
		if !more {
			break
		}
	}
	return errors.Join(it.Error(), it.Close())
}

// ActiveMembersSince implements store.Store. Uids come in ordinal order.
//
// Cost: a scan of all of gid's member keys plus one user lookup per member,
// O(members) point reads (roughly 1-2 µs each from the block cache): about
// a second for a 10^6-member group. The engine calls it per merge window
// for the active tier only, which docs/architecture.md §5 turns off for hot and very
// large groups.
func (s *Store) ActiveMembersSince(ctx context.Context, gid int64, since time.Time) ([]string, error) {
	type ordUID struct {
		ord uint32
		uid string
	}
	var found []ordUID
	floor := encTime(since)
	err := s.view(ctx, "active members", func(snap *pebble.Snapshot) error {
		lo := memberPrefix(nil, gid)
		it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: prefixEnd(lo)})
		if err != nil {
			return err
		}
		kb := make([]byte, 0, 64)
		for ok := it.First(); ok; ok = it.Next() {
			if err := ctx.Err(); err != nil {
				it.Close()
				return err
			}
			uidb := it.Key()[len(lo):]
			var last int64 = noTime
			kb = append(append(kb[:0], pUser), uidb...)
			_, err := get(snap, kb, func(v []byte) error {
				u, err := decUser("", v)
				last = encTime(u.LastActiveAt)
				return err
			})
			if err != nil {
				it.Close()
				return err
			}
			if last == noTime || last < floor {
				continue
			}
			v, err := it.ValueAndErr()
			if err != nil {
				it.Close()
				return err
			}
			if len(v) < 4 {
				it.Close()
				return errCorrupt
			}
			found = append(found, ordUID{uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3]), string(uidb)})
		}
		return errors.Join(it.Error(), it.Close())
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(found, func(a, b ordUID) int { return cmp.Compare(a.ord, b.ord) })
	var out []string
	for _, f := range found {
		out = append(out, f.uid)
	}
	return out, nil
}

// SetUserTier implements store.Store.
func (s *Store) SetUserTier(ctx context.Context, uid string, tier int) error {
	if err := store.CheckTier(tier); err != nil {
		return err
	}
	if err := store.ValidateID("uid", uid, s.lim.MaxUID); err != nil {
		return err
	}
	return s.update(ctx, "set user tier", true, func(b *pebble.Batch) error {
		u := store.User{UID: uid}
		key := userKey(nil, uid)
		if _, err := get(s.db, key, func(v []byte) (err error) { u, err = decUser(uid, v); return err }); err != nil {
			return err
		}
		u.Tier = tier
		return b.Set(key, encUser(nil, &u), nil)
	})
}

// TouchUser implements store.Store. It commits without waiting for an
// fsync (the next synced commit, at the latest the next Append, carries it
// to disk): last_active_at is a hint, and a crash can only move it back.
func (s *Store) TouchUser(ctx context.Context, uid string, at time.Time) error {
	if err := store.ValidateID("uid", uid, s.lim.MaxUID); err != nil {
		return err
	}
	return s.touch(ctx, "touch user", []store.UserTouch{{UID: uid, At: at}})
}

// TouchUsers implements store.Store: one batch, committed as TouchUser's
// is (no fsync).
func (s *Store) TouchUsers(ctx context.Context, touches []store.UserTouch) error {
	ts := make([]store.UserTouch, 0, len(touches))
	for _, t := range touches {
		if store.ValidateID("uid", t.UID, s.lim.MaxUID) == nil {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		return nil
	}
	return s.touch(ctx, "touch users", ts)
}

// touch writes ts (valid uids) in one batch, each user's latest At, never
// moving a stored last_active_at back.
func (s *Store) touch(ctx context.Context, op string, ts []store.UserTouch) error {
	for i := range ts {
		ts[i].At = ts[i].At.Truncate(time.Microsecond)
	}
	slices.SortFunc(ts, func(a, b store.UserTouch) int {
		return cmp.Or(strings.Compare(a.UID, b.UID), b.At.Compare(a.At)) // latest first
	})
	ts = slices.CompactFunc(ts, func(a, b store.UserTouch) bool { return a.UID == b.UID })
	return s.update(ctx, op, false, func(b *pebble.Batch) error {
		var key, val []byte
		for _, t := range ts {
			u := store.User{UID: t.UID}
			key = userKey(key[:0], t.UID)
			found, err := get(s.db, key, func(v []byte) (err error) { u, err = decUser(t.UID, v); return err })
			if err != nil {
				return err
			}
			if found && !u.LastActiveAt.IsZero() && !t.At.After(u.LastActiveAt) {
				continue
			}
			u.LastActiveAt = t.At
			val = encUser(val[:0], &u)
			if err := b.Set(key, val, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// User implements store.Store.
func (s *Store) User(ctx context.Context, uid string) (store.User, error) {
	var u store.User
	err := s.view(ctx, "user", func(snap *pebble.Snapshot) error {
		found, err := get(snap, userKey(nil, uid), func(v []byte) (err error) { u, err = decUser(uid, v); return err })
		if err == nil && !found {
			err = fmt.Errorf("%w: %q", store.ErrUserNotFound, uid)
		}
		return err
	})
	return u, err
}
