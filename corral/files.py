"""Files (`/v1/files`): a workspace's uploads and the files its sessions wrote, as metadata in the knowledge database
(corral.knowledge_db) and bytes in the blob store (corral.blobs).

Bytes are stored by their content, under `files/sha256/<hex>`: two files with the same bytes share one blob, and a
file's delete removes the blob only when no other file still uses it. Whether one does is decided inside one write
transaction, and an upload under way holds its blob with a pending row (`file_uploads`) from before it writes the
blob until its file row exists, so a delete racing an upload of the same bytes never removes the blob the upload
is about to name.

Limits (each refused with a clear message; the gateway maps them to the API's errors):

1. A workspace holds at most `quota_bytes` of files (`CORRAL_FILE_QUOTA_BYTES`, default 10 GiB), counted by each
   file's size (two files with equal bytes count twice, as the user sees them) and not counting expired files:
   past it, `StorageQuotaExceeded` (400 `storage_quota_exceeded`).
2. One file is at most `CORRAL_FILE_MAX_BYTES` (default 500 MiB): `FileTooLarge` (413).
3. A file may expire (`expires_at`). From then on it reads as `FileExpired` (404 `file_expired`), and a durable
   timer removes it (workflows/file_expiry.py, started by `corral.file_expiry.schedule_file_expiry`).

Every file is `downloadable` unless its maker says otherwise: uploads and the files sessions write are. The flag is
the library's, for a file that should only be mounted into sessions (none of corral's own makers sets it today).

Errors::

    FileError                 a file operation was refused
     ├── FileNotFound         no such file in the caller's workspace (another workspace's is the same)
     ├── FileExpired          the file's expiry time has passed (its timer removes it soon)
     ├── StorageQuotaExceeded the upload would take the workspace past its quota
     └── FileTooLarge         the upload is larger than one file may be
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from corral.blobs import BlobStore
from corral.knowledge_db import KnowledgeDB
from corral.names import ENV_FILE_MAX_BYTES, ENV_FILE_QUOTA_BYTES, FILE_ID_PREFIX
from corral.record_ids import new_record_id

DEFAULT_QUOTA_BYTES = 10 * 1024**3
"""The bytes of live files one workspace may hold, unless `CORRAL_FILE_QUOTA_BYTES` says otherwise."""
DEFAULT_MAX_FILE_BYTES = 500 * 1024**2
"""The largest file one upload may carry (upstream's 500 MB), unless `CORRAL_FILE_MAX_BYTES` says otherwise."""
MIN_EXPIRES_IN_SECONDS = 3600
MAX_EXPIRES_IN_SECONDS = 7_776_000
"""An upload's `expires_in_seconds`: from one hour to 90 days (upstream's bounds; the API and the CLI check them)."""
BLOB_PREFIX = "files/sha256/"
DEFAULT_MIME_TYPE = "application/octet-stream"
STALE_UPLOAD = timedelta(hours=6)
"""A pending upload older than this was abandoned (its process died): it no longer holds its blob or its quota."""
MAX_FILENAME_CHARS = 255

_TABLES = (
    """CREATE TABLE IF NOT EXISTS files (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        workspace TEXT NOT NULL,
        filename TEXT NOT NULL,
        mime_type TEXT NOT NULL,
        size_bytes INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        created_at TEXT NOT NULL,
        expires_at TEXT,
        downloadable INTEGER NOT NULL,
        scope_session_id TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS files_by_workspace ON files (workspace, seq)",
    "CREATE INDEX IF NOT EXISTS files_by_sha256 ON files (sha256)",
    """CREATE TABLE IF NOT EXISTS file_uploads (
        id TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        size_bytes INTEGER NOT NULL,
        started_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS file_uploads_by_sha256 ON file_uploads (sha256)",
)


class FileError(Exception):
    """A file operation was refused."""


class FileNotFound(FileError):
    """No such file in the caller's workspace (another workspace's file is not found either)."""


class FileExpired(FileError):
    """The file's expiry time has passed."""


class StorageQuotaExceeded(FileError):
    """The upload would take the workspace past its quota."""


class FileTooLarge(FileError):
    """The upload is larger than one file may be."""


def stamp(moment: datetime) -> str:
    """A time as stored and shown: UTC, microseconds, `Z` (one fixed width, so stored times compare as text)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def blob_key_of(sha256: str) -> str:
    return f"{BLOB_PREFIX}{sha256}"


def guess_mime_type(filename: str) -> str:
    """The type a file's name says (`notes.txt` -> text/plain), else application/octet-stream."""
    guessed, _ = mimetypes.guess_type(filename, strict=False)
    return guessed or DEFAULT_MIME_TYPE


def _env_bytes(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: a number of bytes, like {default}") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r}: at least 1 byte")
    return value


def quota_from_env(env: Mapping[str, str] | None = None) -> int:
    return _env_bytes(os.environ if env is None else env, ENV_FILE_QUOTA_BYTES, DEFAULT_QUOTA_BYTES)


def max_file_bytes_from_env(env: Mapping[str, str] | None = None) -> int:
    return _env_bytes(os.environ if env is None else env, ENV_FILE_MAX_BYTES, DEFAULT_MAX_FILE_BYTES)


@dataclass(frozen=True)
class FileRecord:
    """One file's metadata; its bytes are the blob `blob_key`."""

    id: str
    workspace: str
    filename: str
    mime_type: str
    size_bytes: int
    sha256: str
    blob_key: str
    created_at: datetime
    expires_at: datetime | None
    downloadable: bool
    scope_session_id: str | None

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or datetime.now(UTC))

    def view(self) -> dict[str, Any]:
        """The API's `file` object."""
        return {
            "type": "file",
            "id": self.id,
            "filename": self.filename,
            "mime_type": self.mime_type,
            "size_bytes": self.size_bytes,
            "created_at": stamp(self.created_at),
            "downloadable": self.downloadable,
            "expires_at": stamp(self.expires_at) if self.expires_at is not None else None,
            "scope": {"type": "session", "id": self.scope_session_id} if self.scope_session_id else None,
        }


def _record(row: Mapping[str, Any]) -> FileRecord:
    return FileRecord(
        id=row["id"], workspace=row["workspace"], filename=row["filename"], mime_type=row["mime_type"],
        size_bytes=row["size_bytes"], sha256=row["sha256"], blob_key=blob_key_of(row["sha256"]),
        created_at=parse_stamp(row["created_at"]),
        expires_at=parse_stamp(row["expires_at"]) if row["expires_at"] else None,
        downloadable=bool(row["downloadable"]), scope_session_id=row["scope_session_id"],
    )  # fmt: skip


class FileStore:
    """Files of every workspace, over one knowledge database and one blob store. Its methods block on the disk:
    callers on an event loop run them with `db.run` (a worker thread)."""

    def __init__(
        self,
        db: KnowledgeDB,
        blobs: BlobStore,
        quota_bytes: int | None = None,
        max_file_bytes: int | None = None,
    ) -> None:
        self.db = db
        self.blobs = blobs
        self.quota_bytes = quota_bytes if quota_bytes is not None else quota_from_env()
        """A workspace's most bytes of live files (default: `CORRAL_FILE_QUOTA_BYTES`, else 10 GiB)."""
        self.max_file_bytes = max_file_bytes if max_file_bytes is not None else max_file_bytes_from_env()
        db.migrate("files", _TABLES)

    # ---- writes -------------------------------------------------------------------------------------------------

    def create(
        self,
        workspace: str,
        filename: str,
        data: bytes,
        mime_type: str | None = None,
        *,
        expires_at: datetime | None = None,
        scope_session_id: str | None = None,
        downloadable: bool = True,
    ) -> FileRecord:
        """Store `data` as a new file of `workspace` (its type guessed from `filename` when not given)."""
        if len(data) > self.max_file_bytes:
            raise FileTooLarge(f"the file is {len(data)} bytes; one file may be at most {self.max_file_bytes} bytes")
        filename = filename[:MAX_FILENAME_CHARS] or "unnamed"
        sha256 = hashlib.sha256(data).hexdigest()
        now = datetime.now(UTC)
        upload_id = new_record_id("upload")
        with self.db.write() as connection:  # the quota, and the blob held before it is written
            used = self._used(connection, workspace, now)
            if used + len(data) > self.quota_bytes:
                raise StorageQuotaExceeded(
                    f"workspace {workspace!r} holds {used} bytes of files; {len(data)} more would pass its quota of "
                    f"{self.quota_bytes} bytes: delete files first"
                )
            connection.execute("INSERT INTO file_uploads VALUES (?, ?, ?, ?, ?)",
                               (upload_id, workspace, sha256, len(data), stamp(now)))  # fmt: skip
        try:
            self.blobs.put(blob_key_of(sha256), data)  # the same bytes again is harmless (the same key)
        except BaseException:
            with self.db.write() as connection:
                connection.execute("DELETE FROM file_uploads WHERE id = ?", (upload_id,))
            raise
        row = {
            "id": new_record_id(FILE_ID_PREFIX.removesuffix("_")), "workspace": workspace, "filename": filename,
            "mime_type": mime_type or guess_mime_type(filename), "size_bytes": len(data), "sha256": sha256,
            "created_at": stamp(now), "expires_at": stamp(expires_at) if expires_at is not None else None,
            "downloadable": int(downloadable), "scope_session_id": scope_session_id,
        }  # fmt: skip
        with self.db.write() as connection:
            connection.execute(f"INSERT INTO files ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                               tuple(row.values()))  # fmt: skip
            connection.execute("DELETE FROM file_uploads WHERE id = ?", (upload_id,))
        return _record(row)

    def delete(self, workspace: str, file_id: str) -> FileRecord:
        """Remove a file (expired or not), and its blob when no other file uses it; FileNotFound if there is none."""
        with self.db.write() as connection:
            row = connection.execute("SELECT * FROM files WHERE id = ? AND workspace = ?",
                                     (file_id, workspace)).fetchone()  # fmt: skip
            if row is None:
                raise FileNotFound(f"file {file_id!r} was not found")
            record = _record(row)
            connection.execute("DELETE FROM files WHERE id = ?", (file_id,))
            if not self._blob_in_use(connection, record.sha256):
                self.blobs.delete(record.blob_key)  # inside the transaction: no upload can claim it meanwhile
        return record

    def expire(self, file_id: str, now: datetime | None = None) -> FileRecord | None:
        """Remove the file if its expiry time has passed (its timer's work); None if it is gone or not yet due."""
        with self.db.read() as connection:
            row = connection.execute("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None or not _record(row).expired(now):
            return None
        try:
            return self.delete(row["workspace"], file_id)
        except FileNotFound:
            return None

    # ---- reads --------------------------------------------------------------------------------------------------

    def get(self, workspace: str, file_id: str) -> FileRecord:
        """The file, if it is `workspace`'s (else FileNotFound) and has not expired (else FileExpired)."""
        with self.db.read() as connection:
            row = connection.execute("SELECT * FROM files WHERE id = ? AND workspace = ?",
                                     (file_id, workspace)).fetchone()  # fmt: skip
        if row is None:
            raise FileNotFound(f"file {file_id!r} was not found")
        record = _record(row)
        if record.expired():
            raise FileExpired(f"file {file_id!r} expired at {stamp(record.expires_at or record.created_at)}")
        return record

    def read(self, record: FileRecord) -> bytes:
        return self.blobs.get(record.blob_key)

    def list(
        self,
        workspace: str,
        *,
        limit: int = 20,
        before: int | None = None,
        scope_session_id: str | None = None,
        ids: Sequence[str] | None = None,
    ) -> tuple[list[FileRecord], int | None]:
        """A page of the workspace's live files, newest first, from before the position `before`; and the position
        the next page starts before (None: this is the last). With `ids`, those of them that exist."""
        clauses = ["workspace = ?", "(expires_at IS NULL OR expires_at > ?)"]
        values: list[Any] = [workspace, stamp(datetime.now(UTC))]
        if before is not None:
            clauses.append("seq < ?")
            values.append(before)
        if scope_session_id is not None:
            clauses.append("scope_session_id = ?")
            values.append(scope_session_id)
        if ids is not None:
            if not ids:
                return [], None
            clauses.append(f"id IN ({', '.join('?' * len(ids))})")
            values += list(ids)
        query = f"SELECT * FROM files WHERE {' AND '.join(clauses)} ORDER BY seq DESC LIMIT ?"
        with self.db.read() as connection:
            rows = connection.execute(query, (*values, limit + 1)).fetchall()
        more = len(rows) > limit
        return [_record(row) for row in rows[:limit]], rows[limit - 1]["seq"] if more else None

    def used_bytes(self, workspace: str) -> int:
        """The bytes the workspace's live files (and its uploads under way) count against its quota."""
        with self.db.read() as connection:
            return self._used(connection, workspace, datetime.now(UTC))

    def blob_users(self, sha256: str) -> int:
        """How many files use the blob of these bytes (what a delete decides by)."""
        with self.db.read() as connection:
            found = connection.execute("SELECT COUNT(*) FROM files WHERE sha256 = ?", (sha256,)).fetchone()
        return int(found[0])

    # ---- in a transaction ---------------------------------------------------------------------------------------

    @staticmethod
    def _used(connection: Any, workspace: str, now: datetime) -> int:
        files = connection.execute(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM files WHERE workspace = ? "
            "AND (expires_at IS NULL OR expires_at > ?)",
            (workspace, stamp(now)),
        ).fetchone()[0]
        pending = connection.execute(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM file_uploads WHERE workspace = ? AND started_at > ?",
            (workspace, stamp(now - STALE_UPLOAD)),
        ).fetchone()[0]
        return int(files) + int(pending)

    @staticmethod
    def _blob_in_use(connection: Any, sha256: str) -> bool:
        fresh = stamp(datetime.now(UTC) - STALE_UPLOAD)
        used = connection.execute(
            "SELECT EXISTS (SELECT 1 FROM files WHERE sha256 = ?) "
            "OR EXISTS (SELECT 1 FROM file_uploads WHERE sha256 = ? AND started_at > ?)",
            (sha256, sha256, fresh),
        ).fetchone()[0]
        return bool(used)
