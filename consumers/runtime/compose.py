"""What every consumer's composition root shares (each ``create_app``): the settings all of
them read, the reply channel they declare, and the :class:`ConsumerApp` made of both. A
consumer's own ``create_app`` says only what is its own: its settings, its topic, its handler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from broker.reply_topics import ReplyTopics
from broker.settings import KafkaSettings, TopicSettings
from consumers.runtime.app import ConsumerApp
from consumers.runtime.asyncapi import Channel
from contextcore.storage.settings import DatabaseSettings


@dataclass(frozen=True)
class Environment:
    """The settings every consumer reads, each from the environment unless given, and the
    reply-topic rule of its topic settings."""

    kafka: KafkaSettings
    topics: TopicSettings
    database: DatabaseSettings
    reply_topics: ReplyTopics

    @classmethod
    def of(
        cls,
        kafka: KafkaSettings | None = None,
        topics: TopicSettings | None = None,
        database: DatabaseSettings | None = None,
    ) -> Environment:
        topics = topics or TopicSettings()
        return cls(
            kafka or KafkaSettings(), topics, database or DatabaseSettings(), ReplyTopics.of(topics)
        )


def reply_channel(message: str, description: str, payload: type[BaseModel]) -> Channel:
    """The channel of the answers a consumer sends on the topic each request names."""
    return Channel("{reply_to}", message, description, payload)


def consumer_app(environment: Environment, **own: Any) -> ConsumerApp:
    """A :class:`ConsumerApp` of ``environment`` and the consumer's ``own`` arguments (its
    name, topic, topics, settings, declaration, handler and causes)."""
    return ConsumerApp(
        kafka=environment.kafka,
        database=environment.database,
        reply_topics=environment.reply_topics,
        **own,
    )
