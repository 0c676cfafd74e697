// Generated from docs/schemas/upload-status.schema.json by generate-types.mjs: do not edit.

export type Chunks = number | null;
export type CorrelationId = string;
export type Details = string[];
export type Generation = number | null;
export type Position = string | null;
export type Reason = string | null;
export type SchemaVersion = 1;
export type SourceId = string | null;
export type Status = "pending" | "ready" | "failed" | "rejected" | "superseded";

/**
 * One status of one upload. ``source_id`` is absent only for ``rejected``.
 */
export interface UploadStatusV1 {
  chunks?: Chunks;
  correlation_id: CorrelationId;
  details?: Details;
  generation?: Generation;
  position?: Position;
  reason?: Reason;
  schema_version?: SchemaVersion;
  source_id?: SourceId;
  status: Status;
}
