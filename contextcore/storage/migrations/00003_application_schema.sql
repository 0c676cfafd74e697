-- The application rows the context sources read, with tenancy enforced twice.
--
-- 1. Every organization-scoped read goes through contextcore.storage.tenancy, which filters by
--    the subject's organization itself.
-- 2. Row-level security on every organization-scoped table, keyed on the per-transaction
--    setting contextcore.organization_id, for the role contextcore_app. The services read as
--    that role (SET LOCAL ROLE), which owns no table, so a query that forgot its organization
--    filter still sees one tenant's rows. An unset setting matches no row.
--
-- Shard-ready: tenant tables carry organization_id and lead their primary key, unique
-- constraints and tenant-to-tenant foreign keys with it. Exceptions, each named below:
-- organizations (the tenant root: its id is the organization), intel_companies and
-- intel_people (global reference rows, no organization), definitions (platform rows have a null
-- organization, so the key is id alone).

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'contextcore_app') THEN
        CREATE ROLE contextcore_app NOLOGIN NOINHERIT;
    END IF;
END
$$;

-- The current tenant, or null when the transaction set none (then RLS matches no row).
CREATE FUNCTION contextcore_current_organization() RETURNS uuid
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT NULLIF(current_setting('contextcore.organization_id', true), '')::uuid $$;

-- ------------------------------------------------------------------ organizations and members

-- Exception to shard-by-organization_id: the tenant root, keyed by its own id.
CREATE TABLE organizations (
    id          uuid        PRIMARY KEY,
    name        text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
);

CREATE TABLE organization_members (
    organization_id uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    user_id         uuid        NOT NULL,
    full_name       text        NOT NULL,
    email           text,
    title           text,
    role            text,
    about           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, user_id)
);

-- ------------------------------------------------------------------------------------ CRM

CREATE TABLE crm_companies (
    organization_id  uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id               uuid        NOT NULL,
    name             text        NOT NULL,
    domain           text,
    website          text,
    industry         text,
    lifecycle_stage  text,
    employee_count   integer,
    country          text,
    description      text,
    linkedin_url     text,
    owner_id         uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    deleted_at       timestamptz,
    PRIMARY KEY (organization_id, id)
);

CREATE TABLE crm_people (
    organization_id  uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id               uuid        NOT NULL,
    full_name        text        NOT NULL,
    email            text,
    phone            text,
    current_title    text,
    company_id       uuid,
    lifecycle_stage  text,
    linkedin_url     text,
    country          text,
    owner_id         uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    deleted_at       timestamptz,
    PRIMARY KEY (organization_id, id),
    FOREIGN KEY (organization_id, company_id) REFERENCES crm_companies (organization_id, id)
);

CREATE TABLE crm_deals (
    organization_id  uuid          NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id               uuid          NOT NULL,
    name             text          NOT NULL,
    stage            text,
    status           text,
    amount           numeric(14, 2),
    currency         text,
    close_date       date,
    owner_id         uuid,
    company_id       uuid,
    person_id        uuid,
    created_at       timestamptz   NOT NULL DEFAULT now(),
    updated_at       timestamptz   NOT NULL DEFAULT now(),
    deleted_at       timestamptz,
    PRIMARY KEY (organization_id, id),
    FOREIGN KEY (organization_id, company_id) REFERENCES crm_companies (organization_id, id),
    FOREIGN KEY (organization_id, person_id) REFERENCES crm_people (organization_id, id)
);

-- No soft delete: the design gives crm_activities no deleted_at.
CREATE TABLE crm_activities (
    organization_id  uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id               uuid        NOT NULL,
    type             text        NOT NULL,
    subject          text,
    status           text,
    occurred_at      timestamptz,
    due_at           timestamptz,
    owner_id         uuid,
    company_id       uuid,
    person_id        uuid,
    deal_id          uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, id)
);

CREATE TABLE crm_lists (
    organization_id  uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id               uuid        NOT NULL,
    name             text        NOT NULL,
    description      text,
    kind             text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    deleted_at       timestamptz,
    PRIMARY KEY (organization_id, id)
);

-- ---------------------------------------------------------------- intelligence and prospects

-- Exception: global reference rows of the intelligence plane, no organization. A tenant reads
-- one only as the embedded row of its own bridge row (prospects, prospect_people).
CREATE TABLE intel_companies (
    id                   uuid PRIMARY KEY,
    name                 text NOT NULL,
    domain               text NOT NULL UNIQUE,
    website              text,
    description          text,
    industry             text,
    country              text,
    linkedin_url         text,
    employee_count_band  text
);

