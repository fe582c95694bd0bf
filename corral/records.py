"""Durable, versioned records through Temporal: the client side of `RecordWorkflow` (workflows/records.py), for
the gateway and the CLI. One workflow per object; its id is the object's id.

Every read and write names the caller's workspace, and a record of another workspace is `RecordNotFound`, exactly
like one that never existed or was deleted: an id never reveals, across workspaces, that it exists.

Errors (defined with the record ids in corral.record_ids, raised here, and imported from here)::

    RecordError
    ├── RecordNotFound      no such record, a deleted one, another workspace's, or an id that is not a record id
    ├── VersionConflict     a write that named a version which is no longer the current one; nothing was written
    ├── RecordArchived      a write to an archived record; nothing was written
    └── InvalidRecord       (also a ValueError) a workspace, kind, id prefix or page cursor the caller got wrong

Listings go through Temporal visibility, which the server updates a moment after a write: a record just created,
archived or deleted may be missing from, or still in, a listing made right after. Every item a listing returns is
read from its workflow (a query), so what it shows of an item is current, and an item deleted or archived meanwhile
is left out. Record ids start with their creation time (as a ULID does), so listings sort by id: newest first, the
same order across a record's continue-as-new, and a page cursor (the last id seen) never repeats or skips an item
when records are created between pages. A listing reads the ids of every matching record from visibility (ids
only) to sort them: fine for the thousands of objects of one workspace, not for millions.

A listing bounded by creation time keeps the records whose `created_at` is within the bounds. That time is the
workflow's (its first task's, carried across continue-as-new), which visibility does not have: a run's StartTime is
the run's, later than the record's creation after a continue-as-new. So the time in the id narrows which records
are read (those within `CREATION_TIME_SLACK` of the bounds) and `created_at`, read from each, decides; a page is
filled past the records it leaves out, and its cursor is still the last id it looked at.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from datetime import datetime, timedelta
from typing import Any, Literal, TypeAlias, TypeVar

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from corral.contract.records import (
    ARCHIVED,
    DELETED,
    FORMER_ERROR_TYPES,
    QUERY_GET,
    QUERY_VERSIONS,
    RECORD_WORKFLOW,
    SEARCH_ATTRIBUTE_ARCHIVED,
    SEARCH_ATTRIBUTE_KIND,
    SEARCH_ATTRIBUTE_WORKSPACE,
    UPDATE_ARCHIVE,
    UPDATE_DELETE,
    UPDATE_PUT,
    VERSION_CONFLICT,
    PutRecord,
    RecordInput,
    RecordView,
)
from corral.contract.search_attributes import ARCHIVED_KEY, KIND_KEY, WORKSPACE_KEY
from corral.names import HARNESS_TASK_QUEUE
from corral.record_ids import (  # noqa: F401 - re-exported: callers import them from here
    InvalidRecord,
    RecordArchived,
    RecordError,
    RecordNotFound,
    VersionConflict,
    _check_kind,
    check_workspace,
    is_record_id,
    new_record_id,
    record_id_millis,
)

T = TypeVar("T")

RecordPage: TypeAlias = tuple[list[RecordView], str | None]
"""A listing's page: its records, and the cursor of the next page (None on the last)."""

MAX_PAGE_SIZE = 1000
"""The most items one listing page returns (the gateway's own limit, 100 upstream, is lower)."""

CREATION_TIME_SLACK = timedelta(hours=1)
"""How far a record's `created_at` (the Temporal server's clock, at the workflow's first task) may be from the time
in its id (the creating client's clock, just before the start): clock skew plus the wait for a worker. A listing
bounded by creation time reads the records whose id time is within this of its bounds; a record created further
from its id's time than this may be missing from such a listing (never from an unbounded one)."""


