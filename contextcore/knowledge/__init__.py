"""Knowledge: uploaded documents as searchable chunks under a pinned embedding model.

extract.py   bytes -> sections of text (plain, Markdown, HTML, PDF), bounded
chunk.py     sections -> chunks, with the model's own tokenizer, along the structure
encoder.py   the embedding model (sentence-transformers on OpenVINO, ONNX or torch)
objects.py   reading s3:// and file:// objects, tenant-checked and bounded
ingest.py    one upload -> the source row, its text, its embedding batches (resumable)
embed.py     one batch -> vectors stored, the source ready when complete
store.py     the named SQL of all of it, through the tenancy layer; the pending sweep
search.py    knowledge_search and the knowledge context source
indexes.py   per-tenant HNSW indexes: when a tenant leaves exact search
settings.py  CONTEXTCORE_KNOWLEDGE_*: model, backend, window
"""
