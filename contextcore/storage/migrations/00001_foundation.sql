-- The foundation: pgvector, and the ledger of applied migrations.
--
-- The migration runner creates nothing itself: until this file has run, the ledger does not
-- exist and every migration counts as pending. Each later file is recorded here with the sha256
-- of its bytes, so `contextcore-schema verify` can tell a tampered file from an applied one.
-- Not organization-scoped: the ledger describes the database, not a tenant.

CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE contextcore_migrations (
    version     integer     PRIMARY KEY,
    name        text        NOT NULL,
    checksum    text        NOT NULL CHECK (checksum ~ '^[0-9a-f]{64}$'),
    applied_at  timestamptz NOT NULL DEFAULT now()
);
