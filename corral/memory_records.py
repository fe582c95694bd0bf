"""What the memory stores library (corral.memory_stores) hands out: its records, their API views, its page cursors,
the actors a write is attributed to, and its errors.

Errors::

    MemoryStoreError                  anything the library refuses
    ├── MemoryObjectNotFound          no such object in the workspace (404; another workspace's is the same)
    │   ├── MemoryStoreNotFound
    │   ├── MemoryNotFound
    │   └── MemoryVersionNotFound
    ├── InvalidMemoryRequest          a bad value, or a write to an archived store (400)
    └── MemoryConflict                a path taken, or a precondition that does not hold (409, final)
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Actor = dict[str, str]
"""Who wrote a version: `{"type": "api_actor", "api_key_id"}`, `{"type": "session_actor", "session_id"}` or
`{"type": "user_actor", "user_id"}` (the API's `created_by` / `redacted_by`)."""

PRECONDITION_FAILED = "memory_precondition_failed"
PATH_TAKEN = "memory_path_conflict"


class MemoryStoreError(Exception):
    """Anything the memory stores library refuses."""


class MemoryObjectNotFound(MemoryStoreError):
    """No such object in the caller's workspace: a missing one and another workspace's are the same."""

    kind = "memory object"

    def __init__(self, object_id: str) -> None:
        super().__init__(f"{self.kind} {object_id!r} was not found")
        self.object_id = object_id


class MemoryStoreNotFound(MemoryObjectNotFound):
    """No such memory store."""

    kind = "memory store"


class MemoryNotFound(MemoryObjectNotFound):
    """No such memory in the store."""

    kind = "memory"


class MemoryVersionNotFound(MemoryObjectNotFound):
    """No such memory version in the store."""

    kind = "memory version"


class InvalidMemoryRequest(MemoryStoreError):
    """A value the rules refuse, or a write the store's state refuses (archived)."""


class MemoryConflict(MemoryStoreError):
    """A write that cannot apply as asked and will not by retrying: the path is taken, or the memory's content is
    not the one the caller's precondition names."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def api_actor(api_key_id: str) -> Actor:
    return {"type": "api_actor", "api_key_id": api_key_id}


def session_actor(session_id: str) -> Actor:
    return {"type": "session_actor", "session_id": session_id}


def user_actor(user_id: str) -> Actor:
    return {"type": "user_actor", "user_id": user_id}


def actor_id(actor: Actor) -> str:
    """The one id an actor carries (its key, session or user), which version listings filter by."""
    return next(value for key, value in actor.items() if key != "type")


def now() -> str:
    """The current time as stored: fixed-width UTC RFC 3339 with microseconds, so text order is time order."""
    return stamp(datetime.now(UTC))


def stamp(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise InvalidMemoryRequest("a time bound needs a time zone")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class MemoryStoreRecord:
    id: str
    workspace: str
    name: str
    description: str
    metadata: dict[str, str]
    created_at: str
    updated_at: str
    archived_at: str | None

    def view(self) -> dict[str, Any]:
        """The API's `memory_store` object."""
        return {
            "type": "memory_store",
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "metadata": dict(self.metadata),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "archived_at": self.archived_at,
        }


@dataclass(frozen=True)
class MemoryRecord:
    id: str
    memory_store_id: str
    path: str
    content: str | None
    """None when read without content (a basic listing)."""
    content_sha256: str
    content_size_bytes: int
    memory_version_id: str
    created_at: str
    updated_at: str

    def view(self, full: bool) -> dict[str, Any]:
        """The API's `memory` object; `full` includes the content (view=full), else it is null."""
        return {
            "type": "memory",
            "id": self.id,
            "memory_store_id": self.memory_store_id,
            "path": self.path,
            "content": self.content if full else None,
            "content_sha256": self.content_sha256,
            "content_size_bytes": self.content_size_bytes,
            "memory_version_id": self.memory_version_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True)
class MemoryPrefix:
    """A listing's roll-up of the memories deeper than its `depth` under `path` (which ends in `/`)."""

    path: str

    def view(self, full: bool = False) -> dict[str, Any]:
        return {"type": "memory_prefix", "path": self.path}


@dataclass(frozen=True)
class MemoryVersionRecord:
    id: str
    memory_id: str
    memory_store_id: str
    operation: str
    path: str | None
    content: str | None
    content_sha256: str | None
    content_size_bytes: int | None
    created_at: str
    created_by: Actor | None
    redacted_at: str | None
    redacted_by: Actor | None

    def view(self, full: bool) -> dict[str, Any]:
        """The API's `memory_version` object: content only with `full`; a redacted version's path, content, digest
        and size are null, as a deleted version's content, digest and size are."""
        return {
            "type": "memory_version",
            "id": self.id,
            "memory_id": self.memory_id,
            "memory_store_id": self.memory_store_id,
            "operation": self.operation,
            "path": self.path,
            "content": self.content if full else None,
            "content_sha256": self.content_sha256,
            "content_size_bytes": self.content_size_bytes,
            "created_at": self.created_at,
            "created_by": self.created_by,
            "redacted_at": self.redacted_at,
            "redacted_by": self.redacted_by,
        }


@dataclass(frozen=True)
class MemorySnapshot:
    """A current memory as a session's sandbox is given it (`MemoryStores.export`)."""

    path: str
    content: str
    content_sha256: str


@dataclass(frozen=True)
class MemoryChange:
    """What a session did to one file of a mounted store (`MemoryStores.apply_session_changes`): `base_sha256` is the
    digest it was given at mount (None: it made the file), `content` None means it deleted the file."""

    path: str
    base_sha256: str | None
    content: str | None


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing: `next_page` is the cursor of the next one, None at the end."""

    data: list[T] = field(default_factory=list)
    next_page: str | None = None


def cursor(kind: str, position: list[str]) -> str:
    """An opaque page cursor: which listing gave it, and where its page ended."""
    return base64.urlsafe_b64encode(json.dumps([kind, *position]).encode()).decode()


def position_of(page: str, kind: str, size: int) -> list[str]:
    """The position a cursor of listing `kind` holds (`size` strings), or `InvalidMemoryRequest`."""
    try:
        decoded = json.loads(base64.urlsafe_b64decode(page.encode()).decode())
    except (ValueError, UnicodeError) as exc:
        raise InvalidMemoryRequest("page: not a cursor this list gave") from exc
    if (
        not isinstance(decoded, list)
        or len(decoded) != size + 1
        or decoded[0] != kind
        or not all(isinstance(part, str) for part in decoded)
    ):
        raise InvalidMemoryRequest("page: not a cursor this list gave")
    return decoded[1:]
