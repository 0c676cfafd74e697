-- Erasure: an operator removes a person's memory text and keeps the audit trail (issue 19,
-- CLARIFICATIONS 15; docs/memory.md, "Erasure").
--
-- memory.forget is the agent's act: a tombstone, the text kept. Erasure is an operator's, for a
-- person's right to have their data erased (GDPR article 17, CCPA). memory_erase(organization,
-- selector, selected, apply) matches chains by a user (their user-scope memories and every
-- memory keyed to user:<id>), a subject (<kind>:<id>) or one revision (its whole chain), and
-- with apply, in one transaction:
--
-- 1. records the erasure in memory_erasures: when, the login that ran it, what was asked (ids
--    only), how many chains, revisions and journal rows, and every revision id. No text;
-- 2. appends a tombstone to each matched chain whose head is live, so that the memory source
--    never shows it and a later remember of the same key starts a new live revision
--    ('revived');
-- 3. removes every matched revision's text and its ref's label (free text); the ids, the order,
--    the timestamps, the keys and the tombstones stay. The update trigger lets exactly this
--    change through, once, naming the erasure record;
-- 4. replaces the request fingerprint of every journal row that names a matched revision (the
--    answer's revision, or a duplicate's message) with zeros: a sha256 of a short text
--    confirms a guess of it. A later call with such a key is refused, not replayed.
--
-- Both tables are locked against writers (SHARE ROW EXCLUSIVE) for the transaction, so nothing
-- is appended to a matched chain between the match and the erasure. memory_erase runs as its
-- caller and only the owner may call it: the service role has no UPDATE on either table and no
-- grant on the function or on memory_erasures. The owner's row policies keep it to the
-- organization it names. What erasure cannot reach: see docs/memory.md.

CREATE TABLE memory_erasures (
    organization_id uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id              uuid        NOT NULL DEFAULT gen_random_uuid(),
    erased_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- the login that ran it (session_user): the credential, not a name anyone typed
    erased_by       text        NOT NULL,
    selector        text        NOT NULL CHECK (selector IN ('user', 'subject', 'memory')),
    -- the user id, <kind>:<id>, or the revision id: identifiers, never text
    selected        text        NOT NULL CHECK (length(selected) <= 1000),
    chains          integer     NOT NULL CHECK (chains >= 0),
    revisions       integer     NOT NULL CHECK (revisions >= 0),
    journal_rows    integer     NOT NULL CHECK (journal_rows >= 0),
    memory_ids      uuid[]      NOT NULL,
    PRIMARY KEY (organization_id, id)
);
CREATE INDEX memory_erasures_recent ON memory_erasures (organization_id, erased_at);

CREATE FUNCTION memory_erasures_refuse_update() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'an erasure record is never changed' USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER memory_erasures_append_only BEFORE UPDATE ON memory_erasures
    FOR EACH ROW EXECUTE FUNCTION memory_erasures_refuse_update();
CREATE TRIGGER memory_erasures_never_truncated BEFORE TRUNCATE ON memory_erasures
    FOR EACH STATEMENT EXECUTE FUNCTION memory_refuse_truncate();

ALTER TABLE memories
    ADD COLUMN erasure_id uuid,
    ADD CONSTRAINT memories_erased_by_a_record
        FOREIGN KEY (organization_id, erasure_id) REFERENCES memory_erasures (organization_id, id),
    DROP CONSTRAINT memories_tombstone_has_no_text,
    -- a revision has text until it is forgotten (a tombstone) or erased
    ADD CONSTRAINT memories_text_until_forgotten_or_erased
        CHECK ((text IS NULL) = (forgotten_at IS NOT NULL OR erasure_id IS NOT NULL));

ALTER TABLE memory_writes
    ADD COLUMN erasure_id uuid,
    ADD CONSTRAINT memory_writes_erased_by_a_record
        FOREIGN KEY (organization_id, erasure_id) REFERENCES memory_erasures (organization_id, id);

