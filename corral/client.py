"""The one client of sessions, shared by the CLI, the examples, the tests and the benchmarks: start, send, read, follow.

It names the workflow, its update and its queries by their public names (corral.names) and imports no workflow
code: a client needs the contract, not the harness. Reading a session (its queries, its log, following it) is in
corral.reading; the names are re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio.api.errordetails.v1 import WorkflowNotReadyFailure
from temporalio.client import (
    Client,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from corral.contract.session import (
    AgentConfig,
    ForkSource,
    SendEventsInput,
    SendEventsResult,
    SessionInfo,
    SessionInput,
    UpdateSessionInput,
    web_ui_summary,
)
from corral.names import (
    HANDING_OVER,
    HARNESS_TASK_QUEUE,
    SESSION_ID_PREFIX,
    SESSION_WORKFLOW,
    UPDATE_SEND_EVENTS,
    UPDATE_SESSION,
)
from corral.reading import (  # noqa: F401 - re-exported: callers import them from here
    RETRY_SECONDS,
    SessionClosed,
    event_pages,
    follow_events,
    query_session,
    read_events,
    session_end,
    session_info,
    wait_for_idle,
)

T = TypeVar("T")

BUSY_SECONDS = 60.0
"""How long a send waits for the session to take more updates (Temporal's in-flight limit) before it fails."""
COPY_SECONDS = 120.0
"""How long `fork_session` waits for a fork to copy its source's log."""


def new_session_id() -> str:
    return SESSION_ID_PREFIX + uuid.uuid4().hex[:26]


async def start_session(
    client: Client,
    input: SessionInput,
    *,
    session_id: str | None = None,
    task_queue: str = HARNESS_TASK_QUEUE,
    search_attributes: TypedSearchAttributes | None = None,
    memo: dict[str, Any] | None = None,
) -> WorkflowHandle:
    """Start `SessionWorkflow`; the session id is the workflow id. The gateway adds the session's workspace (a
    search attribute) and what its API view shows without a query (the memo)."""
    summary, details = web_ui_summary(input, client.namespace)
    started = await client.start_workflow(
        SESSION_WORKFLOW,
        input,
        id=session_id or new_session_id(),
        task_queue=task_queue,
        static_summary=summary,
        static_details=details,
        search_attributes=search_attributes,
        memo=memo,
    )
    # Not bound to the first run: the session continues as new as it grows, and queries and updates must reach
    # whichever run is current (terminate and cancel still reach only this session's chain).
    return client.get_workflow_handle(started.id, first_execution_run_id=started.first_execution_run_id)


async def fork_session(
    client: Client, source_id: str, position: int, agent: AgentConfig | None = None, session_id: str | None = None
) -> WorkflowHandle:
    """Start a session whose log is `source_id`'s up to and including `position`, then its own; the source is only
    read. Same start input as the source (its agent, or `agent`), no first message. ValueError for a position the
    source does not have."""
    source = client.get_workflow_handle(source_id)
    last = (await session_info(source)).last_position
    if not 1 <= position <= last:
        raise ValueError(f"position {position} is not in {source_id}, whose log holds positions 1 to {last}")
    started = None
    async for event in source.fetch_history_events():
        started = event.workflow_execution_started_event_attributes
        break
    if started is None:
        raise ValueError(f"{source_id} has no history to fork")
    (original,) = await client.data_converter.decode(started.input.payloads, [SessionInput])
    title = original.title or "agent session"
    fork = original.model_copy(
        update={
            "agent": agent or original.agent,
            "message": None,
            "carry": None,
            "fork": ForkSource(session_id=source_id, position=position),
            "title": f"fork of {title}",
            "metadata": {**original.metadata, "forked_from": f"{source_id} at {position}"},
        }
    )
    handle = await start_session(client, fork, session_id=session_id, task_queue=started.task_queue.name)
    # Returned once the copy is in: until then the fork refuses updates (its first positions are the copy's).
    async with asyncio.timeout(COPY_SECONDS), contextlib.aclosing(follow_events(handle, after=position - 1)) as events:
        async for _ in events:
            break
    return handle


async def send_events(handle: WorkflowHandle, events: list[dict[str, Any]]) -> list[str]:
    """The `send_events` update: the ids come back only once the events are in history (or it is rejected).

    Sent again, with backoff for up to `BUSY_SECONDS`, when Temporal did not take it: past the few updates a
    workflow takes at a time (10 on the dev server) it answers RESOURCE_EXHAUSTED, and an update that arrives while
    the session continues as new is aborted (UNAVAILABLE) or refused (HANDING_OVER) and belongs to the next run,
    and one that meets a workflow task the server refused (a continue-as-new while signals were arriving) answers
    WorkflowNotReady. None of these was applied, so sending again adds no event twice (a client id makes any
    resend harmless)."""
    batch = SendEventsInput(events=events)
    result = await until_taken(
        handle, lambda: handle.execute_update(UPDATE_SEND_EVENTS, batch, result_type=SendEventsResult)
    )
    return result.event_ids


async def send_batch(handle: WorkflowHandle, events: list[dict[str, Any]]) -> SendEventsResult:
    """`send_events`, answered in full: the ids and the events the update wrote, so no query reads them back."""
    batch = SendEventsInput(events=events, answer_events=True)
    return await until_taken(
        handle, lambda: handle.execute_update(UPDATE_SEND_EVENTS, batch, result_type=SendEventsResult)
    )


async def update_session(handle: WorkflowHandle, change: UpdateSessionInput) -> SessionInfo:
    """The `update_session` update (title, metadata, budget, archive, the start of a deletion), sent again as
    `send_events` is when Temporal or the session did not take it."""
    return await until_taken(handle, lambda: handle.execute_update(UPDATE_SESSION, change, result_type=SessionInfo))


async def until_taken(handle: WorkflowHandle, update: Callable[[], Awaitable[T]]) -> T:
    """`update()`, sent again with backoff for up to `BUSY_SECONDS` while it was not taken (see `send_events`)."""
    delay = RETRY_SECONDS
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        try:
            return await update()
        except WorkflowUpdateFailedError as exc:
            handing_over = isinstance(exc.cause, ApplicationError) and exc.cause.type == HANDING_OVER
            if not handing_over or time.monotonic() > deadline:
                raise
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # "workflow execution already completed", or no such session
                ended = await session_end(handle)
                if ended is not None:
                    raise ended from None
            if not _not_taken(exc) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(delay * random.uniform(0.5, 1.5))  # jitter: many senders do not come back together
        delay = min(delay * 2, 2.0)


async def send_text(handle: WorkflowHandle, text: str, client_id: str | None = None) -> str:
    """Send one user message through the `send_events` update; returns its event id once it is in history."""
    event: dict[str, Any] = {"type": "user.message", "content": text}
    if client_id:
        event["id"] = client_id
    (event_id,) = await send_events(handle, [event])
    return event_id


def _not_taken(exc: RPCError) -> bool:
    """Whether Temporal answered an update without taking it, so that it may simply be sent again."""
    if exc.status in (RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE):
        return True
    details = exc.grpc_status.details if exc.status == RPCStatusCode.FAILED_PRECONDITION else []
    return any(detail.Is(WorkflowNotReadyFailure.DESCRIPTOR) for detail in details)
