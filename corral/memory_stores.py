"""Memory stores: named sets of text documents at paths (memories), which sessions mount and people edit, with
every write kept as a version. The gateway's `/v1/memory_stores` routes (gateway/memory_stores.py), the session
side (mounting a store into a sandbox, writing back what the session changed) and `corral memory` all use this.

The tables are in the knowledge database (corral.knowledge_db): `memory_stores`, `memories` (the current state,
one row per path, unique per store) and `memory_versions` (one row per write, kept after its memory is deleted).
Every write is one `db.write()` transaction (BEGIN IMMEDIATE: writers take turns), so a precondition is checked and
the write applied with nothing in between: two writers of one memory never lose a write silently. Each write is
a version in the history, and a precondition that does not hold is a `MemoryConflict`, never an overwrite.

Every method is synchronous (sqlite3); async callers run them with `await db.run(method, ...)`. Records, errors
and actors are in corral.memory_records, the path rules in corral.memory_paths, the paged reads in
corral.memory_listing.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from corral.knowledge_db import KnowledgeDB
from corral.memory_listing import list_memories, list_stores, store_of
from corral.memory_paths import (
    DEFAULT_LIMIT,
    MAX_FULL_LIMIT,
    check_content,
    check_description,
    check_name,
    check_path,
    check_prefix,
    check_sha256,
    checked_limit,
    content_sha256,
    patched_metadata,
)
from corral.memory_records import (
    PATH_TAKEN,
    Actor,
    InvalidMemoryRequest,
    MemoryChange,
    MemoryConflict,
    MemoryNotFound,
    MemoryPrefix,
    MemoryRecord,
    MemorySnapshot,
    MemoryStoreNotFound,
    MemoryStoreRecord,
    MemoryVersionRecord,
    Page,
    actor_id,
    now,
    stamp,
)
from corral.memory_records import MemoryStoreError as MemoryStoreError  # re-exported: callers catch it from here
from corral.memory_versions import MemoryVersions
from corral.memory_writes import (
    INSERT_VERSION,
    apply,
    at_path,
    check_precondition,
    read_memory,
    refuse_archived,
    write,
)
from corral.names import MEMORY_ID_PREFIX, MEMORY_STORE_ID_PREFIX, MEMORY_VERSION_ID_PREFIX
from corral.record_ids import new_record_id

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS memory_stores (
        id TEXT PRIMARY KEY, workspace TEXT NOT NULL, name TEXT NOT NULL, description TEXT NOT NULL,
        metadata TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL, archived_at TEXT)""",
    "CREATE INDEX IF NOT EXISTS memory_stores_by_workspace ON memory_stores (workspace, id)",
    """CREATE TABLE IF NOT EXISTS memories (
        id TEXT PRIMARY KEY, store_id TEXT NOT NULL REFERENCES memory_stores (id) ON DELETE CASCADE,
        path TEXT NOT NULL, content TEXT NOT NULL, content_sha256 TEXT NOT NULL, content_size_bytes INTEGER NOT NULL,
        version_id TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL, UNIQUE (store_id, path))""",
    """CREATE INDEX IF NOT EXISTS memories_listed ON memories (store_id, path, id, content_sha256,
        content_size_bytes, version_id, created_at, updated_at)""",
    """CREATE TABLE IF NOT EXISTS memory_versions (
        seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE,
        store_id TEXT NOT NULL REFERENCES memory_stores (id) ON DELETE CASCADE,
        memory_id TEXT NOT NULL, operation TEXT NOT NULL, path TEXT, content TEXT, content_sha256 TEXT,
        content_size_bytes INTEGER, created_at TEXT NOT NULL, created_by TEXT, actor_id TEXT,
        redacted_at TEXT, redacted_by TEXT)""",
    "CREATE INDEX IF NOT EXISTS memory_versions_by_store ON memory_versions (store_id, seq)",
    "CREATE INDEX IF NOT EXISTS memory_versions_by_memory ON memory_versions (store_id, memory_id, seq)",
    "CREATE INDEX IF NOT EXISTS memory_versions_by_actor ON memory_versions (store_id, actor_id, seq)",
]
"""`UNIQUE (store_id, path)` is the index every path lookup reads; `memories_listed` is the same order holding
every column a basic listing shows, so a prefix range or a skip-scan reads the index alone, not a row of the
table per memory (at 100,000 memories those rows are spread over many pages). A version's
`seq` is its place in the store's history (writes take turns, so it only grows; Postgres: a bigserial), which
listings order by: ids made in the same millisecond do not sort by time."""


