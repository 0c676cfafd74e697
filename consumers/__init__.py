"""The Kafka side of contextcore: the consumers, on one delivery runtime (``runtime/``)."""
