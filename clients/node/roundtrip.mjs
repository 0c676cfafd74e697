// A Node service talking to contextcore with kafkajs, a Kafka client nobody here wrote, from
// the wire shapes alone (docs/topics.md), every message it sends and every reply it reads
// validated against docs/schemas/ with ajv. tests/integration/test_node_client.py runs it
// against the test's own topics and consumers; it exits 1 on the first thing that is wrong.
//
// Settings, from the environment (the service's own names):
//   CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS, CONTEXTCORE_TOPIC_BUILD_REQUEST,
//   CONTEXTCORE_TOPIC_UPLOAD, CONTEXTCORE_TOPIC_MEMORY_WRITE, CONTEXTCORE_TOPIC_REPLY_PREFIX,
//   and CONTEXTCORE_NODE_ORGANIZATION (an organization the database holds).
//
// The last line it prints is JSON: what it did and the round trips it measured.
import { randomBytes, randomUUID } from "node:crypto";
import { readFile, readdir } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { Kafka, logLevel } from "kafkajs";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const topics = {
  build: env("CONTEXTCORE_TOPIC_BUILD_REQUEST"),
  upload: env("CONTEXTCORE_TOPIC_UPLOAD"),
  memory: env("CONTEXTCORE_TOPIC_MEMORY_WRITE"),
};
const organization = env("CONTEXTCORE_NODE_ORGANIZATION");
const replyTopic = `${env("CONTEXTCORE_TOPIC_REPLY_PREFIX")}.node-${randomBytes(8).toString("hex")}`;

// ------------------------------------------------------------------- the schemas, with ajv
const folder = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "docs", "schemas");
const ajv = new Ajv2020({ allErrors: true, strict: false });
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

// --------------------------------------------------------------------- the Kafka client
const kafka = new Kafka({
  clientId: "contextcore-node-check",
  brokers: env("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS").split(","),
  logLevel: logLevel.NOTHING,
});
const admin = kafka.admin();
const producer = kafka.producer();
// The dev broker holds a fetch until its wait ends, records or not: with kafkajs's default
// (5 s) every reply would wait for it (docs/clients.md says so first).
// CONTEXTCORE_NODE_FETCH_WAIT_MS measures another (unset: 100; "default": kafkajs's own).
const wait = process.env.CONTEXTCORE_NODE_FETCH_WAIT_MS ?? "100";
const consumer = kafka.consumer({
  groupId: `node-check-${randomUUID()}`,
  ...(wait === "default" ? {} : { maxWaitTimeInMs: Number(wait) }),
});
const waiting = new Map(); // correlation id -> { statuses, resolve }

await admin.connect();
await admin.createTopics({ topics: [{ topic: replyTopic, numPartitions: 1 }], waitForLeaders: true });
await producer.connect();
await consumer.connect();
await consumer.subscribe({ topic: replyTopic, fromBeginning: true });
await consumer.run({
  eachMessage: async ({ message }) => {
    const reply = JSON.parse(message.value.toString("utf8"));
    const waiter = waiting.get(reply.correlation_id);
    if (waiter) waiter.take(reply);
  },
});

function newId() {
  return randomBytes(16).toString("hex"); // unguessable, never reused, as the Python client's
}

// Send one message and wait for replies of its correlation id until `done` says so.
async function call(topic, schema, message, done = () => true, timeoutMs = 30_000) {
  valid(schema, message);
  const replies = [];
  const finished = new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`no final reply to ${message.correlation_id} in ${timeoutMs} ms`)),
      timeoutMs,
    );
    waiting.set(message.correlation_id, {
      take: (reply) => {
        replies.push(reply);
        if (done(reply)) {
          clearTimeout(timer);
          resolve(replies);
        }
      },
    });
  });
  const started = performance.now();
  await producer.send({
    topic,
    messages: [
      {
        key: organization,
        value: JSON.stringify(message),
        headers: { "contextcore-organization": organization },
      },
    ],
  });
  try {
    return { replies: await finished, ms: performance.now() - started };
  } finally {
    waiting.delete(message.correlation_id);
  }
}

const principal = { organization_id: organization, definition_id: randomUUID(), user_id: randomUUID() };
const subject = {
  organization_id: organization,
  user_id: principal.user_id,
  trigger_id: null,
  definition_id: principal.definition_id,
};
const policy = { total_token_budget: 800, sources: [{ name: "memory", token_budget: 800 }] };
function buildRequest(readAfter) {
  return {
    schema_version: 1,
    correlation_id: newId(),
    reply_to: replyTopic,
    request: { subject, query: "how should I answer?", entities: [] },
    policy,
    ...(readAfter ? { read_after: readAfter } : {}),
  };
}
function check(condition, what) {
  if (!condition) throw new Error(what);
}

