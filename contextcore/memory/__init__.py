"""Agent memory: append-only revision chains the database protects (docs/memory.md).

The logic (no driver):

service.py   MemoryService: the rules that need no row, and writes in batches (group commit)
refs.py      the refs a memory names: the stored-ref parser, the scope owner, the tenant guard's
             drop rules the memory source and memory health share

adapters/    the SQL: the write path (store.py), erasure (erasure.py), health (health.py)
"""
