// A Node service talking to contextcore through the TypeScript client (clients/typescript/, on
// kafkajs, a Kafka client nobody here wrote), every message it sends and every reply it reads
// validated against docs/schemas/ with ajv, and one malformed request sent raw with kafkajs.
// tests/integration/test_node_client.py runs it against the test's own topics and consumers;
// it exits 1 on the first thing that is wrong.
//
// Settings, from the environment (the service's own names):
//   CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS, CONTEXTCORE_TOPIC_BUILD_REQUEST,
//   CONTEXTCORE_TOPIC_UPLOAD, CONTEXTCORE_TOPIC_MEMORY_WRITE, CONTEXTCORE_TOPIC_REPLY_PREFIX,
//   CONTEXTCORE_NODE_ORGANIZATION (an organization the database holds), and
//   CONTEXTCORE_NODE_FETCH_WAIT_MS (the reply consumers' fetch wait: unset 100, "default" kafkajs's own).
//
// The last line it prints is JSON: what it did and the round trips it measured.
import { randomBytes, randomUUID } from "node:crypto";
import { readFile, readdir } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { Kafka, logLevel } from "kafkajs";
import { BuildFailed, ContextcoreClient } from "../typescript/dist/index.js";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const brokers = env("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS").split(",");
const topics = {
  buildRequest: env("CONTEXTCORE_TOPIC_BUILD_REQUEST"),
  upload: env("CONTEXTCORE_TOPIC_UPLOAD"),
  memoryWrite: env("CONTEXTCORE_TOPIC_MEMORY_WRITE"),
};
const replyPrefix = env("CONTEXTCORE_TOPIC_REPLY_PREFIX");
const organization = env("CONTEXTCORE_NODE_ORGANIZATION");
// The dev broker holds a fetch until its wait ends, records or not: with kafkajs's default
// (5 s) every reply would wait for it (docs/clients.md says so first).
const wait = process.env.CONTEXTCORE_NODE_FETCH_WAIT_MS ?? "100";
const fetchMaxWaitMs = wait === "default" ? undefined : Number(wait);

// ------------------------------------------------------------------- the schemas, with ajv
const folder = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "docs", "schemas");
const ajv = new Ajv2020({ allErrors: true, strict: true });
addFormats(ajv);
for (const name of (await readdir(folder)).filter((n) => n.endsWith(".schema.json"))) {
  ajv.addSchema(JSON.parse(await readFile(join(folder, name), "utf8")));
}
function valid(schema, message) {
  const validate = ajv.getSchema(`${schema}.schema.json`);
  if (!validate) throw new Error(`no schema ${schema}`);
  if (!validate(message)) {
    throw new Error(`${schema} does not validate: ${ajv.errorsText(validate.errors)}\n${JSON.stringify(message)}`);
  }
  return message;
}
function check(condition, what) {
  if (!condition) throw new Error(what);
}

