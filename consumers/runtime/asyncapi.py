"""A consumer's AsyncAPI 3.1 document, from its declaration alone: the topic it reads and that
topic's payload, the channels it publishes with theirs, and its dead-letter topic.

The document is built here. FastStream, which ran the loop before, derived a payload from
the handler's type hints, and this runtime's handler takes raw records (decoding, and its
failures, are the handler's), so the payload it reads is declared, never inferred. Schemas are
pydantic's JSON schemas of the declared models, every nested model once under
``components.schemas``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from broker.topics import dead_letter_topic
from schemas.envelope import DeadLetterV1

ASYNCAPI_VERSION = "3.1.0"
KAFKA_BINDING_VERSION = "0.4.0"
SERVER = "development"

DEAD_LETTER_DESCRIPTION = (
    "Records that could not be answered: origin, cause, reason, attempts and the payload, "
    "cut to a bound with its original size and sha256."
)


@dataclass(frozen=True)
class Channel:
    """A topic the consumer publishes to: its address (``{reply_to}`` for the topic a request
    names), a title that names it in the document, what it carries, and its payload."""

    address: str
    title: str
    description: str
    schema: type[BaseModel]


@dataclass(frozen=True)
class Declaration:
    """What a consumer is, for its document: the same values its app is made from."""

    name: str
    version: str
    description: str
    topic: str
    payload: type[BaseModel]
    publishes: Sequence[Channel]

    def channels(self) -> list[tuple[str, Channel]]:
        """``(action, channel)`` for the topic it reads, then what it publishes, then its
        dead-letter topic."""
        read = Channel(self.topic, self.topic, self.description, self.payload)
        letters = Channel(
            dead_letter_topic(self.topic),
            dead_letter_topic(self.topic),
            DEAD_LETTER_DESCRIPTION,
            DeadLetterV1,
        )
        return [("receive", read), *(("send", c) for c in self.publishes), ("send", letters)]


def _schemas(models: Sequence[type[BaseModel]]) -> dict[str, Any]:
    """Every model's JSON schema under its name, with the models it nests beside it."""
    schemas: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return {name: as_asyncapi(schema) for name, schema in schemas.items()}


def as_asyncapi(schema: Any) -> Any:
    """``schema`` as AsyncAPI's Schema Object reads it: without pydantic's ``discriminator``,
    OpenAPI's object (``{propertyName, mapping}``), which the official parser refuses. AsyncAPI's
    own discriminator is a property every variant requires whose values name the variants'
    schemas, which ``action`` is not (``remember``, not ``RememberV1``; an upload may omit it), so
    none is written: the ``oneOf`` beside it tells the variants apart by each one's ``action``."""
    if isinstance(schema, list):
        return [as_asyncapi(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    discriminator = schema.get("discriminator")
    dropped = isinstance(discriminator, dict) and "propertyName" in discriminator
    return {
        key: as_asyncapi(value)
        for key, value in schema.items()
        if not (dropped and key == "discriminator")
    }


def document(declaration: Declaration, server: str) -> dict[str, Any]:
    """The AsyncAPI 3.1 document of the consumer ``declaration`` describes, its broker at
    ``server`` (``host:port``)."""
    channels: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    declared = declaration.channels()
    for action, channel in declared:
        key = channel.title
        message = "SubscribeMessage" if action == "receive" else "Message"
        channels[key] = {
            "address": channel.address,
            "bindings": {
                "kafka": {"bindingVersion": KAFKA_BINDING_VERSION, "topic": channel.address}
            },
            "description": channel.description,
            "messages": {message: {"$ref": f"#/components/messages/{key}:{message}"}},
            "servers": [{"$ref": f"#/servers/{SERVER}"}],
        }
        messages[f"{key}:{message}"] = {
            "correlationId": {"location": "$message.header#/correlation_id"},
            "payload": {"$ref": f"#/components/schemas/{channel.schema.__name__}"},
            "title": f"{key}:{message}",
        }
        operations[key] = {
            "action": action,
            "channel": {"$ref": f"#/channels/{key}"},
            "messages": [{"$ref": f"#/channels/{key}/messages/{message}"}],
        }
    models = [channel.schema for _, channel in declared]
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": f"contextcore {declaration.name} consumer",
            "version": declaration.version,
            "description": declaration.description,
        },
        "defaultContentType": "application/json",
        "servers": {
            SERVER: {"host": server, "pathname": "", "protocol": "kafka", "protocolVersion": "auto"}
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": _schemas(models)},
    }
