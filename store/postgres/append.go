package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanfare-im/fanfare/store"
)

// sqlAppend is the whole Append as one statement, run in its own implicit
// transaction (one round trip, committed at Sync), for batches without
// retries of stored messages:
//   - lk locks the batch's groups in ascending gid order (the sort sits
//     below LockRows) and, in READ COMMITTED, returns their latest last_seq;
//   - v classifies every request: 0 ok, 1 no such group, 2 group not
//     active, 3 not a member, 4 muted;
//   - ok numbers the accepted requests per group in request order from
//     last_seq + 1, so rejected requests get no seq;
//   - ins inserts them, adv advances last_seq to the highest one.
//
// Accepted requests are not looked up as duplicates: a stored (gid, sender,
// client_msg_id) makes ins fail with a unique violation (the index sees
// every committed row, and waits for in-flight ones), the transaction rolls
// back, and Append reruns the batch on the two-round-trip path that answers
// retries. Rejected requests are looked up after the commit (sqlRejectedDups),
// because a retry is answered with its original seq even if the sender was
// muted or the group closed since.
const sqlAppend = `
WITH r AS (
	SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bytea[])
		WITH ORDINALITY AS r(gid, sender, cid, kind, body, i)
), lk AS MATERIALIZED (
	SELECT gid, state = 'active' AS open, last_seq, member_version FROM groups
	WHERE gid = ANY($6::bigint[]) ORDER BY gid FOR NO KEY UPDATE
), v AS MATERIALIZED (
	SELECT r.i, r.gid, r.sender, r.cid, r.kind, r.body, lk.last_seq, lk.member_version,
		CASE WHEN lk.gid IS NULL THEN 1 WHEN NOT lk.open THEN 2
		     WHEN m.muted IS NULL THEN 3 WHEN m.muted THEN 4 ELSE 0 END AS status
	FROM r
	LEFT JOIN lk ON lk.gid = r.gid
	LEFT JOIN LATERAL (SELECT muted FROM group_members
		WHERE gid = r.gid AND uid = r.sender LIMIT 1) m ON true
), ok AS MATERIALIZED (
	SELECT i, gid, sender, cid, kind, body,
		last_seq + row_number() OVER (PARTITION BY gid ORDER BY i) AS seq
	FROM v WHERE status = 0
), ins AS (
	INSERT INTO messages (gid, seq, sender, client_msg_id, kind, body, created_at)
	SELECT gid, seq, sender, cid, kind, body, now() FROM ok
), adv AS (
	UPDATE groups g SET last_seq = c.last
	FROM (SELECT gid, max(seq) AS last FROM ok GROUP BY gid) c
	WHERE g.gid = c.gid
)
SELECT v.i, v.status, coalesce(ok.seq, 0), now(), coalesce(v.member_version, 0) FROM v LEFT JOIN ok ON ok.i = v.i`

// sqlRejectedDups finds which of the requests that sqlAppend rejected are
// retries of stored messages.
const sqlRejectedDups = `SELECT r.i, m.seq, m.created_at
	FROM unnest($1::bigint[], $2::text[], $3::text[]) WITH ORDINALITY AS r(gid, sender, cid, i)
	CROSS JOIN LATERAL (SELECT seq, created_at FROM messages
		WHERE gid = r.gid AND sender = r.sender AND client_msg_id = r.cid LIMIT 1) m`

// Statuses of sqlAppend.
const (
	statusOK = iota
	statusNoGroup
	statusClosed
	statusNotMember
	statusMuted
)

var statusErr = [...]error{nil, store.ErrGroupNotFound, store.ErrGroupClosed, store.ErrNotMember, store.ErrMuted}

