-- The knowledge source reads like the other build sources (00029): one statement each, no
-- transaction held while the query is embedded (issue 20). Before, a knowledge read was BEGIN
-- with the scope, the live models, the embedding of the query in a worker thread with the
-- transaction and its connection held, the search, COMMIT: four round trips and a connection
-- held through the encode.
--
-- Each function enters the organization's scope for its own statement
-- (contextcore_enter_read), then runs what the source ran inside its transaction:
-- knowledge_active_model for both scopes, or knowledge_search (SECURITY INVOKER: the service
-- role's row policies apply, and it refuses a model that is no longer live, CC001).

CREATE FUNCTION contextcore_read_knowledge_models(organization uuid)
RETURNS TABLE (organization_model text, platform_model text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public
AS $$
    SELECT contextcore_enter_read(organization);

    SELECT knowledge_active_model(organization), knowledge_active_model(NULL)
$$;

CREATE FUNCTION contextcore_read_knowledge(
    organization uuid, model text, query_embedding vector, query_text text,
    include_platform boolean, include_organization boolean, max_results integer,
    per_document integer, candidates integer, lexical_weight double precision,
    later_chunk_penalty double precision, ef_search integer
) RETURNS TABLE (
    chunk_id bigint, source_id uuid, organization_id uuid, title text, section text,
    ordinal integer, text text, tokens integer, embedding_model text,
    similarity double precision, lexical double precision, score double precision,
    document_rank integer
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public
AS $$
    SELECT contextcore_enter_read(organization);

    SELECT * FROM knowledge_search(
        organization, model, query_embedding, query_text, include_platform,
        include_organization, max_results, per_document, candidates, lexical_weight,
        later_chunk_penalty, ef_search
    )
$$;

REVOKE EXECUTE ON FUNCTION
    contextcore_read_knowledge_models(uuid),
    contextcore_read_knowledge(uuid, text, vector, text, boolean, boolean, integer, integer,
                               integer, double precision, double precision, integer)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    contextcore_read_knowledge_models(uuid),
    contextcore_read_knowledge(uuid, text, vector, text, boolean, boolean, integer, integer,
                               integer, double precision, double precision, integer)
TO contextcore_app;

-- Every build process caches the live models per organization (they change when an operator
-- switches models); a write to knowledge_settings drops the organization's entry in every
-- process, or every entry when the platform's row changed (an empty payload).
CREATE FUNCTION contextcore_notify_knowledge_models() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, public
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('contextcore_knowledge_models', '');
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM pg_notify('contextcore_knowledge_models', coalesce(OLD.organization_id::text, ''));
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM pg_notify('contextcore_knowledge_models', coalesce(NEW.organization_id::text, ''));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER knowledge_settings_notify AFTER INSERT OR UPDATE OR DELETE ON knowledge_settings
    FOR EACH ROW EXECUTE FUNCTION contextcore_notify_knowledge_models();
CREATE TRIGGER knowledge_settings_notify_truncate AFTER TRUNCATE ON knowledge_settings
    FOR EACH STATEMENT EXECUTE FUNCTION contextcore_notify_knowledge_models();
