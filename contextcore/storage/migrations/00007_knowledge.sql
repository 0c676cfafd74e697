-- Knowledge: sources, their chunks under a pinned embedding model, the live model per scope, and
-- the hybrid search (docs/knowledge.md).
--
-- Scope: a row's organization_id names its tenant; null is the platform (shared documentation).
-- Exception to the shard-by-organization rule (STORAGE.md): a primary key cannot hold a nullable
-- organization, so sources are keyed by their id and chunks by theirs; every index a query
-- uses still leads with organization_id, and the database keeps a chunk's organization equal to
-- its source's (CLARIFICATIONS 11), so a distributed Postgres can co-locate them.

-- ------------------------------------------------------------------------------ models

-- A reference table: the embedding models the service knows, and their dimensions. A chunk's
-- vector has the dimensions of its model; an approximate index casts to them.
CREATE TABLE knowledge_models (
    name        text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9._/:-]{1,200}$'),
    dimensions  integer     NOT NULL CHECK (dimensions BETWEEN 1 AND 16000),
    created_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO knowledge_models (name, dimensions)
VALUES ('sentence-transformers/all-MiniLM-L6-v2', 384);

-- The live model of each scope: every search embeds its query with it and reads only its
-- chunks. NULLS NOT DISTINCT: exactly one platform row (a plain UNIQUE would allow many, and a
-- search would pick a model by chance). An organization without a row uses the platform's.
-- next_embedding_model is a model switch in progress (docs/knowledge.md): every source of the
-- scope is embedded under it too, until the flip makes it the active one.
CREATE TABLE knowledge_settings (
    organization_id         uuid        REFERENCES organizations (id) ON DELETE CASCADE,
    active_embedding_model  text        NOT NULL REFERENCES knowledge_models (name),
    next_embedding_model    text        REFERENCES knowledge_models (name),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT knowledge_settings_one_row_per_scope UNIQUE NULLS NOT DISTINCT (organization_id),
    CONSTRAINT knowledge_settings_next_is_another_model
        CHECK (next_embedding_model <> active_embedding_model)
);
INSERT INTO knowledge_settings (organization_id, active_embedding_model)
VALUES (NULL, 'sentence-transformers/all-MiniLM-L6-v2');

-- ------------------------------------------------------------------------------ sources

-- One uploaded document. Identity (CLARIFICATIONS 12): (organization, uri) or
-- (organization, object_key), NULLS NOT DISTINCT, so a platform source has the same boundary;
-- a second upload with the same identity updates the row and re-ingests it (generation + 1).
-- status is the source's state under its scope's live model; status_reason says why it failed.
-- upload_key is the idempotency key of the upload that started the current generation (a
-- redelivered upload resumes it; an older one finds it superseded). sections keeps the
-- extracted text along its headings, so a retry or a model switch re-chunks without the upload.
CREATE TABLE knowledge_sources (
    id               uuid        PRIMARY KEY,
    organization_id  uuid        REFERENCES organizations (id) ON DELETE CASCADE,
    kind             text        NOT NULL CHECK (kind IN ('inline', 's3', 'file')),
    title            text        NOT NULL CHECK (length(title) BETWEEN 1 AND 500),
    uri              text        CHECK (length(uri) BETWEEN 1 AND 2000),
    object_key       text        CHECK (length(object_key) BETWEEN 1 AND 2000),
    media_type       text        NOT NULL CHECK (length(media_type) BETWEEN 1 AND 200),
    status           text        NOT NULL CHECK (status IN ('pending', 'ready', 'failed')),
    status_reason    text        CHECK (length(status_reason) <= 2000),
    generation       integer     NOT NULL DEFAULT 1 CHECK (generation >= 1),
    upload_key       text        NOT NULL CHECK (length(upload_key) BETWEEN 1 AND 200),
    content_sha256   text        CHECK (content_sha256 ~ '^[0-9a-f]{64}$'),
    sections         jsonb       CHECK (jsonb_typeof(sections) = 'array'),
    reply_to         text,
    correlation_id   text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    pending_since    timestamptz,
    CONSTRAINT knowledge_sources_one_identity CHECK (num_nonnulls(uri, object_key) = 1),
    CONSTRAINT knowledge_sources_failed_has_reason
        CHECK ((status = 'failed') = (status_reason IS NOT NULL)),
    CONSTRAINT knowledge_sources_pending_has_clock
        CHECK ((status = 'pending') = (pending_since IS NOT NULL))
);
CREATE UNIQUE INDEX knowledge_sources_uri_key
    ON knowledge_sources (organization_id, uri) NULLS NOT DISTINCT WHERE uri IS NOT NULL;