// SQL of the two-round-trip Append transaction, used when a batch holds
// retries. The lock statement sorts before it locks (LockRows sits above
// Sort), so groups are locked in ascending gid order.
const (
	sqlLockGroups = `SELECT gid, state = 'active', last_seq, member_version FROM groups
		WHERE gid = ANY($1::bigint[]) ORDER BY gid FOR NO KEY UPDATE`
	sqlClock = `SELECT clock_timestamp()`
	// The lookups are LATERAL ... LIMIT 1 so that they are always one
	// index probe per key (with run-time partition pruning for messages),
	// never a hash join over a whole table, whatever the statistics say.
	sqlMembers = `SELECT r.i, m.muted
		FROM unnest($1::bigint[], $2::text[]) WITH ORDINALITY AS r(gid, uid, i)
		CROSS JOIN LATERAL (SELECT muted FROM group_members
			WHERE gid = r.gid AND uid = r.uid LIMIT 1) m`
	sqlDups = `SELECT r.i, m.seq, m.created_at
		FROM unnest($1::bigint[], $2::text[], $3::text[]) WITH ORDINALITY AS r(gid, sender, cid, i)
		CROSS JOIN LATERAL (SELECT seq, created_at FROM messages
			WHERE gid = r.gid AND sender = r.sender AND client_msg_id = r.cid LIMIT 1) m`
	sqlAdvance = `UPDATE groups g SET last_seq = u.last_seq
		FROM unnest($1::bigint[], $2::bigint[]) AS u(gid, last_seq)
		WHERE g.gid = u.gid`
	sqlInsert = `INSERT INTO messages (gid, seq, sender, client_msg_id, kind, body, created_at)
		SELECT g, s, se, c, k, b, $7::timestamptz
		FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bytea[]) AS t(g, s, se, c, k, b)`
)

var messageCols = []string{"gid", "seq", "sender", "client_msg_id", "kind", "body", "created_at"}

type dupKey struct {
	gid         int64
	sender, cid string
}

type memberKey struct {
	gid int64
	uid string
}

// Per-request classification in appendScratch.ref.
const (
	refRejected = -2 // failed validation
	refFirst    = -1 // first occurrence of its (gid, sender, client_msg_id)
	// >= 0: repeat of the request with that index
)

// Membership states in appendScratch.mState.
const (
	notMember int8 = iota
	member
	mutedMember
)

// appendScratch is the reusable working memory of one Append call.
type appendScratch struct {
	first   map[dupKey]int32
	members map[memberKey]int32 // -> index into mGID/mUID
	groups  map[int64]int32     // -> index into gids

	ref  []int32 // per request, see refFirst
	mref []int32 // per request: index into mGID/mUID

	gids   []int64 // distinct, ascending
	gFound []bool
	gOpen  []bool
	gBase  []int64 // last_seq when locked
	gLast  []int64 // last_seq after this batch
	gVer   []int64 // member_version when locked

	mGID   []int64
	mUID   []string
	mState []int8

	dGID    []int64
	dSender []string
	dCID    []string
	dReq    []int32 // request index of each dedup key
	dKind   []string
	dBody   [][]byte

	rGID    []int64 // requests rejected by sqlAppend, to look up as retries
	rSender []string
	rCID    []string
	rReq    []int32

	iGID    []int64
	iSeq    []int64
	iSender []string
	iCID    []string
	iKind   []string
	iBody   [][]byte

	uGID  []int64
	uLast []int64
}

var scratchPool = sync.Pool{New: func() any {
	return &appendScratch{
		first:   make(map[dupKey]int32),
		members: make(map[memberKey]int32),
		groups:  make(map[int64]int32),
	}
}}

// maxPooledScratch keeps one huge batch from pinning its memory forever.
const maxPooledScratch = 1 << 14

