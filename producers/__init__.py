"""Clients that publish requests to contextcore's topics and await the replies."""

from contextcore.errors import ReplyTimeout
from producers.client import BuildFailed, ContextClient

__all__ = ["BuildFailed", "ContextClient", "ReplyTimeout"]
