// Which topics a reply may go to: the service's rule (broker/reply_topics.py), so a client never
// asks for a reply the service refuses. In order, a refusal of:
// 1. a name that is not a Kafka topic name ([A-Za-z0-9._-], 1 to 249 characters, not . or ..);
// 2. Kafka's internal topics (a name starting __);
// 3. the service's own topics (its request and embedding topics);
// 4. every dead-letter topic (a name ending .dlt);
// 5. a name the reply pattern does not match in full (the service's
//    CONTEXTCORE_TOPIC_REPLY_PATTERN; unset, `<prefix>.` and one or more name characters).

const TOPIC_NAME = /^[A-Za-z0-9._-]{1,249}$/;

function escaped(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

/** Why the service would refuse `topic` as a reply topic, or null when it takes it. */
export function replyTopicRefusal(
  topic: string,
  rule: { prefix: string; pattern?: string | undefined; own: readonly string[] },
): string | null {
  if (topic === "." || topic === ".." || !TOPIC_NAME.test(topic)) {
    return `${JSON.stringify(topic)} is not a Kafka topic name`;
  }
  if (topic.startsWith("__")) return `${topic} is one of Kafka's internal topics`;
  if (rule.own.includes(topic)) return `${topic} is one of the service's own topics`;
  if (topic.endsWith(".dlt")) return `${topic} is a dead-letter topic`;
  const pattern = rule.pattern ?? `${escaped(rule.prefix)}\\.[A-Za-z0-9._-]+`;
  if (!new RegExp(`^(?:${pattern})$`).test(topic)) {
    return `${topic} does not match the reply pattern ${pattern}`;
  }
  return null;
}
