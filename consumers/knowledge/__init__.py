"""The knowledge flow's consumers, one package: ``upload`` (extract, chunk, hand batches on),
``embed`` (the embedding group: embed, store, mark ready), ``sweep`` (fail sources pending too
long; prune the ledger and the start journal), and ``replies``, the one way each of them tells
an uploader its source's status."""
