"""Reading a session, for every reader of the client (corral.client re-exports these): its queries, how it ended,
its log as one sequence across workflow runs and the archive, and the log followed live as it is written."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowHistoryEventFilterType,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.common import QueryRejectCondition
from temporalio.service import RPCError, RPCStatusCode

from corral.archive import read_archived
from corral.blobs import BlobStore, open_blob_store
from corral.contract.carry import ArchiveIndex
from corral.contract.events import SessionEvent
from corral.contract.session import EventPage, EventsQuery, SessionInfo
from corral.converter import INVALID_INPUT
from corral.errors import (
    SessionClosed,
    SessionEnded,
    SessionStartFailed,
)
from corral.names import QUERY_EVENTS, QUERY_SESSION

T = TypeVar("T")


async def session_info(handle: WorkflowHandle) -> SessionInfo:
    return await query_session(handle, QUERY_SESSION, SessionInfo)


async def query_session(handle: WorkflowHandle, name: str, result_type: type[T], *args: Any) -> T:
    """A query of the session, the one way every reader asks one: a run that closed is answered by replaying it on a
    worker, except one whose start input was refused, which cannot be rebuilt: that is `SessionStartFailed` (with
    the refusal), never the worker's "Expected workflow input" nor a query left to time out.

    An open run is asked straight away (no extra round trip); only a closed one is looked at first."""
    try:
        return await handle.query(name, *args, result_type=result_type, reject_condition=QueryRejectCondition.NOT_OPEN)
    except WorkflowQueryRejectedError:
        pass  # closed: answered below, by replay, once we know it can be
    except WorkflowQueryFailedError as exc:
        ended = await session_end(handle)
        if isinstance(ended, SessionStartFailed):
            raise ended from None
        raise exc
    ended = await session_end(handle)
    if isinstance(ended, SessionStartFailed):
        raise ended
    return await handle.query(name, *args, result_type=result_type)


async def session_end(handle: WorkflowHandle) -> SessionEnded | None:
    """How the session's workflow ended, from its close event (`SessionStartFailed` when its input was refused), or
    None while it runs. An RPCError (NOT_FOUND: no such session) goes to the caller."""
    description = await handle.describe()
    status = description.status
    if status in (None, WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW):
        return None
    how = status.name.lower()
    close = await _close_event(handle)
    if close is not None and close.HasField("workflow_execution_failed_event_attributes"):
        failure = close.workflow_execution_failed_event_attributes.failure
        if failure.application_failure_info.type == INVALID_INPUT:
            return SessionStartFailed(handle.id, how, description.close_time, failure.message)
        return SessionEnded(handle.id, how, description.close_time, failure.message)
    if close is not None and close.HasField("workflow_execution_terminated_event_attributes"):
        terminated = close.workflow_execution_terminated_event_attributes
        by = f" (by {terminated.identity})" if terminated.identity else ""
        return SessionEnded(handle.id, how, description.close_time, (terminated.reason or "no reason given") + by)
    return SessionEnded(handle.id, how, description.close_time)


async def _close_event(handle: WorkflowHandle) -> HistoryEvent | None:
    """The close event of the session's current run (Temporal's close-event filter: one event, however long the
    run), or None for a run still open."""
    async for event in handle.fetch_history_events(event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT):
        return event
    return None


async def read_events(
    handle: WorkflowHandle,
    after: int = 0,
    types: list[str] | None = None,
    before: int | None = None,
    limit: int | None = None,
    blobs: BlobStore | None = None,
) -> list[SessionEvent]:
    """The events after `after` (and before `before`, of `types`), at most `limit`: one log across every workflow
    run of the session. The current run's through its `events` query (pages stay under the query size cap), the
    earlier runs' from the archive in `blobs` (default: `open_blob_store()`)."""
    events: list[SessionEvent] = []
    async for page in event_pages(handle, after=after, types=types, before=before, limit=limit, blobs=blobs):
        events.extend(page)
    return events


