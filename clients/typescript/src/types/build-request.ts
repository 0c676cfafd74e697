// Generated from docs/schemas/build-request.schema.json by generate-types.mjs: do not edit.

export type CorrelationId = string;
export type Explain = boolean;
/**
 * @maxItems 10
 */
export type PageOrder =
  | []
  | [
      | "application"
      | "conversation"
      | "definition_summary"
      | "dossier"
      | "knowledge"
      | "memory"
      | "outreach"
      | "outreach_thread"
      | "personal_memory"
      | "run_history"
    ]
  | [
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      )
    ]
  | [
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      )
    ]
  | [
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      )
    ]
  | [
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      )
    ]
  | [
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      )
    ]
  | [
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      )
    ]
  | [
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      )
    ]
  | [
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      )
    ]
  | [
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      ),
      (
        | "application"
        | "conversation"
        | "definition_summary"
        | "dossier"
        | "knowledge"
        | "memory"
        | "outreach"
        | "outreach_thread"
        | "personal_memory"
        | "run_history"
      )
    ];
export type RefreshOnResume = boolean;
export type Enabled = boolean;
export type Limit = number | null;
export type Name = string;
export type Required = boolean;
export type TokenBudget = number;
/**
 * @maxItems 64
 */
export type Sources = ContextSourceSpec[];
export type TotalTokenBudget = number;
export type ReadAfter = string | null;
export type ReplyTo = string;
export type ConversationId = string | null;
export type Id = string;
export type Kind = string;
export type Label = string | null;
/**
 * @maxItems 1000
 */
export type Entities = ResourceRef[];
export type Query = string;
export type RunId = string | null;
export type DefinitionId = string | null;
export type OrganizationId = string;
export type TriggerId = string | null;
export type UserId = string | null;
export type ResumedAfterWait = boolean;
export type SchemaVersion = 1;

/**
 * A request for one brief; the reply goes to ``reply_to`` with ``correlation_id``.
 */
export interface BuildRequestV1 {
  correlation_id: CorrelationId;
  explain?: Explain;
  policy: ContextPolicy;
  read_after?: ReadAfter;
  reply_to: ReplyTo;
  request: ContextRequest;
  resumed_after_wait?: ResumedAfterWait;
  schema_version?: SchemaVersion;
}
/**
 * An admin-authored, frozen description of which sources a brief reads and how much.
 */
export interface ContextPolicy {
  page_order?: PageOrder;
  refresh_on_resume?: RefreshOnResume;
  sources: Sources;
  total_token_budget?: TotalTokenBudget;
}
/**
 * One source in a policy: its budget, its item cap and its options.
 */
export interface ContextSourceSpec {
  enabled?: Enabled;
  limit?: Limit;
  name: Name;
  options?: Options;
  required?: Required;
  token_budget: TokenBudget;
}
export interface Options {
  [k: string]: unknown;
}
/**
 * What one turn asks for. The subject travels here, never in the policy.
 *
 * The query is text PostgreSQL can hold (the knowledge source searches it): a NUL byte makes
 * the request invalid at the message boundary, never a source that fails mid-build.
 */
export interface ContextRequest {
  conversation_id?: ConversationId;
  entities: Entities;
  query: Query;
  run_id?: RunId;
  subject: ContextSubject;
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
/**
 * The four fields the sources filter by; the tenancy of every read.
 *
 * All four are required, the last three nullable, as in the design: a caller states "no user"
 * or "no definition" on purpose. A forgotten field must not silently widen a read (a null
 * definition widens a memory read to every definition of the organization).
 */
export interface ContextSubject {
  definition_id: DefinitionId;
  organization_id: OrganizationId;
  trigger_id: TriggerId;
  user_id: UserId;
}
