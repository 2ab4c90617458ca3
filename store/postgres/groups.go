package postgres

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanfare-im/fanfare/store"
)

const groupCols = `gid, name, owner, state, last_seq, member_count, created_at`

func scanGroup(row pgx.Row) (store.Group, error) {
	var g store.Group
	var state string
	err := row.Scan(&g.GID, &g.Name, &g.Owner, &state, &g.LastSeq, &g.MemberCount, &g.CreatedAt)
	g.State = store.GroupState(state)
	return g, err
}

// CreateGroup implements store.Store.
func (s *Store) CreateGroup(ctx context.Context, g store.Group) (store.Group, error) {
	g, err := s.lim.CheckNewGroup(g)
	if err != nil {
		return store.Group{}, err
	}
	if g.GID > 0 {
		out, err := scanGroup(s.pool.QueryRow(ctx,
			`INSERT INTO groups (gid, name, owner, state) VALUES ($1, $2, $3, $4)
			 ON CONFLICT (gid) DO NOTHING RETURNING `+groupCols, g.GID, g.Name, g.Owner, string(g.State)))
		if errors.Is(err, pgx.ErrNoRows) {
			return store.Group{}, fmt.Errorf("%w: gid %d", store.ErrGroupExists, g.GID)
		}
		return out, dbErr("create group", err)
	}
	// Assigned gid: from the sequence, which explicit gids do not move;
	// it may hand out a gid that was created explicitly: skip those.
	for range 1000 {
		var gid int64
		err := s.pool.QueryRow(ctx, `SELECT nextval('groups_gid_seq')`).Scan(&gid)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "2200H" { // sequence_generator_limit_exceeded
			return store.Group{}, fmt.Errorf("%w: the gid sequence is at its end", store.ErrGIDExhausted)
		}
		if err != nil {
			return store.Group{}, dbErr("create group", err)
		}
		if gid > s.lim.MaxGID {
			return store.Group{}, fmt.Errorf("%w: every gid up to %d is assigned", store.ErrGIDExhausted, s.lim.MaxGID)
		}
		out, err := scanGroup(s.pool.QueryRow(ctx,
			`INSERT INTO groups (gid, name, owner, state) VALUES ($1, $2, $3, $4)
			 ON CONFLICT (gid) DO NOTHING RETURNING `+groupCols, gid, g.Name, g.Owner, string(g.State)))
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		return out, dbErr("create group", err)
	}
	// 1000 explicit gids in a row past the sequence: each try moved it on,
	// so a retry goes on from there.
	return store.Group{}, fmt.Errorf("%w: create group: the next 1000 gids were all created explicitly; retry", store.ErrUnavailable)
}

// Group implements store.Store.
func (s *Store) Group(ctx context.Context, gid int64) (store.Group, error) {
	g, err := scanGroup(s.pool.QueryRow(ctx, `SELECT `+groupCols+` FROM groups WHERE gid = $1`, gid))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Group{}, fmt.Errorf("%w: gid %d", store.ErrGroupNotFound, gid)
	}
	return g, dbErr("group", err)
}

// SetGroupState implements store.Store.
func (s *Store) SetGroupState(ctx context.Context, gid int64, state store.GroupState) (store.Group, error) {
	if !state.Valid() {
		return store.Group{}, fmt.Errorf("%w: unknown group state %q", store.ErrBadRequest, state)
	}
	g, err := scanGroup(s.pool.QueryRow(ctx,
		`UPDATE groups SET state = $2 WHERE gid = $1 RETURNING `+groupCols, gid, string(state)))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Group{}, fmt.Errorf("%w: gid %d", store.ErrGroupNotFound, gid)
	}
	return g, dbErr("set group state", err)
}

const memberCols = `gid, uid, ordinal, join_seq, last_read_seq, role, muted, joined_at`

