-- The memory source reads like the other build sources (00029): one statement, no
-- transaction (issue 20). Before, it was BEGIN with the scope, the live memories, the
-- resolution of their refs, COMMIT: four round trips; now the memories are one statement and
-- the refs, when any memory has one, a second (contextcore_read_application).
--
-- Two queries, chosen by whether the subject names a definition: each is planned on its own
-- (a single query with "definition IS NULL OR definition_id = definition" would get a generic
-- plan that cannot use the definition's index). The subject's user reads organization scope
-- and its own user scope; a null user (a trigger) reads organization scope only.
CREATE FUNCTION contextcore_read_memories(
    organization uuid, asker uuid, max_memories integer, definition uuid
) RETURNS TABLE (
    id uuid, scope text, subject_key text, text text, subject_refs jsonb,
    created_at timestamptz
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
#variable_conflict use_column
BEGIN
    PERFORM contextcore_enter_read(organization);
    IF definition IS NULL THEN
        RETURN QUERY
        SELECT m.id, m.scope, m.subject_key, m.text, m.subject_refs, m.created_at
        FROM live_memories AS m
        WHERE m.organization_id = organization
          AND (m.scope = 'organization' OR (m.scope = 'user' AND m.user_id = asker))
        ORDER BY m.created_at DESC, m.id DESC
        LIMIT max_memories;
    ELSE
        RETURN QUERY
        SELECT m.id, m.scope, m.subject_key, m.text, m.subject_refs, m.created_at
        FROM live_memories AS m
        WHERE m.organization_id = organization
          AND (m.scope = 'organization' OR (m.scope = 'user' AND m.user_id = asker))
          AND m.definition_id = definition
        ORDER BY m.created_at DESC, m.id DESC
        LIMIT max_memories;
    END IF;
END
$$;

REVOKE EXECUTE ON FUNCTION contextcore_read_memories(uuid, uuid, integer, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION contextcore_read_memories(uuid, uuid, integer, uuid)
    TO contextcore_app;
