-- The dossier cache now holds the whole dossier of an organization (issue 20: no round trip for
-- a cached dossier), its documents and the asking member included, so a write to those tables
-- must drop the organization's entries too, in every process, as a write to the organization
-- part does (00003's contextcore_notify_dossier, keyed by organization_id).
CREATE TRIGGER organization_documents_notify_dossier
    AFTER INSERT OR UPDATE OR DELETE ON organization_documents
    FOR EACH ROW EXECUTE FUNCTION contextcore_notify_dossier();
CREATE TRIGGER organization_members_notify_dossier
    AFTER INSERT OR UPDATE OR DELETE ON organization_members
    FOR EACH ROW EXECUTE FUNCTION contextcore_notify_dossier();
