// Generated from docs/schemas/dead-letter.schema.json by generate-types.mjs: do not edit.

export type Attempts = number;
export type Cause = string;
export type ConsumerGroup = string;
export type Key = string | null;
export type Offset = number;
export type Partition = number;
export type Payload = string;
export type PayloadBytes = number;
export type PayloadSha256 = string;
export type PayloadTruncated = boolean;
export type Reason = string;
export type SchemaVersion = number;
export type Topic = string;

/**
 * What lands on ``<topic>.dlt``: enough to find, read and replay the original record.
 */
export interface DeadLetterV1 {
  attempts?: Attempts;
  cause: Cause;
  consumer_group: ConsumerGroup;
  key?: Key;
  offset: Offset;
  partition: Partition;
  payload: Payload;
  payload_bytes: PayloadBytes;
  payload_sha256: PayloadSha256;
  payload_truncated?: PayloadTruncated;
  reason: Reason;
  schema_version?: SchemaVersion;
  topic: Topic;
}