func scanMember(row pgx.Row) (store.Member, error) {
	var m store.Member
	var ord int32
	err := row.Scan(&m.GID, &m.UID, &ord, &m.JoinSeq, &m.LastReadSeq, &m.Role, &m.Muted, &m.JoinedAt)
	m.Ordinal = uint32(ord)
	return m, err
}

func collectMembers(rows pgx.Rows) ([]store.Member, error) {
	defer rows.Close()
	var ms []store.Member
	for rows.Next() {
		m, err := scanMember(rows)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, rows.Err()
}

// AddMembers implements store.Store. It holds the group row lock for the
// whole transaction: ordinals and join_seq are assigned consistently with
// concurrent Appends and other AddMembers/RemoveMember calls.
func (s *Store) AddMembers(ctx context.Context, gid int64, uids []string) ([]store.Member, error) {
	distinct, err := s.lim.DistinctUIDs(uids)
	if err != nil {
		return nil, err
	}
	var out []store.Member
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var (
			state, owner     string
			lastSeq, version int64 // version: 0 unless this call adds someone
			nextOrd          int32
			now              time.Time
		)
		err := tx.QueryRow(ctx,
			`SELECT state, owner, last_seq, next_ordinal, now() FROM groups WHERE gid = $1 FOR NO KEY UPDATE`,
			gid).Scan(&state, &owner, &lastSeq, &nextOrd, &now)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: gid %d", store.ErrGroupNotFound, gid)
		}
		if err != nil {
			return err
		}
		if store.GroupState(state) == store.StateDissolved {
			return fmt.Errorf("%w: gid %d is dissolved", store.ErrGroupClosed, gid)
		}
		if len(distinct) == 0 {
			return nil
		}
		rows, err := tx.Query(ctx,
			`SELECT `+memberCols+` FROM group_members WHERE gid = $1 AND uid = ANY($2)`, gid, distinct)
		if err != nil {
			return err
		}
		existing, err := collectMembers(rows)
		if err != nil {
			return err
		}
		byUID := make(map[string]store.Member, len(distinct))
		for _, m := range existing {
			byUID[m.UID] = m
		}
		var newUIDs []string
		for _, u := range distinct {
			if _, ok := byUID[u]; !ok {
				newUIDs = append(newUIDs, u)
			}
		}
		if len(newUIDs) > 0 {
			rows, err := tx.Query(ctx,
				`DELETE FROM group_free_ordinals WHERE gid = $1 AND ordinal IN (
					SELECT ordinal FROM group_free_ordinals WHERE gid = $1 ORDER BY ordinal LIMIT $2)
				 RETURNING ordinal`, gid, len(newUIDs))
			if err != nil {
				return err
			}
			ords, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil {
				return err
			}
			slices.Sort(ords)
			for len(ords) < len(newUIDs) {
				ords = append(ords, nextOrd)
				nextOrd++
			}
			roles := make([]string, len(newUIDs))
			for i, u := range newUIDs {
				roles[i] = store.RoleMember
				if u == owner {
					roles[i] = store.RoleOwner
				}
				byUID[u] = store.Member{GID: gid, UID: u, Ordinal: uint32(ords[i]), JoinSeq: lastSeq + 1,
					Role: roles[i], JoinedAt: now}
			}
			b := &pgx.Batch{}
			b.Queue(`INSERT INTO group_members (gid, uid, ordinal, join_seq, role, joined_at)
				SELECT $1, u, o, $2, r, $3 FROM unnest($4::text[], $5::integer[], $6::text[]) AS t(u, o, r)`,
				gid, lastSeq+1, now, newUIDs, ords, roles)
			b.Queue(`UPDATE groups SET member_count = member_count + $2, next_ordinal = $3,
				member_version = member_version + 1 WHERE gid = $1 RETURNING member_version`,
				gid, len(newUIDs), nextOrd)
			br := tx.SendBatch(ctx, b)
			_, err = br.Exec()
			if err == nil {
				err = br.QueryRow().Scan(&version)
			}
			if err := errors.Join(err, br.Close()); err != nil {
				return err
			}
		}
		out = make([]store.Member, len(distinct))
		for i, u := range distinct {
			out[i] = byUID[u]
			out[i].MemberVersion = version
		}
		return nil
	})
	if err != nil {
		if isStoreErr(err) {
			return nil, err
		}
		return nil, dbErr("add members", err)
	}
	return out, nil
}

