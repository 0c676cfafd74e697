-- Erasure, hardened after an attacker's review of 00024-00026 (docs/memory.md, "Erasure").
--
-- 1. No writer straddles an erasure. A writer read the chain's head before memory_erase took
--    its lock (reading takes none), decided, and then waited on the lock to journal what it
--    decided: a duplicate refusal with the erased text's fingerprint, written after the
--    erasure. memory_apply now takes ROW EXCLUSIVE on both tables before it reads anything, so
--    an erasure (SHARE ROW EXCLUSIVE) waits for every writer in progress to commit, and every
--    later writer waits for the erasure. Both take the two tables in one order. memory_apply
--    becomes SECURITY DEFINER to take the lock (the service role holds no write privilege to
--    lock with), and the service role loses EXECUTE on memory_apply_one, so every write takes
--    that path.
-- 2. The update triggers let an erasure through only where the record names the row: a
--    revision the record lists, never a live head (the erasure tombstones the head first); a
--    journal row naming a listed revision, or a duplicate refusal naming one.
-- 3. The planner's statistics keep no sample of memory text, ref labels or fingerprints:
--    ANALYZE copied sampled values of memories.text into pg_statistic, where an erasure
--    cannot reach them. A superuser removes the samples an older ANALYZE left (docs).

CREATE OR REPLACE FUNCTION memory_apply(writes jsonb) RETURNS TABLE (
    ordinal bigint, outcome text, reason text, message text, replayed boolean,
    organization_id uuid, id uuid, definition_id uuid, scope text, user_id uuid,
    subject_key text, text text, subject_refs jsonb, proposed_by_run_id uuid,
    supersedes_id uuid, forgotten_at timestamptz, created_at timestamptz,
    chain_length integer
)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    item   jsonb;
    n      bigint;
    a      record;
    length integer;
BEGIN
    -- before any read: an erasure in progress is waited for, and waits for this transaction
    LOCK TABLE public.memories, public.memory_writes IN ROW EXCLUSIVE MODE;
    FOR item, n IN SELECT e.value, e.ordinality
                   FROM jsonb_array_elements(writes) WITH ORDINALITY AS e LOOP
        SELECT * INTO a FROM public.memory_apply_one(item);
        -- a statement of its own: its snapshot sees the revision just appended
        length := NULL;
        IF a.id IS NOT NULL AND NOT a.replayed THEN
            SELECT count(*)::integer INTO length FROM public.memories AS m
            WHERE m.organization_id = a.organization_id
              AND m.definition_id = a.definition_id AND m.scope = a.scope
              AND m.scope_owner_id = coalesce(a.user_id, a.organization_id)
              AND m.subject_key = a.subject_key;
        END IF;
        RETURN QUERY SELECT n, a.outcome, a.reason, a.message, a.replayed, a.organization_id,
                            a.id, a.definition_id, a.scope, a.user_id, a.subject_key, a.text,
                            a.subject_refs, a.proposed_by_run_id, a.supersedes_id,
                            a.forgotten_at, a.created_at, length;
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION memory_apply_one(jsonb) FROM contextcore_app;

CREATE OR REPLACE FUNCTION memories_refuse_update() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.erasure_id IS NULL AND NEW.erasure_id IS NOT NULL
       AND NEW.text IS NULL
       AND NEW.subject_refs = memory_refs_without_labels(OLD.subject_refs)
       AND (NEW.organization_id, NEW.id, NEW.definition_id, NEW.scope, NEW.user_id,
            NEW.subject_key, NEW.proposed_by_run_id, NEW.supersedes_id, NEW.forgotten_at,
            NEW.created_at)
           IS NOT DISTINCT FROM
           (OLD.organization_id, OLD.id, OLD.definition_id, OLD.scope, OLD.user_id,
            OLD.subject_key, OLD.proposed_by_run_id, OLD.supersedes_id, OLD.forgotten_at,
            OLD.created_at)
       -- the record lists this revision
       AND EXISTS (SELECT 1 FROM memory_erasures AS e
                   WHERE e.organization_id = NEW.organization_id AND e.id = NEW.erasure_id
                     AND NEW.id = ANY (e.memory_ids))
       -- and it is not a live head: a tombstone, or superseded
       AND (OLD.forgotten_at IS NOT NULL
            OR EXISTS (SELECT 1 FROM memories AS c
                       WHERE c.organization_id = OLD.organization_id
                         AND c.supersedes_id = OLD.id)) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'memories are append only: a change is a new revision'
        USING ERRCODE = 'restrict_violation';
END
$$;

CREATE OR REPLACE FUNCTION memory_writes_answer_once() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.erasure_id IS NULL AND NEW.erasure_id IS NOT NULL
       AND NEW.request_sha256 = repeat('0', 64)
       AND (NEW.organization_id, NEW.idempotency_key, NEW.operation, NEW.outcome, NEW.reason,
            NEW.message, NEW.memory_id, NEW.created_at)
           IS NOT DISTINCT FROM
           (OLD.organization_id, OLD.idempotency_key, OLD.operation, OLD.outcome, OLD.reason,
            OLD.message, OLD.memory_id, OLD.created_at)
       -- the record lists the revision this row names
       AND EXISTS (SELECT 1 FROM memory_erasures AS e
                   WHERE e.organization_id = NEW.organization_id AND e.id = NEW.erasure_id
                     AND (NEW.memory_id = ANY (e.memory_ids)
                          OR substring(NEW.message FROM '^memory ([0-9a-f-]{36}) ')
                             = ANY (e.memory_ids::text[]))) THEN
        RETURN NEW;
    END IF;
    IF OLD.outcome IS NOT NULL OR OLD.erasure_id IS NOT NULL THEN
        RAISE EXCEPTION 'the answer to idempotency key % is recorded and never changes',
            OLD.idempotency_key
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
$$;

ALTER TABLE memories
    ALTER COLUMN text SET STATISTICS 0,
    ALTER COLUMN subject_refs SET STATISTICS 0;
ALTER TABLE memory_writes
    ALTER COLUMN request_sha256 SET STATISTICS 0,
    ALTER COLUMN message SET STATISTICS 0;
