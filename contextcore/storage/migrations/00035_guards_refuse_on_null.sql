-- Guards that refuse on null (issue 32, item 3; docs/tenancy.md, "Null never opens a scope").
--
-- SQL's logic has three values. A policy's USING that is null hides the row and a WITH CHECK
-- that is null refuses it, so a row policy fails closed; a guard in a function does not:
-- `IF NOT x THEN RAISE` with x null raises nothing, `a <> b` with b null is null and an IF
-- skips it, and the function goes on. An attacker's review of 00034 found the runtime login,
-- in no scope at all, reading another organization's word counts and chunk ids:
-- contextcore_in_scope(B) is null when no organization is set, so the scope check of
-- knowledge_word_counts and knowledge_word_candidates (NOT contextcore_in_scope(...)) let the
-- call through. Every function and every row policy of 00001..00034 was audited for the same
-- fault; tests/integration/test_definer_functions.py calls every SECURITY DEFINER function of
-- the catalog as the runtime login, in no scope, another organization's and the platform's,
-- with each argument null in turn, and runs every RLS table's reads and writes in no scope.
--
-- Changed here (each keeps its signature, owner, grants and search_path):
--
--   contextcore_in_scope(uuid) (00005)   answered null for an organization's row when no
--       organization is set. Now false: true or false, never null, whoever tests it.
--   knowledge_words_scope_check (00017)  the one scope check of knowledge_word_counts and
--       knowledge_word_candidates (both SECURITY DEFINER, 00017; their bodies are unchanged
--       and call it first). It refused only when NOT contextcore_in_scope(...) was true; now
--       it refuses unless the organization is named and contextcore_in_scope(...) IS TRUE. A
--       null p_include_organization still reads nothing of an organization (their bodies
--       test it with IF and CASE WHEN, where null is false).
--   memory_apply_one(jsonb) (00025; SECURITY DEFINER since 00024, behind memory_apply)
--       two guards compared a write's field with <>: a write without its request_sha256 was
--       not "another call" and replayed the journal's answer to the key, with the revision's
--       text, to a caller that never knew the request; a forget without its definition_id
--       was not "another definition" and tombstoned any definition's organization memory.
--       Both now compare with IS DISTINCT FROM: a missing field matches nothing. Only those
--       two lines differ from 00025's body, restated whole because CREATE OR REPLACE must.
--
-- Audited and sound (the latest definition of each):
--
-- SECURITY DEFINER functions
--   contextcore_prune_processed_messages (00006)  null or non-positive batch or retention
--       refused (IS NULL OR ...); across tenants by design, never a claim younger than a day.
--   contextcore_fail_stale_knowledge (00007)  null batch or age refused; the cutoff is never
--       less than an hour (greatest); across tenants by design (the sweep answers uploaders).
--   contextcore_knowledge_source_counts (00014)  no argument; counts, no id or title.
--   contextcore_knowledge_followers_to_embed (00019)  the owner's alone (no EXECUTE for the
--       service role); a null model lists every follower's source, to the owner.
--   contextcore_knowledge_followers_not_ready (00021)  coalesce(platform setting, '') <> 'on'
--       refuses: two-valued. In the platform's scope a count across tenants, by design.
--   contextcore_knowledge_unindexed_tenants (00021)  null or < 100 refused; a count.
--   knowledge_record_deletion (00023)  a trigger (no EXECUTE): it fires only for a row the
--       deleting role's own policy lets it delete; requested_by is coalesced.
--   memory_apply (00027)  null writes: no row; each write is memory_apply_one's. The
--       organization a write names is trusted, as the scope settings are (docs/memory.md):
--       it becomes the scope. A null organization matches no row and its journal row is
--       refused by the owner's policy (contextcore_in_scope(null) is the platform's flag).
--       A null key, fingerprint or operation is refused by the journal's NOT NULL and CHECK
--       (a forget's tombstone rolls back with the statement); a null memory id is not_live;
--       a remember with a null field breaks a NOT NULL or CHECK of memories, or loses the
--       race for a root 32 times (a null scope_owner_id); a user-scope head is tested with
--       IS DISTINCT FROM. (The two <> guards: changed above.)
--
-- Functions that test or enter a scope (SECURITY INVOKER: the caller's policies apply too)
--   contextcore_current_organization (00003)  null when unset, by design: every user
--       compares it with =, and null matches no row.
--   contextcore_enter_read (00029)  a null organization enters no scope (coalesce to '').
--   contextcore_read_application, _dossier, _conversation, _definitions, _runs (00029),
--   _knowledge_models, _knowledge (00032), _memories (00033)  enter the scope they name;
--       with a null organization their filters (organization_id = null) and the policies
--       match no tenant row, and only platform rows, shared by design, remain (definitions,
--       the platform's model and chunks). A null flag (with_organization, with_documents)
--       reads no part; a null cap is no cap, by design; a null asker reads no user's own
--       conversation or memory (c.user_id = asker), the organization's only.
--   knowledge_active_model (00007)  IS NOT DISTINCT FROM; null is the platform's.
--   knowledge_search (00034)  null limit or candidates refused; null flags coalesced to
--       false; a null model skips the CC001 check (<> is null) but matches no chunk (0
--       ready chunks: no row). Its word reads are the two definer functions above.
--   memory_erase (00025)  the owner's alone; a null selector is refused (ELSE); a null
--       selected or organization matches no row (the subject's IF with a null part raises
--       nothing, and its filters match nothing); a null p_apply is a dry run.
--   Triggers: knowledge_same_organization_as_source, knowledge_source_keeps_its_organization
--       (00007: IS DISTINCT FROM, NOT FOUND); memories_refuse_update,
--       memory_writes_answer_once (00027: the one change they let through is an IF whose
--       null falls to the refusal; the rest is IS NOT NULL tests); memory_erasures_refuse_
--       update, memory_refuse_truncate (always raise); knowledge_deletion_login (00018);
--       contextcore_notify_dossier, _definitions, _knowledge_models (00003, 00030, 00032:
--       payloads only).
--   Pure helpers: memory_not_blank, memory_subject_refs_valid, memory_refs_without_labels,
--       contextcore_isoformat. memory_not_blank(null) is null, which a CHECK passes: a
--       tombstone's text, as memories_text_until_forgotten_or_erased allows.
--   Views: tenant_intel_companies, tenant_intel_people (00004: = the current organization,
--       none when unset); memory_heads, live_memories (00009: security_invoker).
--
-- Row policies (a null USING hides the row, a null WITH CHECK refuses it: no policy here
-- says NOT or IS NULL of the scope, so none fails open)
--   tenant_isolation (00003) on organizations (id), organization_members, crm_companies,
--       crm_people, crm_deals, crm_activities, crm_lists, prospects, prospect_people,
--       company_profiles, dossier_services, ideal_customer_profiles, offers,
--       organization_documents, conversations, conversation_messages, runs:
--       = contextcore_current_organization(); definitions: the same, or a platform row
--       (organization_id IS NULL: shared by design).
--   owner_reads_current_tenant (00005) on prospects, prospect_people: the same, the owner's.
--   tenant_claims (00005) on processed_messages: contextcore_in_scope, both ways.
--   tenant_reads, tenant_inserts, tenant_updates, tenant_deletes (00007) on knowledge_sources,
--       knowledge_source_models, knowledge_chunks, knowledge_settings: contextcore_in_scope;
--       reads also a platform row (organization_id IS NULL: shared documentation, by design).
--   owner_sweeps_pending, owner_fails_pending (two), owner_reads_counts (00007),
--       owner_matches_words (00017), owner_reads_states, owner_reads_settings (00019),
--       owner_records_deletions (00021): the owner's, for its definer functions; true or a
--       status test, no scope involved.
--   tenant_reads (00018) on knowledge_deletions; tenant_reads on memories and memory_writes
--       (00009); owner_reads_in_scope, owner_appends_in_scope, owner_journals_in_scope
--       (00024), owner_erases_in_scope (two), owner_records_in_scope on memory_erasures
--       (00025); tenant_reads, tenant_counts, tenant_adds on memory_refusals (00028):
--       contextcore_in_scope.

-- ------------------------------------------------------------------------- the scope test

-- 00005's test, two-valued: an organization's row outside that organization's scope is not in
-- scope (false), whether another organization is set or none. No SET clause, as before: the
-- policies inline it.
CREATE OR REPLACE FUNCTION contextcore_in_scope(row_organization uuid) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN row_organization IS NULL
            THEN coalesce(current_setting('contextcore.platform', true), '') = 'on'
        ELSE coalesce(row_organization = contextcore_current_organization(), false)
    END
$$;

-- ------------------------------------------------------------- the word reads' scope check

-- knowledge_word_counts and knowledge_word_candidates read as the owner and call this first:
-- an organization's words only for the organization this transaction is in. IS NOT TRUE, so
-- an unknown answer (no organization set, before the change above) refuses too.
CREATE OR REPLACE FUNCTION knowledge_words_scope_check(
    p_organization_id uuid, p_include_organization boolean
) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    IF coalesce(p_include_organization, false)
       AND (p_organization_id IS NULL OR contextcore_in_scope(p_organization_id) IS NOT TRUE) THEN
        RAISE EXCEPTION 'the organization % is not this transaction''s scope', p_organization_id
            USING ERRCODE = '42501';
    END IF;
END
$$;

-- ------------------------------------------------------------------ one memory write

-- 00025's memory_apply_one; the two guards marked 00035 compare with IS DISTINCT FROM.
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
        -- 00035: a missing fingerprint matches no call (<> was null, and null replayed)
        ELSIF journal.request_sha256 IS DISTINCT FROM digest THEN
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
                -- 00035: a missing definition owns nothing (<> was null, and null forgot)
                IF head.definition_id IS DISTINCT FROM definition OR (
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
