-- Refusals the journal cannot hold, counted per organization (issue 19: the health refusal
-- rate left out invalid_input; docs/memory.md, "Operating it").
--
-- The journal keeps one row per idempotency key with its answer. Three invalid_input refusals
-- never get a row of their own: a record that does not validate (no call to journal), a key
-- reused for another call (the key's row is the first call's), and a call the database
-- refused (nothing was written). The memory consumer counts them here, by the organization
-- the record names, the day, and the operation (unknown when the action is not one): counts
-- only, no key, no text. A forged organization only inflates that organization's count, and
-- the consumer trusts the organization a record names anyway (docs/memory.md).

CREATE TABLE memory_refusals (
    organization_id uuid    NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    day             date    NOT NULL,
    operation       text    NOT NULL CHECK (operation IN ('remember', 'forget', 'unknown')),
    reason          text    NOT NULL CHECK (reason IN ('invalid_input')),
    calls           integer NOT NULL CHECK (calls > 0),
    PRIMARY KEY (organization_id, day, operation, reason)
);

ALTER TABLE memory_refusals ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_refusals FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_reads ON memory_refusals FOR SELECT TO contextcore_app
    USING (contextcore_in_scope(organization_id));
CREATE POLICY tenant_counts ON memory_refusals FOR INSERT TO contextcore_app
    WITH CHECK (contextcore_in_scope(organization_id));
CREATE POLICY tenant_adds ON memory_refusals FOR UPDATE TO contextcore_app
    USING (contextcore_in_scope(organization_id))
    WITH CHECK (contextcore_in_scope(organization_id));
GRANT SELECT, INSERT, UPDATE (calls) ON memory_refusals TO contextcore_app;