CREATE UNIQUE INDEX knowledge_sources_object_key_key
    ON knowledge_sources (organization_id, object_key) NULLS NOT DISTINCT
    WHERE object_key IS NOT NULL;
CREATE INDEX knowledge_sources_by_status_idx
    ON knowledge_sources (organization_id, status, updated_at DESC);
CREATE INDEX knowledge_sources_pending_idx
    ON knowledge_sources (pending_since) WHERE status = 'pending';

-- The state of one source under one model: how many chunks its current generation has, and
-- how many of them are stored (a batch adds what it inserted, under this row's lock). The
-- source is ready under a model only when this row is; a model switch waits for a ready row
-- under the new model for every source of the scope.
CREATE TABLE knowledge_source_models (
    organization_id  uuid,
    source_id        uuid        NOT NULL REFERENCES knowledge_sources (id) ON DELETE CASCADE,
    embedding_model  text        NOT NULL REFERENCES knowledge_models (name),
    generation       integer     NOT NULL CHECK (generation >= 1),
    chunk_count      integer     NOT NULL CHECK (chunk_count >= 1),
    chunks_stored    integer     NOT NULL DEFAULT 0,
    status           text        NOT NULL CHECK (status IN ('pending', 'ready', 'failed')),
    status_reason    text        CHECK (length(status_reason) <= 2000),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    pending_since    timestamptz,
    PRIMARY KEY (source_id, embedding_model),
    CONSTRAINT knowledge_source_models_stored_within_count
        CHECK (chunks_stored BETWEEN 0 AND chunk_count),
    CONSTRAINT knowledge_source_models_ready_when_complete
        CHECK ((status = 'ready') = (chunks_stored = chunk_count)),
    CONSTRAINT knowledge_source_models_failed_has_reason
        CHECK ((status = 'failed') = (status_reason IS NOT NULL)),
    CONSTRAINT knowledge_source_models_pending_has_clock
        CHECK ((status = 'pending') = (pending_since IS NOT NULL))
);
CREATE INDEX knowledge_source_models_scope_idx
    ON knowledge_source_models (organization_id, embedding_model, status);
CREATE INDEX knowledge_source_models_pending_idx
    ON knowledge_source_models (pending_since) WHERE status = 'pending';

-- ------------------------------------------------------------------------------ chunks

-- One chunk of one generation of a source under one model. The unique key makes a redelivered
-- batch insert nothing twice. section is the heading path (with the document title) the
-- chunk sits under; it is embedded with the text and weighs most in the full-text vector.
-- embedding has no declared dimensions (two models may differ); a per-tenant approximate
-- index casts it to its model's (`contextcore-knowledge index`).
CREATE TABLE knowledge_chunks (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    organization_id  uuid,
    source_id        uuid        NOT NULL REFERENCES knowledge_sources (id) ON DELETE CASCADE,
    embedding_model  text        NOT NULL REFERENCES knowledge_models (name),
    generation       integer     NOT NULL CHECK (generation >= 1),
    ordinal          integer     NOT NULL CHECK (ordinal >= 0),
    section          text        NOT NULL DEFAULT '',
    text             text        NOT NULL CHECK (length(text) > 0),
    tokens           integer     NOT NULL CHECK (tokens > 0),
    embedding        vector      NOT NULL,
    lexemes          tsvector    GENERATED ALWAYS AS (
                         setweight(to_tsvector('english', section), 'A')
                         || setweight(to_tsvector('english', text), 'B')) STORED,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT knowledge_chunks_one_per_ordinal
        UNIQUE (source_id, embedding_model, generation, ordinal)
);
-- The exact plan of a tenant below the approximate-index threshold: its rows of one model.
CREATE INDEX knowledge_chunks_scope_idx
    ON knowledge_chunks (organization_id, embedding_model, source_id, generation);

-- ------------------------------------------------------ the organization is the source's

-- CLARIFICATIONS 11: a chunk (and a per-model state row) carries its source's organization,
-- never a second truth. (The invoker's functions below keep public on their search_path: the
-- RLS policies they trigger call contextcore_in_scope, whose body resolves names through it.) The insert names it and the database refuses any other value, the
-- platform's null included; a source never moves to another organization.
CREATE FUNCTION knowledge_same_organization_as_source() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    owner uuid;
BEGIN
    SELECT s.organization_id INTO owner FROM public.knowledge_sources s WHERE s.id = NEW.source_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'knowledge source % does not exist in this scope', NEW.source_id
            USING ERRCODE = '23503';
    END IF;
    IF NEW.organization_id IS DISTINCT FROM owner THEN
        RAISE EXCEPTION '%.organization_id must equal its source''s organization', TG_TABLE_NAME
            USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER knowledge_chunks_same_organization
    BEFORE INSERT OR UPDATE OF organization_id, source_id ON knowledge_chunks
    FOR EACH ROW EXECUTE FUNCTION knowledge_same_organization_as_source();
CREATE TRIGGER knowledge_source_models_same_organization
    BEFORE INSERT OR UPDATE OF organization_id, source_id ON knowledge_source_models
    FOR EACH ROW EXECUTE FUNCTION knowledge_same_organization_as_source();

CREATE FUNCTION knowledge_source_keeps_its_organization() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.organization_id IS DISTINCT FROM OLD.organization_id THEN
        RAISE EXCEPTION 'a knowledge source never changes organization' USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER knowledge_sources_keep_organization
    BEFORE UPDATE OF organization_id ON knowledge_sources
    FOR EACH ROW EXECUTE FUNCTION knowledge_source_keeps_its_organization();

-- ------------------------------------------------------------------------ row-level security

-- Reads in an organization's scope see that organization's rows and the platform's (shared
-- documentation is reachable from every tenant, and the search still filters explicitly);
-- writes touch only the scope's own rows: an organization cannot write platform rows and the
-- platform scope cannot write an organization's.
DO $$
DECLARE
    scoped text;
