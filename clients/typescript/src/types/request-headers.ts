// Generated from docs/schemas/request-headers.schema.json by generate-types.mjs: do not edit.

/**
 * The headers a client sets on a request (build, upload, memory write); all optional.
 */
export interface RequestHeaders {
  /**
   * the organization a request is for (its UUID, or 'platform'): the consumer serves organizations in turn by it; it grants nothing, the value names the organization
   */
  "contextcore-organization"?: string;
  /**
   * W3C trace context (optional): the request's span joins the caller's trace; a longer value is ignored
   */
  traceparent?: string;
  /**
   * W3C trace state (optional); a longer value is ignored
   */
  tracestate?: string;
  [k: string]: string | undefined;
}
