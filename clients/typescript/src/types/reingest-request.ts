// Generated from docs/schemas/reingest-request.schema.json by generate-types.mjs: do not edit.

export type Action = "reingest";
export type CorrelationId = string | null;
export type IdempotencyKey = string;
export type Models =
  [string] | [string, string] | [string, string, string] | [string, string, string, string] | null;
export type OrganizationId = string | null;
export type ReplyTo = string | null;
export type SchemaVersion = 1;
export type Scope = "organization" | "platform";
export type SourceId = string;

/**
 * An admin command's request (``contextcore knowledge retry`` and ``switch prepare``):
 * ingest a stored source again from its stored text.
 *
 * ``models`` absent: a new generation under every model the scope embeds with (a retry).
 * ``models`` given: the current generation under these models only, while the live model's
 * chunks keep serving (step 1 of a model switch).
 */
export interface ReingestRequestV1 {
  action: Action;
  correlation_id?: CorrelationId;
  idempotency_key: IdempotencyKey;
  models?: Models;
  organization_id?: OrganizationId;
  reply_to?: ReplyTo;
  schema_version?: SchemaVersion;
  scope: Scope;
  source_id: SourceId;
}
