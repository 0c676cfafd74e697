"""Kafka settings from the environment: the connection (``CONTEXTCORE_KAFKA_*``) and the topic
names (``CONTEXTCORE_TOPIC_*``), read the same way by producers and consumers."""

from __future__ import annotations

import ipaddress
from typing import Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from broker.reply_topics import DEAD_LETTER_SUFFIX, INTERNAL_PREFIX, ReplyTopics, is_topic_name
from schemas.envelope import printable
from schemas.errors import ConfigurationError


class KafkaSettings(BaseSettings):
    """How to reach the broker and how a client behaves on it."""

    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_KAFKA_", extra="ignore", frozen=True)

    bootstrap_servers: str | None = None
    """Comma-separated ``host:port`` list of the Kafka-protocol broker."""
    fetch_max_wait_ms: int = Field(default=500, ge=0, le=10_000)
    """How long the broker may hold a fetch that found nothing. Apache Kafka answers a waiting
    fetch as soon as a record arrives, so its default (500) costs no latency there. Tansu, the
    dev broker, holds every fetch to the end of this wait (under 250 ms), records or not: a
    hop waits all of it, so the dev stack sets 2 ms (at some idle CPU: each consumer polls 500
    times a second; docs/delivery.md)."""
    connect_timeout_s: float = Field(default=10.0, gt=0)
    session_timeout_ms: int = Field(default=6_000, ge=1_000, le=300_000)
    """How long the group waits for a silent member before it hands its partitions to another:
    the failover time after a ``kill -9`` (docs/delivery.md measures it)."""
    heartbeat_interval_ms: int = Field(default=2_000, ge=100)
    group_instance_id: str | None = None
    """Static group membership (KIP-345): a member that restarts with the same id within the
    session timeout gets its partitions back without a rebalance. One id per process."""
    request_timeout_ms: int = Field(default=10_000, ge=1_000)
    """A publish that the broker does not acknowledge in this time fails (then it is retried)."""
    max_record_bytes: int = Field(default=1_000_000, ge=10_000)
    """The largest record a client publishes; replies and dead letters are kept under it."""

    @property
    def max_request_bytes(self) -> int:
        """What a producer of ours may send in one request (``max_request_size``): a record of
        ``max_record_bytes`` with its key and headers, never under Kafka's 1 MiB. A consumer
        reads no larger record (:func:`request_bytes`)."""
        return request_bytes(self.max_record_bytes)

    create_topics: bool = True
    """A consumer creates its missing topics at start. Off where an operator owns the topics
    (Strimzi's ``KafkaTopic``s in k8s/): a missing topic then stops the consumer with an error
    naming it, and a consumer never races the operator with a topic of the wrong shape."""
    topic_replication_factor: int = Field(default=1, ge=1)
    """Replicas of a topic a consumer creates (1 suits one broker, as in docker-compose)."""

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_port_list(cls, value: str | None) -> str | None:
        """Comma-separated ``host[:port]`` (``[ipv6]:port``), as aiokafka reads it: a port that
        is not a number would fail at the first connection, as an unreachable broker (exit 3)
        or a traceback, instead of as a setting. Empty is not set (``require_bootstrap_servers``).
        """
        if value:
            for entry in value.split(","):
                _host_port(entry.strip())
        return value

    @model_validator(mode="after")
    def _heartbeat_below_session(self) -> Self:
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be at most a third of session_timeout_ms")
        return self

    def require_bootstrap_servers(self) -> str:
        if not self.bootstrap_servers:
            raise ConfigurationError(
                "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS is not set: point it at a Kafka broker "
                "(or run `contextcore dev up` and use the address it prints)"
            )
        return self.bootstrap_servers


def _host_port(entry: str) -> None:
    """Raises ValueError unless ``entry`` is ``host``, ``host:port``, ``[ipv6]:port`` or a bare
    IPv6 address (aiokafka's forms; no port: 9092)."""
    if not entry:
        raise ValueError("an entry is empty")
    if any(c.isspace() for c in entry):
        raise ValueError(f"{entry!r} is not host:port")
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or not host or (rest and not rest.startswith(":")):
            raise ValueError(f"{entry!r} is not [ipv6]:port")
        port = rest[1:] if rest else None
    elif ":" not in entry:
        return
    else:
        try:
            ipaddress.IPv6Address(entry)
            return
        except ValueError:
            host, _, port = entry.rpartition(":")
        if not host:
            raise ValueError(f"{entry!r} names no host")
    if port is not None and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")


