// ContextcoreClient: build, upload, remember and forget over Kafka with kafkajs, as the Python
// clients do (producers/): each client makes its own one-partition reply topic under the
// service's reply prefix and deletes it on close; every request gets a new, unguessable
// correlation id (128 random bits), never one the caller chose, so a reply nobody waits for (a
// duplicate, a late one after a timeout) is ignored and can never answer a later request.
// Read-your-writes: the client keeps the latest `position` its answers carried and names it in
// every build (`read_after`), so a brief reflects what this client was told is written.
// Keys as the Python client's: a build and an upload by correlation id (spread over the
// partitions), a memory call by organization (one organization's calls in order).
import { randomBytes } from "node:crypto";
import { Kafka, logLevel, type Admin, type Consumer, type Producer } from "kafkajs";

import type { BuildReplyV1, ContextBrief, ErrorInfo } from "./types/build-reply.js";
import type { BuildRequestV1, ContextPolicy, ContextRequest } from "./types/build-request.js";
import type { MemoryAnswerV1 } from "./types/memory-answer.js";
import type { ForgetV1 } from "./types/memory-forget.js";
import type { Invoker, MemoryCandidate, RememberV1 } from "./types/memory-remember.js";
import type { UploadRequestV1 } from "./types/upload-request.js";
import type { UploadStatusV1 } from "./types/upload-status.js";
import { latest } from "./position.js";
import { replyTopicRefusal } from "./reply-topics.js";

/** The root of every error this client raises (the Python client's names). */
export class ContextcoreError extends Error {
  override name = "ContextcoreError";
}
/** No reply within the timeout; a reply that comes later is ignored. */
export class ReplyTimeout extends ContextcoreError {
  override name = "ReplyTimeout";
}
/** The broker did not take the request. */
export class PublishFailed extends ContextcoreError {
  override name = "PublishFailed";
}
/** A setting no service would answer: refused before anything connects. */
export class ConfigurationError extends ContextcoreError {
  override name = "ConfigurationError";
}
/** The service answered, and refused: its code, message and details. */
export class RequestRefused extends ContextcoreError {
  override name = "RequestRefused";
  constructor(
    readonly code: string,
    message: string,
    readonly details: string[] = [],
  ) {
    super(`${code}: ${message}`);
  }
}
/** A build answered with an error reply (`error` holds it whole). */
export class BuildFailed extends RequestRefused {
  override name = "BuildFailed";
  constructor(readonly error: ErrorInfo) {
    super(error.code, error.message, error.details ?? []);
  }
}
/** An upload rejected, or its source failed (`status` holds the reason). */
export class UploadFailed extends RequestRefused {
  override name = "UploadFailed";
  constructor(readonly status: UploadStatusV1) {
    super(status.status, status.reason ?? status.status, status.details ?? []);
  }
}
/** A later upload of the same document replaced this one before it was final. */
export class UploadSuperseded extends UploadFailed {
  override name = "UploadSuperseded";
}

export interface Topics {
  buildRequest: string;
  upload: string;
  memoryWrite: string;
}

export interface ClientOptions {
  brokers: string[];
  /** The service's topics (its defaults unless given). */
  topics?: Partial<Topics>;
  /** The service's reply prefix: its replies go under it only. */
  replyPrefix?: string;
  /** The service's reply pattern, when it sets one (CONTEXTCORE_TOPIC_REPLY_PATTERN). */
  replyPattern?: string;
  /** The reply consumer's fetch wait: the dev broker holds every fetch this long (docs/clients.md). */
  fetchMaxWaitMs?: number;
  clientId?: string;
  /** Called with each message before it is sent (a test validates them against docs/schemas/). */
  onSend?: (topic: string, message: unknown) => void;
}

interface Waiter {
  take(reply: { correlation_id: string; status: string }): void;
  fail(error: Error): void;
}

const FINAL = new Set(["ready", "failed", "rejected", "superseded"]);

function newId(): string {
  return randomBytes(16).toString("hex");
}

export class ContextcoreClient {
  readonly replyTopic: string;
  readonly topics: Topics;
  private latestPosition: string | null = null;
  private readonly waiting = new Map<string, Waiter>();

  private constructor(
    private readonly admin: Admin,
    private readonly producer: Producer,
    private readonly consumer: Consumer,
    private readonly groupId: string,
    replyTopic: string,
    topics: Topics,
    private readonly onSend?: (topic: string, message: unknown) => void,
  ) {
    this.replyTopic = replyTopic;
    this.topics = topics;
  }

  /** The latest database position this client's answers carried (read-your-writes). */
  get position(): string | null {
    return this.latestPosition;
  }

  private note(position: string | null | undefined): void {
    this.latestPosition = latest(this.latestPosition, position ?? null);
  }

