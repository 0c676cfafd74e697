-- memory_apply and memory_apply_one (00011) name their tables unqualified and run as the
-- service role (SECURITY INVOKER). Pin their search_path, as 00007 does for the knowledge
-- functions: otherwise a temporary table of the caller's session named memories or
-- memory_writes would come first (pg_temp is searched first unless it is named) and shadow
-- the real ones inside the function.
ALTER FUNCTION memory_apply_one(jsonb) SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION memory_apply(jsonb) SET search_path = pg_catalog, public, pg_temp;
