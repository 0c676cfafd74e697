-- Harden what 00005 gave the runtime login over the processed-message ledger.
--
-- 1. The prune function runs as its owner (SECURITY DEFINER). Its search_path named no pg_temp,
--    and PostgreSQL then searches a session's temporary schema first for tables: a role able to
--    create a temporary table called processed_messages could have run code as the owner. The
--    function now searches pg_catalog then pg_temp (last) and names its table by schema.
-- 2. The caller chose what counts as expired: the runtime login could prune every tenant's
--    fresh claims with a retention of a microsecond and break idempotency for all of them.
--    Claims younger than one day are now never pruned, whatever the caller asks; a Kafka
--    redelivery comes within minutes, so a day is far beyond what the ledger must remember.
-- 3. Temporary tables are taken away from PUBLIC in the database itself, not only by
--    `contextcore-schema provision` (the owner of the database may do that).
-- 4. The ledger has no primary key (a platform claim's organization is null), so a logical
--    replica could not apply its deletes: the whole row identifies it.

CREATE OR REPLACE FUNCTION contextcore_prune_processed_messages(older_than interval, batch integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
    DELETE FROM public.processed_messages
    WHERE ctid IN (
        SELECT ctid FROM public.processed_messages
        WHERE processed_at < now() - greatest(older_than, interval '1 day')
        LIMIT batch
    );
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END
$$;

DO $$
BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
END
$$;

ALTER TABLE processed_messages REPLICA IDENTITY FULL;