func (sc *appendScratch) reset(n int) {
	clear(sc.first)
	clear(sc.members)
	clear(sc.groups)
	sc.ref = slices.Grow(sc.ref[:0], n)[:n]
	sc.mref = slices.Grow(sc.mref[:0], n)[:n]
	sc.gids, sc.gFound, sc.gOpen, sc.gBase, sc.gLast = sc.gids[:0], sc.gFound[:0], sc.gOpen[:0], sc.gBase[:0], sc.gLast[:0]
	sc.gVer = sc.gVer[:0]
	sc.mGID, sc.mUID, sc.mState = sc.mGID[:0], sc.mUID[:0], sc.mState[:0]
	sc.dGID, sc.dSender, sc.dCID, sc.dReq, sc.dKind = sc.dGID[:0], sc.dSender[:0], sc.dCID[:0], sc.dReq[:0], sc.dKind[:0]
	clear(sc.dBody)
	sc.dBody = sc.dBody[:0]
	sc.rGID, sc.rSender, sc.rCID, sc.rReq = sc.rGID[:0], sc.rSender[:0], sc.rCID[:0], sc.rReq[:0]
	sc.iGID, sc.iSeq, sc.iSender, sc.iCID, sc.iKind = sc.iGID[:0], sc.iSeq[:0], sc.iSender[:0], sc.iCID[:0], sc.iKind[:0]
	clear(sc.iBody) // drop references to callers' bodies
	sc.iBody = sc.iBody[:0]
	clear(sc.mUID[:cap(sc.mUID)])
	sc.uGID, sc.uLast = sc.uGID[:0], sc.uLast[:0]
}

func (sc *appendScratch) release() {
	if cap(sc.ref) > maxPooledScratch {
		return
	}
	sc.reset(0)
	clear(sc.dSender[:cap(sc.dSender)])
	clear(sc.dCID[:cap(sc.dCID)])
	clear(sc.iSender[:cap(sc.iSender)])
	clear(sc.iCID[:cap(sc.iCID)])
	clear(sc.rSender[:cap(sc.rSender)])
	clear(sc.rCID[:cap(sc.rCID)])
	scratchPool.Put(sc)
}

// Append implements store.Store. See the package comment for the
// transaction's shape and its invariants.
func (s *Store) Append(ctx context.Context, reqs []store.AppendRequest, res []store.AppendResult) error {
	if err := s.lim.CheckBatch(len(reqs), len(res)); err != nil {
		return err
	}
	clear(res)
	if len(reqs) == 0 {
		return nil
	}
	if s.merge != nil {
		return s.appendMerged(ctx, reqs, res)
	}
	return s.appendOne(ctx, reqs, res)
}

// appendOne is one Append statement (or transaction) for reqs, whose
// sizes are checked and which is not empty.
func (s *Store) appendOne(ctx context.Context, reqs []store.AppendRequest, res []store.AppendResult) error {
	sc := scratchPool.Get().(*appendScratch)
	defer sc.release()
	sc.reset(len(reqs))

	// Validate and collect the distinct keys the database must answer for.
	for i := range reqs {
		r := &reqs[i]
		if err := store.ValidateAppend(r, s.lim); err != nil {
			res[i].Err = err
			sc.ref[i] = refRejected
			continue
		}
		k := dupKey{r.GID, r.Sender, r.ClientMsgID}
		if j, ok := sc.first[k]; ok {
			sc.ref[i] = j
			continue
		}
		sc.first[k] = int32(i)
		sc.ref[i] = refFirst
		sc.dGID = append(sc.dGID, r.GID)
		sc.dSender = append(sc.dSender, r.Sender)
		sc.dCID = append(sc.dCID, r.ClientMsgID)
		sc.dReq = append(sc.dReq, int32(i))
		kind := r.Kind
		if kind == "" {
			kind = store.KindText
		}
		sc.dKind = append(sc.dKind, kind)
		sc.dBody = append(sc.dBody, r.Body)
		mk := memberKey{r.GID, r.Sender}
		mi, ok := sc.members[mk]
		if !ok {
			mi = int32(len(sc.mGID))
			sc.members[mk] = mi
			sc.mGID = append(sc.mGID, r.GID)
			sc.mUID = append(sc.mUID, r.Sender)
			sc.mState = append(sc.mState, notMember)
		}
		sc.mref[i] = mi
		if _, ok := sc.groups[r.GID]; !ok {
			sc.groups[r.GID] = 0
			sc.gids = append(sc.gids, r.GID)
		}
	}
	if len(sc.gids) > 0 {
		slices.Sort(sc.gids)
		retry, err := true, error(nil)
		if !s.twoStep {
			retry, err = s.appendFast(ctx, res, sc)
		}
		if retry {
			err = s.appendTx(ctx, reqs, res, sc)
		}
		if err != nil {
			clear(res)
			return err
		}
	}
	// Repeats within the batch share the outcome of their first occurrence.
	for i := range reqs {
		if j := sc.ref[i]; j >= 0 {
			res[i] = res[j]
			res[i].Duplicate = res[j].Err == nil
		}
	}
	return nil
}