CREATE TABLE intel_people (
    id                    uuid PRIMARY KEY,
    full_name             text NOT NULL,
    current_title         text,
    current_company_text  text,
    email                 text,
    linkedin_url          text,
    country               text
);

-- No soft delete (design). A company prospect points at intel_company_id; a person prospect
-- at intel_person_id and also holds one prospect_people row for that person.
CREATE TABLE prospects (
    organization_id      uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id                   uuid        NOT NULL,
    intel_company_id     uuid        REFERENCES intel_companies (id) ON DELETE CASCADE,
    intel_person_id      uuid        REFERENCES intel_people (id) ON DELETE CASCADE,
    review_state         text,
    opportunity_score    integer,
    opportunity_reason   text,
    recommended_action   text,
    people_state         text,
    people_state_reason  text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, id)
);
CREATE INDEX prospects_intel_company_idx ON prospects (organization_id, intel_company_id);

-- No soft delete (design). A person added by name alone has a null intel_person_id.
CREATE TABLE prospect_people (
    organization_id  uuid        NOT NULL,
    id               uuid        NOT NULL,
    prospect_id      uuid        NOT NULL,
    intel_person_id  uuid        REFERENCES intel_people (id) ON DELETE CASCADE,
    full_name        text,
    current_title    text,
    email            text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, id),
    FOREIGN KEY (organization_id, prospect_id)
        REFERENCES prospects (organization_id, id) ON DELETE CASCADE,
    CONSTRAINT uq_prospect_people_prospect_person UNIQUE (prospect_id, intel_person_id)
);
-- Nulls are distinct in the constraint above, so a row with no profile is keyed by its name:
-- without case, each run of whitespace as one space. The runs are collapsed before the trim
-- (the design trims first): btrim removes spaces only, so a trailing tab would otherwise
-- survive as a space and let " Ada Lovelace\t" duplicate "Ada Lovelace".
CREATE UNIQUE INDEX uq_prospect_people_prospect_named_person ON prospect_people
    (prospect_id, lower(btrim(regexp_replace(full_name, '\s+', ' ', 'g'))))
    WHERE intel_person_id IS NULL;
CREATE INDEX prospect_people_intel_person_idx ON prospect_people (organization_id, intel_person_id);

-- --------------------------------------------------------------------------- company dossier

CREATE TABLE company_profiles (
    organization_id    uuid        PRIMARY KEY REFERENCES organizations (id) ON DELETE CASCADE,
    company_name       text        NOT NULL,
    website            text,
    description        text,
    industry           text,
    headquarters       text,
    value_proposition  text,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dossier_services (
    organization_id  uuid    NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id               uuid    NOT NULL,
    name             text    NOT NULL,
    description      text,
    position         integer NOT NULL DEFAULT 0,
    PRIMARY KEY (organization_id, id)
);

CREATE TABLE ideal_customer_profiles (
    organization_id  uuid    NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id               uuid    NOT NULL,
    name             text    NOT NULL,
    description      text,
    criteria         text,
    position         integer NOT NULL DEFAULT 0,
    PRIMARY KEY (organization_id, id)
);

CREATE TABLE offers (
    organization_id  uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id               uuid        NOT NULL,
    name             text        NOT NULL,
    description      text,
    price            text,
    position         integer     NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, id)
);

CREATE TABLE organization_documents (
    organization_id  uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id               uuid        NOT NULL,
    title            text        NOT NULL,
    summary          text,
    status           text        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'archived')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, id)
);
CREATE INDEX organization_documents_active_idx
    ON organization_documents (organization_id, created_at DESC, id DESC) WHERE status = 'active';

-- Every process caches the organization part of the dossier for 60 s; a write to any of its
-- tables notifies every listener, in every process, to drop that organization's entry.
CREATE FUNCTION contextcore_notify_dossier() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed jsonb := CASE WHEN TG_OP = 'DELETE' THEN to_jsonb(OLD) ELSE to_jsonb(NEW) END;
BEGIN
    -- organizations is keyed by id; every other dossier table by organization_id
    PERFORM pg_notify(
        'contextcore_dossier', COALESCE(changed ->> 'organization_id', changed ->> 'id')
    );
    RETURN NULL;
END
$$;

CREATE TRIGGER organizations_notify_dossier AFTER INSERT OR UPDATE OR DELETE ON organizations
    FOR EACH ROW EXECUTE FUNCTION contextcore_notify_dossier();
CREATE TRIGGER company_profiles_notify_dossier AFTER INSERT OR UPDATE OR DELETE ON company_profiles
    FOR EACH ROW EXECUTE FUNCTION contextcore_notify_dossier();
