"""Rows for the source tests, written by the administrator, as the application that owns them."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg


def new_id() -> uuid.UUID:
    return uuid.uuid4()


async def insert(conn: asyncpg.Connection, table: str, **values: Any) -> dict[str, Any]:
    columns = list(values)
    params = [json.dumps(v) if isinstance(v, list | dict) else v for v in values.values()]
    await conn.execute(
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join(f'${i + 1}' for i in range(len(columns)))})",
        *params,
    )
    return values


async def organization(conn: asyncpg.Connection, name: str = "Org") -> uuid.UUID:
    org = new_id()
    await insert(conn, "organizations", id=org, name=name)
    return org


async def company(conn: asyncpg.Connection, org: uuid.UUID, **values: Any) -> uuid.UUID:
    row = {"id": new_id(), "name": "Acme", **values}
    await insert(conn, "crm_companies", organization_id=org, **row)
    return uuid.UUID(str(row["id"]))
