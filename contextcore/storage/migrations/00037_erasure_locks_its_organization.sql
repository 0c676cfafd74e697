-- An erasure locks its own organization's memories, not every organization's (issue 33;
-- docs/memory.md, "Erasure").
--
-- Since 00027 memory_apply took ROW EXCLUSIVE on memories and memory_writes before any read,
-- and memory_erase SHARE ROW EXCLUSIVE: so no writer straddled an erasure. But the lock was the
-- tables', and one organization's erasure stalled every organization's memory writes for as long
-- as it ran (measured: an erasure of 10,000 revisions took another tenant's writes at 50/s from
-- p99 223 ms to 6,661 ms).
--
-- Now the lock is an organization's: a transaction-level advisory lock in a key space of its
-- own, the pair (MEMORY_LOCKS, hashtext(organization id)). A writer takes it shared for each
-- organization its batch writes to, in one order, before it reads anything; an erasure takes it
-- exclusive. So an erasure still waits for every writer of its organization in progress, and
-- every later writer of that organization waits for the erasure (00027's rule, kept), and a
-- writer of another organization waits for nothing. A writer may also ask not to wait
-- (memory_apply(writes, false)): the writes of an organization being erased are then answered
-- 'erasing' and not applied, and the memory service applies them apart, so one organization's
-- erasure holds none of another's writes, not even those batched with its own. Two
-- organizations whose ids hash alike share a lock: an erasure of one then delays the other's
-- writes, as every erasure did before.
--
-- The erasure also stops comparing every journal row with every erased id (an array compared
-- row by row grew as revisions × rows): the erased ids are a hashed set.
--
-- The bodies are 00027's memory_apply and 00025's memory_erase with these changes only.
-- The grants of memory_apply(jsonb) and memory_erase stay (CREATE OR REPLACE keeps them).

-- MEMORY_LOCKS = 1835363660, the first key of the pair: no other advisory lock of ours takes a
-- pair (migrations and the index pass take single bigint keys, another key space).

-- memory_apply(writes, wait): 00027's memory_apply with the organization's lock. With wait, a
-- write of an organization being erased waits for the erasure; without, it is answered
-- 'erasing' and nothing of it is written (the others of the batch are applied): the memory
-- service applies those later, apart, so a batch never waits for an erasure that is not its
-- own (contextcore/memory/service.py). A null wait waits.
CREATE FUNCTION memory_apply(writes jsonb, wait boolean) RETURNS TABLE (
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
    item    jsonb;
    n       bigint;
    a       record;
    length  integer;
    org     uuid;
    erasing uuid[] := '{}';
BEGIN
    -- before any read, in one order: an erasure of one of these organizations in progress is
    -- waited for (or its writes set aside), and waits for this transaction
    FOR org IN SELECT DISTINCT (e.value ->> 'organization_id')::uuid AS o
               FROM jsonb_array_elements(writes) AS e
               ORDER BY 1 LOOP
        IF wait IS NOT FALSE THEN
            PERFORM pg_advisory_xact_lock_shared(1835363660, hashtext(org::text));
        ELSIF NOT pg_try_advisory_xact_lock_shared(1835363660, hashtext(org::text)) THEN
            erasing := erasing || org;
        END IF;
    END LOOP;
    FOR item, n IN SELECT e.value, e.ordinality
                   FROM jsonb_array_elements(writes) WITH ORDINALITY AS e LOOP
        org := (item ->> 'organization_id')::uuid;
        IF org = ANY (erasing) THEN
            RETURN QUERY SELECT n, 'erasing'::text, NULL::text, NULL::text, false, org,
                                NULL::uuid, NULL::uuid, NULL::text, NULL::uuid, NULL::text,
                                NULL::text, NULL::jsonb, NULL::uuid, NULL::uuid,
                                NULL::timestamptz, NULL::timestamptz, NULL::integer;
            CONTINUE;
        END IF;
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
REVOKE EXECUTE ON FUNCTION memory_apply(jsonb, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memory_apply(jsonb, boolean) TO contextcore_app;

-- memory_apply(writes): the waiting form, as before (a member of the code before 00037 calls it)
CREATE OR REPLACE FUNCTION memory_apply(writes jsonb) RETURNS TABLE (
    ordinal bigint, outcome text, reason text, message text, replayed boolean,
    organization_id uuid, id uuid, definition_id uuid, scope text, user_id uuid,
    subject_key text, text text, subject_refs jsonb, proposed_by_run_id uuid,
    supersedes_id uuid, forgotten_at timestamptz, created_at timestamptz,
    chain_length integer
)
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT * FROM public.memory_apply(writes, true)
$$;

CREATE OR REPLACE FUNCTION memory_erase(
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
        -- 00037: this organization's writers, not the tables (a null organization: no lock,
        -- and it matches no row)
        PERFORM pg_advisory_xact_lock(1835363660, hashtext(p_organization::text));
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
    -- (00037: IN a subquery, a hashed set, not = ANY of the array, a scan of it per row)
    SELECT count(*) INTO n_journal
    FROM public.memory_writes AS j
    WHERE j.organization_id = p_organization AND j.erasure_id IS NULL
      AND (j.memory_id IN (SELECT unnest(ids))
           OR (j.reason = 'duplicate'
               AND substring(j.message FROM '^memory ([0-9a-f-]{36}) ')
                   IN (SELECT unnest(ids)::text)));

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
          AND h.id IN (SELECT unnest(ids));

        UPDATE public.memories AS m
        SET text = NULL, subject_refs = public.memory_refs_without_labels(m.subject_refs),
            erasure_id = record_id
        WHERE m.organization_id = p_organization AND m.id IN (SELECT unnest(ids));

        UPDATE public.memory_writes AS j
        SET request_sha256 = repeat('0', 64), erasure_id = record_id
        WHERE j.organization_id = p_organization AND j.erasure_id IS NULL
          AND (j.memory_id IN (SELECT unnest(ids))
               OR (j.reason = 'duplicate'
                   AND substring(j.message FROM '^memory ([0-9a-f-]{36}) ')
                       IN (SELECT unnest(ids)::text)));
    END IF;

    erasure_id := record_id;
    chains := n_chains;
    revisions := cardinality(ids);
    journal_rows := n_journal;
    memory_ids := ids;
    RETURN NEXT;
END
$$;
