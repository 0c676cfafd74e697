"""Small helpers the sources share."""

from __future__ import annotations

from uuid import UUID

from pydantic import BaseModel, ConfigDict


class NoOptions(BaseModel):
    """The options schema of a source that takes none: any key fails admission."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_uuid(raw: str) -> UUID | None:
    """The UUID ``raw`` names, or ``None``: an id that is not a UUID can name no row."""
    try:
        return UUID(raw)
    except ValueError:
        return None
