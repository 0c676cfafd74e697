// Generated from docs/schemas/memory-answer.schema.json by generate-types.mjs: do not edit.

export type Change = ("created" | "superseded" | "revived" | "forgotten") | null;
export type CorrelationId = string;
export type Details = string[];
export type CreatedAt = string;
export type DefinitionId = string;
export type ForgottenAt = string | null;
export type Id = string;
export type OrganizationId = string;
export type ProposedByRunId = string | null;
export type Scope = "user" | "organization";
export type SubjectKey = string;
export type Id1 = string;
export type Kind = string;
export type Label = string | null;
export type SubjectRefs = MemorySubjectRef[];
export type SupersedesId = string | null;
export type Text = string | null;
export type UserId = string | null;
export type Message = string | null;
export type Position = string | null;
export type Reason =
  | (
      | "namespace"
      | "trigger_user_scope"
      | "duplicate"
      | "not_live"
      | "not_owner"
      | "workflow_node"
      | "invalid_input"
      | "quota"
      | "not_handled"
    )
  | null;
export type SchemaVersion = 1;
export type Status = "written" | "refused";

/**
 * ``written`` carries ``change`` and ``memory``; ``refused`` carries ``reason`` and
 * ``message`` (and ``details`` for invalid input).
 */
export interface MemoryAnswerV1 {
  change?: Change;
  correlation_id: CorrelationId;
  details?: Details;
  memory?: AgentMemory | null;
  message?: Message;
  position?: Position;
  reason?: Reason;
  schema_version?: SchemaVersion;
  status: Status;
}
/**
 * One stored revision; a tombstone has no text and carries ``forgotten_at``.
 */
export interface AgentMemory {
  created_at: CreatedAt;
  definition_id: DefinitionId;
  forgotten_at: ForgottenAt;
  id: Id;
  organization_id: OrganizationId;
  proposed_by_run_id: ProposedByRunId;
  scope: Scope;
  subject_key: SubjectKey;
  subject_refs: SubjectRefs;
  supersedes_id: SupersedesId;
  text: Text;
  user_id: UserId;
}
/**
 * The row a memory is about. ``label`` joins no key, so it may hold a colon.
 */
export interface MemorySubjectRef {
  id: Id1;
  kind: Kind;
  label?: Label;
}
