"""Agent memory: append-only revision chains the database protects (docs/memory.md).

models.py    what a write takes and answers, the stored revision, the stored-ref parser
store.py     named SQL on memories, memory_heads and the memory_writes journal
service.py   MemoryService: the rules of memory.remember and memory.forget
"""
