-- Quotas an operator sets per organization (issue 33, target 6; docs/operations.md, "Quotas").
--
-- One place for them: organization_quotas. A row per organization that has quotas of its own,
-- and at most one row whose organization is null: the default of every organization, quota by
-- quota (an organization's own value, where it has one, else the default's; a null in both:
-- no limit). No row at all, the state after this migration: no quota anywhere.
--
--   build_rate, build_burst   build requests a second per consumer process, and how many at
--                             once above it (a token bucket; the build consumer answers the
--                             excess 'throttled' with how long to wait)
--   uploads_in_flight         uploads pending at once (the next one is 'rejected')
--   chunks_per_document       chunks one document may become (the source fails with the reason
--                             before any chunk is stored)
--   stored_chunks             chunks of all the organization's documents under the live model,
--                             ready and pending (a document that would pass it fails, likewise)
--   memory_revisions          revisions of the organization's memory chains (a remember past it
--                             is refused 'quota', not journaled; a forget is always taken)
--
-- The service role reads its scope's row and the default (RLS), never another organization's,
-- and writes none: quotas are the operator's, written as the schema owner
-- (`contextcore quota`, admin/quotas.py).

CREATE TABLE organization_quotas (
    organization_id     uuid REFERENCES organizations (id) ON DELETE CASCADE,
    build_rate          double precision CHECK (build_rate > 0 AND build_rate < 'infinity'),
    build_burst         integer CHECK (build_burst >= 1),
    uploads_in_flight   integer CHECK (uploads_in_flight >= 1),
    chunks_per_document integer CHECK (chunks_per_document >= 1),
    stored_chunks       bigint CHECK (stored_chunks >= 1),
    memory_revisions    bigint CHECK (memory_revisions >= 1),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    -- one row per organization, and one default (two nulls are one key here)
    CONSTRAINT organization_quotas_one_row UNIQUE NULLS NOT DISTINCT (organization_id)
);

ALTER TABLE organization_quotas ENABLE ROW LEVEL SECURITY;
ALTER TABLE organization_quotas FORCE ROW LEVEL SECURITY;

-- the scope's own row and the default; never another organization's. The owner (memory_apply,
-- a definer function) reads under the same policy, in the scope it entered.
CREATE POLICY tenant_reads ON organization_quotas FOR SELECT
    USING (organization_id IS NULL OR contextcore_in_scope(organization_id));
-- the operator's command writes as the owner, any row (FORCE applies policies to the owner too)
CREATE POLICY owner_writes ON organization_quotas FOR ALL TO CURRENT_USER
    USING (true) WITH CHECK (true);
GRANT SELECT ON organization_quotas TO contextcore_app;

-- contextcore_quotas(organization): the quotas in force for an organization, each its own
-- value or the default's; one row, nulls where there is no limit. Read in the caller's scope:
-- a scope that is not this organization's sees the default only.
CREATE FUNCTION contextcore_quotas(organization uuid) RETURNS TABLE (
    build_rate double precision, build_burst integer, uploads_in_flight integer,
    chunks_per_document integer, stored_chunks bigint, memory_revisions bigint
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, public
AS $$
    SELECT coalesce(own.build_rate, fallback.build_rate),
           coalesce(own.build_burst, fallback.build_burst),
           coalesce(own.uploads_in_flight, fallback.uploads_in_flight),
           coalesce(own.chunks_per_document, fallback.chunks_per_document),
           coalesce(own.stored_chunks, fallback.stored_chunks),
           coalesce(own.memory_revisions, fallback.memory_revisions)
    FROM (SELECT 1) AS one
    LEFT JOIN organization_quotas AS own ON own.organization_id = organization
    LEFT JOIN organization_quotas AS fallback ON fallback.organization_id IS NULL
$$;

-- contextcore_read_quotas(organization): the same in one statement outside a transaction, as
-- the build consumer reads (00029's pattern: enter the scope, then read).
CREATE FUNCTION contextcore_read_quotas(organization uuid) RETURNS TABLE (
    build_rate double precision, build_burst integer, uploads_in_flight integer,
    chunks_per_document integer, stored_chunks bigint, memory_revisions bigint
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public
AS $$
    SELECT contextcore_enter_read(organization);

    SELECT * FROM contextcore_quotas(organization)
$$;
REVOKE EXECUTE ON FUNCTION contextcore_read_quotas(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION contextcore_read_quotas(uuid) TO contextcore_app;

-- memory_apply(writes, wait): 00037's, with the memory_revisions quota. Per organization of the
-- batch with a quota, the revisions it holds are counted once (at most the quota's worth: an
-- index scan bounded by the quota), then each revision the batch appends counts. A remember
-- that finds the organization at its quota is answered 'refused', reason 'quota', and not
-- journaled (a later call with the same key, under a raised quota, is applied), unless its key
-- is journaled already (it replays, as any used key does). A forget is always applied: it ends
-- a chain, and the way under a quota is to forget or to erase.
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
        IF org IS NOT NULL AND item ->> 'operation' = 'remember' THEN
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
                           'memory_revisions: forget or erase memories, or ask the operator '
                           'to raise it', quota),
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

-- an upload's quotas are checked under this organization's lock (uploads_in_flight when a
-- source is accepted, stored_chunks when its chunk count is recorded), so two uploads of one
-- organization cannot both pass the last unit of room. Key space 1835363661: the pair (that,
-- hashtext(organization id)), beside 00037's memory locks.