// RemoveMember implements store.Store.
func (s *Store) RemoveMember(ctx context.Context, gid int64, uid string) (store.Member, error) {
	if !storable(uid) {
		return store.Member{}, fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
	}
	var m store.Member
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM groups WHERE gid = $1 FOR NO KEY UPDATE`, gid).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
		}
		if err != nil {
			return err
		}
		m, err = scanMember(tx.QueryRow(ctx,
			`DELETE FROM group_members WHERE gid = $1 AND uid = $2 RETURNING `+memberCols, gid, uid))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
		}
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO group_free_ordinals (gid, ordinal) VALUES ($1, $2)`, gid, int32(m.Ordinal))
		b.Queue(`UPDATE groups SET member_count = member_count - 1, member_version = member_version + 1
			WHERE gid = $1 RETURNING member_version`, gid)
		b.Queue(`DELETE FROM conversations WHERE uid = $1 AND gid = $2`, uid, gid)
		br := tx.SendBatch(ctx, b)
		_, err = br.Exec()
		if err == nil {
			err = br.QueryRow().Scan(&m.MemberVersion)
		}
		if err == nil {
			_, err = br.Exec()
		}
		return errors.Join(err, br.Close())
	})
	if err != nil {
		if isStoreErr(err) {
			return store.Member{}, err
		}
		return store.Member{}, dbErr("remove member", err)
	}
	return m, nil
}

// SetMemberMuted implements store.Store.
func (s *Store) SetMemberMuted(ctx context.Context, gid int64, uid string, muted bool) error {
	if !storable(uid) {
		return fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
	}
	ct, err := s.pool.Exec(ctx, `UPDATE group_members SET muted = $3 WHERE gid = $1 AND uid = $2`, gid, uid, muted)
	if err != nil {
		return dbErr("set member muted", err)
	}
	if ct.RowsAffected() == 0 {
		return fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
	}
	return nil
}

// Member implements store.Store.
func (s *Store) Member(ctx context.Context, gid int64, uid string) (store.Member, error) {
	if !storable(uid) {
		return store.Member{}, fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
	}
	m, err := scanMember(s.pool.QueryRow(ctx,
		`SELECT `+memberCols+` FROM group_members WHERE gid = $1 AND uid = $2`, gid, uid))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Member{}, fmt.Errorf("%w: gid %d has no member %q", store.ErrNotMember, gid, uid)
	}
	return m, dbErr("member", err)
}

// MembersOf implements store.Store: one statement, so the version and the
// rows come from one snapshot.
func (s *Store) MembersOf(ctx context.Context, gid int64, uids []string) ([]store.Member, int64, error) {
	if len(uids) > s.lim.MaxAddMembers {
		return nil, 0, fmt.Errorf("%w: %d uids, max %d", store.ErrTooLarge, len(uids), s.lim.MaxAddMembers)
	}
	keep := make([]string, 0, len(uids))
	for _, u := range uids {
		if storable(u) {
			keep = append(keep, u)
		}
	}
	rows, err := s.pool.Query(ctx,
		`SELECT g.member_version, m.gid, m.uid, m.ordinal, m.join_seq, m.last_read_seq, m.role, m.muted, m.joined_at
		 FROM groups g LEFT JOIN group_members m ON m.gid = g.gid AND m.uid = ANY($2::text[])
		 WHERE g.gid = $1`, gid, keep)
	if err != nil {
		return nil, 0, dbErr("members of", err)
	}
	defer rows.Close()
	var (
		ms      []store.Member
		version int64
		found   bool
	)
	for rows.Next() {
		var (
			mgid         *int64
			uid, role    *string
			ord          *int32
			join, lastRd *int64
			muted        *bool
			joinedAt     *time.Time
		)
		if err := rows.Scan(&version, &mgid, &uid, &ord, &join, &lastRd, &role, &muted, &joinedAt); err != nil {
			return nil, 0, dbErr("members of", err)
		}
		found = true
		if mgid == nil {
			continue // the group has none of uids
		}
		ms = append(ms, store.Member{GID: *mgid, UID: *uid, Ordinal: uint32(*ord), JoinSeq: *join,
			LastReadSeq: *lastRd, Role: *role, Muted: *muted, JoinedAt: *joinedAt})
	}
	if err := rows.Err(); err != nil {
		return nil, 0, dbErr("members of", err)
	}
	if !found {
		return nil, 0, fmt.Errorf("%w: gid %d", store.ErrGroupNotFound, gid)
	}
	return ms, version, nil
}

