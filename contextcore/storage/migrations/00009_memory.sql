-- Agent memory: append-only revision chains, their heads, the live view, and the write journal
-- (docs/memory.md).
--
-- A chain is every revision of one fact: one organization, one owning definition, one scope and
-- its owner (the user for user scope, the organization for organization scope), one subject
-- key. A revision is one insert; nothing is ever updated. organization_id leads every key and
-- index (STORAGE.md: shard by organization).

-- ------------------------------------------------------------------------------ subject refs

-- Whether a text holds a character that is not blank. Blank is every character Python's
-- str.isspace() calls whitespace (CLARIFICATIONS 2): [[:space:]] alone, in this database's
-- locale, lets a no-break space or an em space through, so they are named as well. Not btrim,
-- which removes the space and nothing else.
CREATE FUNCTION memory_not_blank(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT value ~ '[^[:space:]\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\u001c-\u001f]'
$$;

-- V1 stores zero or one subject ref. The element's kind and id join the subject key, so each is
-- a string that is not blank and holds no ':'; jsonb refuses a null byte on its own. label joins
-- no key and stays free text.
CREATE FUNCTION memory_subject_refs_valid(refs jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN jsonb_typeof(refs) IS DISTINCT FROM 'array' THEN false
        WHEN jsonb_array_length(refs) = 0 THEN true
        WHEN jsonb_array_length(refs) > 1 THEN false
        WHEN jsonb_typeof(refs -> 0) IS DISTINCT FROM 'object' THEN false
        WHEN jsonb_typeof(refs -> 0 -> 'kind') IS DISTINCT FROM 'string' THEN false
        WHEN jsonb_typeof(refs -> 0 -> 'id') IS DISTINCT FROM 'string' THEN false
        ELSE memory_not_blank(refs -> 0 ->> 'kind') AND strpos(refs -> 0 ->> 'kind', ':') = 0
         AND memory_not_blank(refs -> 0 ->> 'id') AND strpos(refs -> 0 ->> 'id', ':') = 0
    END
$$;

-- ------------------------------------------------------------------------------ memories

CREATE TABLE memories (
    organization_id     uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    id                  uuid        NOT NULL DEFAULT gen_random_uuid(),
    definition_id       uuid        NOT NULL,
    scope               text        NOT NULL CHECK (scope IN ('user', 'organization')),
    user_id             uuid,
    -- whose memory it is: the user (user scope) or the organization; part of the chain identity
    -- (a nullable column would let a foreign key skip its check)
    scope_owner_id      uuid        NOT NULL GENERATED ALWAYS AS (coalesce(user_id, organization_id)) STORED,
    subject_key         text        NOT NULL,
    text                text,
    subject_refs        jsonb       NOT NULL DEFAULT '[]',
    proposed_by_run_id  uuid,
    supersedes_id       uuid,
    forgotten_at        timestamptz,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (organization_id, id),
    CONSTRAINT memories_user_scope_has_a_user CHECK ((scope = 'user') = (user_id IS NOT NULL)),
    -- <kind>:<id>:<attribute>, no part empty or holding ':', the attribute in a memory namespace
    CONSTRAINT memories_subject_key_shape CHECK (
        subject_key ~ '^[^:]+:[^:]+:(observation|preference)\.[^:]+$' AND length(subject_key) <= 700),
    -- a tombstone has no text and carries forgotten_at; a revision has text, never blank
    CONSTRAINT memories_tombstone_has_no_text CHECK ((text IS NULL) = (forgotten_at IS NOT NULL)),
    CONSTRAINT memories_text_not_blank CHECK (memory_not_blank(text) AND length(text) <= 4000),
    CONSTRAINT memories_subject_refs_valid CHECK (memory_subject_refs_valid(subject_refs)),
    -- the key is made from the one ref, or from the scope owner when there is none (CLARIFICATIONS 8)
    CONSTRAINT memories_key_names_its_subject CHECK (CASE
        WHEN subject_refs = '[]' THEN subject_key = scope || ':' || scope_owner_id || ':' || split_part(subject_key, ':', 3)
        ELSE subject_key = (subject_refs -> 0 ->> 'kind') || ':' || (subject_refs -> 0 ->> 'id') || ':' || split_part(subject_key, ':', 3)
    END),
    CONSTRAINT memories_not_its_own_parent CHECK (supersedes_id <> id),
    -- one revision has at most one child
    CONSTRAINT memories_one_child UNIQUE (organization_id, supersedes_id),
    -- the self-reference carries the chain identity: a child cannot change the organization, the
    -- definition, the scope, the user or the subject key of the revision it supersedes
    CONSTRAINT memories_chain_identity
        UNIQUE (organization_id, definition_id, scope, scope_owner_id, subject_key, id),
    CONSTRAINT memories_child_keeps_the_chain
        FOREIGN KEY (organization_id, definition_id, scope, scope_owner_id, subject_key, supersedes_id)
        REFERENCES memories (organization_id, definition_id, scope, scope_owner_id, subject_key, id)
);

-- one chain has one root
CREATE UNIQUE INDEX memories_one_root
    ON memories (organization_id, definition_id, scope, scope_owner_id, subject_key)
    WHERE supersedes_id IS NULL;

-- the memory source: an organization's newest revisions, of one definition or of all
CREATE INDEX memories_recent ON memories (organization_id, created_at DESC, id DESC);
CREATE INDEX memories_recent_by_definition
    ON memories (organization_id, definition_id, created_at DESC, id DESC);

-- append only: a revision is never changed (a change is the next revision)
CREATE FUNCTION memories_refuse_update() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'memories are append only: a change is a new revision'
        USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER memories_append_only BEFORE UPDATE ON memories
    FOR EACH ROW EXECUTE FUNCTION memories_refuse_update();

-- ------------------------------------------------------------------------------ views

-- The current revision of each chain (the one no revision supersedes), tombstones included.
-- Writers read the exact head here, never a time sort: two revisions can share a timestamp.
-- security_invoker: the caller's RLS applies to the rows underneath.
CREATE VIEW memory_heads WITH (security_invoker = true) AS
SELECT m.*
FROM memories AS m
WHERE NOT EXISTS (
    SELECT 1 FROM memories AS child
    WHERE child.organization_id = m.organization_id AND child.supersedes_id = m.id
);

-- The current non-tombstone revision of each chain. It drops scope_owner_id and forgotten_at:
-- the read path declares its own row shape.
CREATE VIEW live_memories WITH (security_invoker = true) AS
SELECT organization_id, id, definition_id, scope, user_id, subject_key, text, subject_refs,
       proposed_by_run_id, supersedes_id, created_at
FROM memory_heads
WHERE forgotten_at IS NULL;

-- ------------------------------------------------------------------------------ journal

-- One row per write call (memory.remember / memory.forget), keyed by its idempotency key in its
-- organization, in the same transaction as the revision it appends: the same key again is
-- answered from here (the same answer, no second row), also after a crash between the insert
-- and the commit (then neither exists). request_sha256 tells a redelivery from a reused key.
CREATE TABLE memory_writes (
    organization_id  uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    idempotency_key  text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    request_sha256   text        NOT NULL CHECK (request_sha256 ~ '^[0-9a-f]{64}$'),
    operation        text        NOT NULL CHECK (operation IN ('remember', 'forget')),
    outcome          text        CHECK (outcome IN ('created', 'superseded', 'revived', 'forgotten', 'refused')),
    reason           text        CHECK (reason IN ('namespace', 'trigger_user_scope', 'duplicate', 'not_live', 'not_owner', 'workflow_node', 'invalid_input')),
    message          text        CHECK (length(message) <= 2000),
    memory_id        uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, idempotency_key),
    CONSTRAINT memory_writes_refusal_has_a_reason CHECK ((outcome = 'refused') = (reason IS NOT NULL)),
    CONSTRAINT memory_writes_revision_exists
        FOREIGN KEY (organization_id, memory_id) REFERENCES memories (organization_id, id)
);
CREATE INDEX memory_writes_recent ON memory_writes (organization_id, created_at);

-- ------------------------------------------------------------------------------ security

-- Forced RLS: the service role reads and appends in its organization's scope only (there is no
-- platform memory). No UPDATE or DELETE policy or grant on memories: append only, for the
-- service role by grant and policy, for everyone by the trigger above.
ALTER TABLE memories ENABLE ROW LEVEL SECURITY;
ALTER TABLE memories FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_reads ON memories FOR SELECT TO contextcore_app
    USING (contextcore_in_scope(organization_id));
CREATE POLICY tenant_appends ON memories FOR INSERT TO contextcore_app
    WITH CHECK (contextcore_in_scope(organization_id));
GRANT SELECT, INSERT ON memories TO contextcore_app;
GRANT SELECT ON memory_heads, live_memories TO contextcore_app;

ALTER TABLE memory_writes ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_writes FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_reads ON memory_writes FOR SELECT TO contextcore_app
    USING (contextcore_in_scope(organization_id));
CREATE POLICY tenant_claims ON memory_writes FOR INSERT TO contextcore_app
    WITH CHECK (contextcore_in_scope(organization_id));
CREATE POLICY tenant_answers ON memory_writes FOR UPDATE TO contextcore_app
    USING (contextcore_in_scope(organization_id))
    WITH CHECK (contextcore_in_scope(organization_id));
GRANT SELECT, INSERT, UPDATE (outcome, reason, message, memory_id) ON memory_writes TO contextcore_app;
