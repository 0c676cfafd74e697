-- Agent memory, hardened after an attacker's review of 00009 (docs/memory.md):
--
-- * A chain starts with a fact: a root is never a tombstone.
-- * The service role inserts only the columns a write names. The id and created_at come from
--   the defaults, so no writer can choose a revision's id or backdate it, which would move it in
--   the recency order.
-- * A journal answer, once recorded, never changes.
-- * A subject key fits the unique indexes it is part of. A btree entry holds at most about 2.7 kB,
--   so the real limit is in bytes, not characters.

ALTER TABLE memories
    ADD CONSTRAINT memories_root_is_not_a_tombstone
        CHECK (forgotten_at IS NULL OR supersedes_id IS NOT NULL),
    ADD CONSTRAINT memories_subject_key_fits_its_indexes
        CHECK (octet_length(subject_key) <= 2400);

REVOKE INSERT ON memories FROM contextcore_app;
GRANT INSERT (organization_id, definition_id, scope, user_id, subject_key, text, subject_refs,
              supersedes_id, proposed_by_run_id, forgotten_at)
    ON memories TO contextcore_app;

CREATE FUNCTION memory_writes_answer_once() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.outcome IS NOT NULL THEN
        RAISE EXCEPTION 'the answer to idempotency key % is recorded and never changes',
            OLD.idempotency_key
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER memory_writes_answer_once BEFORE UPDATE ON memory_writes
    FOR EACH ROW EXECUTE FUNCTION memory_writes_answer_once();