-- A stored subject_refs value without the labels: each object element loses its label; kind
-- and id (part of the key) stay.
CREATE FUNCTION memory_refs_without_labels(refs jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN jsonb_typeof(refs) = 'array' THEN
        coalesce((SELECT jsonb_agg(CASE WHEN jsonb_typeof(e) = 'object' THEN e - 'label' ELSE e END
                                   ORDER BY n)
                  FROM jsonb_array_elements(refs) WITH ORDINALITY AS x (e, n)), '[]'::jsonb)
    ELSE refs END
$$;

-- 00009's append-only trigger, with the one change it lets through: an erasure (the text and
-- the ref's label removed, the record named, nothing else changed, once).
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
            OLD.created_at) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'memories are append only: a change is a new revision'
        USING ERRCODE = 'restrict_violation';
END
$$;

-- 00010's journal trigger, with the same one exception: the fingerprint zeroed by an erasure.
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
            OLD.message, OLD.memory_id, OLD.created_at) THEN
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

-- The owner erases in the organization it names, and records the erasure there.
DO $$
BEGIN
    EXECUTE format(
        'CREATE POLICY owner_erases_in_scope ON memories FOR UPDATE TO %I '
        'USING (contextcore_in_scope(organization_id)) '
        'WITH CHECK (contextcore_in_scope(organization_id))', current_user);
    EXECUTE format(
        'CREATE POLICY owner_erases_in_scope ON memory_writes FOR UPDATE TO %I '
        'USING (contextcore_in_scope(organization_id)) '
        'WITH CHECK (contextcore_in_scope(organization_id))', current_user);
    EXECUTE format(
        'CREATE POLICY owner_records_in_scope ON memory_erasures FOR ALL TO %I '
        'USING (contextcore_in_scope(organization_id)) '
        'WITH CHECK (contextcore_in_scope(organization_id))', current_user);
END
$$;
ALTER TABLE memory_erasures ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_erasures FORCE ROW LEVEL SECURITY;

-- memory_apply_one (00011, definer since 00024) with one change: a journal row an erasure
-- zeroed answers a refusal, never a replay of a revision that has no text.
CREATE OR REPLACE FUNCTION memory_apply_one(w jsonb) RETURNS TABLE (
    outcome text, reason text, message text, replayed boolean,
    organization_id uuid, id uuid, definition_id uuid, scope text, user_id uuid,
    subject_key text, text text, subject_refs jsonb, proposed_by_run_id uuid,
    supersedes_id uuid, forgotten_at timestamptz, created_at timestamptz
)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
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
    SELECT j.request_sha256, j.outcome, j.reason, j.message, j.memory_id, j.erasure_id
    INTO journal
    FROM memory_writes AS j
    WHERE j.organization_id = org AND j.idempotency_key = key;
    IF FOUND THEN
        IF journal.erasure_id IS NOT NULL THEN
            -- 00025: the call's fingerprint went with the erased text; it is not replayed
            outcome := 'refused';
            reason := 'invalid_input';
            message := format('what idempotency key %L wrote was erased (erasure %s)', key,
                              journal.erasure_id);
            replayed := false;
        ELSIF journal.request_sha256 <> digest THEN
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

-- What matches and, with p_apply, the erasure. Returns the record's id (null on a dry run), the
-- counts and the matched revision ids.
CREATE FUNCTION memory_erase(
    p_organization uuid, p_selector text, p_selected text, p_apply boolean
) RETURNS TABLE (
    erasure_id uuid, chains integer, revisions integer, journal_rows integer, memory_ids uuid[]
)
LANGUAGE plpgsql SECURITY INVOKER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    person    uuid;
    kind      text;
    row_id    text;
    revision  uuid;
    ids       uuid[];
    n_chains  integer;
    n_journal integer;
    record_id uuid;
