"""The embedded database of what outlives a session: files' metadata, skills and their versions, memory stores,
their memories and every memory's versions. Bytes (a file's content, a skill's bundle) are in the blob store
(corral.blobs); this holds what is looked up, listed and written under a precondition.

Locally it is one SQLite file, `knowledge.db` in the state dir (`CORRAL_KNOWLEDGE_DB` names another), in WAL mode:
the gateway and the workers of `corral up` open the same file, readers never wait for a writer, and writers take
turns (`write()` begins IMMEDIATE, so two writers never both read-then-write the same row). It lives in the state
dir, so it survives `corral down` / `corral up` like Temporal's own database. In production the same tables go to
Postgres (docs/knowledge.md); nothing outside the `corral.*` stores that own the tables runs SQL.

Each store module owns its tables and creates them with `migrate(name, statements)`: `CREATE … IF NOT EXISTS`,
run once per process and database.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from corral.names import ENV_KNOWLEDGE_DB, ENV_STATE_DIR

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000
"""How long a writer waits for another's transaction to end before SQLite says `database is locked`."""


def knowledge_db_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    named = env.get(ENV_KNOWLEDGE_DB)
    if named:
        return Path(named).expanduser().absolute()
    return (Path(env.get(ENV_STATE_DIR) or ".corral") / "knowledge.db").expanduser().absolute()


class KnowledgeDB:
    """One SQLite database, with a connection per thread (sqlite3 connections stay in the thread that made them)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._migrated: set[str] = set()
        self._migrate_lock = threading.Lock()

    def connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            connection.row_factory = sqlite3.Row
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute("PRAGMA foreign_keys=ON")
            connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._local.connection = connection
        return connection

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One transaction that holds the write lock from its first statement: all of it is written, or none."""
        connection = self.connection()
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One consistent snapshot for several reads."""
        connection = self.connection()
        connection.execute("BEGIN")
        try:
            yield connection
        finally:
            connection.execute("COMMIT")

    def migrate(self, name: str, statements: Sequence[str]) -> None:
        """Create one store's tables and indexes (idempotent statements), once per process."""
        with self._migrate_lock:
            if name in self._migrated:
                return
            with self.write() as connection:
                for statement in statements:
                    connection.execute(statement)
            self._migrated.add(name)

    async def run(self, function: Callable[..., T], *args: object) -> T:
        """`function(*args)` on a worker thread: the event loop never waits on the disk."""
        return await asyncio.to_thread(function, *args)


_opened: dict[Path, KnowledgeDB] = {}
_opened_lock = threading.Lock()


def open_knowledge_db(path: Path | None = None) -> KnowledgeDB:
    """The database at `path` (default: `knowledge_db_path()`), one object per path in a process."""
    resolved = (path or knowledge_db_path()).expanduser().absolute()
    with _opened_lock:
        if resolved not in _opened:
            _opened[resolved] = KnowledgeDB(resolved)
        return _opened[resolved]
