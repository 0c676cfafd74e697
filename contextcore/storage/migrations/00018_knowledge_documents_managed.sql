-- Documents an admin can list and delete (issue 18; docs/knowledge.md).
--
-- 1. knowledge_sources.size_bytes: the size of the document as uploaded (the bytes the
--    extraction read), set with the extracted text; null for a source that has not been read
--    yet (pending) or was read before this migration.
-- 2. knowledge_deletions: one row per deleted document, kept after the source, its per-model
--    rows and its chunks are gone (the delete cascades from the source, in one transaction, so
--    the document leaves every search at once). What was deleted (id, title, identity, chunk
--    count), when, by which database login and at whose request; never its text. Append only:
--    the service role may insert and read its scope's rows, never change or remove one.
--
-- A later upload of the same identity (uri or object key) creates a new source: the unique
-- identity indexes only hold live sources.
--
-- Shard note (STORAGE.md): like knowledge_sources, a deletion may belong to the platform
-- (organization_id null), so its primary key is its own id; the index a read uses leads with
-- organization_id.

ALTER TABLE knowledge_sources
    ADD COLUMN size_bytes bigint CHECK (size_bytes >= 0);

CREATE TABLE knowledge_deletions (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    organization_id  uuid        REFERENCES organizations (id) ON DELETE CASCADE,
    source_id        uuid        NOT NULL,
    title            text        NOT NULL CHECK (length(title) BETWEEN 1 AND 500),
    identity         text        NOT NULL CHECK (length(identity) BETWEEN 1 AND 2000),
    chunks           integer     NOT NULL CHECK (chunks >= 0),
    login            text        NOT NULL DEFAULT session_user,
    requested_by     text        CHECK (length(requested_by) BETWEEN 1 AND 200),
    deleted_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX knowledge_deletions_scope_idx
    ON knowledge_deletions (organization_id, deleted_at DESC);

-- A deletion is recorded by the login that deleted, whatever the caller says.
CREATE FUNCTION knowledge_deletion_login() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.login := session_user;
    NEW.deleted_at := now();
    RETURN NEW;
END
$$;
CREATE TRIGGER knowledge_deletions_login
    BEFORE INSERT ON knowledge_deletions
    FOR EACH ROW EXECUTE FUNCTION knowledge_deletion_login();

ALTER TABLE knowledge_deletions ENABLE ROW LEVEL SECURITY;
ALTER TABLE knowledge_deletions FORCE ROW LEVEL SECURITY;
-- Unlike the sources, the platform's deletions are not an organization's to read.
CREATE POLICY tenant_reads ON knowledge_deletions FOR SELECT TO contextcore_app
    USING (contextcore_in_scope(organization_id));
CREATE POLICY tenant_inserts ON knowledge_deletions FOR INSERT TO contextcore_app
    WITH CHECK (contextcore_in_scope(organization_id));
GRANT SELECT, INSERT ON knowledge_deletions TO contextcore_app;
