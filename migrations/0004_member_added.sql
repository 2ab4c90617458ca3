-- The feed of additions (Store.MembersAdded): each membership records the
-- id of the transaction that added it, and the feed is read in that order
-- from an index. A reader that read up to a snapshot next reads from that
-- snapshot's oldest running transaction on (pg_snapshot_xmin): every
-- addition not visible to it was made by a transaction at or above it, so
-- none is skipped whatever order transactions commit in. Rows added before
-- this migration keep 0 (no feed reaches back before a node starts), so
-- the column is added without rewriting the table.
ALTER TABLE group_members ADD COLUMN added_xid bigint NOT NULL DEFAULT 0;
ALTER TABLE group_members ALTER COLUMN added_xid SET DEFAULT (pg_current_xact_id()::text::bigint);
CREATE INDEX group_members_added_idx ON group_members (added_xid, gid, uid);
