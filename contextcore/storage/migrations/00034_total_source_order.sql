-- Every build source's item order is total: the same request against the same rows gives the
-- same brief, byte for byte, in one process and across processes, whatever plan PostgreSQL
-- picks and wherever the rows lie on disk.
--
-- The audit of the latest definition of each function a source reads through found every
-- order ending in a unique key already, but one:
--
--   contextcore_read_conversation (00029)  created_at DESC, id DESC
--   contextcore_read_runs (00029)          created_at DESC, id DESC
--   contextcore_read_memories (00033)      created_at DESC, id DESC (both branches)
--   contextcore_read_definitions (00029)   organization_id IS NULL, kind, name, id
--   contextcore_read_dossier (00029)       section, ordinal; each numbered part by
--                                          (position, name, id), the documents by
--                                          (created_at DESC, id DESC); one row per other part
--   contextcore_read_application (00029)   no order: the source puts the rows in request order
--   knowledge_search (00022, through       rank, then chunk within the document: both unique
--   contextcore_read_knowledge, 00032)     (documents by score, then their first chunk id;
--                                          chunks by score, then id); the lexical candidates
--                                          (knowledge_word_candidates, 00017) by score, then id
--
-- The exception: knowledge_search's vector candidates, each scope's p_candidates nearest
-- chunks, ordered by distance alone. Chunks at one distance (the same passage in two documents
-- has the same embedding) tie, and at the cut the exact plan of a small tenant kept whichever
-- its scan met first: by source id, then where the row lies on disk, which an UPDATE, a VACUUM
-- FULL or a restore changes. Another candidate set ranks other documents. The chunk id now
-- breaks the tie (the nearest first, then the oldest chunk), as the lexical side's order and
-- each document's first chunk already did. The exact plan sorts anyway (one more key); an
-- indexed tenant keeps its HNSW scan and sorts only the rows of one distance (an incremental
-- sort; measured on 10,000 chunks: the index still chosen, the same recall). That approximate
-- scan's candidates are the index's, as before: the same while the index is the same. Only that
-- ORDER BY differs from 00022's body, restated whole because CREATE OR REPLACE must.

-- pgvector defines hnsw.* when its library loads; a value of the type loads it, so the owner
-- may name them in the SET clause below (as in 00008, 00017 and 00022: an upgrade from 00033
-- starts a session of its own).
SELECT '[0]'::vector;

CREATE OR REPLACE FUNCTION knowledge_search(
    p_organization_id uuid,
    p_model text,
    p_query_embedding vector,
    p_query_text text,
    p_include_platform boolean,
    p_include_organization boolean,
    p_limit integer,
    p_per_document integer DEFAULT 1,
    p_candidates integer DEFAULT 40,
    p_lexical_weight double precision DEFAULT 0.4,
    p_later_chunk_penalty double precision DEFAULT 0.2,
    p_ef_search integer DEFAULT 200
)
RETURNS TABLE (
    chunk_id bigint, source_id uuid, organization_id uuid, title text, section text,
    ordinal integer, text text, tokens integer, embedding_model text,
    similarity double precision, lexical double precision, score double precision,
    document_rank integer
)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, public, pg_temp
SET enable_sort = off
SET hnsw.ef_search = 40
SET hnsw.iterative_scan = relaxed_order
AS $$
DECLARE
    dims integer;
    scopes text[] := ARRAY[]::text[];
    scope_filter text;
    unready uuid[];
    chunks bigint;
    words tsquery[] := ARRAY[]::tsquery[];
    rarity double precision[] := ARRAY[]::double precision[];
    asked tsquery[];
    counts bigint[];
    by_words bigint[] := '{}';
    any_word tsquery;
    matched bigint := 0;
    i bigint;
    MATCHES constant bigint := 1000;
    weight double precision := 0;
    nearest text := '';
