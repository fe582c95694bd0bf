"""The reads of the memory stores library that page: stores, memories (with their `depth` roll-ups) and versions.
Each runs on a connection its caller opened (corral.memory_stores), and pages by a cursor that holds where the
last page ended, never by an offset, so every page costs the same however deep into a listing it is.

A listing of memories at a `depth` rolls the memories deeper than it into one `memory_prefix` each, and costs
no more for a prefix with 100,000 memories under it than for one with a single memory: once a roll-up is shown,
the next read seeks past all of it (`path >= prefix_end(rolled)`, one range read of the `(store_id, path)` index)
instead of reading the rows under it. This is a skip-scan: a page of `limit` items costs at most `limit` seeks.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from corral.memory_paths import prefix_end, rolled_prefix
from corral.memory_records import (
    InvalidMemoryRequest,
    MemoryPrefix,
    MemoryRecord,
    MemoryStoreRecord,
    MemoryVersionRecord,
    Page,
    cursor,
    position_of,
)

MEMORY_COLUMNS = "id, store_id, path, content_sha256, content_size_bytes, version_id, created_at, updated_at"
VERSION_COLUMNS = (
    "seq, id, memory_id, store_id, operation, path, content_sha256, content_size_bytes, created_at, created_by, "
    "redacted_at, redacted_by"
)


def store_of(row: sqlite3.Row) -> MemoryStoreRecord:
    return MemoryStoreRecord(
        id=row["id"],
        workspace=row["workspace"],
        name=row["name"],
        description=row["description"],
        metadata=json.loads(row["metadata"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        archived_at=row["archived_at"],
    )


def memory_of(row: sqlite3.Row, full: bool) -> MemoryRecord:
    return MemoryRecord(
        id=row["id"],
        memory_store_id=row["store_id"],
        path=row["path"],
        content=row["content"] if full else None,
        content_sha256=row["content_sha256"],
        content_size_bytes=row["content_size_bytes"],
        memory_version_id=row["version_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def version_of(row: sqlite3.Row, full: bool) -> MemoryVersionRecord:
    return MemoryVersionRecord(
        id=row["id"],
        memory_id=row["memory_id"],
        memory_store_id=row["store_id"],
        operation=row["operation"],
        path=row["path"],
        content=row["content"] if full else None,
        content_sha256=row["content_sha256"],
        content_size_bytes=row["content_size_bytes"],
        created_at=row["created_at"],
        created_by=json.loads(row["created_by"]) if row["created_by"] else None,
        redacted_at=row["redacted_at"],
        redacted_by=json.loads(row["redacted_by"]) if row["redacted_by"] else None,
    )


def list_stores(
    connection: sqlite3.Connection,
    workspace: str | None,
    include_archived: bool,
    created_at_gte: str | None,
    created_at_lte: str | None,
    limit: int,
    page: str | None,
) -> Page[MemoryStoreRecord]:
    """Newest first (ids sort by creation time); `workspace` None lists every workspace's (the operator's CLI)."""
    where, values = _conditions(
        ("workspace = ?", workspace),
        ("created_at >= ?", created_at_gte),
        ("created_at <= ?", created_at_lte),
        ("id < ?", position_of(page, "stores", 1)[0] if page else None),
    )
    if not include_archived:
        where.append("archived_at IS NULL")
    rows = connection.execute(
        f"SELECT * FROM memory_stores WHERE {' AND '.join(where) or '1'} ORDER BY id DESC LIMIT ?", (*values, limit + 1)
    ).fetchall()
    stores = [store_of(row) for row in rows[:limit]]
    return Page(stores, cursor("stores", [stores[-1].id]) if len(rows) > limit else None)


def list_memories(
    connection: sqlite3.Connection, store_id: str, prefix: str, depth: int, limit: int, page: str | None, full: bool
) -> Page[MemoryRecord | MemoryPrefix]:
    """The memories under `prefix` in path order, those deeper than `depth` segments below it rolled up (see the
    module's docstring). A position is `(">", path)` after a memory and `(">=", prefix_end(rolled))` after a
    roll-up."""
    operator, bound = position_of(page, "memories", 2) if page else (">=", prefix)
    if operator not in (">", ">="):
        operator = ">="
    end = prefix_end(prefix)
    columns = MEMORY_COLUMNS + (", content" if full else "")
    items: list[MemoryRecord | MemoryPrefix] = []
    exhausted = False
    while len(items) < limit and not exhausted:
        wanted = limit - len(items)
        rows = connection.execute(
            f"SELECT {columns} FROM memories WHERE store_id = ? AND path {operator} ? AND path < ? "
            "ORDER BY path LIMIT ?",
            (store_id, bound, end, wanted),
        )  # read row by row: after a roll-up the rest are not read, and the next read seeks past it
        read = 0
        for row in rows:
            read += 1
            rolled = rolled_prefix(row["path"], prefix, depth)
            if rolled is None:
                items.append(memory_of(row, full))
                operator, bound = ">", row["path"]
                continue
            items.append(MemoryPrefix(rolled))
            operator, bound = ">=", prefix_end(rolled)
            break
        else:
            exhausted = read < wanted
        rows.close()
    more = (
        len(items) == limit
        and connection.execute(
            f"SELECT 1 FROM memories WHERE store_id = ? AND path {operator} ? AND path < ? LIMIT 1",
            (store_id, bound, end),
        ).fetchone()
        is not None
    )
    return Page(items, cursor("memories", [operator, bound]) if more else None)


def list_versions(
    connection: sqlite3.Connection,
    store_id: str,
    filters: Sequence[tuple[str, object]],
    limit: int,
    page: str | None,
    full: bool,
) -> Page[MemoryVersionRecord]:
    """Newest first; `filters` are `(condition with one ?, value)`, a None value leaving its condition out."""
    where, values = _conditions(("store_id = ?", store_id), *filters, ("seq < ?", _seq(page) if page else None))
    columns = VERSION_COLUMNS + (", content" if full else "")
    rows = connection.execute(
        f"SELECT {columns} FROM memory_versions WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT ?",
        (*values, limit + 1),
    ).fetchall()
    versions = [version_of(row, full) for row in rows[:limit]]
    return Page(versions, cursor("versions", [str(rows[limit - 1]["seq"])]) if len(rows) > limit else None)


def _seq(page: str) -> int:
    position = position_of(page, "versions", 1)[0]
    if not position.isdigit():
        raise InvalidMemoryRequest("page: not a cursor this list gave")
    return int(position)


def _conditions(*pairs: tuple[str, object]) -> tuple[list[str], list[object]]:
    kept = [(condition, value) for condition, value in pairs if value is not None]
    return [condition for condition, _ in kept], [value for _, value in kept]
