// Generated from docs/schemas/memory-forget.schema.json by generate-types.mjs: do not edit.

export type Action = "forget";
export type CorrelationId = string;
export type IdempotencyKey = string;
export type MemoryId = string;
export type DefinitionId = string;
export type OrganizationId = string;
export type RunId = string | null;
export type TriggerId = string | null;
export type UserId = string | null;
export type WorkflowNode = boolean;
export type ReplyTo = string;
export type SchemaVersion = 1;

export interface ForgetV1 {
  action: Action;
  correlation_id: CorrelationId;
  idempotency_key: IdempotencyKey;
  memory_id: MemoryId;
  principal: Invoker;
  reply_to: ReplyTo;
  schema_version?: SchemaVersion;
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
