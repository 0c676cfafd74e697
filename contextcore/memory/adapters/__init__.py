"""Memory's adapters: the SQL of agent memory through the tenancy layer, implementing the ports
the logic in ``contextcore/memory/`` declares. Only the entry points and other adapters import
these.

store.py     the write path's one statement: memory_apply (migration 00011), and its answers
erasure.py   the operator's erasure of a person's or a subject's memory text (00025)
health.py    one organization's chains, refusals and what the memory source drops at read
"""