class Records:
    """Create, read, version, archive, delete and list records of one Temporal namespace.

    The `RecordWorkflow`s run on `task_queue`, served by the harness worker (workers/roles.py).
    """

    def __init__(self, client: Client, task_queue: str = HARNESS_TASK_QUEUE) -> None:
        self.client = client
        self.task_queue = task_queue

    # ---- writes ---------------------------------------------------------------------------------------------

    async def create(
        self, kind: str, workspace: str, body: dict[str, Any], id_prefix: str, *, record_id: str | None = None
    ) -> RecordView:
        """A new record at version 1, readable (get) as soon as this returns; listings show it a moment later.

        `record_id` (of `id_prefix`) is for an object named by what it is rather than when it was made (a hand's
        task queue): a second create of the same id raises `WorkflowAlreadyStartedError` and writes nothing."""
        input = RecordInput(kind=_check_kind(kind), workspace=check_workspace(workspace), body=body)
        if record_id is None:
            record_id = new_record_id(id_prefix)
        elif not is_record_id(record_id, id_prefix):
            raise InvalidRecord(f"{record_id!r} is not a record id of prefix {id_prefix!r}")
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            RECORD_WORKFLOW,
            input,
            id=record_id,
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,  # a deleted record's id is never another's
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(KIND_KEY, kind),
                    SearchAttributePair(WORKSPACE_KEY, workspace),
                    SearchAttributePair(ARCHIVED_KEY, "false"),
                ]
            ),
            static_summary=f"{kind} in workspace {workspace}",
        )
        # The put of the same body is no change: it makes no version, and returns version 1 once the workflow
        # holds it, in the same round trip as the start (read-your-writes without a query that could come first).
        view: RecordView = await self.client.execute_update_with_start_workflow(
            UPDATE_PUT,
            PutRecord(expected_version=1, body=input.body),
            start_workflow_operation=start,
            result_type=RecordView,
        )
        return view

    async def put(
        self,
        id: str,
        workspace: str,
        body: dict[str, Any],
        expected_version: int | None = None,
        *,
        kind: str | None = None,
    ) -> RecordView:
        """A new version with `body` (the current one, unchanged, when `body` equals it). With `expected_version`,
        only if the record is still at that version, else `VersionConflict`."""
        await self.get(id, workspace, kind=kind)
        input = PutRecord(expected_version=expected_version, body=body)
        return await self._update(id, UPDATE_PUT, input, RecordView)

    async def archive(self, id: str, workspace: str, *, kind: str | None = None) -> RecordView:
        """Archive the record (again: no change). It stays readable; listings show it only with include_archived."""
        await self.get(id, workspace, kind=kind)
        return await self._update(id, UPDATE_ARCHIVE, None, RecordView)

    async def delete(self, id: str, workspace: str, *, kind: str | None = None) -> None:
        """Delete the record: from now on it is `RecordNotFound` everywhere. Its history stays in Temporal for the
        namespace's retention of closed workflows."""
        await self.get(id, workspace, kind=kind)
        await self._update(id, UPDATE_DELETE, None, type(None))

    # ---- reads ----------------------------------------------------------------------------------------------

    async def get(self, id: str, workspace: str, version: int | None = None, *, kind: str | None = None) -> RecordView:
        """The current version, or `version`, of a record of `workspace` (and of `kind`, when given)."""
        check_workspace(workspace)
        view = await self.get_any(id, version, kind=kind)
        if view.workspace != workspace:
            raise RecordNotFound(id)
        return view

    async def get_any(self, id: str, version: int | None = None, *, kind: str | None = None) -> RecordView:
        """A record of any workspace. Internal: for what identifies the workspace itself (an API key)."""
        if not isinstance(id, str) or not is_record_id(id) or (version is not None and version < 1):
            raise RecordNotFound(id)
        try:
            view: RecordView = await self._handle(id).query(QUERY_GET, version, result_type=RecordView)
        except WorkflowQueryFailedError as exc:  # no such version, or a workflow that is not a record
            raise RecordNotFound(id) from exc
        except RPCError as exc:
            raise _not_found_or(exc, id) from exc
        if view.deleted or (kind is not None and view.kind != kind):
            raise RecordNotFound(id)
        return view

    async def versions(self, id: str, workspace: str, *, kind: str | None = None) -> list[RecordView]:
        """Every version of the record, oldest first."""
        await self.get(id, workspace, kind=kind)
        try:
            views: list[RecordView] = await self._handle(id).query(QUERY_VERSIONS, result_type=list[RecordView])
        except WorkflowQueryFailedError as exc:
            raise RecordNotFound(id) from exc
        except RPCError as exc:
            raise _not_found_or(exc, id) from exc
        return views

    async def list(
        self,
        kind: str,
        workspace: str,
        *,
        include_archived: bool = False,
        limit: int = 20,
        page: str | None = None,
        order: Literal["desc", "asc"] = "desc",
        created_at_gte: datetime | None = None,
        created_at_lte: datetime | None = None,
    ) -> RecordPage:
        """One page of the workspace's records of `kind`, newest first (`order="asc"`: oldest first), and the
        cursor of the next page (None on the last). With `created_at_gte` / `created_at_lte` (aware datetimes),
        only the records created within those bounds (inclusive). See the module docstring for visibility's
        delay and for how creation time is matched."""
        created = _CreationBounds(created_at_gte, created_at_lte)
        return await self._list(kind, check_workspace(workspace), include_archived, limit, page, order, created)

    async def list_any_workspace(
        self,
        kind: str,
        *,
        include_archived: bool = False,
        limit: int = 20,
        page: str | None = None,
        order: Literal["desc", "asc"] = "desc",
    ) -> RecordPage:
        """`list` across every workspace. Internal: for operators (the CLI's `api-key ls`), never the gateway."""
        return await self._list(kind, None, include_archived, limit, page, order, _CreationBounds(None, None))

    async def _list(
        self,
        kind: str,
        workspace: str | None,
        include_archived: bool,
        limit: int,
        page: str | None,
        order: Literal["desc", "asc"],
        created: _CreationBounds,
    ) -> RecordPage:
        _check_kind(kind)
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise InvalidRecord(f"limit must be between 1 and {MAX_PAGE_SIZE}")
        if order not in ("desc", "asc"):
            raise InvalidRecord(f"order must be desc or asc, not {order!r}")
        after = _decode_page(page) if page is not None else None
        query = (
            f"WorkflowType = '{RECORD_WORKFLOW}' AND {SEARCH_ATTRIBUTE_KIND} = '{kind}'"
            + (f" AND {SEARCH_ATTRIBUTE_WORKSPACE} = '{workspace}'" if workspace is not None else "")
            + " AND ExecutionStatus = 'Running'"
            + ("" if include_archived else f" AND {SEARCH_ATTRIBUTE_ARCHIVED} = 'false'")
        )
        # A set: during a continue-as-new, visibility can show the closing run and the new one both running.
        ids = {execution.id async for execution in self.client.list_workflows(query) if is_record_id(execution.id)}
        ordered = sorted(ids, reverse=order == "desc")
        if after is not None:
            ordered = [id for id in ordered if (id < after if order == "desc" else id > after)]
        ordered = [id for id in ordered if created.may_hold(id)]
        # Read `limit` records at a time, and again past those left out (deleted or archived since visibility
        # listed them, or created outside the bounds), until the page is full: the cursor is the last id looked at.
        found: list[RecordView] = []
        looked_at = 0
        while len(found) < limit and looked_at < len(ordered):
            batch = ordered[looked_at : looked_at + limit - len(found)]
            views = await asyncio.gather(*(self._listed(id, kind, workspace, include_archived) for id in batch))
            found += [view for view in views if view is not None and created.holds(view)]
            looked_at += len(batch)
        next_page = _encode_page(ordered[looked_at - 1]) if looked_at < len(ordered) else None
        return found, next_page

    async def _listed(self, id: str, kind: str, workspace: str | None, include_archived: bool) -> RecordView | None:
        """A listed record as it is now; None when it no longer belongs in the listing (visibility lags)."""
        try:
            view = await self.get_any(id, kind=kind)
        except RecordNotFound:
            return None
        if workspace is not None and view.workspace != workspace:
            return None
        if view.archived_at is not None and not include_archived:
            return None
        return view

    # ---- plumbing -------------------------------------------------------------------------------------------

    def _handle(self, id: str) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(id)

    async def _update(self, id: str, update: str, arg: Any, result_type: type[T]) -> T:
        """Run an update, with its refusals as this module's errors."""
        args = [] if arg is None else [arg]
        try:
            result: T = await self._handle(id).execute_update(update, args=args, result_type=result_type)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            error_type = cause.type if isinstance(cause, ApplicationError) else None
            error_type = FORMER_ERROR_TYPES.get(error_type, error_type) if error_type is not None else None
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            if error_type == VERSION_CONFLICT:
                raise VersionConflict(message) from exc
            if error_type == ARCHIVED:
                raise RecordArchived(message) from exc
            if error_type == DELETED:
                raise RecordNotFound(id) from exc
            raise
        except RPCError as exc:  # the workflow ended between the read and this write
            raise _not_found_or(exc, id) from exc
        return result


