-- A switch of the platform's model waits for the organizations that follow it (issue 18).
--
-- An organization without a knowledge_settings row of its own searches under the platform's
-- live model. Flipping the platform's row therefore moves every such organization at once, and
-- the spec's step 2 ("wait until every source is ready under the new model") covers their
-- sources too, not only the platform's. A platform-scope transaction cannot see them (row
-- security), so two functions of the owner, which return no text:
--
-- * contextcore_knowledge_followers_not_ready(model): how many sources of following
--   organizations (not failed) are not ready under the model in their current generation; the
--   platform's flip (contextcore/knowledge/admin.py) refuses while it is not 0, in the statement
--   that flips. The service role may call it: a count across tenants, no id, no title.
-- * contextcore_knowledge_followers_to_embed(model): which ones (organization, source), for
--   `contextcore-knowledge switch prepare --platform --apply`, which runs as the owner and asks
--   the upload consumer to embed each under the model in its organization's scope. Owner only.
--
-- The owner reads the sources' and the settings' rows for them (FORCE ROW LEVEL SECURITY holds
-- the owner to policies; these two are read-only, and the functions return ids and counts).

DO $$
BEGIN
    EXECUTE format(
        'CREATE POLICY owner_reads_states ON knowledge_sources FOR SELECT TO %I USING (true)',
        current_user);
    EXECUTE format(
        'CREATE POLICY owner_reads_settings ON knowledge_settings FOR SELECT TO %I USING (true)',
        current_user);
END
$$;

CREATE FUNCTION contextcore_knowledge_followers_to_embed(p_model text)
RETURNS TABLE (organization_id uuid, source_id uuid)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.organization_id, s.id
    FROM public.knowledge_sources s
    WHERE s.organization_id IS NOT NULL AND s.status <> 'failed'
      AND NOT EXISTS (SELECT 1 FROM public.knowledge_settings k
                      WHERE k.organization_id = s.organization_id)
      AND NOT EXISTS (SELECT 1 FROM public.knowledge_source_models m
                      WHERE m.source_id = s.id AND m.embedding_model = p_model
                        AND m.status = 'ready' AND m.generation = s.generation)
    ORDER BY s.organization_id, s.created_at, s.id
$$;
REVOKE EXECUTE ON FUNCTION contextcore_knowledge_followers_to_embed(text) FROM PUBLIC;

CREATE FUNCTION contextcore_knowledge_followers_not_ready(p_model text) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) FROM public.contextcore_knowledge_followers_to_embed(p_model)
$$;
REVOKE EXECUTE ON FUNCTION contextcore_knowledge_followers_not_ready(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION contextcore_knowledge_followers_not_ready(text) TO contextcore_app;