class MemoryStores:
    """The memory stores of every workspace in one knowledge database. Each method takes the caller's workspace,
    and an object of another workspace is not found, exactly like a missing one."""

    def __init__(self, db: KnowledgeDB) -> None:
        self.db = db
        db.migrate("memory_stores", SCHEMA)
        self.versions = MemoryVersions(db, self.store_in)

    # ---- stores -----------------------------------------------------------------------------------------------

    def create_store(
        self, workspace: str, name: Any, description: Any = None, metadata: Any = None
    ) -> MemoryStoreRecord:
        checked_metadata = patched_metadata({}, metadata or {}) if metadata is not None else {}
        store_id = new_record_id(MEMORY_STORE_ID_PREFIX.removesuffix("_"))
        moment = now()
        with self.db.write() as connection:
            connection.execute(
                "INSERT INTO memory_stores VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
                (store_id, workspace, check_name(name), check_description(description), json.dumps(checked_metadata),
                 moment, moment),
            )  # fmt: skip
        return self.get_store(workspace, store_id)

    def get_store(self, workspace: str, store_id: str) -> MemoryStoreRecord:
        """The store, or `MemoryStoreNotFound` (also for another workspace's)."""
        with self.db.read() as connection:
            return self.store_in(connection, workspace, store_id)

    def locate_store(self, store_id: str) -> MemoryStoreRecord:
        """The store whatever its workspace: for the operator's CLI only, never for an API caller."""
        row = self.db.connection().execute("SELECT * FROM memory_stores WHERE id = ?", (store_id,)).fetchone()
        if row is None:
            raise MemoryStoreNotFound(store_id)
        return store_of(row)

    def update_store(
        self, workspace: str, store_id: str, name: Any = None, description: Any = None, metadata: Any = None
    ) -> MemoryStoreRecord:
        """Change what is given: `description` "" clears it, `metadata` is a patch (a null value deletes its key).
        An archived store refuses (`InvalidMemoryRequest`)."""
        with self.db.write() as connection:
            store = self.store_in(connection, workspace, store_id)
            refuse_archived(store, "update")
            merged = patched_metadata(store.metadata, metadata) if metadata is not None else store.metadata
            connection.execute(
                "UPDATE memory_stores SET name = ?, description = ?, metadata = ?, updated_at = ? WHERE id = ?",
                (store.name if name is None else check_name(name),
                 store.description if description is None else check_description(description),
                 json.dumps(merged), now(), store.id),
            )  # fmt: skip
            return self.store_in(connection, workspace, store_id)

    def list_stores(
        self,
        workspace: str | None,
        include_archived: bool = False,
        created_at_gte: datetime | None = None,
        created_at_lte: datetime | None = None,
        limit: int = DEFAULT_LIMIT,
        page: str | None = None,
    ) -> Page[MemoryStoreRecord]:
        """Newest first. `workspace` None is every workspace's stores (the operator's CLI only)."""
        with self.db.read() as connection:
            return list_stores(connection, workspace, include_archived, _bound(created_at_gte),
                               _bound(created_at_lte), checked_limit(limit), page)  # fmt: skip

    def archive_store(self, workspace: str, store_id: str) -> MemoryStoreRecord:
        """Archive the store (irreversible; archiving again changes nothing)."""
        with self.db.write() as connection:
            store = self.store_in(connection, workspace, store_id)
            if store.archived_at is None:
                moment = now()
                connection.execute("UPDATE memory_stores SET archived_at = ?, updated_at = ? WHERE id = ?",
                                   (moment, moment, store.id))  # fmt: skip
            return self.store_in(connection, workspace, store_id)

    def delete_store(self, workspace: str, store_id: str) -> None:
        """Delete the store, its memories and all their versions."""
        with self.db.write() as connection:
            store = self.store_in(connection, workspace, store_id)
            connection.execute("DELETE FROM memory_stores WHERE id = ?", (store.id,))

    # ---- memories ---------------------------------------------------------------------------------------------

    def create_memory(self, workspace: str, store_id: str, path: Any, content: Any, actor: Actor) -> MemoryRecord:
        """A new memory at `path` (`MemoryConflict` if the store has one there)."""
        path, content = check_path(path), check_content(content)
        with self.db.write() as connection:
            store = self.store_in(connection, workspace, store_id)
            refuse_archived(store, "create memories in")
            if at_path(connection, store.id, path) is not None:
                raise MemoryConflict(f"path {path!r} already holds a memory in {store.id}", PATH_TAKEN)
            memory_id = write(connection, store.id, None, path, content, actor)
            return read_memory(connection, store.id, memory_id, full=True)

    def get_memory(self, workspace: str, store_id: str, memory_id: str, full: bool = True) -> MemoryRecord:
        with self.db.read() as connection:
            store = self.store_in(connection, workspace, store_id)
            return read_memory(connection, store.id, memory_id, full)

    def find_memory_id(self, workspace: str, store_id: str, path: str) -> str:
        """The id of the memory at `path`, or of the last one that was there (deleted since; its history stays),
        else `MemoryNotFound`: how a person names a memory (`corral memory cat / history`)."""
        with self.db.read() as connection:
            store = self.store_in(connection, workspace, store_id)
            found = at_path(connection, store.id, path)
            if found is None:
                row = connection.execute(
                    "SELECT memory_id FROM memory_versions WHERE store_id = ? AND path = ? ORDER BY seq DESC LIMIT 1",
                    (store.id, path),
                ).fetchone()
                found = None if row is None else str(row["memory_id"])
        if found is None:
            raise MemoryNotFound(path)
        return found

    def update_memory(
        self,
        workspace: str,
        store_id: str,
        memory_id: str,
        actor: Actor,
        content: Any = None,
        path: Any = None,
        expected_sha256: Any = None,
    ) -> MemoryRecord:
        """Change the content, or rename (the id stays), or both; None leaves each as it is. With
        `expected_sha256`, only if the content is still that (else `MemoryConflict`). A change to nothing writes
        no version."""
        new_path = None if path is None else check_path(path)
        new_content = None if content is None else check_content(content)
        expected = None if expected_sha256 is None else check_sha256(expected_sha256, "precondition.content_sha256")
        with self.db.write() as connection:
            store = self.store_in(connection, workspace, store_id)
            refuse_archived(store, "update memories in")
            memory = read_memory(connection, store.id, memory_id, full=True)
            check_precondition(memory, expected)
            new_path = memory.path if new_path is None else new_path
            new_content = memory.content if new_content is None else new_content
            if new_path == memory.path and new_content == memory.content:
                return memory
            if new_path != memory.path and at_path(connection, store.id, new_path) is not None:
                raise MemoryConflict(f"path {new_path!r} already holds a memory in {store.id}", PATH_TAKEN)
            write(connection, store.id, memory, new_path, new_content, actor)
            return read_memory(connection, store.id, memory.id, full=True)

    def delete_memory(
        self, workspace: str, store_id: str, memory_id: str, actor: Actor, expected_sha256: Any = None
    ) -> None:
        """Delete the memory (its versions stay, and a `deleted` one is added); with `expected_sha256`, only if its
        content is still that (else `MemoryConflict`). An archived store allows it."""
        expected = None if expected_sha256 is None else check_sha256(expected_sha256, "expected_content_sha256")
        with self.db.write() as connection:
            store = self.store_in(connection, workspace, store_id)
            memory = read_memory(connection, store.id, memory_id, full=False)
            check_precondition(memory, expected)
            write(connection, store.id, memory, memory.path, None, actor)

    def list_memories(
        self,
        workspace: str,
        store_id: str,
        path_prefix: Any = None,
        depth: Any = 0,
        limit: Any = DEFAULT_LIMIT,
        page: str | None = None,
        full: bool = False,
    ) -> Page[MemoryRecord | MemoryPrefix]:
        """The memories under `path_prefix` (default the whole store) in path order; at `depth` N > 0 those more
        than N segments below it come as one `MemoryPrefix` per directory at depth N. A full page holds at most
        `MAX_FULL_LIMIT` items."""
        prefix = "/" if path_prefix is None else check_prefix(path_prefix)
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise InvalidMemoryRequest("depth must be a whole number from 0 (0: every memory below the prefix)")
        limit = checked_limit(limit)
        with self.db.read() as connection:
            store = self.store_in(connection, workspace, store_id)
            return list_memories(connection, store.id, prefix, depth,
                                 min(limit, MAX_FULL_LIMIT) if full else limit, page, full)  # fmt: skip

    def export(self, workspace: str, store_id: str) -> list[MemorySnapshot]:
        """Every current memory of the store, in path order: what a session's sandbox is given at mount."""
        with self.db.read() as connection:
            store = self.store_in(connection, workspace, store_id)
            rows = connection.execute(
                "SELECT path, content, content_sha256 FROM memories WHERE store_id = ? ORDER BY path", (store.id,)
            ).fetchall()
        return [MemorySnapshot(row["path"], row["content"], row["content_sha256"]) for row in rows]

    def apply_session_changes(
        self, workspace: str, store_id: str, session_id: str, changes: list[MemoryChange]
    ) -> list[str]:
        """Write back what a session did to its mounted copy of the store, each write attributed to the session,
        all in one transaction. Returns one line per change, saying what became of it (for the session's log).

        - A write to a file whose current digest is `base_sha256` (or a new file at a free path) is applied as a
          version like any other.
        - A write to a file someone else changed (or deleted) since the mount is still applied, as a new version
          by the session: the session is the last writer, so its content is current, and the other writer's
          version stays in the history. Nothing is lost.
        - A write that leaves the content as it is writes no version.
        - A delete whose base no longer matches the current content is skipped: the other writer's content is
          kept. A delete of a file that is already gone is skipped too.
        - A change whose path or content breaks the rules (corral.memory_paths) is skipped and reported.

        A rename in the sandbox arrives as a delete and a create, so the renamed memory gets a new id. The lead
        never calls this for an archived or read-only store; an archived one is refused all the same.
        """
        actor: Actor = {"type": "session_actor", "session_id": session_id}
        report: list[str] = []
        with self.db.write() as connection:
            store = self.store_in(connection, workspace, store_id)
            refuse_archived(store, "write session changes to")
            for change in changes:
                report.append(apply(connection, store.id, change, actor))
        return report

    def import_memories(self, workspace: str, store_id: str, items: Iterable[tuple[str, str]], actor: Actor) -> int:
        """Create many memories at once (each with its `created` version), in one transaction: for seeding a store
        and for the benchmark. A path already taken is a `MemoryConflict` and nothing is written."""
        checked = [(check_path(path), check_content(content)) for path, content in items]
        with self.db.write() as connection:
            store = self.store_in(connection, workspace, store_id)
            refuse_archived(store, "create memories in")
            memory_rows, version_rows = [], []
            moment, created_by = now(), json.dumps(actor)
            for path, content in checked:
                memory_id = new_record_id(MEMORY_ID_PREFIX.removesuffix("_"))
                version_id = new_record_id(MEMORY_VERSION_ID_PREFIX.removesuffix("_"))
                sha, size = content_sha256(content), len(content.encode("utf-8"))
                memory_rows.append((memory_id, store.id, path, content, sha, size, version_id, moment, moment))
                version_rows.append((version_id, store.id, memory_id, "created", path, content, sha, size, moment,
                                     created_by, actor_id(actor)))  # fmt: skip
            try:
                connection.executemany("INSERT INTO memories VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", memory_rows)
            except sqlite3.IntegrityError as exc:
                raise MemoryConflict(f"a path is given twice or already holds a memory: {exc}", PATH_TAKEN) from exc
            connection.executemany(INSERT_VERSION, version_rows)
        return len(checked)

    # ---- versions (corral.memory_versions) --------------------------------------------------------------------

    def list_versions(self, workspace: str, store_id: str, **filters: Any) -> Page[MemoryVersionRecord]:
        """See `MemoryVersions.list`."""
        return self.versions.list(workspace, store_id, **filters)

    def get_version(self, workspace: str, store_id: str, version_id: str, full: bool = True) -> MemoryVersionRecord:
        return self.versions.get(workspace, store_id, version_id, full)

    def redact_version(self, workspace: str, store_id: str, version_id: str, actor: Actor) -> MemoryVersionRecord:
        """See `MemoryVersions.redact`."""
        return self.versions.redact(workspace, store_id, version_id, actor)

    # ---- helpers ----------------------------------------------------------------------------------------------

    @staticmethod
    def store_in(connection: sqlite3.Connection, workspace: str, store_id: str) -> MemoryStoreRecord:
        """The store as `connection` reads it, in a transaction of the caller's; `MemoryStoreNotFound` as get_store."""
        row = connection.execute(
            "SELECT * FROM memory_stores WHERE id = ? AND workspace = ?", (store_id, workspace)
        ).fetchone()
        if row is None:
            raise MemoryStoreNotFound(store_id)
        return store_of(row)


def _bound(moment: datetime | None) -> str | None:
    return None if moment is None else stamp(moment)
