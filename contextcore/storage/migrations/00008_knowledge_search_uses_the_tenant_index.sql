-- knowledge_search uses a tenant's own HNSW index whenever it has one, and changes no setting
-- beyond its own call (bench/search.py, docs/knowledge.md).
--
-- 1. With its cost model, the planner preferred an exact scan and a sort to a tenant's partial
--    HNSW index up to about 6,000 chunks, at ef_search 200: 8 to 19 ms where the index answers
--    in 3.3 to 5 ms (measured at 2,000 to 23,000 chunks). enable_sort = off for the function
--    makes a plan that needs no sort win wherever an index can order the rows; a tenant with no
--    index of its own has only plans with a sort, and keeps its exact one.
-- 2. hnsw.ef_search and hnsw.iterative_scan were set with set_config(…, true) inside the
--    function, which lasts to the end of the caller's transaction. Named in the function's SET
--    clause, they are restored when the call returns, as enable_sort is.
--
-- The body stays 00007's: only the function's settings change.

-- pgvector defines hnsw.* when its library loads; a value of the type loads it, so the owner
-- may name them in the SET clause below (an unloaded extension's settings are the superuser's).
SELECT '[0]'::vector;

ALTER FUNCTION knowledge_search(
    uuid, vector, text, boolean, boolean, integer, integer, double precision, integer
)
    SET enable_sort = off
    SET hnsw.ef_search = 40
    SET hnsw.iterative_scan = relaxed_order;
