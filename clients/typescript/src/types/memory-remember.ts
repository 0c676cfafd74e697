// Generated from docs/schemas/memory-remember.schema.json by generate-types.mjs: do not edit.

export type Action = "remember";
export type CorrelationId = string;
export type IdempotencyKey = string;
export type Attribute = string;
export type Scope = "user" | "organization";
/**
 * @maxItems 1
 */
export type SubjectRefs = [] | [MemorySubjectRef];
export type Id = string;
export type Kind = string;
export type Label = string | null;
export type Text = string;
export type DefinitionId = string;
export type OrganizationId = string;
export type RunId = string | null;
export type TriggerId = string | null;
export type UserId = string | null;
export type WorkflowNode = boolean;
export type ReplyTo = string;
export type SchemaVersion = 1;

export interface RememberV1 {
  action: Action;
  correlation_id: CorrelationId;
  idempotency_key: IdempotencyKey;
  memory: MemoryCandidate;
  principal: Invoker;
  reply_to: ReplyTo;
  schema_version?: SchemaVersion;
}
/**
 * What ``memory.remember`` asks to store. At most one subject ref (V1): with two, the
 * service would have to choose one without a rule.
 */
export interface MemoryCandidate {
  attribute: Attribute;
  scope: Scope;
  subject_refs?: SubjectRefs;
  text: Text;
}
/**
 * The row a memory is about. ``label`` joins no key, so it may hold a colon.
 */
export interface MemorySubjectRef {
  id: Id;
  kind: Kind;
  label?: Label;
}
/**
 * Who calls: the organization, the agent definition that owns the memory, exactly one of a
 * user or a trigger, the run, and whether the caller is a workflow node (refused: only an
 * agent definition owns memory).
 */
export interface Invoker {
  definition_id: DefinitionId;
  organization_id: OrganizationId;
  run_id?: RunId;
  trigger_id?: TriggerId;
  user_id?: UserId;
  workflow_node?: WorkflowNode;
}