async def event_pages(
    handle: WorkflowHandle,
    after: int = 0,
    types: list[str] | None = None,
    before: int | None = None,
    limit: int | None = None,
    blobs: BlobStore | None = None,
) -> AsyncGenerator[list[SessionEvent], None]:
    """`read_events` one page at a time, for a reader that writes as it goes (an export of a long log)."""
    count = 0
    archive: ArchiveIndex | None = None
    while limit is None or count < limit:
        page_size = 1000 if limit is None else min(limit - count, 1000)
        page: EventPage | None = None
        if archive is None or after >= archive.through:
            query = EventsQuery(after=after, before=before, types=types, limit=page_size)
            page = await query_session(handle, QUERY_EVENTS, EventPage, query)
            archive = page.archive or archive
        if archive is not None and after < archive.through:  # in an earlier run: read it from the archive
            end = archive.through + 1 if before is None else min(before, archive.through + 1)
            read = partial(_archived_page, blobs or open_blob_store(), handle.id, archive, after, end, types, page_size)
            events, after = await asyncio.to_thread(read)
            count += len(events)
            yield events
            if (before is not None and after >= before - 1) or (limit is not None and count >= limit):
                break
            if page is None or after < archive.through:
                continue
            # The archive is read to its end, and the page holds this run's events that follow it.
            kept = page.events[: page_size - len(events)]
            if len(kept) < len(page.events):
                page = EventPage(events=kept, has_more=True, next_after=kept[-1].position if kept else after)
        assert page is not None
        count += len(page.events)
        yield page.events
        if not page.has_more:
            break
        after = page.next_after


def _archived_page(
    store: BlobStore, session_id: str, archive: ArchiveIndex, after: int, end: int, types: list[str] | None, limit: int
) -> tuple[list[SessionEvent], int]:
    """Up to `limit` archived events of `types` in `(after, end)`, and the position to read on after."""
    events: list[SessionEvent] = []
    for event in read_archived(store, session_id, archive, after, end):
        if types is None or event.type in types:
            if len(events) == limit:
                return events, events[-1].position
            events.append(event)
    return events, end - 1


_CLOSED: dict[int, WorkflowExecutionStatus] = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: WorkflowExecutionStatus.COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: WorkflowExecutionStatus.FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: WorkflowExecutionStatus.TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: WorkflowExecutionStatus.CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: WorkflowExecutionStatus.TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: WorkflowExecutionStatus.CONTINUED_AS_NEW,
}
_TRANSIENT = (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.CANCELLED)
RETRY_SECONDS = 0.2
UNREACHABLE_SECONDS = 30.0


async def _retrying(call: Callable[[], Awaitable[T]]) -> T:
    """`call()`, asked again after a transient RPC failure.

    While a harness worker that died is being replaced, a query can wait for it (queries go to the worker that has
    the session cached) and expire; the log itself is never at risk. A server that stays unreachable for
    `UNREACHABLE_SECONDS` is not transient: that error is raised (the CLI says "cannot reach Temporal")."""
    unreachable_since: float | None = None
    while True:
        try:
            return await call()
        except RPCError as exc:
            if exc.status not in _TRANSIENT:
                raise
            if exc.status != RPCStatusCode.UNAVAILABLE:
                unreachable_since = None
            elif unreachable_since is None:
                unreachable_since = time.monotonic()
            elif time.monotonic() - unreachable_since > UNREACHABLE_SECONDS:
                raise
        await asyncio.sleep(RETRY_SECONDS)


async def _log_since(handle: WorkflowHandle, after: int) -> tuple[list[SessionEvent], int]:
    """The log after `after`, and the last history event its read covers: every workflow task completed by then
    wrote its events into it (0: the harness did not say). One query, unless the log is long or archived."""
    page = await query_session(handle, QUERY_EVENTS, EventPage, EventsQuery(after=after, limit=1000))
    covered = page.history_length + 1 if page.history_length else 0
    if page.archive is not None and after < page.archive.through:
        return await read_events(handle, after=after), covered  # from the archive of earlier runs on
    if page.has_more:
        return page.events + await read_events(handle, after=page.next_after), covered  # the pages after this one
    return page.events, covered


