"""Development tooling that production never imports (an import-linter contract says so).

stack.py            the embedded broker (Tansu) and PostgreSQL 18 + pgvector on 127.0.0.1
replica.py          a hot standby of that PostgreSQL (``contextcore dev up --replica``)
demo.py             the main job end to end on the embedded default
demo_seed.py        the demo organization's rows
cli.py              ``contextcore dev up|down|status|env|demo``
history_guard.py    CI: committed migrations are never edited
asyncapi.py         the AsyncAPI documents under docs/asyncapi, generated from the apps
json_schemas.py     docs/schemas/: a JSON Schema of every message, from the models
schema_snapshot.py  contextcore/storage/schema.sql: the schema after the last migration
settings_doc.py     docs/settings.md: every environment variable, from the settings classes
generated.py        the write-or---check command of every generated file
k8s_validate.py     CI: k8s/ rendered with kustomize and every object validated offline
k8s_schemas/        the custom resources' schemas that validation reads (generated, npm)
prometheus.py       Prometheus and promtool for the checks and tests, from Debian's package
"""
