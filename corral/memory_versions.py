"""A memory store's history: every write to a memory is one version (created, modified or deleted), attributed to
its actor, kept after the memory is deleted, and changed after that only by redaction, which blanks its path and
content and records who redacted it. The versions are written by corral.memory_stores with each write; this reads
and redacts them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from datetime import datetime
from typing import Any

from corral.knowledge_db import KnowledgeDB
from corral.memory_listing import VERSION_COLUMNS, list_versions, version_of
from corral.memory_paths import DEFAULT_LIMIT, MAX_FULL_LIMIT, checked_limit
from corral.memory_records import (
    Actor,
    InvalidMemoryRequest,
    MemoryStoreRecord,
    MemoryVersionNotFound,
    MemoryVersionRecord,
    Page,
    now,
    stamp,
)

OPERATIONS = ("created", "modified", "deleted")

StoreLookup = Callable[[sqlite3.Connection, str, str], MemoryStoreRecord]
"""`(connection, workspace, store_id)` -> the store, or `MemoryStoreNotFound`."""


class MemoryVersions:
    def __init__(self, db: KnowledgeDB, store: StoreLookup) -> None:
        self.db = db
        self._store = store

    def list(
        self,
        workspace: str,
        store_id: str,
        *,
        memory_id: str | None = None,
        session_id: str | None = None,
        api_key_id: str | None = None,
        user_id: str | None = None,
        service_account_id: str | None = None,
        operation: str | None = None,
        created_at_gte: datetime | None = None,
        created_at_lte: datetime | None = None,
        limit: int = DEFAULT_LIMIT,
        page: str | None = None,
        full: bool = False,
    ) -> Page[MemoryVersionRecord]:
        """The store's versions, newest first, of one memory, one actor, one operation or a time range when asked.
        With content (`full`), a page holds at most 20."""
        if operation is not None and operation not in OPERATIONS:
            raise InvalidMemoryRequest(f"operation must be one of {', '.join(OPERATIONS)}")
        actors = [value for value in (session_id, api_key_id, user_id, service_account_id) if value is not None]
        if len(actors) > 1:
            raise InvalidMemoryRequest("filter by one of session_id, api_key_id and service_account_id at a time")
        kind = ("session_actor" if session_id else "api_actor" if api_key_id else "user_actor" if user_id
                else "service_account_actor")  # fmt: skip
        limit = checked_limit(limit)
        filters = [
            ("memory_id = ?", memory_id),
            ("actor_id = ?", actors[0] if actors else None),
            ("json_extract(created_by, '$.type') = ?", kind if actors else None),
            ("operation = ?", operation),
            ("created_at >= ?", None if created_at_gte is None else stamp(created_at_gte)),
            ("created_at <= ?", None if created_at_lte is None else stamp(created_at_lte)),
        ]
        with self.db.read() as connection:
            store = self._store(connection, workspace, store_id)
            return list_versions(connection, store.id, filters, min(limit, MAX_FULL_LIMIT) if full else limit,
                                 page, full)  # fmt: skip

    def get(self, workspace: str, store_id: str, version_id: str, full: bool = True) -> MemoryVersionRecord:
        with self.db.read() as connection:
            store = self._store(connection, workspace, store_id)
            return _version(connection, store.id, version_id, full)

    def redact(self, workspace: str, store_id: str, version_id: str, actor: Actor) -> MemoryVersionRecord:
        """Blank the version's path, content, digest and size for good, recording when and by whom (redacting it
        again changes nothing). The version that holds a memory's current content cannot be: change or delete
        the memory first. An archived store allows it."""
        with self.db.write() as connection:
            store = self._store(connection, workspace, store_id)
            version = _version(connection, store.id, version_id, full=False)
            if version.redacted_at is not None:
                return version
            current = connection.execute(
                "SELECT id FROM memories WHERE store_id = ? AND version_id = ?", (store.id, version.id)
            ).fetchone()
            if current is not None:
                raise InvalidMemoryRequest(
                    f"{version.id} holds the current content of memory {version.memory_id}: update or delete the "
                    "memory first, then redact this version"
                )
            connection.execute(
                "UPDATE memory_versions SET path = NULL, content = NULL, content_sha256 = NULL, "
                "content_size_bytes = NULL, redacted_at = ?, redacted_by = ? WHERE id = ?",
                (now(), json.dumps(actor), version.id),
            )
            return _version(connection, store.id, version.id, full=True)


def _version(connection: sqlite3.Connection, store_id: str, version_id: Any, full: bool) -> MemoryVersionRecord:
    row = connection.execute(
        f"SELECT {VERSION_COLUMNS}, content FROM memory_versions WHERE id = ? AND store_id = ?", (version_id, store_id)
    ).fetchone()
    if row is None:
        raise MemoryVersionNotFound(str(version_id))
    return version_of(row, full)
