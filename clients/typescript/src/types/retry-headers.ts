// Generated from docs/schemas/retry-headers.schema.json by generate-types.mjs: do not edit.

/**
 * The headers a retried copy carries on its consumer's own topic, beside the client's (docs/topics.md); any producer may set them, and the runtime reads them defensively.
 */
export interface RetryHeaders {
  /**
   * the attempt this copy is (2, 3, ...), in decimal
   */
  "contextcore-attempt"?: string;
  /**
   * topic/partition/offset of the first delivery
   */
  "contextcore-first-position"?: string;
  /**
   * the last failure
   */
  "contextcore-last-error"?: string;
  /**
   * wall-clock milliseconds before which it is not handled again
   */
  "contextcore-not-before-ms"?: string;
  [k: string]: string | undefined;
}
