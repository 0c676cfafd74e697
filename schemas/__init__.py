"""Message contracts of every topic, versioned. Pure pydantic: no Kafka code.

Each message carries ``schema_version``; a consumer refuses a version it does not know with a
clear error instead of guessing. New fields are added with defaults; a breaking change is a new
version beside the old one until every producer has moved.
"""
