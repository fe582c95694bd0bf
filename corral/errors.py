"""Errors of `corral`, the ground every role stands on, as types of corral's own.

The hierarchy, so callers catch exactly as much as they mean to::

    SessionEnded                 the session's workflow closed (failed, terminated, timed out, cancelled): it takes
     │                           no more events; its log, where it has one, can still be read
     └── SessionStartFailed      the run's start input was refused: it never had a log, so nothing can be read
    BlobStoreError               the blob store (corral.blobs) is misconfigured or a blob is missing
     └── BlobNotFound            no blob has this key, or no blob could
    MissingBlobError             a payload refers to a blob that is not in the store (corral.converter)
    HandRegistryError            a hand registry (corral.hand_registry) operation was refused
     ├── InvalidHandQueue        a queue that can never be registered (also a ValueError)
     └── HandNotRegistered       no registration of this queue

    RecordError                  a record operation (corral.records) failed
     ├── RecordNotFound          no such record in the caller's workspace
     ├── VersionConflict         the write named a version that is no longer current; nothing was written
     ├── RecordArchived          the record is archived; nothing was written
     └── InvalidRecord           a malformed workspace, kind, id prefix or cursor (also a ValueError)
    SessionClosed                the session's workflow closed while its events were followed (corral.reading)

    SkillError                   a skill operation (corral.skills) was refused
     ├── InvalidSkillBundle      the uploaded files are not a skill's folder (also a ValueError)
     ├── SkillNotFound           no such skill or version in the caller's workspace
     └── SkillConflict           the skill's state forbids it (deleting its only version)

The error types that cross from activities to workflows are in `corral.contract.errors`.

Sessions' ends: Temporal says such things in its own terms, or not at all: an update to a closed workflow is
"workflow execution already completed" (NOT_FOUND, which reads as "no such session"), and a query on a run whose
start input did not decode fails inside the worker with "Expected workflow input. This is a Python SDK bug."
`corral.client` is the one choke point that turns these into `SessionEnded` and `SessionStartFailed`, read from
the workflow's own close event, so that every reader (the CLI, the gateway, a script) says what happened and when.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from temporalio.client import WorkflowExecutionStatus


class SessionEnded(Exception):
    """The session's workflow has closed: how (`how`: failed, terminated, timed_out, canceled, completed), when
    (`at`) and why (`reason`: the failure's message, the terminate reason, or empty)."""

    def __init__(self, session_id: str, how: str, at: datetime | None, reason: str = "") -> None:
        self.session_id, self.how, self.at, self.reason = session_id, how, at, reason
        super().__init__(self.describe())

    def describe(self) -> str:
        when = f" at {format_time(self.at)}" if self.at is not None else ""
        verb = {
            "failed": "failed",
            "terminated": "was terminated",
            "timed_out": "timed out (its workflow execution timeout passed)",
            "canceled": "was cancelled",
            "completed": "ended",
        }.get(self.how, self.how)
        return f"session {self.session_id} {verb}{when}" + (f": {self.reason}" if self.reason else "")


class SessionStartFailed(SessionEnded):
    """The session's run failed at its start because its input was refused (it did not fit `SessionInput`): it
    never ran, so it has no log, and a query cannot be answered (the worker cannot rebuild it)."""

    def describe(self) -> str:
        when = f" ({format_time(self.at)})" if self.at is not None else ""
        return f"session {self.session_id} failed at start{when}: its start input was refused: {self.reason}"


class BlobStoreError(Exception):
    """The store is misconfigured or a blob is missing; the message says which."""


class BlobNotFound(BlobStoreError):
    """No blob has this key, or no blob could (a key corral never writes); the store itself answered."""


class MissingBlobError(RuntimeError):
    """A payload referred to a blob that is not in the store (corral.blobs.missing_blob).

    Not an ApplicationError on purpose: a signal carrying one is dropped and an update rejected, as for any input
    that does not decode, while a workflow task that decodes an activity result or a run's input this way fails and
    is retried (the blob may be in a store this worker does not see: a misconfiguration to fix, not a session to end).
    """


class HandRegistryError(Exception):
    """Any refusal of a registry operation."""


class InvalidHandQueue(HandRegistryError, ValueError):
    """A queue that can never be registered: corral's own, Temporal's, or a name outside `HAND_QUEUE_PATTERN`."""


class HandNotRegistered(HandRegistryError):
    """No registration of this queue (it never was registered)."""


def format_time(moment: datetime) -> str:
    """A close time as people read it, in UTC (a server's and a reader's local times differ)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class RecordError(Exception):
    """Any failure of a record operation that corral.records reports as its own."""


class RecordNotFound(RecordError):
    """No such record in the caller's workspace (never existed, deleted, another workspace's, or a malformed id)."""


class VersionConflict(RecordError):
    """The write named a version that is no longer the current one; nothing was written."""


class RecordArchived(RecordError):
    """The record is archived: it can no longer change; nothing was written."""


class InvalidRecord(RecordError, ValueError):
    """A workspace name, kind, id prefix or page cursor that does not fit its pattern: the caller's mistake."""


class SessionClosed(Exception):
    """The session's workflow closed (completed, failed, terminated …): nothing more will be written to its log."""

    def __init__(self, session_id: str, status: WorkflowExecutionStatus) -> None:
        super().__init__(f"the workflow of session {session_id} closed ({status.name.lower()})")
        self.status = status


class SkillError(Exception):
    """Any refusal of a skill operation (corral.skills); the message says what to change."""


class InvalidSkillBundle(SkillError, ValueError):
    """The uploaded files are not one skill's folder: no `SKILL.md` at its root, bad frontmatter, a path that
    leaves the folder, too many or too large files, or none."""


class SkillNotFound(SkillError):
    """No such skill, or no such version of it, in the caller's workspace (another workspace's is not found too).
    `kind` is "skill" or "skill version" and `object_id` the id (or version) that was asked for."""

    def __init__(self, kind: str, object_id: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.object_id = kind, object_id


class SkillConflict(SkillError):
    """The skill's current state forbids the change (its only version cannot be deleted: delete the skill)."""
