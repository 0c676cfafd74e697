-- The build's five database sources read in one statement each (issue 20).
--
-- Until now a source read was a transaction of its own: BEGIN with the scope settings, one
-- query per kind or part, COMMIT. A typical build made about 17 round trips, each costing the
-- consumer and PostgreSQL CPU. Each function below is one statement that
--
--   1. enters the organization's scope for this statement's transaction only
--      (contextcore_enter_read: set_config(..., is_local => true)); the caller sends it
--      outside any transaction, so the scope ends with the statement;
--   2. then runs the source's query, which filters by the organization itself and is filtered
--      again by the service role's row policies, reading the scope entered in step 1.
--
-- A SQL function runs its statements in order, each planned and executed after the previous
-- one finished, so the policies of step 2 always read the scope of step 1. The functions are
-- SECURITY INVOKER: they run as the caller, who must already be the service role for its whole
-- session (a pool opened with create_pool(session_role=...)); a login that is not gets no
-- EXECUTE and no row. An unset scope matches no row.
--
-- Values leave as text where a source renders them as text (application, dossier); timestamps
-- that a brief shows are rendered as Python's datetime.isoformat() renders them, so briefs do
-- not change (contextcore_isoformat).

-- Enter an organization's read scope for the rest of this transaction: the organization named,
-- never the platform's own scope (platform rows a source may read, such as platform
-- definitions, are readable in an organization's scope by their policy).
CREATE FUNCTION contextcore_enter_read(organization uuid) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public
AS $$
    SELECT set_config('contextcore.organization_id', coalesce(organization::text, ''), true),
           set_config('contextcore.platform', '', true);
$$;

