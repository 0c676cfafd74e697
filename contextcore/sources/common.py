"""Small helpers the sources share."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict


class NoOptions(BaseModel):
    """The options schema of a source that takes none: any key fails admission."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def as_text(value: Any) -> str:
    """A column value as the text a brief shows."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    return str(value)


def parse_uuid(raw: str) -> UUID | None:
    """The UUID ``raw`` names, or ``None``: an id that is not a UUID can name no row."""
    try:
        return UUID(raw)
    except ValueError:
        return None
