-- Agent memory writes applied by the database, many in one transaction (docs/memory.md).
--
-- memory_apply(writes) applies a batch of memory.remember / memory.forget calls in the caller's
-- transaction, in the order given, and returns one answer per write. Each write arrives as
-- MemoryService decided it in Python: the rules that need no row (workflow_node, namespace,
-- trigger_user_scope), the subject key and the request's fingerprint. Everything that depends on
-- stored rows happens here, next to the rows, in one round trip per batch:
--
-- 1. a key the journal holds is answered from it (replayed), or refused when it was used for
--    another call;
-- 2. a write that a rule refused is refused;
-- 3. remember reads the chain's exact head and refuses identical live text (duplicate), or
--    appends after it (created, superseded, revived); forget appends a tombstone after a
--    current live revision the caller owns (else not_live, not_owner);
-- 4. the journal row is inserted with the answer: one row, never updated. A writer of the same
--    key that committed meanwhile makes this insert conflict: SQLSTATE CC002 rolls the whole
--    transaction back (the revision included), and the caller's next attempt replays the
--    other's answer.
--
-- Two writers can read one head, but the unique constraints let only one attach to it
-- (memories_one_child, memories_one_root): the loser's insert does nothing, and it reads the new
-- head and decides again, at most 32 times; then SQLSTATE CC001, and the caller retries later.
--
-- SECURITY INVOKER: it runs as the service role, under row-level security. It names each
-- write's organization as the transaction's scope (contextcore.organization_id) before it touches
-- that write's rows, so RLS repeats every organization filter written below. It never names the
-- platform: there is no platform memory.

CREATE FUNCTION memory_apply_one(w jsonb) RETURNS TABLE (
    outcome text, reason text, message text, replayed boolean,
    organization_id uuid, id uuid, definition_id uuid, scope text, user_id uuid,
    subject_key text, text text, subject_refs jsonb, proposed_by_run_id uuid,
    supersedes_id uuid, forgotten_at timestamptz, created_at timestamptz
)
LANGUAGE plpgsql SECURITY INVOKER
AS $$
#variable_conflict use_column
DECLARE
    org        uuid := (w ->> 'organization_id')::uuid;
    key        text := w ->> 'idempotency_key';
    digest     text := w ->> 'request_sha256';
    definition uuid := (w ->> 'definition_id')::uuid;
    run        uuid := (w ->> 'run_id')::uuid;
    journal    record;
    head       memories%ROWTYPE;
    appended   uuid;
BEGIN
    PERFORM set_config('contextcore.platform', '', true),
            set_config('contextcore.organization_id', org::text, true);

    -- 1. a key used before
    SELECT j.request_sha256, j.outcome, j.reason, j.message, j.memory_id INTO journal
    FROM memory_writes AS j
    WHERE j.organization_id = org AND j.idempotency_key = key;
    IF FOUND THEN
        IF journal.request_sha256 <> digest THEN
            outcome := 'refused';
            reason := 'invalid_input';
            message := format('idempotency key %L was used for another call', key);
            replayed := false;
        ELSE
            outcome := journal.outcome;
            reason := journal.reason;
            message := journal.message;
            replayed := true;
            appended := journal.memory_id;
        END IF;
    ELSE
        IF w ? 'refusal' THEN
            -- 2. refused by a rule that needs no row
            outcome := 'refused';
            reason := w -> 'refusal' ->> 'reason';
            message := w -> 'refusal' ->> 'message';
        ELSIF w ->> 'operation' = 'remember' THEN
            -- 3. remember, after the exact head (never a time sort)
            FOR attempt IN 1..32 LOOP
                SELECT * INTO head FROM memory_heads AS h
                WHERE h.organization_id = org AND h.definition_id = definition
                  AND h.scope = w ->> 'scope'
                  AND h.scope_owner_id = (w ->> 'scope_owner_id')::uuid
                  AND h.subject_key = w ->> 'subject_key';
                IF head.text = w ->> 'text' THEN
                    outcome := 'refused';
                    reason := 'duplicate';
                    message := format('memory %s already says this under %s', head.id,
                                      w ->> 'subject_key');
                    EXIT;
                END IF;
                INSERT INTO memories (organization_id, definition_id, scope, user_id,
                                      subject_key, text, subject_refs, supersedes_id,
                                      proposed_by_run_id)
                VALUES (org, definition, w ->> 'scope', (w ->> 'user_id')::uuid,
                        w ->> 'subject_key', w ->> 'text', w -> 'subject_refs', head.id, run)
                ON CONFLICT DO NOTHING
                RETURNING id INTO appended;
                IF appended IS NOT NULL THEN
                    outcome := CASE WHEN head.id IS NULL THEN 'created'
                                    WHEN head.forgotten_at IS NOT NULL THEN 'revived'
                                    ELSE 'superseded' END;
                    EXIT;
                END IF;
            END LOOP;
        ELSE
            -- 3. forget: a tombstone after a current live revision the caller owns
            FOR attempt IN 1..32 LOOP
                SELECT * INTO head FROM memory_heads AS h
                WHERE h.organization_id = org AND h.id = (w ->> 'memory_id')::uuid;
                IF head.id IS NULL OR head.forgotten_at IS NOT NULL THEN
                    outcome := 'refused';
                    reason := 'not_live';
                    message := format('%s is not the current live revision of a memory',
                                      w ->> 'memory_id');
                    EXIT;
                END IF;
                IF head.definition_id <> definition OR (
                    head.scope = 'user' AND head.user_id IS DISTINCT FROM (w ->> 'user_id')::uuid
                ) THEN
                    outcome := 'refused';
                    reason := 'not_owner';
                    message := format('memory %s belongs to another definition or user', head.id);
                    EXIT;
                END IF;
                -- the tombstone copies its parent's chain identity and stored refs as they are
                INSERT INTO memories (organization_id, definition_id, scope, user_id,
                                      subject_key, text, subject_refs, supersedes_id,
                                      proposed_by_run_id, forgotten_at)
                VALUES (org, head.definition_id, head.scope, head.user_id, head.subject_key,
                        NULL, head.subject_refs, head.id, run, clock_timestamp())
                ON CONFLICT DO NOTHING
                RETURNING id INTO appended;
                IF appended IS NOT NULL THEN
                    outcome := 'forgotten';
                    EXIT;
                END IF;
            END LOOP;
        END IF;
        IF outcome IS NULL THEN
            RAISE EXCEPTION 'lost the race for the head of % 32 times',
                coalesce(w ->> 'subject_key', w ->> 'memory_id') USING ERRCODE = 'CC001';
        END IF;
        -- 4. the answer, journaled once
        message := left(message, 2000);
        INSERT INTO memory_writes (organization_id, idempotency_key, request_sha256, operation,
                                   outcome, reason, message, memory_id)
        VALUES (org, key, digest, w ->> 'operation', memory_apply_one.outcome,
                memory_apply_one.reason, memory_apply_one.message, appended)
        ON CONFLICT ON CONSTRAINT memory_writes_pkey DO NOTHING;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'idempotency key % was written concurrently', key
                USING ERRCODE = 'CC002';
        END IF;
        replayed := false;
    END IF;

    IF appended IS NOT NULL THEN
        SELECT m.organization_id, m.id, m.definition_id, m.scope, m.user_id, m.subject_key,
               m.text, m.subject_refs, m.proposed_by_run_id, m.supersedes_id, m.forgotten_at,
               m.created_at
        INTO organization_id, id, definition_id, scope, user_id, subject_key, text,
             subject_refs, proposed_by_run_id, supersedes_id, forgotten_at, created_at
        FROM memories AS m
        WHERE m.organization_id = org AND m.id = appended;
    END IF;
    RETURN NEXT;