// appendFast runs sqlAppend for the validated first occurrences. retry
// reports that the batch holds a retry of a stored message and must run on
// the slow path; nothing was stored then.
func (s *Store) appendFast(ctx context.Context, res []store.AppendResult, sc *appendScratch) (retry bool, err error) {
	rows, err := s.pool.Query(ctx, cmp.Or(s.fastSQL, sqlAppend), sc.dGID, sc.dSender, sc.dCID, sc.dKind, sc.dBody, sc.gids)
	if err != nil {
		return false, dbErr("append", err)
	}
	for rows.Next() {
		var i, seq, ver int64
		var status int32
		var at time.Time
		if err := rows.Scan(&i, &status, &seq, &at, &ver); err != nil {
			rows.Close()
			return false, dbErr("append", err)
		}
		if i < 1 || int(i) > len(sc.dReq) || status < 0 || int(status) >= len(statusErr) {
			rows.Close()
			return false, fmt.Errorf("store/postgres: append: bad result row (%d, %d)", i, status)
		}
		ri := sc.dReq[i-1]
		if status == statusOK {
			res[ri] = store.AppendResult{Seq: seq, CreatedAt: at, MemberVersion: ver}
		} else {
			res[ri] = store.AppendResult{Err: statusErr[status]}
			sc.rGID = append(sc.rGID, sc.dGID[i-1])
			sc.rSender = append(sc.rSender, sc.dSender[i-1])
			sc.rCID = append(sc.rCID, sc.dCID[i-1])
			sc.rReq = append(sc.rReq, ri)
		}
	}
	// The inserts run after the result rows are sent, and the commit at the
	// end: only a clean close means stored.
	rows.Close()
	if err := rows.Err(); err != nil {
		for _, ri := range sc.dReq { // keep the validation errors of the others
			res[ri] = store.AppendResult{}
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && // unique_violation
			strings.HasSuffix(pgErr.ConstraintName, "client_msg_id_key") { // of a retry, not of (gid, seq)
			return true, nil
		}
		return false, dbErr("append", err)
	}
	if len(sc.rGID) == 0 {
		return false, nil
	}
	// The accepted requests are committed: a failure here must not fail
	// the batch, it only leaves the rejections unchecked for retries.
	if err := s.rejectedDups(ctx, res, sc); err != nil {
		s.log.Warn("append: looking up rejected requests as retries failed", "err", err)
	}
	return false, nil
}

// rejectedDups answers the rejected requests of appendFast that are
// retries of stored messages with their original seq.
func (s *Store) rejectedDups(ctx context.Context, res []store.AppendResult, sc *appendScratch) error {
	rows, err := s.pool.Query(ctx, sqlRejectedDups, sc.rGID, sc.rSender, sc.rCID)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var i, seq int64
		var at time.Time
		if err := rows.Scan(&i, &seq, &at); err != nil {
			return err
		}
		if i < 1 || int(i) > len(sc.rReq) {
			return fmt.Errorf("bad result row %d", i)
		}
		res[sc.rReq[i-1]] = store.AppendResult{Seq: seq, CreatedAt: at, Duplicate: true}
	}
	return rows.Err()
}

