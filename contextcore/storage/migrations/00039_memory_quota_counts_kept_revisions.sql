-- The quota memory_revisions, corrected after a review of 00038 (issue 33; docs/operations.md,
-- "Quotas"). memory_apply(writes, wait) is 00038's with three changes:
--
-- 1. The revisions counted are those not erased (erasure_id IS NULL). Memories are append
--    only: a forget adds a tombstone and removes nothing, so under 00038 an organization at its
--    quota could never get under it again. An erasure (the operator's act) now frees the room
--    its revisions took; a forget still counts (it is a revision too), and stays always taken.
-- 2. Two batches of one organization no longer both count the same room: for an organization
--    with the quota, the batch takes an exclusive transaction lock of its own,
--    (1835363662, hashtext(organization)), in the same ordered pass as the erasure lock and
--    after it, before anything is counted. Organizations without the quota take nothing more.
--    (00038 counted under the shared erasure lock: concurrent batches overshot the quota by
--    up to a batch each.)
-- 3. A remember the service already refused by a rule (it carries its refusal) is answered
--    with that refusal, journaled, as before 00038, never 'quota'.

CREATE OR REPLACE FUNCTION memory_apply(writes jsonb, wait boolean) RETURNS TABLE (
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
    item      jsonb;
    n         bigint;
    a         record;
    length    integer;
    org       uuid;
    erasing   uuid[] := '{}';
    room      jsonb := '{}';  -- organization → revisions it may still append (null: no quota)
    quota     bigint;
    left_over bigint;
BEGIN
    FOR org IN SELECT DISTINCT (e.value ->> 'organization_id')::uuid AS o
               FROM jsonb_array_elements(writes) AS e
               ORDER BY 1 LOOP
        IF wait IS NOT FALSE THEN
            PERFORM pg_advisory_xact_lock_shared(1835363660, hashtext(org::text));
        ELSIF NOT pg_try_advisory_xact_lock_shared(1835363660, hashtext(org::text)) THEN
            erasing := erasing || org;
            CONTINUE;
        END IF;
        -- 00039: one batch at a time counts an organization's room under its quota
        IF (SELECT q.memory_revisions FROM public.contextcore_quotas(org) AS q) IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(1835363662, hashtext(org::text));
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
        left_over := NULL;
        IF org IS NOT NULL AND item ->> 'operation' = 'remember' AND NOT item ? 'refusal' THEN
            IF NOT room ? org::text THEN
                PERFORM set_config('contextcore.platform', '', true),
                        set_config('contextcore.organization_id', org::text, true);
                SELECT q.memory_revisions INTO quota FROM public.contextcore_quotas(org) AS q;
                IF quota IS NULL THEN
                    room := room || jsonb_build_object(org::text, NULL);
                ELSE
                    room := room || jsonb_build_object(org::text, quota - (
                        SELECT count(*) FROM (SELECT 1 FROM public.memories AS m
                                              WHERE m.organization_id = org
                                                AND m.erasure_id IS NULL
                                              LIMIT quota) AS held));
                END IF;
            END IF;
            left_over := (room ->> org::text)::bigint;
            IF left_over IS NOT NULL AND left_over <= 0 AND NOT EXISTS (
                SELECT 1 FROM public.memory_writes AS j
                WHERE j.organization_id = org
                  AND j.idempotency_key = item ->> 'idempotency_key'
            ) THEN
                quota := (SELECT q.memory_revisions FROM public.contextcore_quotas(org) AS q);
                RETURN QUERY SELECT n, 'refused'::text, 'quota'::text,
                    format('the organization holds %s memory revisions, its quota '
                           'memory_revisions: ask the operator to erase memories or to raise '
                           'it', quota),
                    false, org, NULL::uuid, NULL::uuid, NULL::text, NULL::uuid, NULL::text,
                    NULL::text, NULL::jsonb, NULL::uuid, NULL::uuid, NULL::timestamptz,
                    NULL::timestamptz, NULL::integer;
                CONTINUE;
            END IF;
        END IF;
        SELECT * INTO a FROM public.memory_apply_one(item);
        length := NULL;
        IF a.id IS NOT NULL AND NOT a.replayed THEN
            SELECT count(*)::integer INTO length FROM public.memories AS m
            WHERE m.organization_id = a.organization_id
              AND m.definition_id = a.definition_id AND m.scope = a.scope
              AND m.scope_owner_id = coalesce(a.user_id, a.organization_id)
              AND m.subject_key = a.subject_key;
        END IF;
        IF left_over IS NOT NULL AND a.outcome <> 'refused' AND NOT a.replayed THEN
            room := jsonb_set(room, ARRAY[org::text], to_jsonb(left_over - 1));
        END IF;
        RETURN QUERY SELECT n, a.outcome, a.reason, a.message, a.replayed, a.organization_id,
                            a.id, a.definition_id, a.scope, a.user_id, a.subject_key, a.text,
                            a.subject_refs, a.proposed_by_run_id, a.supersedes_id,
                            a.forgotten_at, a.created_at, length;
    END LOOP;
END
$$;
