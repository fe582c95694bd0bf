"""Records: the durable, versioned objects the gateway serves (agents, environments, vaults, API keys), one
`RecordWorkflow` per object (workflows/records.py), read and written through `corral.records.Records`.

Persisted schemas: add optional fields, never repurpose one. A record's `body` is the object's JSON as the API
shows it, minus its id, version and timestamps, which the workflow owns.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from pydantic import BaseModel, Field

RECORD_WORKFLOW: Final = "RecordWorkflow"
UPDATE_PUT: Final = "put"
UPDATE_ARCHIVE: Final = "archive"
UPDATE_DELETE: Final = "delete"
QUERY_GET: Final = "get"
QUERY_VERSIONS: Final = "versions"

# Search attributes (keyword) that list records through Temporal visibility; registered in corral.temporal.
SEARCH_ATTRIBUTE_KIND: Final = "CorralKind"
SEARCH_ATTRIBUTE_WORKSPACE: Final = "CorralWorkspace"
SEARCH_ATTRIBUTE_ARCHIVED: Final = "CorralArchived"
""""true" once the record is archived or deleted, else "false": listings leave archived records out by default."""
RECORD_SEARCH_ATTRIBUTES: Final = (SEARCH_ATTRIBUTE_KIND, SEARCH_ATTRIBUTE_WORKSPACE, SEARCH_ATTRIBUTE_ARCHIVED)

# The error types of a rejected update or query (ApplicationError.type), CamelCase as every corral error type;
# corral.records maps them to its exceptions. Raised by validators and queries, so they are never in history.
VERSION_CONFLICT: Final = "VersionConflict"
ARCHIVED: Final = "RecordArchived"
DELETED: Final = "RecordDeleted"
NO_SUCH_VERSION: Final = "NoSuchVersion"
FORMER_ERROR_TYPES: Final = {
    "version_conflict": VERSION_CONFLICT,
    "archived": ARCHIVED,
    "deleted": DELETED,
    "no_such_version": NO_SUCH_VERSION,
}
"""The snake_case types these had before, read as their names now (a harness build still pinned to running records
raises them to a newer reader)."""

WORKSPACE_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,62}$"
KIND_PATTERN: Final = r"^[a-z][a-z0-9_]{0,31}$"
ID_PREFIX_PATTERN: Final = r"[a-z][a-z0-9_]{0,31}"
ID_SUFFIX_LENGTH: Final = 26
ID_ALPHABET: Final = "0123456789abcdefghjkmnpqrstvwxyz"
"""Crockford's base32, lower case (a ULID's alphabet): no i, l, o, u, so an id read aloud is not misread."""
RECORD_ID_PATTERN: Final = rf"^(?P<prefix>{ID_PREFIX_PATTERN})_[{ID_ALPHABET}]{{{ID_SUFFIX_LENGTH}}}$"

MAX_UPDATES_PER_RUN: Final = 500
"""Updates a record's run takes before it continues as new (well under Temporal's 2,000 per run); the next run
carries every version, so a long-lived record's history stays short."""


class RecordVersion(BaseModel):
    """One version of a record's body. `updated_at` moves past `created_at` when the record is archived."""

    version: int = Field(ge=1)
    body: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class RecordCarry(BaseModel):
    """What a run hands to the next when it continues as new."""

    versions: list[RecordVersion] = Field(min_length=1)
    archived_at: datetime | None = None


class RecordInput(BaseModel):
    """The start input of a `RecordWorkflow`: a new record's first version (or, with `carry`, a continued one)."""

    kind: str = Field(pattern=KIND_PATTERN)
    workspace: str = Field(pattern=WORKSPACE_PATTERN)
    body: dict[str, Any]
    carry: RecordCarry | None = None


class PutRecord(BaseModel):
    """A new body; with `expected_version`, only if the record is still at that version (optimistic concurrency)."""

    expected_version: int | None = Field(default=None, ge=1)
    body: dict[str, Any]


class RecordView(BaseModel):
    """One version of a record as readers see it. `created_at` is the record's (its first version's);
    `updated_at` is this version's. `deleted` is only ever true when read from a deleted record's last run:
    `corral.records` turns that into `RecordNotFound`."""

    id: str
    kind: str
    workspace: str
    version: int
    body: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    archived_at: datetime | None = None
    deleted: bool = False
