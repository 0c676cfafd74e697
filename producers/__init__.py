"""Clients that publish requests to contextcore's topics and await the replies."""

from producers.client import BuildFailed, ContextClient, Session
from schemas.errors import ReplyTimeout

__all__ = ["BuildFailed", "ContextClient", "ReplyTimeout", "Session"]