  private failAll(error: Error): void {
    for (const waiter of this.waiting.values()) waiter.fail(error);
    this.waiting.clear();
  }

  /** A started client: its reply topic made and read, its producer connected.
   *
   * kafkajs reads a topic only as a member of a consumer group: the client's group is named
   * after its reply topic (`<reply topic>.reader`, so a caller's ACLs must let it join groups
   * under the reply prefix) and deleted on close. A reader that crashes fails every call
   * waiting for a reply. */
  static async connect(options: ClientOptions): Promise<ContextcoreClient> {
    const kafka = new Kafka({
      clientId: options.clientId ?? "contextcore-typescript",
      brokers: options.brokers,
      logLevel: logLevel.NOTHING,
    });
    const prefix = options.replyPrefix ?? "contextcore.reply";
    const replyTopic = `${prefix}.ts-${newId()}`;
    const groupId = `${replyTopic}.reader`;
    const topics: Topics = {
      buildRequest: "contextcore.build-request",
      upload: "contextcore.upload",
      memoryWrite: "contextcore.memory-write",
      ...options.topics,
    };
    const refused = replyTopicRefusal(replyTopic, {
      prefix,
      pattern: options.replyPattern,
      own: [topics.buildRequest, topics.upload, topics.memoryWrite, "contextcore.embed"],
    });
    if (refused !== null) {
      throw new ConfigurationError(`no reply could ever reach this client: ${refused}`);
    }
    const admin = kafka.admin();
    const producer = kafka.producer();
    const consumer = kafka.consumer({ groupId, maxWaitTimeInMs: options.fetchMaxWaitMs ?? 100 });
    const client = new ContextcoreClient(
      admin,
      producer,
      consumer,
      groupId,
      replyTopic,
      topics,
      options.onSend,
    );
    try {
      await admin.connect();
      await admin.createTopics({
        topics: [{ topic: replyTopic, numPartitions: 1 }],
        waitForLeaders: true,
      });
      await producer.connect();
      await consumer.connect();
      await consumer.subscribe({ topic: replyTopic, fromBeginning: true });
      consumer.on(consumer.events.CRASH, (event) => {
        client.failAll(new ContextcoreError(`the reply reader crashed: ${String(event.payload.error)}`));
      });
      await consumer.run({ eachMessage: async ({ message }) => client.onReply(message.value) });
    } catch (error) {
      await client.close();
      throw error;
    }
    return client;
  }

  private onReply(value: Buffer | null): void {
    let reply: { correlation_id?: unknown; status?: unknown };
    try {
      reply = JSON.parse(value?.toString("utf8") ?? "null") as typeof reply;
    } catch {
      return; // not JSON: nobody's reply
    }
    if (typeof reply?.correlation_id !== "string" || typeof reply.status !== "string") return;
    this.waiting.get(reply.correlation_id)?.take(reply as { correlation_id: string; status: string });
  }

  /** Fail every call still waiting, stop reading, delete the reply topic and the reader's
   * group, disconnect; each step runs whatever the one before it did. */
  async close(): Promise<void> {
    this.failAll(new ContextcoreError("the client was closed"));
    const steps = [
      () => this.consumer.disconnect(),
      () => this.producer.disconnect(),
      () => this.admin.deleteTopics({ topics: [this.replyTopic] }),
      () => this.admin.deleteGroups([this.groupId]),
      () => this.admin.disconnect(),
    ];
    for (const step of steps) {
      try {
        await step();
      } catch {
        // best effort: the next step still runs
      }
    }
  }

  /** A build request's reply, brief or error, as the service sent it. */
  async request(
    request: ContextRequest,
    policy: ContextPolicy,
    options: { timeoutMs?: number; explain?: boolean; readAfter?: string } = {},
  ): Promise<BuildReplyV1> {
    const message: BuildRequestV1 = {
      schema_version: 1,
      correlation_id: newId(),
      reply_to: this.replyTopic,
      request,
      policy,
      explain: options.explain ?? false,
    };
    const readAfter = latest(options.readAfter ?? null, this.position);
    if (readAfter !== null) message.read_after = readAfter;
    const [reply] = await this.call<BuildReplyV1>(
      this.topics.buildRequest,
      message,
      message.correlation_id, // builds spread over the partitions, as the Python client's
      request.subject.organization_id,
      options.timeoutMs ?? 10_000,
      () => true,
    );
    return reply as BuildReplyV1;
  }

  /** The brief; an error reply is a {@link BuildFailed}. */
  async build(
    request: ContextRequest,
    policy: ContextPolicy,
    options: { timeoutMs?: number; readAfter?: string } = {},
  ): Promise<ContextBrief> {
    const reply = await this.request(request, policy, options);
    if (reply.status === "error" && reply.error) throw new BuildFailed(reply.error);
    if (!reply.brief) throw new ContextcoreError(`a ${reply.status} reply without a brief`);
    return reply.brief;
  }

