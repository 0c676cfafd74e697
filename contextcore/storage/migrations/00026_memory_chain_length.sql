-- memory_apply answers each appended revision's chain length (issue 19: chain length as a
-- metric at write, not only in `contextcore-memory health`).
--
-- The batch function's answer gains one column, chain_length: the revisions of the chain the
-- write appended to, counting the one appended (a tombstone counts), or null for a refusal or a
-- replay. It is counted over the chain identity index (memories_chain_identity), in the write's
-- own organization: memory_apply_one named it as the transaction's scope, so the service
-- role's row policy repeats the filter. A changed result type needs a new function.

DROP FUNCTION memory_apply(jsonb);

CREATE FUNCTION memory_apply(writes jsonb) RETURNS TABLE (
    ordinal bigint, outcome text, reason text, message text, replayed boolean,
    organization_id uuid, id uuid, definition_id uuid, scope text, user_id uuid,
    subject_key text, text text, subject_refs jsonb, proposed_by_run_id uuid,
    supersedes_id uuid, forgotten_at timestamptz, created_at timestamptz,
    chain_length integer
)
LANGUAGE plpgsql SECURITY INVOKER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    item   jsonb;
    n      bigint;
    a      record;
    length integer;
BEGIN
    FOR item, n IN SELECT e.value, e.ordinality
                   FROM jsonb_array_elements(writes) WITH ORDINALITY AS e LOOP
        SELECT * INTO a FROM memory_apply_one(item);
        -- a statement of its own: its snapshot sees the revision just appended (and any a
        -- racing writer committed before it), which the statement that appended cannot
        length := NULL;
        IF a.id IS NOT NULL AND NOT a.replayed THEN
            SELECT count(*)::integer INTO length FROM memories AS m
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

REVOKE EXECUTE ON FUNCTION memory_apply(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memory_apply(jsonb) TO contextcore_app;
