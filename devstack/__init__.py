"""Development tooling that production never imports (an import-linter contract says so).

stack.py          the embedded broker (Tansu) and PostgreSQL 18 + pgvector on 127.0.0.1
demo.py           the main job end to end on the embedded default
demo_seed.py      the demo organization's rows
history_guard.py  CI: committed migrations are never edited
asyncapi.py       the AsyncAPI documents under docs/asyncapi, generated from the apps
cli.py            ``contextcore dev up|down|status|env|demo``
"""