-- A timestamp as Python's datetime.isoformat() writes a UTC datetime: seconds always, the
-- microseconds only when there are any, and +00:00.
CREATE FUNCTION contextcore_isoformat(moment timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, public
AS $$
    SELECT to_char(moment AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
           || CASE WHEN extract(microseconds FROM moment)::bigint % 1000000 <> 0
                   THEN to_char(moment AT TIME ZONE 'UTC', '.US') ELSE '' END
           || '+00:00'
$$;

-- application: the rows the request names, every kind in one statement (CLARIFICATIONS 14:
-- one query whatever the number of refs). One array of ids per kind, empty when the request
-- names none of it. Each row: the kind, the row id, its projected fields in the projection's
-- order as text (contextcore/sources/application.py PROJECTIONS, kept equal by a test), and
-- the time the row was recorded. Shared intelligence rows are reached only through this
-- tenant's bridge rows (00004).
-- The plan is always the generic one: with custom plans PostgreSQL planned all eight branches
-- on every call (about 0.55 ms of server CPU per call, measured), and each branch is a lookup
-- by primary key whatever the ids (about 0.1 ms per call with the generic plan).
CREATE FUNCTION contextcore_read_application(
    organization uuid,
    companies uuid[], people uuid[], deals uuid[], activities uuid[], lists uuid[],
    prospect_ids uuid[], intel_companies uuid[], intel_people uuid[]
) RETURNS TABLE (kind text, id uuid, fields text[], recorded_at timestamptz)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public
SET plan_cache_mode = force_generic_plan
AS $$
    SELECT contextcore_enter_read(organization);

    SELECT 'crm.company', c.id,
           ARRAY[c.name, c.domain, c.website, c.industry, c.lifecycle_stage,
                 c.employee_count::text, c.country, c.description, c.linkedin_url,
                 c.owner_id::text],
           c.updated_at
    FROM crm_companies AS c
    WHERE c.organization_id = organization AND c.id = ANY(companies) AND c.deleted_at IS NULL
    UNION ALL
    SELECT 'crm.person', p.id,
           ARRAY[p.full_name, p.email, p.phone, p.current_title, p.company_id::text,
                 p.lifecycle_stage, p.linkedin_url, p.country, p.owner_id::text],
           p.updated_at
    FROM crm_people AS p
    WHERE p.organization_id = organization AND p.id = ANY(people) AND p.deleted_at IS NULL
    UNION ALL
    SELECT 'crm.deal', d.id,
           ARRAY[d.name, d.stage, d.status, d.amount::text, d.currency, d.close_date::text,
                 d.owner_id::text, d.company_id::text, d.person_id::text],
           d.updated_at
    FROM crm_deals AS d
    WHERE d.organization_id = organization AND d.id = ANY(deals) AND d.deleted_at IS NULL
    UNION ALL
    SELECT 'crm.activity', a.id,
           ARRAY[a.type, a.subject, a.status, contextcore_isoformat(a.occurred_at),
                 contextcore_isoformat(a.due_at), a.owner_id::text, a.company_id::text,
                 a.person_id::text, a.deal_id::text],
           a.created_at
    FROM crm_activities AS a
    WHERE a.organization_id = organization AND a.id = ANY(activities)
    UNION ALL
    SELECT 'crm.list', l.id, ARRAY[l.name, l.description, l.kind], l.updated_at
    FROM crm_lists AS l
    WHERE l.organization_id = organization AND l.id = ANY(lists) AND l.deleted_at IS NULL
    UNION ALL
    SELECT 'prospect', p.id,
           ARRAY[p.review_state, p.opportunity_score::text, p.opportunity_reason,
                 p.recommended_action, p.people_state, p.people_state_reason],
           p.created_at
    FROM prospects AS p
    WHERE p.organization_id = organization AND p.id = ANY(prospect_ids)
    UNION ALL
    SELECT 'intelligence.company', c.id,
           ARRAY[c.name, c.domain, c.website, c.description, c.industry, c.country,
                 c.linkedin_url, c.employee_count_band],
           NULL::timestamptz
    FROM tenant_intel_companies AS c
    WHERE c.id = ANY(intel_companies)
      AND EXISTS (SELECT FROM prospects AS p
                  WHERE p.organization_id = organization AND p.intel_company_id = c.id)
    UNION ALL
    SELECT 'intelligence.person', person.id,
           ARRAY[person.full_name, person.current_title, person.current_company_text,
                 person.email, person.linkedin_url, person.country],
           NULL::timestamptz
    FROM tenant_intel_people AS person
    WHERE person.id = ANY(intel_people)
      AND EXISTS (SELECT FROM prospect_people AS pp
                  WHERE pp.organization_id = organization AND pp.intel_person_id = person.id)
$$;

-- dossier: the organization part when asked (the cache has none), the asking member when
-- asked, the active documents newest first (at most max_documents; NULL: no cap) and their
-- count, in that order: (section, ordinal) orders the rows. Every field is text.
--   profile:  company_name, website, industry, headquarters, description, value_proposition
--   service:  name, description            profile_of_customer: name, description, criteria
--   offer:    name, description, price     user: full_name, title, role, about
--   document: title, summary               documents: the count of active documents
CREATE FUNCTION contextcore_read_dossier(
    organization uuid, with_organization boolean, asker uuid, with_documents boolean,
    max_documents integer
) RETURNS TABLE (part text, fields text[])
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public
AS $$
    SELECT contextcore_enter_read(organization);

    SELECT part, fields FROM (
        SELECT 1 AS section, 0::bigint AS ordinal, 'profile' AS part,
               ARRAY[company_name, website, industry, headquarters, description,
                     value_proposition] AS fields
        FROM company_profiles
        WHERE with_organization AND organization_id = organization
        UNION ALL
        SELECT 2, row_number() OVER (ORDER BY position, name, id), 'service',
               ARRAY[name, description]
        FROM dossier_services
        WHERE with_organization AND organization_id = organization
        UNION ALL
        SELECT 3, row_number() OVER (ORDER BY position, name, id), 'profile_of_customer',
               ARRAY[name, description, criteria]
        FROM ideal_customer_profiles
        WHERE with_organization AND organization_id = organization
        UNION ALL
        SELECT 4, row_number() OVER (ORDER BY position, name, id), 'offer',
               ARRAY[name, description, price]
        FROM offers
        WHERE with_organization AND organization_id = organization
        UNION ALL
        SELECT 5, 0, 'user', ARRAY[full_name, title, role, about]
        FROM organization_members
        WHERE organization_id = organization AND user_id = asker
        UNION ALL
        (SELECT 6, row_number() OVER (ORDER BY created_at DESC, id DESC), 'document',
                ARRAY[title, summary]
         FROM organization_documents
         WHERE with_documents AND organization_id = organization AND status = 'active'
         ORDER BY created_at DESC, id DESC
         LIMIT max_documents)
        UNION ALL
        SELECT 7, 0, 'documents', ARRAY[count(*)::text]
        FROM organization_documents
        WHERE with_documents AND organization_id = organization AND status = 'active'
        HAVING with_documents
    ) AS parts
    ORDER BY section, ordinal
$$;

-- conversation: the conversation of this tenant, if it exists and is the subject's to read
-- (the organization's: no user; or this user's own), with its newest messages, newest first,
-- at most max_messages. One row per message; a conversation without messages gives one row
-- whose message columns are null; no row at all: missing, another tenant's or another
-- person's conversation.
CREATE FUNCTION contextcore_read_conversation(
    organization uuid, conversation uuid, asker uuid, max_messages integer
) RETURNS TABLE (
    summary text, summary_updated_at timestamptz, role text, content text,
    created_at timestamptz
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public
AS $$
    SELECT contextcore_enter_read(organization);

    SELECT c.summary, c.summary_updated_at, m.role, m.content, m.created_at
    FROM conversations AS c
    LEFT JOIN LATERAL (
        SELECT role, content, created_at, id FROM conversation_messages
        WHERE organization_id = organization AND conversation_id = c.id
        ORDER BY created_at DESC, id DESC
        LIMIT max_messages
    ) AS m ON true
    WHERE c.organization_id = organization AND c.id = conversation
      AND (c.user_id IS NULL OR c.user_id = asker)
    ORDER BY m.created_at DESC, m.id DESC
$$;

-- definition_summary: published and listed definitions, this organization's then the
-- platform's (a null organization), each by kind and name; at most max_rows (NULL: no cap).
-- The safe summary only: never instructions, tools or configuration.
CREATE FUNCTION contextcore_read_definitions(organization uuid, max_rows integer)
RETURNS TABLE (id uuid, kind text, name text, safe_summary text, created_at timestamptz)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public
AS $$
    SELECT contextcore_enter_read(organization);

    SELECT id, kind, name, safe_summary, created_at
    FROM definitions
    WHERE (organization_id = organization OR organization_id IS NULL)
      AND status = 'published' AND visibility = 'listed'
    ORDER BY organization_id IS NULL, kind, name, id
    LIMIT max_rows
$$;

-- run_history: this tenant's runs of the same user or trigger, or about an entity of the
-- request (a JSON containment pattern per entity), within the lookback, newest first, not the
-- current run. Only id, status, result and creation time are read: never a span tree, an
-- input, a principal or a snapshot.
CREATE FUNCTION contextcore_read_runs(
    organization uuid, lookback_hours integer, asker uuid, asking_trigger uuid,
    patterns jsonb[],
    current_run uuid, max_runs integer
) RETURNS TABLE (
    id uuid, parent_run_id uuid, status text, result_summary text, result_refs jsonb,
    waiting_reason text, failure_reason text, created_at timestamptz
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public
AS $$
    SELECT contextcore_enter_read(organization);

    SELECT id, parent_run_id, status, result_summary, result_refs, waiting_reason,
           failure_reason, created_at
    FROM runs
    WHERE organization_id = organization
      AND created_at >= now() - make_interval(hours => lookback_hours)
      AND (user_id = asker OR trigger_id = asking_trigger OR result_refs @> ANY(patterns))
      AND (current_run IS NULL OR id <> current_run)
    ORDER BY created_at DESC, id DESC
    LIMIT max_runs
$$;

-- Only the service role runs them; the runtime login, which holds nothing until it becomes
-- the service role, cannot.
REVOKE EXECUTE ON FUNCTION
    contextcore_enter_read(uuid),
    contextcore_read_application(uuid, uuid[], uuid[], uuid[], uuid[], uuid[], uuid[], uuid[],
                                 uuid[]),
    contextcore_read_dossier(uuid, boolean, uuid, boolean, integer),
    contextcore_read_conversation(uuid, uuid, uuid, integer),
    contextcore_read_definitions(uuid, integer),
    contextcore_read_runs(uuid, integer, uuid, uuid, jsonb[], uuid, integer)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    contextcore_enter_read(uuid),
    contextcore_read_application(uuid, uuid[], uuid[], uuid[], uuid[], uuid[], uuid[], uuid[],
                                 uuid[]),
    contextcore_read_dossier(uuid, boolean, uuid, boolean, integer),
    contextcore_read_conversation(uuid, uuid, uuid, integer),
    contextcore_read_definitions(uuid, integer),
    contextcore_read_runs(uuid, integer, uuid, uuid, jsonb[], uuid, integer)
TO contextcore_app;