// appendTx is the slow path: an explicit transaction in two round trips
// that looks up stored duplicates after locking the groups.
func (s *Store) appendTx(ctx context.Context, reqs []store.AppendRequest, res []store.AppendResult, sc *appendScratch) (err error) {
	for gi, gid := range sc.gids {
		sc.groups[gid] = int32(gi)
	}
	n := len(sc.gids)
	sc.gFound = slices.Grow(sc.gFound, n)[:n]
	sc.gOpen = slices.Grow(sc.gOpen, n)[:n]
	sc.gBase = slices.Grow(sc.gBase, n)[:n]
	sc.gLast = slices.Grow(sc.gLast, n)[:n]
	sc.gVer = slices.Grow(sc.gVer, n)[:n]
	clear(sc.gFound)

	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return dbErr("append: acquire", err)
	}
	inTx := false
	defer func() {
		if err != nil && inTx {
			rollback(ctx, conn)
		}
		conn.Release()
	}()

	// Round trip 1: begin, lock the groups, read membership and duplicates.
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue(sqlLockGroups, sc.gids)
	b.Queue(sqlClock)
	b.Queue(sqlMembers, sc.mGID, sc.mUID)
	b.Queue(sqlDups, sc.dGID, sc.dSender, sc.dCID)
	inTx = true
	now, err := s.readLookups(conn.Conn().SendBatch(ctx, b), res, sc)
	if err != nil {
		return dbErr("append", err)
	}

	// Assign seqs in request order per group.
	for i := range reqs {
		if sc.ref[i] != refFirst || res[i].Duplicate {
			continue
		}
		r := &reqs[i]
		gi := sc.groups[r.GID]
		switch {
		case !sc.gFound[gi]:
			res[i].Err = store.ErrGroupNotFound
		case !sc.gOpen[gi]:
			res[i].Err = store.ErrGroupClosed
		case sc.mState[sc.mref[i]] == notMember:
			res[i].Err = store.ErrNotMember
		case sc.mState[sc.mref[i]] == mutedMember:
			res[i].Err = store.ErrMuted
		default:
			sc.gLast[gi]++
			res[i].Seq = sc.gLast[gi]
			res[i].CreatedAt = now
			res[i].MemberVersion = sc.gVer[gi]
			kind := r.Kind
			if kind == "" {
				kind = store.KindText
			}
			sc.iGID = append(sc.iGID, r.GID)
			sc.iSeq = append(sc.iSeq, sc.gLast[gi])
			sc.iSender = append(sc.iSender, r.Sender)
			sc.iCID = append(sc.iCID, r.ClientMsgID)
			sc.iKind = append(sc.iKind, kind)
			sc.iBody = append(sc.iBody, r.Body)
		}
	}
	for gi := range sc.gids {
		if sc.gFound[gi] && sc.gLast[gi] != sc.gBase[gi] {
			sc.uGID = append(sc.uGID, sc.gids[gi])
			sc.uLast = append(sc.uLast, sc.gLast[gi])
		}
	}

	// Round trip 2: advance last_seq, insert, commit.
	if len(sc.iGID) == 0 {
		if _, err := conn.Exec(ctx, "commit"); err != nil {
			return dbErr("append: commit", err)
		}
		inTx = false
		return nil
	}
	if s.copyInsert {
		err = s.writeCopy(ctx, conn, sc, now)
	} else {
		err = s.writeInsert(ctx, conn, sc, now)
	}
	if err != nil {
		return err
	}
	inTx = false
	return nil
}

// readLookups reads the results of round trip 1 into sc and res. It returns
// the commit timestamp to report.
func (s *Store) readLookups(br pgx.BatchResults, res []store.AppendResult, sc *appendScratch) (now time.Time, err error) {
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err = br.Exec(); err != nil {
		return now, err
	}
	rows, err := br.Query()
	if err != nil {
		return now, err
	}
	for rows.Next() {
		var gid, last, ver int64
		var open bool
		if err = rows.Scan(&gid, &open, &last, &ver); err != nil {
			rows.Close()
			return now, err
		}
		gi := sc.groups[gid]
		sc.gFound[gi], sc.gOpen[gi], sc.gBase[gi], sc.gLast[gi], sc.gVer[gi] = true, open, last, last, ver
	}
	if err = rows.Err(); err != nil {
		return now, err
	}
	if err = br.QueryRow().Scan(&now); err != nil {
		return now, err
	}
	if rows, err = br.Query(); err != nil {
		return now, err
	}
	for rows.Next() {
		var i int64
		var muted bool
		if err = rows.Scan(&i, &muted); err != nil {
			rows.Close()
			return now, err
		}
		sc.mState[i-1] = member
		if muted {
			sc.mState[i-1] = mutedMember
		}
	}
	if err = rows.Err(); err != nil {
		return now, err
	}
	if rows, err = br.Query(); err != nil {
		return now, err
	}
	for rows.Next() {
		var i, seq int64
		var at time.Time
		if err = rows.Scan(&i, &seq, &at); err != nil {
			rows.Close()
			return now, err
		}
		ri := sc.dReq[i-1]
		res[ri] = store.AppendResult{Seq: seq, CreatedAt: at, Duplicate: true}
	}
	return now, rows.Err()
}

