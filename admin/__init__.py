"""The operator's commands that read and write PostgreSQL directly, and the clients they use.

schema.py      ``contextcore schema``: migrations, roles, the check a consumer makes at start
knowledge.py   ``contextcore knowledge``: documents, models, indexes, exports of the knowledge base
documents.py   DocumentsClient: list and delete an organization's documents, as the runtime login
memory.py      ``contextcore memory health`` and ``contextcore memory erase``
quotas.py      ``contextcore quota``: an organization's quotas, as the schema owner

They ship in the service distribution: they need asyncpg and the domain. What they ask of a
consumer (a re-ingest) they ask over Kafka, through the client distribution's clients.
"""
