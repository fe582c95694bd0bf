"""The operator's registry of hands: which task queues serve hands, and which workspaces may use each.

A hand is any worker serving the `execute` activity on a task queue (corral.hands). An agent made over the HTTP
API may declare `{"type": "hand", "task_queue": ...}` only for a queue registered here for its workspace, so an
API key cannot send work to another tenant's tool workers or to a queue it merely guessed. Only the operator
writes this registry (`corral hand register|revoke`, cli/hands.py); the gateway only reads it. A Temporal-client
user who starts a `SessionWorkflow` directly is the operator and is not bound by it; corral's own queues
(`corral.names.reserved_task_queue`) are refused to everyone, by the contract itself.

Each registered queue is one record (corral.records) of kind `hand`, whose id is derived from the queue's name,
so a check is one read of one record by id: consistent the moment a registration returns (no listing, which
Temporal visibility shows only a moment later), and the same for every gateway. Every change is a new version of
the record, so its history says who could use the queue when. A revoked queue keeps its record with no workspace;
registering it again opens it again. The records sit in `OPERATOR_WORKSPACE`, which no gateway route reads: the
gateway reads them by id and kind, never by workspace.
"""

from __future__ import annotations

import hashlib
import re

from pydantic import BaseModel, Field
from temporalio.exceptions import WorkflowAlreadyStartedError

from corral import names
from corral.contract.records import ID_ALPHABET, ID_SUFFIX_LENGTH, RecordView
from corral.errors import HandNotRegistered, HandRegistryError, InvalidHandQueue
from corral.names import OPERATOR_WORKSPACE, reserved_task_queue_problem
from corral.records import RecordNotFound, Records, VersionConflict, check_workspace

HAND_KIND = "hand"
HAND_ID_PREFIX = names.HAND_ID_PREFIX.removesuffix("_")
"""The prefix `Records.create` takes (it adds the `_`)."""
HAND_QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
"""A registrable queue name: letters, digits, `.`, `_` and `-`, at most 200 characters."""
WRITE_ATTEMPTS = 3

_HAND_QUEUE = re.compile(HAND_QUEUE_PATTERN)


class HandRegistration(BaseModel):
    """A registered hand queue (the record's body): who may use it. No workspace and not `all_workspaces`: revoked."""

    task_queue: str
    workspaces: list[str] = Field(default_factory=list)
    all_workspaces: bool = False

    def allows(self, workspace: str) -> bool:
        return self.all_workspaces or workspace in self.workspaces

    @property
    def revoked(self) -> bool:
        return not self.all_workspaces and not self.workspaces


def hand_queue_problem(queue: str) -> str | None:
    """Why `queue` can never be registered as a hand, or None when it can."""
    reserved = reserved_task_queue_problem(queue)
    if reserved is not None:
        return reserved
    if not _HAND_QUEUE.match(queue):
        return (
            f"{queue[:200]!r} is not a hand queue name: 1-200 letters, digits, '.', '_' and '-', starting with a "
            "letter or digit"
        )
    return None


def hand_record_id(queue: str) -> str:
    """The registry record of `queue`: `hand_` and 26 characters of the SHA-256 of its name (a record id's shape)."""
    value = int.from_bytes(hashlib.sha256(queue.encode("utf-8")).digest(), "big")
    return f"{HAND_ID_PREFIX}_" + "".join(ID_ALPHABET[(value >> (5 * i)) & 31] for i in range(ID_SUFFIX_LENGTH))


async def hand_registration(records: Records, queue: str) -> HandRegistration | None:
    """The registration of `queue` (a revoked one too), or None when it was never registered."""
    view = await _read(records, queue)
    return _registration(view) if view is not None else None


async def hand_refusal(records: Records, workspace: str, queue: str) -> str | None:
    """Why `workspace` may not declare a hand on `queue`, or None when it may. The same words whether the queue is
    unregistered or another workspace's: a tenant learns nothing about which queues exist."""
    problem = reserved_task_queue_problem(queue)
    if problem is not None:
        return problem
    registration = await hand_registration(records, queue) if _HAND_QUEUE.match(queue) else None
    if registration is None or not registration.allows(workspace):
        return (
            f"{queue[:200]!r} is not a hand queue registered for this workspace (the operator registers hands: "
            "`corral hand register QUEUE --workspace NAME`)"
        )
    return None