class _CreationBounds:
    """A listing's creation-time bounds (inclusive; None: unbounded on that side)."""

    def __init__(self, gte: datetime | None, lte: datetime | None) -> None:
        for bound in (gte, lte):
            if bound is not None and bound.utcoffset() is None:
                raise InvalidRecord(f"a creation-time bound needs a time zone: {bound.isoformat()}")
        self.gte, self.lte = gte, lte
        slack = CREATION_TIME_SLACK / timedelta(milliseconds=1)
        self._lowest_id_millis = (gte.timestamp() * 1000 - slack) if gte is not None else None
        self._highest_id_millis = (lte.timestamp() * 1000 + slack) if lte is not None else None

    def may_hold(self, id: str) -> bool:
        """Whether the record `id` may have been created within the bounds, going by its id's time."""
        millis = record_id_millis(id)
        return (self._lowest_id_millis is None or millis >= self._lowest_id_millis) and (
            self._highest_id_millis is None or millis <= self._highest_id_millis
        )

    def holds(self, view: RecordView) -> bool:
        """Whether the record was created within the bounds."""
        return (self.gte is None or view.created_at >= self.gte) and (self.lte is None or view.created_at <= self.lte)


def _not_found_or(error: RPCError, id: str) -> Exception:
    return RecordNotFound(id) if error.status == RPCStatusCode.NOT_FOUND else error


def _encode_page(last_id: str) -> str:
    return base64.urlsafe_b64encode(last_id.encode()).decode().rstrip("=")


def _decode_page(page: str) -> str:
    """The last id of the previous page; InvalidRecord for a cursor this module did not make."""
    try:
        last_id = base64.urlsafe_b64decode(page + "=" * (-len(page) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRecord("not a page cursor") from None
    if not is_record_id(last_id):
        raise InvalidRecord("not a page cursor")
    return last_id