// maxAddedRunning bounds AddedCursor.Running: the transactions that were
// running when a pass began, whose additions the next pass reads again.
// Postgres bounds them by its connections and prepared transactions
// (max_connections + max_prepared_transactions, a few hundred in common
// setups); past this many, the next pass starts at the snapshot's xmin
// instead (rows of every transaction from the oldest running one on,
// read again), which is correct, only not minimal, and the list costs at
// most 32 KiB per cursor.
var maxAddedRunning = 4096

// MembersAdded implements store.Store on group_members.added_xid (the
// adding transaction's id, migration 0004), in (added_xid, gid, uid)
// order, by keyset from the cursor's position. A pass reads the rows of
// the transactions the previous pass's first snapshot could not see: at
// or above its xmax (AddedCursor.Horizon) or running then, listed in its
// xip (AddedCursor.Running, all below xmax). A transaction id is handed
// out at the first write, not at commit, so ids do not come in commit
// order; but every transaction that had none when a snapshot was taken
// gets one at or above its xmax, and every other one not visible to it
// is in its xip, so the next pass, from that set, skips none whatever
// order transactions commit in; and a committed addition visible to that
// snapshot is read by the pass that took it (its later pages see at
// least as much), never again. The first page of a pass records its
// snapshot's xmax and xip for the next (NextHorizon, NextRunning); an
// xip longer than maxAddedRunning makes the next pass start at the
// snapshot's xmin instead. What a pass reads more than once: rows of a
// transaction running at its start that a later page read after it
// committed, and rows at or above its start's xmax read by its later
// pages (both come once more in the next pass; callers skip them). So a
// transaction left open, whatever it does, costs one id in the cursor,
// not a re-read of everything added since it began. Rows at or above the
// current snapshot's xmax are not read: no transaction of this cluster
// made them yet, so they were copied from another cluster (pg_dump and
// restore, logical replication) with that cluster's xids, and reading
// them would make every pass read them all again (docs/operations.md
// §8.4). added_xid > 0 lets the partial index serve the read.
func (s *Store) MembersAdded(ctx context.Context, cursor store.AddedCursor, limit int) ([]store.Member, store.AddedCursor, error) {
	if limit < 1 {
		return nil, cursor, fmt.Errorf("%w: limit %d, want at least 1", store.ErrBadRequest, limit)
	}
	limit = min(limit, s.lim.MaxAddMembers)
	if !cursor.Set {
		var (
			xmin, xmax int64
			xip        []int64
		)
		err := s.pool.QueryRow(ctx, snapshotQuery, maxAddedRunning+1).Scan(&xmin, &xmax, &xip)
		if err != nil {
			return nil, cursor, dbErr("members added", err)
		}
		// The next pass reads from position (0, 0, ""), below every key.
		return nil, passFrom(xmin, xmax, xip), nil
	}
	rows, err := s.pool.Query(ctx,
		`SELECT x.xmin, x.xmax, x.xip, m.added_xid, m.gid, m.uid, m.ordinal, m.join_seq, m.last_read_seq, m.role, m.muted, m.joined_at
		 FROM (`+snapshotQuery+`) x
		 LEFT JOIN LATERAL (
			(SELECT * FROM group_members WHERE added_xid = ANY($6::bigint[]) AND added_xid > 0
				AND (added_xid, gid, uid) > ($2, $3, $4)
				ORDER BY added_xid, gid, uid LIMIT $5)
			UNION ALL
			(SELECT * FROM group_members WHERE added_xid >= $7 AND added_xid > 0 AND added_xid < x.xmax
				AND (added_xid, gid, uid) > ($2, $3, $4)
				ORDER BY added_xid, gid, uid LIMIT $5)
			ORDER BY added_xid, gid, uid LIMIT $5) m ON true`,
		maxAddedRunning+1, cursor.Mark, cursor.GID, cursor.UID, limit, cursor.Running, cursor.Horizon)
	if err != nil {
		return nil, cursor, dbErr("members added", err)
	}
	defer rows.Close()
	var (
		ms         []store.Member
		xmin, xmax int64
		xip        []int64
		next       = cursor
	)
	for rows.Next() {
		var (
			xid, mgid    *int64
			uid, role    *string
			ord          *int32
			join, lastRd *int64
			muted        *bool
			joinedAt     *time.Time
		)
		if err := rows.Scan(&xmin, &xmax, &xip, &xid, &mgid, &uid, &ord, &join, &lastRd, &role, &muted, &joinedAt); err != nil {
			return nil, cursor, dbErr("members added", err)
		}
		if mgid == nil {
			continue // nothing after the cursor
		}
		ms = append(ms, store.Member{GID: *mgid, UID: *uid, Ordinal: uint32(*ord), JoinSeq: *join,
			LastReadSeq: *lastRd, Role: *role, Muted: *muted, JoinedAt: *joinedAt})
		next.Mark, next.GID, next.UID = *xid, *mgid, *uid
	}
	if err := rows.Err(); err != nil {
		return nil, cursor, dbErr("members added", err)
	}
	if next.NextHorizon == 0 { // the first page of a pass
		p := passFrom(xmin, xmax, xip)
		next.NextHorizon, next.NextRunning = p.Horizon, p.Running
	}
	if len(ms) < limit { // the pass is over: the next reads what its first page could not see
		next = store.AddedCursor{Set: true, Horizon: next.NextHorizon, Running: next.NextRunning}
	}
	return ms, next, nil
}

