-- The catalog of embedding models is the owner's to write (issue 17, item 5).
--
-- knowledge_models is a global reference table: no organization, no row-level security, one
-- row per model every tenant's chunks and searches refer to. 00007 granted INSERT on it to the
-- service role, so the runtime login could add rows from inside any tenant's scope (a tenant
-- scope is that role), for every tenant at once. Registering a model is an operator's step of a
-- model switch (`contextcore-knowledge switch prepare`), which now runs it with the schema
-- owner's credential, as the `index` command does; the service role keeps SELECT (the search
-- reads a model's dimensions).
REVOKE INSERT ON knowledge_models FROM contextcore_app;
