"""The embedding group: batches of chunks in, vectors in pgvector, ``ready`` replies out."""