// snapshotQuery reads the statement's snapshot: xmin, xmax and at most $1
// of the ids in its xip, smallest first.
const snapshotQuery = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin,
	pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax,
	ARRAY(SELECT r::text::bigint FROM pg_snapshot_xip(pg_current_snapshot()) r ORDER BY 1 LIMIT $1) AS xip`

// passFrom is the cursor of a pass over what a snapshot with xmin, xmax
// and xip could not see, from the first key on. An xip cut at
// maxAddedRunning+1 ids is replaced by the snapshot's xmin.
func passFrom(xmin, xmax int64, xip []int64) store.AddedCursor {
	if len(xip) > maxAddedRunning {
		return store.AddedCursor{Set: true, Horizon: xmin}
	}
	if len(xip) == 0 {
		xip = nil
	}
	return store.AddedCursor{Set: true, Horizon: xmax, Running: xip}
}

// UserGroups implements store.Store. Memberships come in gid order.
func (s *Store) UserGroups(ctx context.Context, uid string) ([]store.Member, error) {
	if !storable(uid) {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT `+memberCols+` FROM group_members WHERE uid = $1 ORDER BY gid`, uid)
	if err != nil {
		return nil, dbErr("user groups", err)
	}
	ms, err := collectMembers(rows)
	return ms, dbErr("user groups", err)
}

