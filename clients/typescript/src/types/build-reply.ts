// Generated from docs/schemas/build-reply.schema.json by generate-types.mjs: do not edit.

export type FailedSources = string[];
export type Id = string;
export type Kind = string;
export type Label = string | null;
export type Items = ResourceRef[];
export type Text = string;
export type Tokens = number;
export type CorrelationId = string;
export type DroppedEntities = number;
export type Code =
  "invalid_request" | "policy_rejected" | "required_source_failed" | "internal_error" | "throttled";
export type Details = string[];
export type Message = string;
export type RetryAfterMs = number | null;
export type BriefSha256 = string;
export type Cause = "timeout" | "error" | "missing" | "wrong_source";
export type Error = string | null;
export type Required = boolean;
export type Source = string;
export type TimeoutMs = number | null;
export type FailedSources1 = FailedRead[];
export type Kind1 =
  | "application"
  | "conversation"
  | "definition_summary"
  | "dossier"
  | "knowledge"
  | "memory"
  | "outreach"
  | "outreach_thread"
  | "personal_memory"
  | "run_history";
export type Outcome = string;
export type Ref = string | null;
export type Source1 = string;
export type SubjectKey = string | null;
export type Tokens1 = number;
export type Items1 = ManifestEntry[];
export type PolicySha256 = string;
export type SchemaVersion = 1;
export type Status = "ok" | "error" | "reuse_previous";

/**
 * ``ok`` carries ``brief``, ``error`` carries ``error``, ``reuse_previous`` carries neither.
 */
export interface BuildReplyV1 {
  brief?: ContextBrief | null;
  correlation_id: CorrelationId;
  dropped_entities?: DroppedEntities;
  error?: ErrorInfo | null;
  manifest?: BriefManifest | null;
  schema_version?: SchemaVersion;
  status: Status;
}
/**
 * The packed brief and the pressure it was packed under; the prompt itself is not stored.
 */
export interface ContextBrief {
  dropped: Dropped;
  failed_sources: FailedSources;
  items: Items;
  per_source_tokens: PerSourceTokens;
  text: Text;
  tokens: Tokens;
}
export interface Dropped {
  [k: string]: number;
}
/**
 * A row of the application: matching and dedupe use (kind, id), never the label.
 *
 * Every part is text a query parameter and a reply can carry: a ref holding a NUL byte or a
 * lone surrogate is malformed, and the message boundary drops it like any malformed ref.
 */
export interface ResourceRef {
  id: Id;
  kind: Kind;
  label?: Label;
}
export interface PerSourceTokens {
  [k: string]: number;
}
export interface ErrorInfo {
  code: Code;
  details?: Details;
  message: Message;
  retry_after_ms?: RetryAfterMs;
}
/**
 * Why the brief holds what it holds: every item the sources returned with its outcome, in
 * pack order (the items of a source no spec enables first, in the order they came), the
 * sources that failed in policy order, the policy's fingerprint and the digest of the text.
 */
export interface BriefManifest {
  brief_sha256: BriefSha256;
  failed_sources: FailedSources1;
  items: Items1;
  policy_sha256: PolicySha256;
}
/**
 * One enabled source that gave no items.
 */
export interface FailedRead {
  cause: Cause;
  error?: Error;
  required: Required;
  source: Source;
  timeout_ms?: TimeoutMs;
}
/**
 * One item a source returned, and what the packer did with it.
 */
export interface ManifestEntry {
  kind: Kind1;
  outcome: Outcome;
  ref: Ref;
  source: Source1;
  subject_key: SubjectKey;
  tokens: Tokens1;
}
