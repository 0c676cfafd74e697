"""Knowledge: uploaded documents as searchable chunks under a pinned embedding model.

The logic (no driver; it declares the ports the adapters implement):

extract.py    bytes -> sections of text (plain, Markdown, HTML, PDF), bounded
chunk.py      sections -> chunks, with the model's own tokenizer, along the structure
ingest.py     one upload -> the source row, its text, its embedding batches (resumable)
embed.py      one batch -> vectors stored, the source ready when complete
encoding.py   the Encoder port, coalesced and shared encodes
batching.py   encode batches by length: the least padding
addresses.py  s3:// and file:// addresses, checked before anything is read
state.py      a source's states and a batch's result

adapters/     PostgreSQL, S3 and files, the model libraries, the worker processes, the settings
"""
