package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanfare-im/fanfare/store"
)

// oldestSQL reads the created_at of the group's oldest message: one
// index probe, all a round costs for a group with nothing to delete.
const oldestSQL = `SELECT created_at FROM messages WHERE gid = $1 ORDER BY seq LIMIT 1`

// expireSQL deletes the group's oldest messages (at most $3) below the
// first one created at or after $2, as one range of the primary key: only
// a prefix of a group's messages is ever deleted, so seqs stay dense above
// the oldest message left even if created_at is not monotone in seq.
const expireSQL = `
WITH head AS (
	SELECT seq, created_at FROM messages WHERE gid = $1 ORDER BY seq LIMIT $3
), stop AS (
	SELECT coalesce(min(seq) FILTER (WHERE created_at >= $2), max(seq) + 1) AS seq FROM head
)
DELETE FROM messages WHERE gid = $1 AND seq < (SELECT seq FROM stop)`

// ExpireMessages implements store.Store.
func (s *Store) ExpireMessages(ctx context.Context, gid int64, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: limit %d", store.ErrBadRequest, limit)
	}
	var oldest time.Time
	switch err := s.pool.QueryRow(ctx, oldestSQL, gid).Scan(&oldest); {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, dbErr("expire messages", err)
	case !oldest.Before(before):
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, expireSQL, gid, before, limit)
	if err != nil {
		return 0, dbErr("expire messages", err)
	}
	return int(tag.RowsAffected()), nil
}

// GroupIDs implements store.Store.
func (s *Store) GroupIDs(ctx context.Context, after int64, limit int) ([]int64, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: limit %d", store.ErrBadRequest, limit)
	}
	rows, err := s.pool.Query(ctx, `SELECT gid FROM groups WHERE gid > $1 ORDER BY gid LIMIT $2`, after, limit)
	if err != nil {
		return nil, dbErr("group ids", err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var gid int64
		if err := rows.Scan(&gid); err != nil {
			return nil, dbErr("group ids", err)
		}
		out = append(out, gid)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr("group ids", err)
	}
	return out, nil
}
