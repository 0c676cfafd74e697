"""Knowledge's adapters: what reaches PostgreSQL, files and S3, the model libraries, worker
processes and the environment, implementing the ports the logic in ``contextcore/knowledge/``
declares. Only the entry points and other adapters import these.

store.py     the named SQL of ingestion and embedding (the two repositories), the pending sweep
search.py    knowledge_search, hybrid, by document: what the knowledge source reads
queries.py   a query's vector under a model: coalesced and cached (the knowledge source's)
admin.py     the operator's steps: documents, failures, retries, the model switch
indexes.py   per-tenant HNSW indexes: when a tenant leaves exact search
encoder.py   the embedding model (sentence-transformers on OpenVINO, ONNX or torch)
export.py    ``python -m contextcore.knowledge.adapters.export``: a model exported to OpenVINO
objects.py   reading s3:// and file:// objects, tenant-checked and bounded
sandbox.py   extraction and chunking out of process: a pool of bounded workers
worker.py    ``python -m contextcore.knowledge.adapters.worker``: one worker process
settings.py  CONTEXTCORE_KNOWLEDGE_*: model, backend, window
"""