END
$$;

-- The batch: one answer per write, in the order given (ordinal from 1).
CREATE FUNCTION memory_apply(writes jsonb) RETURNS TABLE (
    ordinal bigint, outcome text, reason text, message text, replayed boolean,
    organization_id uuid, id uuid, definition_id uuid, scope text, user_id uuid,
    subject_key text, text text, subject_refs jsonb, proposed_by_run_id uuid,
    supersedes_id uuid, forgotten_at timestamptz, created_at timestamptz
)
LANGUAGE plpgsql SECURITY INVOKER
AS $$
DECLARE
    item jsonb;
    n    bigint;
BEGIN
    FOR item, n IN SELECT e.value, e.ordinality
                   FROM jsonb_array_elements(writes) WITH ORDINALITY AS e LOOP
        RETURN QUERY SELECT n, a.* FROM memory_apply_one(item) AS a;
    END LOOP;
END
$$;

REVOKE EXECUTE ON FUNCTION memory_apply_one(jsonb), memory_apply(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memory_apply_one(jsonb), memory_apply(jsonb) TO contextcore_app;

-- The CHECK helpers of 00009 become PL/pgSQL, same expressions. A SQL function in a CHECK is
-- inlined, so every INSERT parsed its body again (measured: a sixth of the database's CPU per
-- memory write); a PL/pgSQL function is compiled once per session.
CREATE OR REPLACE FUNCTION memory_not_blank(value text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    RETURN value ~ '[^[:space:]\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\u001c-\u001f]';
END
$$;

CREATE OR REPLACE FUNCTION memory_subject_refs_valid(refs jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    RETURN CASE
        WHEN jsonb_typeof(refs) IS DISTINCT FROM 'array' THEN false
        WHEN jsonb_array_length(refs) = 0 THEN true
        WHEN jsonb_array_length(refs) > 1 THEN false
        WHEN jsonb_typeof(refs -> 0) IS DISTINCT FROM 'object' THEN false
        WHEN jsonb_typeof(refs -> 0 -> 'kind') IS DISTINCT FROM 'string' THEN false
        WHEN jsonb_typeof(refs -> 0 -> 'id') IS DISTINCT FROM 'string' THEN false
        ELSE memory_not_blank(refs -> 0 ->> 'kind') AND strpos(refs -> 0 ->> 'kind', ':') = 0
         AND memory_not_blank(refs -> 0 ->> 'id') AND strpos(refs -> 0 ->> 'id', ':') = 0
    END;
END
$$;
