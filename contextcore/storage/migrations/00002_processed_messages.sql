-- The processed-message ledger of the idempotent consumers.
--
-- A consumer that writes (upload, embedding, memory) inserts (consumer, message_id) in the same
-- transaction as its effect, and skips a message whose row already exists: Kafka delivers at
-- least once, and a redelivered message must not apply its effect twice. The message id is the
-- producer's idempotency key when the message carries one, else topic/partition/offset.
--
-- Bounded: rows older than the retention are deleted by the sweeper (index on processed_at).
-- Exception to the shard-by-organization rule: a message id is global, and the ledger is
-- infrastructure, not tenant data, so the table has no organization_id.

CREATE TABLE processed_messages (
    consumer      text        NOT NULL CHECK (consumer <> ''),
    message_id    text        NOT NULL CHECK (message_id <> ''),
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX processed_messages_processed_at_idx ON processed_messages (processed_at);
