export {
  BuildFailed,
  ConfigurationError,
  ContextcoreClient,
  ContextcoreError,
  PublishFailed,
  ReplyTimeout,
  RequestRefused,
  UploadFailed,
  UploadSuperseded,
} from "./client.js";
export type { ClientOptions, Topics } from "./client.js";
export { latest, positionValue } from "./position.js";
export { replyTopicRefusal } from "./reply-topics.js";
export type { BuildReplyV1, ContextBrief, ErrorInfo } from "./types/build-reply.js";
export type {
  BuildRequestV1,
  ContextPolicy,
  ContextRequest,
  ContextSourceSpec,
  ContextSubject,
} from "./types/build-request.js";
export type { AgentMemory, MemoryAnswerV1 } from "./types/memory-answer.js";
export type { Invoker, MemoryCandidate } from "./types/memory-remember.js";
export type { UploadStatusV1 } from "./types/upload-status.js";
