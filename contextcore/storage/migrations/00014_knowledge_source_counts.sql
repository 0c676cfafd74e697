-- Knowledge sources by status, for the sweep's metrics (docs/operations.md): how many sources
-- of all tenants are pending, ready and failed, and how long the oldest pending one has waited.
-- Counts only: no id, no title, no organization leaves the function.
--
-- SECURITY DEFINER, as the owner, like contextcore_fail_stale_knowledge (00007): the owner's
-- policies there let it see pending and failed sources, so those are counted in
-- knowledge_sources; a ready source is counted as a source with a ready per-model state, which
-- the owner reads in knowledge_source_models (ids, counts and states). No policy is widened.
CREATE FUNCTION contextcore_knowledge_source_counts()
RETURNS TABLE (status text, sources bigint, oldest_pending_seconds double precision)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.status, count(*),
           CASE WHEN s.status = 'pending'
                THEN extract(epoch FROM now() - min(s.pending_since))::double precision END
    FROM public.knowledge_sources s
    WHERE s.status IN ('pending', 'failed')
    GROUP BY s.status
    UNION ALL
    SELECT 'ready', count(DISTINCT m.source_id), NULL
    FROM public.knowledge_source_models m
    WHERE m.status = 'ready'
$$;
REVOKE EXECUTE ON FUNCTION contextcore_knowledge_source_counts() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION contextcore_knowledge_source_counts() TO contextcore_app;
