-- fanfare schema v1 (docs/architecture.md §3). Unqualified names: applied to the first
-- schema on the search_path.

-- Groups. last_seq is the seq allocator: Append takes this row's lock
-- (FOR NO KEY UPDATE, in gid order) and advances last_seq by the number of
-- messages it stores in the same transaction, so seqs are dense per group.
-- next_ordinal is the high-water mark of member ordinals; freed ordinals
-- below it are in group_free_ordinals.
CREATE SEQUENCE groups_gid_seq AS bigint START 1;

CREATE TABLE groups (
    gid          bigint      PRIMARY KEY CHECK (gid > 0),
    name         text        NOT NULL DEFAULT '',
    owner        text        NOT NULL DEFAULT '',
    state        text        NOT NULL DEFAULT 'active'
                             CHECK (state IN ('active', 'muted_all', 'dissolved')),
    last_seq     bigint      NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
    member_count bigint      NOT NULL DEFAULT 0 CHECK (member_count >= 0),
    next_ordinal integer     NOT NULL DEFAULT 0 CHECK (next_ordinal >= 0),
    created_at   timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50); -- every batch updates its groups' rows: keep room for HOT updates

-- Members. ordinal is the member's bit index in presence bitmaps: dense per
-- group, reused only through group_free_ordinals. join_seq is the first seq
-- the member may see (groups.last_seq + 1 when it joined).
CREATE TABLE group_members (
    gid           bigint      NOT NULL REFERENCES groups (gid),
    uid           text        NOT NULL,
    ordinal       integer     NOT NULL CHECK (ordinal >= 0),
    join_seq      bigint      NOT NULL CHECK (join_seq > 0),
    last_read_seq bigint      NOT NULL DEFAULT 0 CHECK (last_read_seq >= 0),
    role          text        NOT NULL DEFAULT 'member',
    muted         boolean     NOT NULL DEFAULT false,
    joined_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (gid, uid),
    UNIQUE (gid, ordinal)
) WITH (fillfactor = 90); -- last_read_seq updates stay HOT
-- Sync and UserGroups: every membership of one user.
CREATE INDEX group_members_uid_idx ON group_members (uid, gid);

-- Ordinals freed by removed members, handed out again smallest first.
CREATE TABLE group_free_ordinals (
    gid     bigint  NOT NULL,
    ordinal integer NOT NULL,
    PRIMARY KEY (gid, ordinal)
);

-- Messages, hash-partitioned by gid so that no single index grows with the
-- whole message history. Both keys contain the partition key gid.
CREATE TABLE messages (
    gid           bigint      NOT NULL,
    seq           bigint      NOT NULL CHECK (seq > 0),
    sender        text        NOT NULL,
    client_msg_id text        NOT NULL,
    kind          text        NOT NULL DEFAULT 'text' CHECK (kind IN ('text', 'at_all')),
    body          bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (gid, seq),
    UNIQUE (gid, sender, client_msg_id)
) PARTITION BY HASH (gid);

CREATE TABLE messages_p00 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 0);
CREATE TABLE messages_p01 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 1);
CREATE TABLE messages_p02 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 2);
CREATE TABLE messages_p03 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 3);
CREATE TABLE messages_p04 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 4);
CREATE TABLE messages_p05 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 5);
CREATE TABLE messages_p06 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 6);
CREATE TABLE messages_p07 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 7);
CREATE TABLE messages_p08 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 8);
CREATE TABLE messages_p09 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 9);
CREATE TABLE messages_p10 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 10);
CREATE TABLE messages_p11 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 11);
CREATE TABLE messages_p12 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 12);
CREATE TABLE messages_p13 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 13);
CREATE TABLE messages_p14 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 14);
CREATE TABLE messages_p15 PARTITION OF messages FOR VALUES WITH (MODULUS 16, REMAINDER 15);

-- Tier-2 index: which of my groups moved. Written coalesced for active
-- members, never per message; last_seq never moves backwards.
CREATE TABLE conversations (
    uid        text        NOT NULL,
    gid        bigint      NOT NULL,
    last_seq   bigint      NOT NULL CHECK (last_seq >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (uid, gid)
);

-- Users: level 0 normal, 1..3 VIP. last_active_at is NULL until first seen.
CREATE TABLE users (
    uid            text        PRIMARY KEY,
    level          smallint    NOT NULL DEFAULT 0 CHECK (level BETWEEN 0 AND 3),
    last_active_at timestamptz
);
