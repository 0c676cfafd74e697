-- Every build process caches what the definition_summary source read, per organization, for up
-- to 60 s (issue 20: one round trip less per build). A write to definitions tells every
-- listener, in every process, which organization's entries to drop: the organization's id,
-- or an empty payload when the row is a platform definition (a null organization), which every
-- organization's entries may hold. An update that moves a row tells both organizations.
CREATE FUNCTION contextcore_notify_definitions() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, public
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('contextcore_definitions', '');
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM pg_notify('contextcore_definitions', coalesce(OLD.organization_id::text, ''));
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM pg_notify('contextcore_definitions', coalesce(NEW.organization_id::text, ''));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER definitions_notify AFTER INSERT OR UPDATE OR DELETE ON definitions
    FOR EACH ROW EXECUTE FUNCTION contextcore_notify_definitions();
CREATE TRIGGER definitions_notify_truncate AFTER TRUNCATE ON definitions
    FOR EACH STATEMENT EXECUTE FUNCTION contextcore_notify_definitions();
