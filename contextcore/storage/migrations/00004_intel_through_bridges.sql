-- Shared intelligence rows reach the service role only through a tenant's bridge rows.
--
-- 00003 let contextcore_app read intel_companies and intel_people directly; only the source's
-- query kept a tenant from reading a shared row no bridge of theirs points at. Now the role
-- reads two views instead. Each returns the shared rows that a bridge row of the current
-- organization (contextcore.organization_id) points at, and nothing when no organization is
-- set. The views belong to the migration owner and filter by the setting themselves, because
-- RLS does not apply to the owner; security_barrier keeps a caller's predicates from running
-- before that filter.

REVOKE SELECT ON intel_companies, intel_people FROM contextcore_app;

CREATE VIEW tenant_intel_companies WITH (security_barrier) AS
SELECT c.*
FROM intel_companies AS c
WHERE EXISTS (
    SELECT 1 FROM prospects AS p
    WHERE p.intel_company_id = c.id
      AND p.organization_id = contextcore_current_organization()
);

CREATE VIEW tenant_intel_people WITH (security_barrier) AS
SELECT person.*
FROM intel_people AS person
WHERE EXISTS (
    SELECT 1 FROM prospect_people AS pp
    WHERE pp.intel_person_id = person.id
      AND pp.organization_id = contextcore_current_organization()
);

GRANT SELECT ON tenant_intel_companies, tenant_intel_people TO contextcore_app;