BEGIN
    FOREACH scoped IN ARRAY ARRAY[
        'knowledge_sources', 'knowledge_source_models', 'knowledge_chunks', 'knowledge_settings'
    ] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', scoped);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', scoped);
        EXECUTE format(
            'CREATE POLICY tenant_reads ON %I FOR SELECT TO contextcore_app '
            'USING (organization_id IS NULL OR contextcore_in_scope(organization_id))', scoped);
        EXECUTE format(
            'CREATE POLICY tenant_inserts ON %I FOR INSERT TO contextcore_app '
            'WITH CHECK (contextcore_in_scope(organization_id))', scoped);
        EXECUTE format(
            'CREATE POLICY tenant_updates ON %I FOR UPDATE TO contextcore_app '
            'USING (contextcore_in_scope(organization_id)) '
            'WITH CHECK (contextcore_in_scope(organization_id))', scoped);
        EXECUTE format(
            'CREATE POLICY tenant_deletes ON %I FOR DELETE TO contextcore_app '
            'USING (contextcore_in_scope(organization_id))', scoped);
    END LOOP;
END
$$;
GRANT SELECT, INSERT, UPDATE, DELETE
    ON knowledge_sources, knowledge_source_models, knowledge_chunks TO contextcore_app;
GRANT SELECT, INSERT, UPDATE ON knowledge_settings TO contextcore_app;
GRANT SELECT, INSERT ON knowledge_models TO contextcore_app;

