-- Least privilege for the runtime login, row-level security forced on every tenant table, and a
-- processed-message ledger keyed by tenant.
--
-- Roles (docs/tenancy.md; `contextcore-schema provision` creates them before any migration):
--   the owner      runs these migrations and owns every object; never a service's credential.
--   contextcore_app  NOLOGIN NOINHERIT: the service role. It owns nothing, holds the grants,
--                  and is the role every RLS policy names.
--   the runtime login  LOGIN NOINHERIT, a member of contextcore_app and nothing else: it holds
--                  no privilege until a tenant scope runs SET LOCAL ROLE contextcore_app, so a
--                  statement that says RESET ROLE is left with no privilege at all.
-- Nothing below names the login; only the service role and the migrating owner (current_user).

-- ------------------------------------------------------------------ the ledger, per tenant

-- Until now (consumer, message_id) was global: tenant B reusing tenant A's idempotency key made
-- A's message look processed. A claim now belongs to one organization, or to the platform (a
-- null organization); NULLS NOT DISTINCT makes the platform one key space, as in
-- knowledge_settings. No consumer wrote claims before this migration; any row left becomes a
-- platform claim. organization_id leads the key (shard by organization).
ALTER TABLE processed_messages ADD COLUMN organization_id uuid;
ALTER TABLE processed_messages DROP CONSTRAINT processed_messages_pkey;
ALTER TABLE processed_messages ADD CONSTRAINT processed_messages_key
    UNIQUE NULLS NOT DISTINCT (organization_id, consumer, message_id);

-- A write scope names either one organization (contextcore.organization_id) or the platform
-- (contextcore.platform = 'on'); a row matches the scope it was written in, and an unset scope
-- matches nothing.
CREATE FUNCTION contextcore_in_scope(row_organization uuid) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN row_organization IS NULL
            THEN coalesce(current_setting('contextcore.platform', true), '') = 'on'
        ELSE row_organization = contextcore_current_organization()
    END
$$;

-- RLS is enabled and not forced here, the one exception: the ledger holds message ids and
-- times, no tenant content, and the owner's prune function below must see every tenant's
-- expired claims. The service role still reads and writes only its scope's claims.
ALTER TABLE processed_messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_claims ON processed_messages FOR ALL TO contextcore_app
    USING (contextcore_in_scope(organization_id))
    WITH CHECK (contextcore_in_scope(organization_id));
GRANT SELECT, INSERT ON processed_messages TO contextcore_app;

-- Forget claims older than the retention, a bounded batch at a time, across every tenant.
-- SECURITY DEFINER (the owner) because a claim's retention is not a tenant decision; the one
-- thing the service role may do with other tenants' claims is delete expired ones, through
-- here. A non-positive batch or retention is refused.
CREATE FUNCTION contextcore_prune_processed_messages(older_than interval, batch integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public
AS $$
DECLARE
    removed integer;
BEGIN
    IF batch IS NULL OR batch <= 0 THEN
        RAISE EXCEPTION 'prune batch must be positive, not %', batch USING ERRCODE = '22023';
    END IF;
    IF older_than IS NULL OR older_than <= interval '0' THEN
        RAISE EXCEPTION 'prune retention must be positive, not %', older_than
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM processed_messages
    WHERE ctid IN (
        SELECT ctid FROM processed_messages
        WHERE processed_at < now() - older_than
        LIMIT batch
    );
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END
$$;
REVOKE EXECUTE ON FUNCTION contextcore_prune_processed_messages(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION contextcore_prune_processed_messages(interval, integer)
    TO contextcore_app;

-- --------------------------------------------------------- RLS forced on every tenant table

-- FORCE applies the policies to the table owner too: a view or function the owner defines, or
-- a service wrongly started with the owner's credential, reads no tenant row that the current
-- organization does not own. Only a superuser (or a BYPASSRLS role) reads across tenants.
DO $$
DECLARE
    scoped text;
BEGIN
    FOREACH scoped IN ARRAY ARRAY[
        'organizations', 'organization_members', 'crm_companies', 'crm_people', 'crm_deals',
        'crm_activities', 'crm_lists', 'prospects', 'prospect_people', 'company_profiles',
        'dossier_services', 'ideal_customer_profiles', 'offers', 'organization_documents',
        'definitions', 'conversations', 'conversation_messages', 'runs'
    ] LOOP
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', scoped);
    END LOOP;
END
$$;

-- The tenant_intel_* views (00004) run as their owner and read the bridge tables to decide
-- which shared rows the current organization may see. Under FORCE the owner needs a policy of
-- its own there: the same tenant rule, for reading only.
DO $$
BEGIN
    EXECUTE format(
        'CREATE POLICY owner_reads_current_tenant ON prospects FOR SELECT TO %I '
        'USING (organization_id = contextcore_current_organization())', current_user);
    EXECUTE format(
        'CREATE POLICY owner_reads_current_tenant ON prospect_people FOR SELECT TO %I '
        'USING (organization_id = contextcore_current_organization())', current_user);
END
$$;

-- ------------------------------------------------------------- what the service role may do

-- Consumers check the schema at start-up as the service role: it reads the migration ledger,
-- never writes it.
GRANT SELECT ON contextcore_migrations TO contextcore_app;
GRANT EXECUTE ON FUNCTION contextcore_in_scope(uuid) TO contextcore_app;
