"""Kafka knowledge that producers and consumers share: settings, topic names, topic creation.

Nothing here knows a message's meaning (that is ``schemas``) or how a record is handled (that is
``consumers``); ``producers`` and ``consumers`` both import this package, never each other.
"""