class HistoryPositions:
    """Where this process last read each session's history to (a page token of Temporal's, and the last event id
    read), so that a follow that starts again long-polls from there instead of reading the history from its
    beginning: a session's every `wait_for_idle`, and every new event stream of the gateway, would otherwise read
    its whole history (about 7 ms of the server's CPU per 250 events), on every turn, more the longer it runs."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._positions: OrderedDict[tuple[str, str], tuple[bytes, int]] = OrderedDict()

    @staticmethod
    def _key(handle: WorkflowHandle) -> tuple[str, str]:
        return handle.id, handle.run_id or ""

    def get(self, handle: WorkflowHandle) -> tuple[bytes, int] | None:
        return self._positions.get(self._key(handle))

    def put(self, handle: WorkflowHandle, token: bytes, seen: int) -> None:
        key = self._key(handle)
        self._positions[key] = (token, seen)
        self._positions.move_to_end(key)
        while len(self._positions) > self._size:
            self._positions.popitem(last=False)

    def forget(self, handle: WorkflowHandle) -> None:
        self._positions.pop(self._key(handle), None)


HISTORY_POSITIONS = HistoryPositions()


async def follow_events(handle: WorkflowHandle, after: int = 0) -> AsyncGenerator[SessionEvent, None]:
    """Yield the events after `after`, then each new one as it is written; the caller decides when to stop.

    No polling: a long poll on the workflow history (`wait_new_event`) returns when something is appended. Session
    events are written by workflow tasks, so the log is read once the history has been caught up with, and again
    only after a page of history that completes a workflow task the last read did not cover (the session says how
    far into its history a read reaches: `EventPage.history_length`). Raises `SessionClosed` once the workflow has
    closed, after the last events are yielded.
    """
    resumed = HISTORY_POSITIONS.get(handle)
    while True:  # once per history followed: from where this process last read it, else from its beginning
        if resumed is not None:
            # The log is read first: the long poll from there waits for the next event before it returns anything.
            token, seen = resumed
            history = handle.fetch_history_events(wait_new_event=True, next_page_token=token)
            events, covered = await _retrying(partial(_log_since, handle, after))
            for event in events:
                after = event.position
                yield event
            covered = covered or seen
        else:
            # The long poll needs a position, and without one the only way to it is to read the history from its
            # beginning: about 70 ms per 1000 history events. The history is read first, then the log: a query
            # sent after it covers every workflow task it shows completed, so none of them is asked about again.
            history = handle.fetch_history_events(wait_new_event=True)
            seen = covered = 0  # the last history event read; the last one a read of the log covers
        while True:
            try:
                await _retrying(history.fetch_next_page)  # at once while catching up; then when the history grew
            except RPCError:
                if resumed is None:
                    raise
                break  # a position this server no longer knows (the run is gone): from the beginning
            page = history.current_page or []
            seen = max([seen, *(event.event_id for event in page)])
            if history.next_page_token:
                HISTORY_POSITIONS.put(handle, history.next_page_token, seen)
            written = covered == 0 or any(
                event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and event.event_id > covered
                for event in page
            )
            closed = next((_CLOSED[event.event_type] for event in page if event.event_type in _CLOSED), None)
            if resumed is not None and closed not in (None, WorkflowExecutionStatus.CONTINUED_AS_NEW):
                break  # maybe an earlier run of this id (a reset one): the latest run's own history says
            if written:
                events, covered = await _retrying(partial(_log_since, handle, after))
                covered = covered or seen
                for event in events:
                    after = event.position
                    yield event
            if closed == WorkflowExecutionStatus.CONTINUED_AS_NEW:
                break  # not an end: the session goes on in its next run, followed from its beginning
            if closed is not None:
                HISTORY_POSITIONS.forget(handle)
                raise SessionClosed(handle.id, closed)
        HISTORY_POSITIONS.forget(handle)
        resumed = None


async def wait_for_idle(handle: WorkflowHandle, after: int = 0, within_seconds: float = 60) -> list[SessionEvent]:
    """Events up to and including the next `session.status_idle` after position `after`.

    Raises `SessionClosed` if the workflow closes first, TimeoutError if `within_seconds` pass first."""
    collected: list[SessionEvent] = []

    async def collect() -> list[SessionEvent]:
        async with contextlib.aclosing(follow_events(handle, after=after)) as events:
            async for event in events:
                collected.append(event)
                if event.type == "session.status_idle":
                    return collected
        raise AssertionError("follow_events stops only by raising SessionClosed")

    return await asyncio.wait_for(collect(), within_seconds)
