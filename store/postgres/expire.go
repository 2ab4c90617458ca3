package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// expireSQL deletes the group's oldest messages (at most $3, by the
// primary key) below the first one created at or after $2.
const expireSQL = `
WITH head AS (
	SELECT seq, created_at FROM messages WHERE gid = $1 ORDER BY seq LIMIT $3
), stop AS (
	SELECT min(seq) AS seq FROM head WHERE created_at >= $2
)
DELETE FROM messages m USING head h
WHERE m.gid = $1 AND m.seq = h.seq
  AND h.seq < coalesce((SELECT seq FROM stop), 9223372036854775807)`

// ExpireMessages implements store.Store.
func (s *Store) ExpireMessages(ctx context.Context, gid int64, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: limit %d", store.ErrBadRequest, limit)
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
