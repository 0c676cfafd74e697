-- Every memory revision goes through memory_apply (issue 19; docs/memory.md, "Who can write").
--
-- Until now the service role held INSERT on memories and INSERT and UPDATE on memory_writes, so
-- that memory_apply_one (SECURITY INVOKER) could append. The same grants let the runtime login
-- append a child of a chain's head with a plain INSERT: no journal row, and no duplicate rule
-- (a child repeating its parent's text was accepted). It could also plant a journal answer for
-- an idempotency key not yet used, which the real call would then replay.
--
-- Now the service role can only read them. memory_apply_one runs as the owner (SECURITY
-- DEFINER), the one path that appends a revision or a journal row, and it always appends both
-- in one transaction. Row security still repeats every organization filter the function
-- writes: the owner's policies below are the service role's, the caller-named organization
-- being the transaction's scope (memory_apply_one names it before it touches a row). The
-- function was already the only code that wrote; what changes is who may.
--
-- And the owner: a trigger refuses TRUNCATE of memories and memory_writes, which skips the
-- row triggers (TRUNCATE organizations CASCADE reached them too). The owner could still drop
-- these triggers; docs/memory.md says which rules hold against which role.

DO $$
BEGIN
    EXECUTE format(
        'CREATE POLICY owner_reads_in_scope ON memories FOR SELECT TO %I '
        'USING (contextcore_in_scope(organization_id))', current_user);
    EXECUTE format(
        'CREATE POLICY owner_appends_in_scope ON memories FOR INSERT TO %I '
        'WITH CHECK (contextcore_in_scope(organization_id))', current_user);
    EXECUTE format(
        'CREATE POLICY owner_reads_in_scope ON memory_writes FOR SELECT TO %I '
        'USING (contextcore_in_scope(organization_id))', current_user);
    EXECUTE format(
        'CREATE POLICY owner_journals_in_scope ON memory_writes FOR INSERT TO %I '
        'WITH CHECK (contextcore_in_scope(organization_id))', current_user);
END
$$;

ALTER FUNCTION memory_apply_one(jsonb) SECURITY DEFINER;

-- A table-level REVOKE takes the column grants of 00010 with it.
REVOKE INSERT ON memories FROM contextcore_app;
REVOKE INSERT, UPDATE ON memory_writes FROM contextcore_app;
DROP POLICY tenant_appends ON memories;
DROP POLICY tenant_claims ON memory_writes;
DROP POLICY tenant_answers ON memory_writes;

CREATE FUNCTION memory_refuse_truncate() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION '% is append only: it is never truncated', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER memories_never_truncated BEFORE TRUNCATE ON memories
    FOR EACH STATEMENT EXECUTE FUNCTION memory_refuse_truncate();
CREATE TRIGGER memory_writes_never_truncated BEFORE TRUNCATE ON memory_writes
    FOR EACH STATEMENT EXECUTE FUNCTION memory_refuse_truncate();
