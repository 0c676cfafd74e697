"""A database position: how far the primary's write-ahead log had reached when a write was
answered, so a later read can ask for a database that has that write (read-your-writes).

On the wire it is PostgreSQL's ``pg_lsn`` text, two hexadecimal numbers (``"16/B374D848"``). A
memory answer and an upload's ``ready`` status carry one (``position``); a build request may
name one (``read_after``), and its sources then read a database that has replayed at least that
far. Positions of one cluster are ordered; :func:`latest` keeps the greater.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

POSITION_PATTERN = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"
Position = Annotated[str, Field(pattern=POSITION_PATTERN, max_length=17)]


def position_value(position: str) -> int:
    """The position as one 64-bit number (``pg_lsn``'s order).

    Raises:
        ValueError: ``position`` is not two hexadecimal numbers of at most 8 digits.
    """
    if re.fullmatch(POSITION_PATTERN, position) is None:
        raise ValueError(f"not a database position: {position[:40]!r}")
    high, _, low = position.partition("/")
    return int(high, 16) << 32 | int(low, 16)


def latest(*positions: str | None) -> str | None:
    """The greatest of ``positions`` (``None`` ones ignored), or ``None`` when all are."""
    given = [p for p in positions if p is not None]
    return max(given, key=position_value) if given else None