-- The pending sweep (below) runs as the owner across tenants. Under FORCE the owner needs a
-- policy: it may see pending and failed sources (PostgreSQL checks an updated row against the
-- SELECT policy too) and fail pending ones, nothing else of them. It reads every per-model
-- row (ids, counts and states; no text): the sweep's reasons and the per-tenant index command
-- (`contextcore-knowledge index`) count chunks there.
DO $$
BEGIN
    EXECUTE format(
        'CREATE POLICY owner_sweeps_pending ON knowledge_sources FOR SELECT TO %I '
        'USING (status IN (''pending'', ''failed''))', current_user);
    EXECUTE format(
        'CREATE POLICY owner_fails_pending ON knowledge_sources FOR UPDATE TO %I '
        'USING (status = ''pending'') WITH CHECK (status = ''failed'')', current_user);
    EXECUTE format(
        'CREATE POLICY owner_reads_counts ON knowledge_source_models FOR SELECT TO %I '
        'USING (true)', current_user);
    EXECUTE format(
        'CREATE POLICY owner_fails_pending ON knowledge_source_models FOR UPDATE TO %I '
        'USING (status = ''pending'') WITH CHECK (status = ''failed'')', current_user);
END
$$;

-- ------------------------------------------------------------------------- the pending sweep

-- Fail every source (and per-model state) pending for longer than older_than, never less than
-- an hour, a bounded batch at a time, with the reason; returns what it failed so the sweeper
-- can count it and tell the uploader. SECURITY DEFINER: pending rows of every tenant, and only
-- those, through the owner's two policies above.
CREATE FUNCTION contextcore_fail_stale_knowledge(older_than interval, batch integer)
RETURNS TABLE (
    organization_id uuid, source_id uuid, embedding_model text, title text, reason text,
    reply_to text, correlation_id text
)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff timestamptz;
BEGIN
    IF batch IS NULL OR batch <= 0 THEN
        RAISE EXCEPTION 'sweep batch must be positive, not %', batch USING ERRCODE = '22023';
    END IF;
    IF older_than IS NULL THEN
        RAISE EXCEPTION 'sweep age must be given' USING ERRCODE = '22023';
    END IF;
    cutoff := now() - greatest(older_than, interval '1 hour');
    RETURN QUERY
    WITH stale_models AS (
        SELECT m.source_id, m.embedding_model, m.organization_id,
               format('pending for more than an hour (since %s): %s of %s chunks stored under %s',
                      to_char(m.pending_since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                      m.chunks_stored, m.chunk_count, m.embedding_model) AS reason
        FROM public.knowledge_source_models m
        WHERE m.status = 'pending' AND m.pending_since < cutoff
        ORDER BY m.pending_since
        LIMIT batch
        FOR UPDATE SKIP LOCKED
    ), failed_models AS (
        UPDATE public.knowledge_source_models m
        SET status = 'failed', status_reason = sm.reason, pending_since = NULL, updated_at = now()
        FROM stale_models sm
        WHERE m.source_id = sm.source_id AND m.embedding_model = sm.embedding_model
    ), stale_sources AS (
        SELECT s.id, s.organization_id, s.title, s.reply_to, s.correlation_id,
               (SELECT sm.embedding_model FROM stale_models sm
                WHERE sm.source_id = s.id ORDER BY sm.embedding_model LIMIT 1) AS model,
               coalesce(
                   (SELECT sm.reason FROM stale_models sm
                    WHERE sm.source_id = s.id ORDER BY sm.embedding_model LIMIT 1),
                   format('pending for more than an hour (since %s) before its text was chunked',
                          to_char(s.pending_since AT TIME ZONE 'UTC',
                                  'YYYY-MM-DD"T"HH24:MI:SS"Z"'))) AS reason
        FROM public.knowledge_sources s
        WHERE s.status = 'pending' AND s.pending_since < cutoff
        ORDER BY s.pending_since
        LIMIT batch
        FOR UPDATE SKIP LOCKED
    ), failed_sources AS (
        UPDATE public.knowledge_sources s
        SET status = 'failed', status_reason = ss.reason, pending_since = NULL, updated_at = now()
        FROM stale_sources ss
        WHERE s.id = ss.id
    )
    SELECT ss.organization_id, ss.id, ss.model, ss.title, ss.reason, ss.reply_to,
           ss.correlation_id
    FROM stale_sources ss
    UNION ALL
    -- a model's row alone (a switch's target, its source ready under the live model): the
    -- source's title is not the owner's to read
    SELECT sm.organization_id, sm.source_id, sm.embedding_model, NULL::text, sm.reason, NULL,
           NULL
    FROM stale_models sm
    WHERE NOT EXISTS (SELECT 1 FROM stale_sources ss WHERE ss.id = sm.source_id);