class TopicSettings(BaseSettings):
    """The names of contextcore's topics; a producer and its consumer must agree on them."""

    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_TOPIC_", extra="ignore", frozen=True)

    build_request: str = "contextcore.build-request"
    build_request_partitions: int = Field(default=4, ge=1)
    upload: str = "contextcore.upload"
    upload_partitions: int = Field(default=2, ge=1)
    embed: str = "contextcore.embed"
    """Embedding batches: the upload consumer writes them, the embedding group reads them."""
    embed_partitions: int = Field(default=8, ge=1)
    """The embedding group's ceiling: one process per partition at most does work."""
    memory_write: str = "contextcore.memory-write"
    """``memory.remember`` / ``memory.forget`` calls, keyed by organization."""
    memory_write_partitions: int = Field(default=4, ge=1)
    reply_prefix: str = "contextcore.reply"
    """Clients create an ephemeral reply topic ``<prefix>.<client id>`` and delete it on close."""
    reply_pattern: str | None = None
    """The topics a reply may go to: a regular expression a ``reply_to`` must match in full.
    Unset: the names under ``reply_prefix`` (``<prefix>.`` and more). Kafka's internal topics,
    the service's own and every ``.dlt`` topic are refused whatever it says
    (:mod:`broker.reply_topics`)."""

    @field_validator("build_request", "upload", "embed", "memory_write")
    @classmethod
    def _service_topic(cls, name: str) -> str:
        """A topic the service reads and dead-letters, so a name a client may publish to and a
        consumer may create: a Kafka topic name whose dead-letter topic is one too, never
        Kafka's internal topics (``__consumer_offsets``: a client would publish requests into
        it) nor a dead-letter topic. Unchecked, a client waited out its send timeout on a name
        the broker refuses (exit 3), and a consumer said it was ready on one."""
        problem = service_topic_problem(name)
        if problem is not None:
            raise ValueError(problem)
        return name

    @model_validator(mode="after")
    def _distinct_topics(self) -> Self:
        """Each of the service's topics carries one kind of record: two settings naming one
        topic would hand each consumer the other's records, all dead-lettered."""
        fields = ("build_request", "upload", "embed", "memory_write")
        for index, field in enumerate(fields):
            for other in fields[index + 1 :]:
                if getattr(self, field) == getattr(self, other):
                    prefix = self.model_config.get("env_prefix") or ""
                    raise ConfigurationError(
                        f"{prefix}{field.upper()} and {prefix}{other.upper()} name one topic, "
                        f"{getattr(self, field)!r}: each of the service's topics must have its own"
                    )
        return self

    @model_validator(mode="after")
    def _reply_prefix_is_a_topic_name(self) -> Self:
        """The prefix is a Kafka topic name itself, so that ``<prefix>.<client id>`` names a
        client's topic under it: an empty prefix (or ``.``) made every topic whose name starts
        with a dot a reply topic. The reply-topic rule (:meth:`_usable_reply_rule`, next)
        checks the names under it."""
        if not is_topic_name(self.reply_prefix):
            problem = _not_a_topic_name(self.reply_prefix)
            raise ConfigurationError(f"CONTEXTCORE_TOPIC_REPLY_PREFIX is malformed: {problem}")
        return self

    @model_validator(mode="after")
    def _usable_reply_rule(self) -> Self:
        """A malformed pattern, or one that refuses the clients' own reply topics, stops the
        process that reads it (a :class:`ConfigurationError`, not a refused reply later)."""
        ReplyTopics.of(self)
        return self


_TOPIC_NAME_MAX = 249
"""Kafka's longest topic name."""


def _not_a_topic_name(name: str) -> str:
    return (
        f"{printable(name)[:100]!r} is not a Kafka topic name (1 to {_TOPIC_NAME_MAX} of "
        "A-Z a-z 0-9 . _ -, not '.' or '..')"
    )


def service_topic_problem(name: str) -> str | None:
    """Why ``name`` cannot be one of the service's topics (the rule of :class:`TopicSettings`);
    ``None`` when it can. The name is quoted, printable, at most 100 characters of it."""
    shown = repr(printable(name)[:100])
    if not is_topic_name(name):
        return _not_a_topic_name(name)
    if name.startswith(INTERNAL_PREFIX):
        return f"{shown} is internal to Kafka (a name starting {INTERNAL_PREFIX!r})"
    if name.endswith(DEAD_LETTER_SUFFIX):
        return f"{shown} is a dead-letter topic (a name ending {DEAD_LETTER_SUFFIX!r})"
    if len(name) + len(DEAD_LETTER_SUFFIX) > _TOPIC_NAME_MAX:
        return (
            f"{shown}... is too long: its dead-letter topic (the name and "
            f"{DEAD_LETTER_SUFFIX!r}) must fit Kafka's {_TOPIC_NAME_MAX} characters"
        )
    return None


def request_bytes(max_record_bytes: int) -> int:
    """The request limit of producers whose records are at most ``max_record_bytes``."""
    return max(1_048_576, max_record_bytes + 4_096)
