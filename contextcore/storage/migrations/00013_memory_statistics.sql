-- The planner's view of memories (docs/memory.md, "The head lookup's plan").
--
-- An agent definition belongs to one organization, so (organization_id, definition_id) are
-- correlated; planned as independent columns, an organization's rows of one definition are
-- estimated at a hundredth of what they are. memory_apply_one's head lookup runs under a
-- generic plan (PL/pgSQL caches it), and with that estimate the plan chose the index on
-- (organization_id, definition_id, created_at, id) and filtered every revision of the
-- definition, in place of the chain identity index: each write read the organization's whole
-- history. Measured on a 2,000-row table after ANALYZE, the plan a fresh deployment makes.
-- Multivariate statistics give the planner the real count.
CREATE STATISTICS memories_organization_definition (ndistinct, dependencies)
    ON organization_id, definition_id FROM memories;
ANALYZE memories;
