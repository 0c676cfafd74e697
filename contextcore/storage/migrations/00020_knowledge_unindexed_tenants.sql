-- How many tenants have outgrown the exact scan without their own HNSW index (issue 18), for the
-- sweep's gauge contextcore_knowledge_tenants_without_index (docs/operations.md).
--
-- `contextcore-knowledge index --apply --every N`, a job of the schema owner (docker-compose's
-- knowledge-indexer, k8s's CronJob), builds a tenant's index when the tenant crosses the
-- threshold; the gauge shows what it has not built yet (it is not running, or a build failed).
-- A tenant is an (organization, model) pair, its size the chunks of its sources not failed, as
-- contextcore/knowledge/indexes.py counts them; its index is named as indexes.index_name names
-- it, and counts only when valid (a CREATE INDEX CONCURRENTLY that failed leaves an invalid
-- one). SECURITY DEFINER, as the owner, who reads every per-model row (00007's policy
-- owner_reads_counts): a count leaves the function, no organization.
CREATE FUNCTION contextcore_knowledge_unindexed_tenants(p_min_chunks integer) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH sizes AS (
        SELECT m.organization_id, m.embedding_model, sum(m.chunk_count) AS chunks
        FROM public.knowledge_source_models m
        WHERE m.status <> 'failed'
        GROUP BY m.organization_id, m.embedding_model
    )
    SELECT count(*)
    FROM sizes s
    WHERE s.chunks >= p_min_chunks
      AND NOT EXISTS (
          SELECT 1 FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
          WHERE c.relnamespace = 'public'::regnamespace AND i.indisvalid
            AND c.relname = 'knowledge_chunks_ann_' || left(encode(sha256(convert_to(
                    coalesce(s.organization_id::text, 'platform') || '|' || s.embedding_model,
                    'UTF8')), 'hex'), 20))
$$;
REVOKE EXECUTE ON FUNCTION contextcore_knowledge_unindexed_tenants(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION contextcore_knowledge_unindexed_tenants(integer) TO contextcore_app;