  /** Upload one document (inline `text` or `base64` with a `uri`, or an `object` address);
   * the `ready` status once every chunk is stored. */
  async upload(document: {
    organizationId: string | null;
    title: string;
    mediaType: string;
    uri?: string;
    text?: string;
    base64?: string;
    object?: string;
    idempotencyKey?: string;
    timeoutMs?: number;
  }): Promise<UploadStatusV1> {
    const message: UploadRequestV1 = {
      schema_version: 1,
      action: "upload",
      correlation_id: newId(),
      reply_to: this.replyTopic,
      scope: document.organizationId === null ? "platform" : "organization",
      organization_id: document.organizationId,
      title: document.title,
      media_type: document.mediaType,
      idempotency_key: document.idempotencyKey ?? newId(),
      uri: document.uri ?? null,
      object: document.object ?? null,
      content:
        document.text !== undefined
          ? { text: document.text }
          : document.base64 !== undefined
            ? { base64: document.base64 }
            : null,
    };
    const statuses = await this.call<UploadStatusV1>(
      this.topics.upload,
      message,
      message.correlation_id,
      document.organizationId ?? "platform",
      document.timeoutMs ?? 300_000,
      (status) => FINAL.has(status.status),
    );
    const final = statuses[statuses.length - 1] as UploadStatusV1;
    if (final.status === "superseded") throw new UploadSuperseded(final);
    if (final.status !== "ready") throw new UploadFailed(final);
    this.note(final.position);
    return final;
  }

  /** memory.remember: the new revision, or a refusal with its reason (an answer, not an error). */
  async remember(
    principal: Invoker,
    memory: MemoryCandidate,
    options: { idempotencyKey?: string; timeoutMs?: number } = {},
  ): Promise<MemoryAnswerV1> {
    const message: RememberV1 = {
      schema_version: 1,
      action: "remember",
      correlation_id: newId(),
      reply_to: this.replyTopic,
      idempotency_key: options.idempotencyKey ?? newId(),
      principal,
      memory,
    };
    return this.memoryCall(message, principal.organization_id, options.timeoutMs);
  }

  /** memory.forget: a tombstone after the live revision `memoryId`, or a refusal. */
  async forget(
    principal: Invoker,
    memoryId: string,
    options: { idempotencyKey?: string; timeoutMs?: number } = {},
  ): Promise<MemoryAnswerV1> {
    const message: ForgetV1 = {
      schema_version: 1,
      action: "forget",
      correlation_id: newId(),
      reply_to: this.replyTopic,
      idempotency_key: options.idempotencyKey ?? newId(),
      principal,
      memory_id: memoryId,
    };
    return this.memoryCall(message, principal.organization_id, options.timeoutMs);
  }

  private async memoryCall(
    message: RememberV1 | ForgetV1,
    organization: string,
    timeoutMs = 30_000,
  ): Promise<MemoryAnswerV1> {
    const [answer] = await this.call<MemoryAnswerV1>(
      this.topics.memoryWrite,
      message,
      organization, // one organization's calls in order, on one partition
      organization,
      timeoutMs,
      () => true,
    );
    const told = answer as MemoryAnswerV1;
    this.note(told.position);
    return told;
  }

  /** Publish `message` and collect the replies of its correlation id until `final` says so.
   * The waiter is registered before the send (a reply cannot come first); the timeout runs
   * from the broker's acknowledgement, as the Python client's does. */
  private async call<T extends { correlation_id: string; status: string }>(
    topic: string,
    message: { correlation_id: string },
    key: string,
    organization: string,
    timeoutMs: number,
    final: (reply: T) => boolean,
  ): Promise<T[]> {
    const replies: T[] = [];
    let timer: NodeJS.Timeout | undefined;
    const done = new Promise<T[]>((resolve, reject) => {
      this.waiting.set(message.correlation_id, {
        take: (reply) => {
          replies.push(reply as T);
          if (final(reply as T)) resolve(replies);
        },
        fail: reject,
      });
    });
    done.catch(() => undefined); // handled below; a close during the send must not go unhandled
    try {
      this.onSend?.(topic, message);
      try {
        await this.producer.send({
          topic,
          messages: [
            {
              key,
              value: JSON.stringify(message),
              headers: { "contextcore-organization": organization },
            },
          ],
        });
      } catch (error) {
        throw new PublishFailed(`the broker did not take the request on ${topic}: ${String(error)}`);
      }
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new ReplyTimeout(`no reply to ${message.correlation_id} within ${timeoutMs} ms`)),
          timeoutMs,
        );
      });
      return await Promise.race([done, timeout]);
    } finally {
      clearTimeout(timer);
      this.waiting.delete(message.correlation_id);
    }
  }
}