END
$$;
REVOKE EXECUTE ON FUNCTION contextcore_fail_stale_knowledge(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION contextcore_fail_stale_knowledge(interval, integer) TO contextcore_app;

-- ------------------------------------------------------------------------------- the search

-- The live model of a scope: the organization's row, else the platform's.
CREATE FUNCTION knowledge_active_model(p_organization_id uuid) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT ks.active_embedding_model FROM public.knowledge_settings ks
    WHERE ks.organization_id IS NOT DISTINCT FROM p_organization_id
       OR ks.organization_id IS NULL
    ORDER BY ks.organization_id NULLS LAST
    LIMIT 1
$$;

-- Hybrid search (CLARIFICATIONS 10) over the ready sources of one organization and, when asked,
-- the platform; chunks of the live model only. SECURITY INVOKER: the caller's RLS applies, and
-- the organization is filtered explicitly too (the service role reads platform rows in every
-- scope, so the filter is what keeps include_platform = false honest).
--
-- Plan: each scope is one statement built with its organization and model as literals
-- (format %L) and run with EXECUTE, so it is planned for those values every time: a tenant
-- with its own partial HNSW index (`contextcore-knowledge index`) gets an approximate scan
-- (iterative, so the readiness filter never starves the top k), and a small tenant an exact
-- scan of its rows. A prepared generic plan could use neither partial index.
--
-- Fusion (measured in bench/quality.py, docs/knowledge.md): the vector ranking chooses
-- p_candidates per scope; the full-text rank of the question's words (any of them, English
-- stems; ts_rank with a section and a body weighing the same) re-ranks them:
-- score = cosine similarity + p_lexical_weight * rank / (rank + 1). With no query text the
-- order is the vector order. The lexical signal never brings a candidate of its own: as an
-- equal voter (rank fusion) it lowered recall on our questions.
CREATE FUNCTION knowledge_search(
    p_organization_id uuid,
    p_query_embedding vector,
    p_query_text text,
    p_include_platform boolean,
    p_include_organization boolean,
    p_limit integer,
    p_candidates integer DEFAULT 40,
    p_lexical_weight double precision DEFAULT 0.2,
    p_ef_search integer DEFAULT 200
)
RETURNS TABLE (
    chunk_id bigint, source_id uuid, organization_id uuid, title text, section text,
    ordinal integer, text text, tokens integer, embedding_model text,
    similarity double precision, lexical double precision, score double precision
)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    model text;
    dims integer;
    query_lexemes tsquery;
    scopes text[] := ARRAY[]::text[];
    scope_filter text;
    ready uuid[];
    statement text := '';