CREATE TRIGGER dossier_services_notify_dossier AFTER INSERT OR UPDATE OR DELETE ON dossier_services
    FOR EACH ROW EXECUTE FUNCTION contextcore_notify_dossier();
CREATE TRIGGER ideal_customer_profiles_notify_dossier
    AFTER INSERT OR UPDATE OR DELETE ON ideal_customer_profiles
    FOR EACH ROW EXECUTE FUNCTION contextcore_notify_dossier();
CREATE TRIGGER offers_notify_dossier AFTER INSERT OR UPDATE OR DELETE ON offers
    FOR EACH ROW EXECUTE FUNCTION contextcore_notify_dossier();

-- ------------------------------------------------------------------------------ definitions

-- Exception: platform definitions have a null organization_id, so the key is id alone.
CREATE TABLE definitions (
    id               uuid        PRIMARY KEY,
    organization_id  uuid        REFERENCES organizations (id) ON DELETE CASCADE,
    kind             text        NOT NULL CHECK (kind IN ('agent', 'workflow', 'skill')),
    name             text        NOT NULL,
    safe_summary     text        NOT NULL,
    status           text        NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'published', 'archived')),
    visibility       text        NOT NULL DEFAULT 'listed' CHECK (visibility IN ('listed', 'hidden')),
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX definitions_visible_idx ON definitions (organization_id, kind, name)
    WHERE status = 'published' AND visibility = 'listed';

-- ---------------------------------------------------------------------------- conversations

CREATE TABLE conversations (
    organization_id     uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id                  uuid        NOT NULL,
    user_id             uuid,
    title               text,
    summary             text,
    summary_updated_at  timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, id)
);

CREATE TABLE conversation_messages (
    organization_id  uuid        NOT NULL,
    id               uuid        NOT NULL,
    conversation_id  uuid        NOT NULL,
    role             text        NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
    content          text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, id),
    FOREIGN KEY (organization_id, conversation_id)
        REFERENCES conversations (organization_id, id) ON DELETE CASCADE
);
CREATE INDEX conversation_messages_recent_idx
    ON conversation_messages (organization_id, conversation_id, created_at DESC, id DESC);

-- ------------------------------------------------------------------------------------- runs

-- result_refs: a JSON array of {"kind": <stored word>, "id": <text>} objects.
CREATE TABLE runs (
    organization_id  uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id               uuid        NOT NULL,
    parent_run_id    uuid,
    definition_id    uuid,
    user_id          uuid,
    trigger_id       uuid,
    status           text        NOT NULL CHECK (status IN
                         ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled')),
    result_summary   text,
    result_refs      jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(result_refs) = 'array'),
    waiting_reason   text,
    failure_reason   text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, id),
    FOREIGN KEY (organization_id, parent_run_id) REFERENCES runs (organization_id, id)
);
CREATE INDEX runs_recent_idx ON runs (organization_id, created_at DESC, id DESC);
CREATE INDEX runs_user_recent_idx ON runs (organization_id, user_id, created_at DESC);
CREATE INDEX runs_trigger_recent_idx ON runs (organization_id, trigger_id, created_at DESC);
CREATE INDEX runs_result_refs_idx ON runs USING gin (result_refs jsonb_path_ops);

-- ------------------------------------------------------------------------ row-level security

DO $$
DECLARE
    scoped text;
BEGIN
    FOREACH scoped IN ARRAY ARRAY[
        'organization_members', 'crm_companies', 'crm_people', 'crm_deals', 'crm_activities',
        'crm_lists', 'prospects', 'prospect_people', 'company_profiles', 'dossier_services',
        'ideal_customer_profiles', 'offers', 'organization_documents', 'conversations',
        'conversation_messages', 'runs'
    ] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', scoped);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I FOR SELECT TO contextcore_app '
            'USING (organization_id = contextcore_current_organization())', scoped);
        EXECUTE format('GRANT SELECT ON %I TO contextcore_app', scoped);
    END LOOP;
END
$$;

ALTER TABLE organizations ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON organizations FOR SELECT TO contextcore_app
    USING (id = contextcore_current_organization());
GRANT SELECT ON organizations TO contextcore_app;

-- Platform definitions are shared on purpose: a null organization is the explicit platform flag.
ALTER TABLE definitions ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON definitions FOR SELECT TO contextcore_app
    USING (organization_id IS NULL OR organization_id = contextcore_current_organization());
GRANT SELECT ON definitions TO contextcore_app;

-- Global reference rows: readable, reached only through a tenant's bridge row by the sources.
GRANT SELECT ON intel_companies, intel_people TO contextcore_app;
GRANT EXECUTE ON FUNCTION contextcore_current_organization() TO contextcore_app;
