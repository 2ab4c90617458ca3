-- The feed of additions (Store.MembersAdded): each membership records the
-- id of the transaction that added it, and the feed is read in that order
-- from an index. A reader that read up to a snapshot next reads the rows
-- of the transactions that snapshot could not see (at or above its xmax,
-- or in its list of running ones; store/postgres MembersAdded), so none is
-- skipped whatever order transactions commit in. Rows added before
-- this migration keep 0 (no feed reaches back before a node starts).
--
-- Cheap on a big table: ADD COLUMN with a constant default and SET DEFAULT
-- change the catalog only (no rewrite), and the index is partial (only
-- rows added since, added_xid > 0), so its build reads the table once but
-- writes almost nothing. The ALTERs take group_members' ACCESS EXCLUSIVE
-- lock until the migration commits: lock_timeout makes them give up
-- (the node's start fails, retry it) rather than queue behind a long
-- query with every send, connect and read queued behind them. On a table
-- too big to scan under that lock, run the statements of
-- docs/operations.md §8.4 by hand first (the index CONCURRENTLY): each
-- statement here is then a no-op.
SET LOCAL lock_timeout = '10s';
ALTER TABLE group_members ADD COLUMN IF NOT EXISTS added_xid bigint NOT NULL DEFAULT 0;
ALTER TABLE group_members ALTER COLUMN added_xid SET DEFAULT (pg_current_xact_id()::text::bigint);
CREATE INDEX IF NOT EXISTS group_members_added_idx ON group_members (added_xid, gid, uid) WHERE added_xid > 0;
