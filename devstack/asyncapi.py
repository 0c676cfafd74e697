"""The AsyncAPI documents of the consumers, generated from their declarations
(consumers/runtime/asyncapi.py).

    python -m devstack.asyncapi          write docs/asyncapi/<consumer>.yaml
    python -m devstack.asyncapi --check  exit 1 when a committed document no longer matches

CI runs the check (``tests/unit/test_asyncapi.py``): the documents describe the code as it is.
They are generated from the default settings, never from this machine's environment, and every
mapping is written with sorted keys.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from broker.settings import KafkaSettings, TopicSettings
from consumers.build.app import create_app as build_app
from consumers.build.settings import BuildSettings
from consumers.knowledge.embed.app import create_app as embed_app
from consumers.knowledge.embed.settings import EmbedSettings
from consumers.knowledge.upload.app import create_app as upload_app
from consumers.knowledge.upload.settings import UploadSettings
from consumers.memory.app import create_app as memory_app
from consumers.memory.settings import MemorySettings
from consumers.runtime.asyncapi import document
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.storage.settings import DatabaseSettings

DOCS = Path(__file__).resolve().parents[1] / "docs" / "asyncapi"


def documents() -> dict[str, str]:
    """``{file name: YAML}`` for every consumer, from default settings only."""
    kafka = KafkaSettings.model_construct(bootstrap_servers="kafka:9092")
    topics = TopicSettings.model_construct()
    database = DatabaseSettings.model_construct()
    knowledge = KnowledgeSettings.model_construct()
    apps = {
        "build.yaml": build_app(
            BuildSettings.model_construct(), kafka, topics, database, knowledge
        ),
        "upload.yaml": upload_app(
            UploadSettings.model_construct(), kafka, topics, database, knowledge
        ),
        "embed.yaml": embed_app(
            EmbedSettings.model_construct(), kafka, topics, database, knowledge
        ),
        "memory.yaml": memory_app(MemorySettings.model_construct(), kafka, topics, database),
    }
    documents = {}
    for name, consumer in apps.items():
        spec = document(consumer.declaration, kafka.require_bootstrap_servers())
        documents[name] = yaml.safe_dump(spec, sort_keys=True, allow_unicode=True)
    return documents


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.asyncapi", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, text in documents().items():
        path = DOCS / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    for name in stale:
        print(f"docs/asyncapi/{name} does not match the code: run python -m devstack.asyncapi")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