// ------------------------------------------- a raw channel, for what the client never sends
// Its own reply topic and consumer, started beside the client (a group join takes seconds on
// the dev broker: the two overlap).
async function rawChannel() {
  const kafka = new Kafka({ clientId: "contextcore-node-raw", brokers, logLevel: logLevel.NOTHING });
  const replyTopic = `${replyPrefix}.node-${randomBytes(8).toString("hex")}`;
  const admin = kafka.admin();
  const producer = kafka.producer();
  const consumer = kafka.consumer({
    groupId: `node-raw-${randomUUID()}`,
    ...(fetchMaxWaitMs !== undefined ? { maxWaitTimeInMs: fetchMaxWaitMs } : {}),
  });
  const waiting = new Map();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic: replyTopic, numPartitions: 1 }], waitForLeaders: true });
  await producer.connect();
  await consumer.connect();
  await consumer.subscribe({ topic: replyTopic, fromBeginning: true });
  await consumer.run({
    eachMessage: async ({ message }) => {
      const reply = JSON.parse(message.value.toString("utf8"));
      waiting.get(reply.correlation_id)?.(reply);
    },
  });
  return {
    replyTopic,
    // send `message` (its reply_to this channel's topic) and wait for its one reply
    async request(topic, message, timeoutMs = 30_000) {
      const reply = new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no reply to ${message.correlation_id}`)), timeoutMs);
        waiting.set(message.correlation_id, (value) => {
          clearTimeout(timer);
          resolve(value);
        });
      });
      await producer.send({ topic, messages: [{ value: JSON.stringify(message) }] });
      return reply;
    },
    async close() {
      await consumer.disconnect();
      await producer.disconnect();
      await admin.deleteTopics({ topics: [replyTopic] }).catch(() => {});
      await admin.disconnect();
    },
  };
}

// -------------------------------------------------------- everything else, through the client
const principal = { organization_id: organization, definition_id: randomUUID(), user_id: randomUUID() };
const request = {
  subject: { organization_id: organization, user_id: principal.user_id, trigger_id: null, definition_id: principal.definition_id },
  query: "how should I answer?",
  entities: [],
};
const policy = { total_token_budget: 800, sources: [{ name: "memory", token_budget: 800 }] };

// every message the client sends, validated before it goes
const sent = [];
function validateSent(topic, message) {
  const schema =
    topic === topics.buildRequest
      ? "build-request"
      : topic === topics.upload
        ? "upload-request"
        : `memory-${message.action}`;
  valid(schema, message);
  sent.push(schema);
}
const [client, raw] = await Promise.all([
  ContextcoreClient.connect({ brokers, topics, replyPrefix, fetchMaxWaitMs, onSend: validateSent }),
  rawChannel(),
]);
const summary = {};
try {
  // memory.remember, then a brief: the memory is in it (the client names the answer's position)
  const memory = { scope: "user", attribute: "preference.language", text: "Answers in Welsh" };
  const written = valid("memory-answer", await client.remember(principal, memory));
  check(written.status === "written" && written.position, `remember: ${JSON.stringify(written)}`);
  check(client.position === written.position, "the client keeps the answer's position");
  const brief = valid("build-reply", await client.request(request, policy));
  check(brief.status === "ok" && brief.brief.text.includes("Answers in Welsh"), `brief: ${JSON.stringify(brief)}`);

  // memory.forget, then a brief without it
  const forgotten = valid("memory-answer", await client.forget(principal, written.memory.id));
  check(forgotten.status === "written" && forgotten.change === "forgotten", `forget: ${JSON.stringify(forgotten)}`);
  const after = valid("build-reply", await client.request(request, policy));
  check(after.status === "ok" && !after.brief.text.includes("Answers in Welsh"), `after forget: ${JSON.stringify(after)}`);

  // an error reply is the client's BuildFailed, by name, with its code
  let failed;
  try {
    await client.build(request, { total_token_budget: 10, sources: [{ name: "no_such_source", token_budget: 5 }] });
  } catch (error) {
    failed = error;
  }
  check(failed instanceof BuildFailed && failed.code === "policy_rejected", `policy: ${failed}`);

  // a malformed request, sent raw: an error reply that says why
  const malformed = {
    schema_version: 1,
    correlation_id: randomBytes(16).toString("hex"),
    reply_to: raw.replyTopic,
    request: 5,
    policy,
  };
  check(!ajv.getSchema("build-request.schema.json")(malformed), "the malformed request validates");
  const sentAt = performance.now();
  const refused = valid("build-reply", await raw.request(topics.buildRequest, malformed));
  check(refused.status === "error" && refused.error.code === "invalid_request", `malformed: ${JSON.stringify(refused)}`);
  summary.invalid_request_ms = Math.round(performance.now() - sentAt);

  // an upload, until its final status: ready
  const started = performance.now();
  const ready = valid(
    "upload-status",
    await client.upload({
      organizationId: organization,
      title: "Handbook",
      mediaType: "text/markdown",
      uri: "docs://node/handbook",
      text: "# Handbook\n\n## Refunds\n\nA customer may cancel within 30 days for a full refund.",
      timeoutMs: 120_000,
    }),
  );
  check(ready.status === "ready" && ready.chunks >= 1 && ready.position, `upload: ${JSON.stringify(ready)}`);
  summary.upload_ready_ms = Math.round(performance.now() - started);

  // round trips: one build at a time
  const times = [];
  for (let i = 0; i < 20; i += 1) {
    const begun = performance.now();
    const reply = valid("build-reply", await client.request(request, policy));
    check(reply.status === "ok", `build ${i}: ${JSON.stringify(reply)}`);
    times.push(performance.now() - begun);
  }
  times.sort((a, b) => a - b);
  summary.build_round_trip_ms = { p50: Math.round(times[10]), max: Math.round(times[19]), n: 20 };
  summary.fetch_wait_ms = wait;
  summary.checked = ["memory-remember", "build-reply", "memory-forget", "invalid_request", "upload-ready"];
  summary.sent_validated = [...new Set(sent)].sort();
  summary.memory_id = written.memory.id;
  summary.source_id = ready.source_id;
} finally {
  await Promise.all([client.close(), raw.close()]);
}
console.log(JSON.stringify(summary));
