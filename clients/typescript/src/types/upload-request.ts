// Generated from docs/schemas/upload-request.schema.json by generate-types.mjs: do not edit.

export type Action = "upload";
export type Base64 = string | null;
export type Text = string | null;
export type CorrelationId = string;
export type IdempotencyKey = string;
export type MediaType = string;
export type Object = string | null;
export type OrganizationId = string | null;
export type ReplyTo = string;
export type SchemaVersion = 1;
export type Scope = "organization" | "platform";
export type Title = string;
export type Uri = string | null;

export interface UploadRequestV1 {
  action?: Action;
  content?: InlineContent | null;
  correlation_id: CorrelationId;
  idempotency_key: IdempotencyKey;
  media_type: MediaType;
  object?: Object;
  organization_id?: OrganizationId;
  reply_to: ReplyTo;
  schema_version?: SchemaVersion;
  scope: Scope;
  title: Title;
  uri?: Uri;
}
/**
 * Exactly one of ``text`` (UTF-8 text formats) or ``base64`` (any bytes).
 */
export interface InlineContent {
  base64?: Base64;
  text?: Text;
}
