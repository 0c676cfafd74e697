-- The start journal of the delivery runtime (docs/delivery.md, "A record that kills its
-- process"): every record a consumer group starts is counted here before its handler runs, so a
-- record that takes its process down before it has an outcome is still counted after the
-- restart. A record started before without an outcome is run alone; once it has died alone
-- max_crashes times it is dead-lettered (crashed_the_consumer) instead of started again.
--
-- Infrastructure, not tenant data: keyed by the consumer group and the record's position, no
-- organization and no payload (the exception to the shard-by-organization rule, as the
-- processed-message ledger was before 00005; no tenant can name a row). Bounded: a member
-- deletes the rows below each position it commits, and the sweep deletes rows no commit
-- reached (a group or a topic that is gone) after a week.
--
-- starts: how often the record was started; solo_starts: how often it was started alone and
-- has not finished since (a solo run that finishes takes its start back).

CREATE TABLE delivery_starts (
    consumer_group    text        NOT NULL CHECK (length(consumer_group) BETWEEN 1 AND 255),
    topic             text        NOT NULL CHECK (topic ~ '^[A-Za-z0-9._-]{1,249}$'),
    "partition"       integer     NOT NULL CHECK ("partition" >= 0),
    "offset"          bigint      NOT NULL CHECK ("offset" >= 0),
    starts            integer     NOT NULL DEFAULT 1 CHECK (starts >= 1),
    solo_starts       integer     NOT NULL DEFAULT 0 CHECK (solo_starts >= 0),
    last_started_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, "partition", "offset")
);

CREATE INDEX delivery_starts_last_started_at_idx ON delivery_starts (last_started_at);

-- The runtime login reaches it as the service role, like every table; it reads and writes rows
-- of any consumer group (it is one service), and nothing here holds tenant content.
GRANT SELECT, INSERT, UPDATE, DELETE ON delivery_starts TO contextcore_app;