// writeInsert is round trip 2 as one pipeline: UPDATE groups, one INSERT
// from arrays, COMMIT.
func (s *Store) writeInsert(ctx context.Context, conn *pgxpool.Conn, sc *appendScratch, now time.Time) (err error) {
	b := &pgx.Batch{}
	b.Queue(sqlAdvance, sc.uGID, sc.uLast)
	b.Queue(sqlInsert, sc.iGID, sc.iSeq, sc.iSender, sc.iCID, sc.iKind, sc.iBody, now)
	b.Queue("commit")
	br := conn.Conn().SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = dbErr("append: commit", cerr)
		}
	}()
	if err := checkTag(br, "append: advance", len(sc.uGID)); err != nil {
		return err
	}
	if err := checkTag(br, "append: insert", len(sc.iGID)); err != nil {
		return err
	}
	return checkCommit(br.Exec())
}

// writeCopy is round trip 2 with COPY instead of INSERT (benchmarks).
func (s *Store) writeCopy(ctx context.Context, conn *pgxpool.Conn, sc *appendScratch, now time.Time) error {
	ct, err := conn.Exec(ctx, sqlAdvance, sc.uGID, sc.uLast)
	if err != nil {
		return dbErr("append: advance", err)
	}
	if int(ct.RowsAffected()) != len(sc.uGID) {
		return fmt.Errorf("store/postgres: append: advanced %d groups, want %d", ct.RowsAffected(), len(sc.uGID))
	}
	row := make([]any, len(messageCols))
	n, err := conn.CopyFrom(ctx, pgx.Identifier{"messages"}, messageCols,
		pgx.CopyFromSlice(len(sc.iGID), func(i int) ([]any, error) {
			// pgx encodes each row before asking for the next: reusing row is safe.
			row[0], row[1], row[2], row[3], row[4], row[5], row[6] =
				sc.iGID[i], sc.iSeq[i], sc.iSender[i], sc.iCID[i], sc.iKind[i], sc.iBody[i], now
			return row, nil
		}))
	if err != nil {
		return dbErr("append: copy", err)
	}
	if int(n) != len(sc.iGID) {
		return fmt.Errorf("store/postgres: append: copied %d rows, want %d", n, len(sc.iGID))
	}
	return checkCommit(conn.Exec(ctx, "commit"))
}

func checkTag(br pgx.BatchResults, op string, want int) error {
	ct, err := br.Exec()
	if err != nil {
		return dbErr(op, err)
	}
	if int(ct.RowsAffected()) != want {
		return fmt.Errorf("store/postgres: %s: %d rows, want %d", op, ct.RowsAffected(), want)
	}
	return nil
}

func checkCommit(ct interface{ String() string }, err error) error {
	if err != nil {
		return dbErr("append: commit", err)
	}
	if ct.String() != "COMMIT" {
		// COMMIT of a failed transaction answers ROLLBACK without an error.
		return store.Unavailable(fmt.Errorf("postgres: append: commit answered %q", ct.String()))
	}
	return nil
}

// rollback ends a failed transaction so the connection can be reused; when
// that fails the pool discards the connection on Release (it is not idle).
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	if conn.Conn().IsClosed() {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	conn.Exec(rctx, "rollback") //nolint:errcheck // best effort, see above
}