BEGIN
    IF p_selector = 'user' THEN
        person := p_selected::uuid;
    ELSIF p_selector = 'subject' THEN
        kind := split_part(p_selected, ':', 1);
        row_id := split_part(p_selected, ':', 2);
        IF kind = '' OR row_id = '' OR p_selected <> kind || ':' || row_id THEN
            RAISE EXCEPTION 'a subject is <kind>:<id>, not %', p_selected
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    ELSIF p_selector = 'memory' THEN
        revision := p_selected::uuid;
    ELSE
        RAISE EXCEPTION 'erase by user, subject or memory, not %', p_selector
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('contextcore.platform', '', true),
            set_config('contextcore.organization_id', p_organization::text, true);
    IF p_apply THEN
        LOCK TABLE public.memories, public.memory_writes IN SHARE ROW EXCLUSIVE MODE;
    END IF;

    -- the matched chains (by their identity), and every revision of them not yet erased,
    -- tombstones included (a tombstone keeps its parent's ref, label and all)
    WITH matched AS (
        SELECT DISTINCT m.definition_id, m.scope, m.scope_owner_id, m.subject_key
        FROM public.memories AS m
        WHERE m.organization_id = p_organization
          AND CASE p_selector
              WHEN 'user' THEN (m.scope = 'user' AND m.user_id = person)
                            OR m.subject_key LIKE 'user:' || person::text || ':%'
              WHEN 'subject' THEN split_part(m.subject_key, ':', 1) = kind
                              AND split_part(m.subject_key, ':', 2) = row_id
              ELSE m.id = revision
          END
    )
    SELECT (SELECT count(*) FROM matched),
           coalesce(array_agg(m.id ORDER BY m.created_at, m.id)
                        FILTER (WHERE m.id IS NOT NULL), '{}')
    INTO n_chains, ids
    FROM matched
    LEFT JOIN public.memories AS m
        ON m.organization_id = p_organization AND m.erasure_id IS NULL
       AND (m.definition_id, m.scope, m.scope_owner_id, m.subject_key)
         = (matched.definition_id, matched.scope, matched.scope_owner_id, matched.subject_key);

    -- the journal rows that name one of them: the answer's revision, or a duplicate's message
    SELECT count(*) INTO n_journal
    FROM public.memory_writes AS j
    WHERE j.organization_id = p_organization AND j.erasure_id IS NULL
      AND (j.memory_id = ANY (ids)
           OR (j.reason = 'duplicate'
               AND substring(j.message FROM '^memory ([0-9a-f-]{36}) ') = ANY (ids::text[])));

    IF p_apply AND cardinality(ids) > 0 THEN
        INSERT INTO public.memory_erasures (organization_id, erased_by, selector, selected,
                                            chains, revisions, journal_rows, memory_ids)
        VALUES (p_organization, session_user, p_selector, p_selected, n_chains,
                cardinality(ids), n_journal, ids)
        RETURNING id INTO record_id;

        -- a tombstone after each matched chain whose head is live: no chain stays live
        INSERT INTO public.memories (organization_id, definition_id, scope, user_id,
                                     subject_key, text, subject_refs, supersedes_id,
                                     forgotten_at, erasure_id)
        SELECT h.organization_id, h.definition_id, h.scope, h.user_id, h.subject_key, NULL,
               public.memory_refs_without_labels(h.subject_refs), h.id, clock_timestamp(),
               record_id
        FROM public.memory_heads AS h
        WHERE h.organization_id = p_organization AND h.forgotten_at IS NULL
          AND h.id = ANY (ids);

        UPDATE public.memories AS m
        SET text = NULL, subject_refs = public.memory_refs_without_labels(m.subject_refs),
            erasure_id = record_id
        WHERE m.organization_id = p_organization AND m.id = ANY (ids);

        UPDATE public.memory_writes AS j
        SET request_sha256 = repeat('0', 64), erasure_id = record_id
        WHERE j.organization_id = p_organization AND j.erasure_id IS NULL
          AND (j.memory_id = ANY (ids)
               OR (j.reason = 'duplicate'
                   AND substring(j.message FROM '^memory ([0-9a-f-]{36}) ') = ANY (ids::text[])));
    END IF;

    erasure_id := record_id;
    chains := n_chains;
    revisions := cardinality(ids);
    journal_rows := n_journal;
    memory_ids := ids;
    RETURN NEXT;
END
$$;
REVOKE EXECUTE ON FUNCTION memory_erase(uuid, text, text, boolean) FROM PUBLIC;