const summary = {};
try {
  // memory.remember, then a brief that names its position: the memory is in it
  const remember = {
    schema_version: 1,
    action: "remember",
    correlation_id: newId(),
    reply_to: replyTopic,
    idempotency_key: newId(),
    principal,
    memory: { scope: "user", attribute: "preference.language", text: "Answers in Welsh" },
  };
  const [written] = (await call(topics.memory, "memory-remember", remember)).replies;
  valid("memory-answer", written);
  check(written.status === "written" && written.position, `remember: ${JSON.stringify(written)}`);

  const { replies: [brief] } = await call(topics.build, "build-request", buildRequest(written.position));
  valid("build-reply", brief);
  check(brief.status === "ok" && brief.brief.text.includes("Answers in Welsh"), `brief: ${JSON.stringify(brief)}`);

  // memory.forget, then a brief without it
  const forget = {
    schema_version: 1,
    action: "forget",
    correlation_id: newId(),
    reply_to: replyTopic,
    idempotency_key: newId(),
    principal,
    memory_id: written.memory.id,
  };
  const [forgotten] = (await call(topics.memory, "memory-forget", forget)).replies;
  valid("memory-answer", forgotten);
  check(forgotten.status === "written" && forgotten.change === "forgotten", `forget: ${JSON.stringify(forgotten)}`);
  const { replies: [after] } = await call(topics.build, "build-request", buildRequest(forgotten.position));
  valid("build-reply", after);
  check(after.status === "ok" && !after.brief.text.includes("Answers in Welsh"), `after forget: ${JSON.stringify(after)}`);

  // a malformed request: an error reply that says why, never silence
  const malformed = { schema_version: 1, correlation_id: newId(), reply_to: replyTopic, request: 5, policy };
  check(!ajv.getSchema("build-request.schema.json")(malformed), "the malformed request validates");
  const sent = performance.now();
  await producer.send({ topic: topics.build, messages: [{ value: JSON.stringify(malformed) }] });
  const refused = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no reply to the malformed request")), 30_000);
    waiting.set(malformed.correlation_id, { take: (reply) => { clearTimeout(timer); resolve(reply); } });
  });
  valid("build-reply", refused);
  check(refused.status === "error" && refused.error.code === "invalid_request", `malformed: ${JSON.stringify(refused)}`);
  summary.invalid_request_ms = Math.round(performance.now() - sent);

  // an upload: pending, then ready (a final status may come first: the client takes the first)
  const upload = {
    schema_version: 1,
    correlation_id: newId(),
    reply_to: replyTopic,
    scope: "organization",
    organization_id: organization,
    title: "Handbook",
    media_type: "text/markdown",
    idempotency_key: newId(),
    uri: "docs://node/handbook",
    content: { text: "# Handbook\n\n## Refunds\n\nA customer may cancel within 30 days for a full refund." },
  };
  const final = new Set(["ready", "failed", "rejected", "superseded"]);
  const uploaded = await call(topics.upload, "upload-request", upload, (s) => final.has(s.status), 120_000);
  for (const status of uploaded.replies) valid("upload-status", status);
  const ready = uploaded.replies.at(-1);
  check(ready.status === "ready" && ready.chunks >= 1 && ready.position, `upload: ${JSON.stringify(ready)}`);
  summary.upload_ready_ms = Math.round(uploaded.ms);

  // round trips: one build at a time
  const times = [];
  for (let i = 0; i < 20; i += 1) {
    const { replies: [reply], ms } = await call(topics.build, "build-request", buildRequest());
    valid("build-reply", reply);
    check(reply.status === "ok", `build ${i}: ${JSON.stringify(reply)}`);
    times.push(ms);
  }
  times.sort((a, b) => a - b);
  summary.build_round_trip_ms = { p50: Math.round(times[10]), max: Math.round(times[19]), n: 20 };
  summary.fetch_wait_ms = wait;
  summary.checked = ["memory-remember", "build-reply", "memory-forget", "invalid_request", "upload-ready"];
} finally {
  await consumer.disconnect();
  await producer.disconnect();
  await admin.deleteTopics({ topics: [replyTopic] }).catch(() => {});
  await admin.disconnect();
}
console.log(JSON.stringify(summary));
