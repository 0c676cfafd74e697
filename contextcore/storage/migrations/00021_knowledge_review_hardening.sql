-- What an attacker's review of issue 18's migrations found (docs/knowledge.md):
--
-- 1. A deletion was recorded by the caller's own INSERT: the service role could write a record
--    of a deletion that never happened, and a delete by any other path recorded nothing. Now a
--    trigger records every deletion of a source, as the owner, and the service role may no
--    longer insert. Who asked comes from the transaction's `contextcore.requested_by` setting
--    (set by the delete, as text; the login that deleted is the session's, as before). A source
--    deleted because its organization is (a cascade, trigger depth > 1) is not recorded: the
--    organization's records go with it.
-- 2. contextcore_knowledge_followers_not_ready counted across tenants for any scope; only the
--    platform's switch needs it. contextcore_knowledge_unindexed_tenants took any threshold:
--    a threshold of 1 and below counted every tenant. Both now refuse what they do not serve.

CREATE FUNCTION knowledge_record_deletion() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN OLD;
    END IF;
    INSERT INTO public.knowledge_deletions
        (organization_id, source_id, title, identity, chunks, requested_by)
    VALUES (
        OLD.organization_id, OLD.id, OLD.title, coalesce(OLD.uri, OLD.object_key),
        (SELECT count(*) FROM public.knowledge_chunks c WHERE c.source_id = OLD.id),
        nullif(left(btrim(coalesce(current_setting('contextcore.requested_by', true), '')), 200),
               ''));
    RETURN OLD;
END
$$;
REVOKE EXECUTE ON FUNCTION knowledge_record_deletion() FROM PUBLIC;
CREATE TRIGGER knowledge_sources_record_deletion
    BEFORE DELETE ON knowledge_sources
    FOR EACH ROW EXECUTE FUNCTION knowledge_record_deletion();

DO $$
BEGIN
    EXECUTE format(
        'CREATE POLICY owner_records_deletions ON knowledge_deletions FOR INSERT TO %I'
        ' WITH CHECK (true)', current_user);
END
$$;
REVOKE INSERT ON knowledge_deletions FROM contextcore_app;
DROP POLICY tenant_inserts ON knowledge_deletions;

CREATE OR REPLACE FUNCTION contextcore_knowledge_followers_not_ready(p_model text) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- contextcore_in_scope(NULL)'s own test, inline: its body resolves names through public,
    -- which this definer's search_path leaves out
    IF coalesce(current_setting('contextcore.platform', true), '') <> 'on' THEN
        RAISE EXCEPTION 'only the platform''s scope counts the organizations that follow it'
            USING ERRCODE = '42501';
    END IF;
    RETURN (SELECT count(*) FROM public.contextcore_knowledge_followers_to_embed(p_model));
END
$$;

CREATE OR REPLACE FUNCTION contextcore_knowledge_unindexed_tenants(p_min_chunks integer)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_min_chunks IS NULL OR p_min_chunks < 100 THEN
        RAISE EXCEPTION 'the index threshold must be at least 100 chunks, not %', p_min_chunks
            USING ERRCODE = '22023';
    END IF;
    RETURN (
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
                        'UTF8')), 'hex'), 20)));
END
$$;