BEGIN
    IF p_limit IS NULL OR p_limit < 0 OR p_limit > 1000 THEN
        RAISE EXCEPTION 'knowledge_search limit must be 0..1000, not %', p_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_candidates IS NULL OR p_candidates < 1 OR p_candidates > 1000 THEN
        RAISE EXCEPTION 'knowledge_search candidates must be 1..1000, not %', p_candidates
            USING ERRCODE = '22023';
    END IF;
    IF p_per_document IS NOT NULL AND (p_per_document < 1 OR p_per_document > 20) THEN
        RAISE EXCEPTION 'knowledge_search chunks per document must be 1..20, not %',
            p_per_document USING ERRCODE = '22023';
    END IF;
    IF p_include_organization AND p_organization_id IS NULL THEN
        RAISE EXCEPTION 'knowledge_search: include_organization needs an organization'
            USING ERRCODE = '22023';
    END IF;
    IF p_limit = 0 OR NOT (coalesce(p_include_platform, false)
                           OR coalesce(p_include_organization, false)) THEN
        RETURN;
    END IF;
    -- A query never mixes models (CLARIFICATIONS 17): each scope searched is under p_model.
    IF p_include_organization AND knowledge_active_model(p_organization_id) <> p_model THEN
        RAISE EXCEPTION 'the organization''s live embedding model is %, not %',
            knowledge_active_model(p_organization_id), p_model USING ERRCODE = 'CC001';
    END IF;
    IF p_include_platform AND knowledge_active_model(NULL) <> p_model THEN
        RAISE EXCEPTION 'the platform''s live embedding model is %, not %',
            knowledge_active_model(NULL), p_model USING ERRCODE = 'CC001';
    END IF;
    SELECT km.dimensions INTO dims FROM knowledge_models km WHERE km.name = p_model;
    IF vector_dims(p_query_embedding) <> dims THEN
        RAISE EXCEPTION 'the query embedding has % dimensions; the model % has %',
            vector_dims(p_query_embedding), p_model, dims USING ERRCODE = '22023';
    END IF;
    -- The sources of the scopes that have chunks under the model but are not ready under it
    -- (a generation being embedded, a failure), first: a plain filter on the chunk scans, so a
    -- tenant's HNSW index orders the scan and the iterative scan skips them. A ready source's
    -- chunks under the model are its current generation (older ones are deleted when a new
    -- one becomes ready). 00007 listed the ready sources instead: 5 ms at 4,500 documents,
    -- where the others are few. chunks: the ready ones' count, for the words' rarity.
    SELECT coalesce(array_agg(DISTINCT u.source_id), '{}') INTO unready
    FROM (
        SELECT m.source_id FROM knowledge_source_models m
        WHERE m.embedding_model = p_model AND m.status <> 'ready'
          AND ((p_include_organization AND m.organization_id = p_organization_id)
               OR (p_include_platform AND m.organization_id IS NULL))
        UNION ALL
        SELECT s.id FROM knowledge_sources s
        WHERE s.status <> 'ready'
          AND ((p_include_organization AND s.organization_id = p_organization_id)
               OR (p_include_platform AND s.organization_id IS NULL))
    ) u;
    SELECT coalesce(sum(m.chunk_count), 0) INTO chunks
    FROM knowledge_source_models m
    WHERE m.embedding_model = p_model AND m.status = 'ready' AND m.source_id <> ALL(unready)
      AND ((p_include_organization AND m.organization_id = p_organization_id)
           OR (p_include_platform AND m.organization_id IS NULL));
    IF chunks = 0 THEN
        RETURN;
    END IF;
    IF p_include_organization THEN
        scopes := scopes || format('c.organization_id = %L::uuid', p_organization_id);
    END IF;
    IF p_include_platform THEN
        scopes := scopes || 'c.organization_id IS NULL'::text;
    END IF;
    PERFORM set_config('hnsw.ef_search', greatest(p_ef_search, p_candidates)::text, true);

    -- The question's words (English stems, stop words dropped), each with its rarity in the
    -- scopes: ln(1 + (N - n + 0.5) / (n + 0.5)), N the scopes' chunks, n those with the word
    -- (one statement per scope counts every word). A word no chunk has is dropped. Each word is
    -- its own quoted query, so no character of the question is ever read as query syntax.
    SELECT coalesce(array_agg(('''' || replace(replace(w.lexeme, '\', '\\'), '''', '''''')
                               || '''')::tsquery ORDER BY w.lexeme), '{}')
    INTO asked
    FROM (SELECT DISTINCT t.lexeme
          FROM unnest(to_tsvector('english', left(coalesce(p_query_text, ''), 2000))) t
          ORDER BY 1 LIMIT 32) w;
    IF cardinality(asked) > 0 THEN
        counts := knowledge_word_counts(
            p_organization_id, p_include_platform, p_include_organization, p_model, asked);
        -- rarest first: every word weighs in the score, but only the rarest find candidates,
        -- as many as match at most MATCHES chunks together (always the rarest one), so a
        -- question full of the corpus's common words does not rank half of it
        FOR i IN SELECT x.n FROM unnest(counts) WITH ORDINALITY AS x (c, n)
                 WHERE x.c > 0 ORDER BY x.c, x.n LOOP
            words := words || asked[i];
            rarity := rarity || ln(1 + (greatest(chunks, counts[i]) - counts[i] + 0.5)
                                       / (counts[i] + 0.5));
            IF any_word IS NULL OR matched + counts[i] <= MATCHES THEN
                any_word := CASE WHEN any_word IS NULL THEN asked[i]
                                 ELSE any_word || asked[i] END;
                matched := matched + counts[i];
            END IF;
        END LOOP;
        -- The lexical weight follows how well the question's words tell chunks apart: its
        -- rarest word's rarity, as a share of the rarity of a word one chunk alone has. A
        -- question whose words every document shares weighs its words little; one that names
        -- something few chunks mention, fully.
        weight := p_lexical_weight * least(1, (SELECT max(r) FROM unnest(rarity) r)
                                              / ln(1 + (chunks - 0.5) / 1.5));
        -- as shares of the question's rarity: a chunk with every word scores about 1 however
        -- long the question, so one weight fits short questions and long ones
        rarity := ARRAY(SELECT x.r / sum(x.r) OVER () FROM unnest(rarity) WITH ORDINALITY AS x (r, n)
                        ORDER BY x.n);
    END IF;

    -- each scope's p_candidates nearest chunks; the chunk id breaks a tie of distance (00034)
    FOREACH scope_filter IN ARRAY scopes LOOP
        nearest := nearest || CASE WHEN nearest = '' THEN '' ELSE ' UNION ALL ' END || format($q$
            (SELECT c.id FROM knowledge_chunks c
             WHERE %s AND c.embedding_model = %L AND c.source_id <> ALL($2)
             ORDER BY c.embedding::vector(%s) <=> $1, c.id
             LIMIT %s)$q$, scope_filter, p_model, dims, p_candidates);
    END LOOP;
    IF any_word IS NOT NULL THEN
        SELECT coalesce(array_agg(w.chunk_id), '{}') INTO by_words
        FROM knowledge_word_candidates(
            p_organization_id, p_include_platform, p_include_organization, p_model, any_word,
            words, rarity, unready, p_candidates) w;
    END IF;

    -- Each candidate once, scored; then documents (or chunks) ranked.
    RETURN QUERY EXECUTE format($q$
        WITH candidates AS (
            SELECT DISTINCT x.id FROM (%s UNION ALL SELECT unnest($10::bigint[])) x (id)
        ), scored AS (
            SELECT c.id, c.source_id, c.organization_id, c.section, c.ordinal, c.text, c.tokens,
                   1 - (c.embedding::vector(%s) <=> $1) AS similarity,
                   CASE WHEN $3 IS NULL OR NOT c.lexemes @@ $3 THEN 0 ELSE
                       (SELECT sum(w.rarity * ts_rank('{0.1, 0.2, 1.0, 1.0}', c.lexemes, w.q))
                        FROM unnest($4, $5) AS w (q, rarity)) END::double precision AS lexical
            FROM candidates k JOIN knowledge_chunks c ON c.id = k.id
        ), weighed AS (
            SELECT s.*,
                   s.similarity - CASE WHEN s.ordinal > 0 THEN $7 ELSE 0 END AS nearness,
                   s.similarity - CASE WHEN s.ordinal > 0 THEN $7 ELSE 0 END
                       + $6 * s.lexical AS chunk_score
            FROM scored s
        ), documents AS (
            SELECT w.source_id,
                   max(w.nearness) + $6 * max(w.lexical) AS document_score,
                   min(w.id) AS first_chunk
            FROM weighed w
            GROUP BY w.source_id
        ), ranked AS (
            SELECT w.*, d.document_score,
                   dense_rank() OVER (ORDER BY d.document_score DESC, d.first_chunk)
                       AS document_rank,
                   row_number() OVER (PARTITION BY w.source_id
                                      ORDER BY w.chunk_score DESC, w.id) AS in_document,
                   row_number() OVER (ORDER BY w.chunk_score DESC, w.id) AS chunk_rank
            FROM weighed w JOIN documents d ON d.source_id = w.source_id
        )
        SELECT r.id, r.source_id, r.organization_id, s.title, r.section, r.ordinal, r.text,
               r.tokens, %L::text, r.similarity, r.lexical,
               CASE WHEN $8 IS NULL THEN r.chunk_score ELSE r.document_score END,
               CASE WHEN $8 IS NULL THEN r.chunk_rank ELSE r.document_rank END::integer
        FROM ranked r
        JOIN knowledge_sources s ON s.id = r.source_id
        WHERE CASE WHEN $8 IS NULL THEN r.chunk_rank <= $9
                   ELSE r.document_rank <= $9 AND r.in_document <= $8 END
        ORDER BY 13, r.in_document$q$, nearest, dims, p_model)
        USING p_query_embedding, unready, any_word, words, rarity, weight,
              p_later_chunk_penalty, p_per_document, p_limit, by_words;
END
$$;