async def register_hand(
    records: Records, queue: str, workspaces: list[str], *, all_workspaces: bool = False
) -> HandRegistration:
    """Register `queue` for `workspaces` (added to those it already has), or for every workspace. A revoked queue
    is opened again."""
    problem = hand_queue_problem(queue)
    if problem is not None:
        raise InvalidHandQueue(problem)
    for workspace in workspaces:
        check_workspace(workspace)
    if not workspaces and not all_workspaces:
        raise InvalidHandQueue("name at least one workspace that may use the hand, or every workspace")
    for _ in range(WRITE_ATTEMPTS):
        view = await _read(records, queue)
        if view is None:
            body = HandRegistration(task_queue=queue, workspaces=sorted(set(workspaces)), all_workspaces=all_workspaces)
            try:
                created = await records.create(
                    HAND_KIND, OPERATOR_WORKSPACE, body.model_dump(), HAND_ID_PREFIX, record_id=hand_record_id(queue)
                )
            except WorkflowAlreadyStartedError:
                continue  # registered meanwhile by another operator: add to theirs
            return _registration(created)
        current = _registration(view)
        changed = current.model_copy(
            update={
                "workspaces": sorted(set(current.workspaces) | set(workspaces)),
                "all_workspaces": current.all_workspaces or all_workspaces,
            }
        )
        written = await _write(records, view, changed)
        if written is not None:
            return written
    raise VersionConflict(f"the registration of {queue!r} kept changing while it was being written")


async def revoke_hand(records: Records, queue: str, workspaces: list[str] | None = None) -> HandRegistration:
    """Take `queue` from `workspaces`, or from every workspace (None): their agents and sessions can no longer use
    it. `HandNotRegistered` for a queue never registered."""
    for workspace in workspaces or []:
        check_workspace(workspace)
    for _ in range(WRITE_ATTEMPTS):
        view = await _read(records, queue)
        if view is None:
            raise HandNotRegistered(queue)
        current = _registration(view)
        if workspaces is None:
            changed = current.model_copy(update={"workspaces": [], "all_workspaces": False})
        elif current.all_workspaces:
            raise HandRegistryError(
                f"{queue!r} is registered for every workspace: revoke it whole, then register the workspaces that "
                "keep it"
            )
        else:
            changed = current.model_copy(update={"workspaces": sorted(set(current.workspaces) - set(workspaces))})
        written = await _write(records, view, changed)
        if written is not None:
            return written
    raise VersionConflict(f"the registration of {queue!r} kept changing while it was being written")


async def list_hands(records: Records) -> list[tuple[HandRegistration, RecordView]]:
    """Every registered queue (revoked ones too), by name, with its record (for its times). Read through Temporal
    visibility: a queue registered a moment ago may be missing yet, though the registration is in force."""
    found: list[RecordView] = []
    page: str | None = None
    while True:
        views, page = await records.list_any_workspace(HAND_KIND, include_archived=True, limit=100, page=page)
        found += views
        if page is None:
            break
    return sorted(((_registration(view), view) for view in found), key=lambda pair: pair[0].task_queue)


async def _read(records: Records, queue: str) -> RecordView | None:
    try:
        view = await records.get_any(hand_record_id(queue), kind=HAND_KIND)
    except RecordNotFound:
        return None
    return view if view.body.get("task_queue") == queue else None  # never another queue's, however unlikely


async def _write(records: Records, view: RecordView, changed: HandRegistration) -> HandRegistration | None:
    """Write `changed` over `view` if nothing changed it meanwhile; None when something did (read it again)."""
    try:
        written = await records.put(view.id, view.workspace, changed.model_dump(), view.version, kind=HAND_KIND)
    except VersionConflict:
        return None
    return _registration(written)


def _registration(view: RecordView) -> HandRegistration:
    return HandRegistration.model_validate(view.body)
