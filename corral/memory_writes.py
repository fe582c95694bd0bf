"""The row-level steps every write of corral.memory_stores is made of, on the connection of its transaction:
reading a memory, checking a precondition, and `write`, which records one version and applies it to the current
state (the one place a memory row changes). Also the session write-back's step for one change (`apply`).
"""

from __future__ import annotations

import json
import sqlite3

from corral.memory_listing import MEMORY_COLUMNS, memory_of
from corral.memory_paths import check_content, check_path, content_sha256
from corral.memory_records import (
    PRECONDITION_FAILED,
    Actor,
    InvalidMemoryRequest,
    MemoryChange,
    MemoryConflict,
    MemoryNotFound,
    MemoryRecord,
    MemoryStoreRecord,
    actor_id,
    now,
)
from corral.names import MEMORY_ID_PREFIX, MEMORY_VERSION_ID_PREFIX
from corral.record_ids import new_record_id

INSERT_VERSION = (
    "INSERT INTO memory_versions (id, store_id, memory_id, operation, path, content, content_sha256, "
    "content_size_bytes, created_at, created_by, actor_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def apply(connection: sqlite3.Connection, store_id: str, change: MemoryChange, actor: Actor) -> str:
    """One of a session's changes (see `MemoryStores.apply_session_changes`), as a line for the log."""
    try:
        path = check_path(change.path)
        content = None if change.content is None else check_content(change.content)
    except InvalidMemoryRequest as exc:
        return f"skipped {change.path[:200]!r}: {exc}"
    current_id = at_path(connection, store_id, path)
    current = None if current_id is None else read_memory(connection, store_id, current_id, full=True)
    if content is None:
        if current is None:
            return f"skipped deleting {path}: it is already gone"
        if current.content_sha256 != change.base_sha256:
            return f"skipped deleting {path}: another writer changed it since the mount, and their content is kept"
        write(connection, store_id, current, path, None, actor)
        return f"deleted {path}"
    if current is None:
        write(connection, store_id, None, path, content, actor)
        meanwhile = " (another writer deleted it since the mount)" if change.base_sha256 is not None else ""
        return f"created {path}{meanwhile}"
    if current.content == content:
        return f"unchanged {path}"
    write(connection, store_id, current, path, content, actor)
    if current.content_sha256 != change.base_sha256:
        return f"wrote {path} over another writer's change since the mount (both versions are in the history)"
    return f"wrote {path}"


def write(
    connection: sqlite3.Connection,
    store_id: str,
    memory: MemoryRecord | None,
    path: str,
    content: str | None,
    actor: Actor,
) -> str:
    """Record one write as a version and apply it to the current state: `memory` None creates, `content` None
    deletes, else it modifies. Returns the memory's id."""
    version_id = new_record_id(MEMORY_VERSION_ID_PREFIX.removesuffix("_"))
    memory_id = memory.id if memory else new_record_id(MEMORY_ID_PREFIX.removesuffix("_"))
    operation = "created" if memory is None else "deleted" if content is None else "modified"
    sha = None if content is None else content_sha256(content)
    size = None if content is None else len(content.encode("utf-8"))
    moment = now()
    connection.execute(
        INSERT_VERSION,
        (version_id, store_id, memory_id, operation, path, content, sha, size, moment, json.dumps(actor),
         actor_id(actor)),
    )  # fmt: skip
    if memory is None:
        connection.execute("INSERT INTO memories VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (memory_id, store_id, path, content, sha, size, version_id, moment, moment))  # fmt: skip
    elif content is None:
        connection.execute("DELETE FROM memories WHERE id = ?", (memory_id,))
    else:
        connection.execute(
            "UPDATE memories SET path = ?, content = ?, content_sha256 = ?, content_size_bytes = ?, version_id = ?, "
            "updated_at = ? WHERE id = ?",
            (path, content, sha, size, version_id, moment, memory_id),
        )
    return memory_id


def read_memory(connection: sqlite3.Connection, store_id: str, memory_id: str, full: bool) -> MemoryRecord:
    row = connection.execute(
        f"SELECT {MEMORY_COLUMNS}, content FROM memories WHERE id = ? AND store_id = ?", (memory_id, store_id)
    ).fetchone()
    if row is None:
        raise MemoryNotFound(memory_id)
    return memory_of(row, full)


def at_path(connection: sqlite3.Connection, store_id: str, path: str) -> str | None:
    row = connection.execute("SELECT id FROM memories WHERE store_id = ? AND path = ?", (store_id, path)).fetchone()
    return None if row is None else str(row["id"])


def check_precondition(memory: MemoryRecord, expected: str | None) -> None:
    if expected is not None and memory.content_sha256 != expected:
        raise MemoryConflict(
            f"memory {memory.id} has content_sha256 {memory.content_sha256}, not {expected}: it changed since you "
            "read it (read it again, then retry)",
            PRECONDITION_FAILED,
        )


def refuse_archived(store: MemoryStoreRecord, what: str) -> None:
    if store.archived_at is not None:
        raise InvalidMemoryRequest(f"memory store {store.id} is archived: you cannot {what} it")
