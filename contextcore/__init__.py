"""contextcore: the domain of the context service, and its adapters.

The domain's logic (the builder, the packer, the registry, ingestion, the embedder, the memory
service) declares the ports it needs; the adapters here implement them on PostgreSQL, files and
S3, the encoders and worker processes (docs/architecture.md, "Ports and adapters"). A module's
folder says which it is: ``contextcore/<area>/`` is logic, ``contextcore/<area>/adapters/`` and
the packages that are adapters whole (``storage/``, ``sources/``) are adapters. Nothing here
imports Kafka code: the consumers are the adapters to the broker.
"""

__version__ = "0.1.0"
