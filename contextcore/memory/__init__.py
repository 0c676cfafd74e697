"""Agent memory: append-only revision chains the database protects (docs/memory.md).

models.py    what a write takes and answers, the stored revision, the stored-ref parser
store.py     the write path's one statement: memory_apply (migration 00011), and its answers
service.py   MemoryService: the rules that need no row, and writes in batches (group commit)
health.py    one organization's chains, refusals and what the memory source drops at read
erasure.py   the operator's erasure of a person's or a subject's memory text (00025)
"""
