"""Small helpers the sources share."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class NoOptions(BaseModel):
    """The options schema of a source that takes none: any key fails admission."""

    model_config = ConfigDict(extra="forbid", frozen=True)