// ActiveMembersSince implements store.Store. Uids come in ordinal order.
func (s *Store) ActiveMembersSince(ctx context.Context, gid int64, since time.Time) ([]string, error) {
	rows, err := s.pool.Query(ctx,
		`SELECT m.uid FROM group_members m JOIN users u ON u.uid = m.uid
		 WHERE m.gid = $1 AND u.last_active_at >= $2 ORDER BY m.ordinal`, gid, since)
	if err != nil {
		return nil, dbErr("active members", err)
	}
	uids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return uids, dbErr("active members", err)
}

// SetUserTier implements store.Store.
func (s *Store) SetUserTier(ctx context.Context, uid string, tier int) error {
	if err := store.CheckTier(tier); err != nil {
		return err
	}
	if err := store.ValidateID("uid", uid, s.lim.MaxUID); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx,
		`INSERT INTO users (uid, level) VALUES ($1, $2)
		 ON CONFLICT (uid) DO UPDATE SET level = excluded.level`, uid, tier) // the column is still named level
	return dbErr("set user tier", err)
}

// TouchUser implements store.Store.
func (s *Store) TouchUser(ctx context.Context, uid string, at time.Time) error {
	if err := store.ValidateID("uid", uid, s.lim.MaxUID); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx,
		`INSERT INTO users (uid, last_active_at) VALUES ($1, $2)
		 ON CONFLICT (uid) DO UPDATE SET last_active_at = greatest(users.last_active_at, excluded.last_active_at)`,
		uid, at)
	return dbErr("touch user", err)
}

// TouchUsers implements store.Store: one statement, the users in uid
// order (the row locks of concurrent calls are taken in one order).
func (s *Store) TouchUsers(ctx context.Context, touches []store.UserTouch) error {
	latest := make(map[string]time.Time, len(touches))
	for _, t := range touches {
		if store.ValidateID("uid", t.UID, s.lim.MaxUID) != nil {
			continue
		}
		if cur, ok := latest[t.UID]; !ok || t.At.After(cur) {
			latest[t.UID] = t.At
		}
	}
	if len(latest) == 0 {
		return nil
	}
	uids := slices.Sorted(maps.Keys(latest))
	ats := make([]time.Time, len(uids))
	for i, uid := range uids {
		ats[i] = latest[uid]
	}
	_, err := s.pool.Exec(ctx,
		`INSERT INTO users (uid, last_active_at)
		 SELECT uid, at FROM unnest($1::text[], $2::timestamptz[]) AS t(uid, at) ORDER BY uid
		 ON CONFLICT (uid) DO UPDATE SET last_active_at = greatest(users.last_active_at, excluded.last_active_at)`,
		uids, ats)
	return dbErr("touch users", err)
}

// User implements store.Store.
func (s *Store) User(ctx context.Context, uid string) (store.User, error) {
	if !storable(uid) {
		return store.User{}, fmt.Errorf("%w: %q", store.ErrUserNotFound, uid)
	}
	u := store.User{UID: uid}
	var level int16
	var last *time.Time
	err := s.pool.QueryRow(ctx, `SELECT level, last_active_at FROM users WHERE uid = $1`, uid).Scan(&level, &last)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.User{}, fmt.Errorf("%w: %q", store.ErrUserNotFound, uid)
	}
	if err != nil {
		return store.User{}, dbErr("user", err)
	}
	u.Tier = int(level)
	if last != nil {
		u.LastActiveAt = *last
	}
	return u, nil
}

// storable reports whether Postgres can hold s as text (valid UTF-8, no
// NUL). A uid that is not can be no member or user: lookups answer "not
// found" instead of sending it and failing with a database error.
func storable(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// isStoreErr reports whether err is one of the store's typed request
// errors, which are returned as they are.
func isStoreErr(err error) bool {
	for _, e := range []error{store.ErrGroupNotFound, store.ErrGroupExists, store.ErrNotMember,
		store.ErrMuted, store.ErrGroupClosed, store.ErrTooLarge, store.ErrBadRequest, store.ErrUserNotFound} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