BEGIN
    IF p_limit IS NULL OR p_limit < 0 OR p_limit > 1000 THEN
        RAISE EXCEPTION 'knowledge_search limit must be 0..1000, not %', p_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_candidates IS NULL OR p_candidates < 1 OR p_candidates > 1000 THEN
        RAISE EXCEPTION 'knowledge_search candidates must be 1..1000, not %', p_candidates
            USING ERRCODE = '22023';
    END IF;
    IF p_include_organization AND p_organization_id IS NULL THEN
        RAISE EXCEPTION 'knowledge_search: include_organization needs an organization'
            USING ERRCODE = '22023';
    END IF;
    IF p_limit = 0 OR NOT (coalesce(p_include_platform, false)
                           OR coalesce(p_include_organization, false)) THEN
        RETURN;
    END IF;
    model := knowledge_active_model(p_organization_id);
    SELECT km.dimensions INTO dims FROM knowledge_models km WHERE km.name = model;
    IF vector_dims(p_query_embedding) <> dims THEN
        RAISE EXCEPTION 'the query embedding has % dimensions; the live model % has %',
            vector_dims(p_query_embedding), model, dims USING ERRCODE = '22023';
    END IF;
    IF coalesce(btrim(p_query_text), '') <> '' THEN
        -- any word of the question, not all of them (an AND of a question's words matches
        -- almost no passage); websearch syntax never fails on raw input, once quotes and
        -- leading minus signs (phrase and negation) are blanked
        query_lexemes := websearch_to_tsquery('english', regexp_replace(
            btrim(regexp_replace(p_query_text, '["-]+', ' ', 'g')), '\s+', ' or ', 'g'));
    END IF;
    -- The ready sources of the scopes, under the live model, first: as a plain filter on the
    -- chunk scan (not a join the planner could put first) it lets a tenant's HNSW index order
    -- the scan, and the iterative scan skip what is not ready. A source's chunks of an older
    -- generation are deleted in the transaction that makes the new one ready, and a source
    -- being re-ingested is pending, so a ready source's chunks under the model are its current
    -- generation.
    SELECT coalesce(array_agg(m.source_id), '{}') INTO ready
    FROM knowledge_source_models m
    JOIN knowledge_sources s ON s.id = m.source_id
    WHERE m.embedding_model = model AND m.status = 'ready' AND s.status = 'ready'
      AND ((p_include_organization AND m.organization_id = p_organization_id)
           OR (p_include_platform AND m.organization_id IS NULL));
    IF cardinality(ready) = 0 THEN
        RETURN;
    END IF;
    IF p_include_organization THEN
        scopes := scopes || format('c.organization_id = %L::uuid', p_organization_id);
    END IF;
    IF p_include_platform THEN
        scopes := scopes || 'c.organization_id IS NULL'::text;
    END IF;
    PERFORM set_config('hnsw.ef_search', greatest(p_ef_search, p_candidates)::text, true);
    PERFORM set_config('hnsw.iterative_scan', 'relaxed_order', true);
    FOREACH scope_filter IN ARRAY scopes LOOP
        IF statement <> '' THEN
            statement := statement || ' UNION ALL ';
        END IF;
        statement := statement || format($q$
            (SELECT c.id, c.source_id, c.organization_id, c.section, c.ordinal, c.text, c.tokens,
                    c.lexemes, c.embedding::vector(%s) <=> $1 AS distance
             FROM knowledge_chunks c
             WHERE %s AND c.embedding_model = %L
               AND c.source_id = ANY($5)
             ORDER BY c.embedding::vector(%s) <=> $1
             LIMIT %s)$q$, dims, scope_filter, model, dims, p_candidates);
    END LOOP;
    RETURN QUERY EXECUTE format($q$
        SELECT k.id, k.source_id, k.organization_id, s.title, k.section, k.ordinal, k.text,
               k.tokens, %L::text, 1 - k.distance,
               coalesce(ts_rank('{0.1, 0.2, 1.0, 1.0}', k.lexemes, $2, 32), 0)::double precision,
               1 - k.distance
                 + $3 * coalesce(ts_rank('{0.1, 0.2, 1.0, 1.0}', k.lexemes, $2, 32), 0)
        FROM (%s) k
        JOIN knowledge_sources s ON s.id = k.source_id
        ORDER BY 12 DESC, k.distance, k.id
        LIMIT $4$q$, model, statement)
        USING p_query_embedding, query_lexemes, p_lexical_weight, p_limit, ready;
END
$$;
GRANT EXECUTE ON FUNCTION knowledge_active_model(uuid) TO contextcore_app;
GRANT EXECUTE ON FUNCTION knowledge_search(
    uuid, vector, text, boolean, boolean, integer, integer, double precision, integer
) TO contextcore_app;
