// Generated from docs/schemas/dead-letter-headers.schema.json by generate-types.mjs: do not edit.

/**
 * The headers of a record on <topic>.dlt.
 */
export interface DeadLetterHeaders {
  "content-type": "application/json";
  /**
   * the letter's cause (DeadLetterV1.cause)
   */
  "x-dead-letter-cause": string;
  /**
   * its offset there, in decimal
   */
  "x-original-offset": string;
  /**
   * its partition, in decimal
   */
  "x-original-partition": string;
  /**
   * the topic the record first arrived on
   */
  "x-original-topic": string;
  [k: string]: string | "application/json";
}
