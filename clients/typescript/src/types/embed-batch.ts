// Generated from docs/schemas/embed-batch.schema.json by generate-types.mjs: do not edit.

/**
 * @minItems 1
 * @maxItems 512
 */
export type Chunks = [EmbedChunkV1, ...EmbedChunkV1[]];
export type Ordinal = number;
export type Section = string;
export type Text = string;
export type Tokens = number;
export type EmbeddingModel = string;
export type Generation = number;
export type OrganizationId = string | null;
export type SchemaVersion = 1;
export type SourceId = string;

/**
 * Chunks of one generation of one source, to embed under one model (an internal topic:
 * the upload consumer writes it, the embedding group reads it).
 */
export interface EmbedBatchV1 {
  chunks: Chunks;
  embedding_model: EmbeddingModel;
  generation: Generation;
  organization_id: OrganizationId;
  schema_version?: SchemaVersion;
  source_id: SourceId;
}
/**
 * One chunk of a document on the wire: the upload consumer writes its chunks so, and the
 * embedding group reads them back as chunks. ``Chunk`` (contextcore/knowledge/chunk.py) has the
 * same four fields; the consumers convert at the edge, so this package imports no domain.
 */
export interface EmbedChunkV1 {
  ordinal: Ordinal;
  section: Section;
  text: Text;
  tokens: Tokens;
}
