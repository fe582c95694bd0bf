"""The one client of sessions, shared by the CLI, the examples, the tests and the benchmarks: start, send, read, follow.

It names the workflow, its update and its queries by their public names (corral.names) and imports no workflow
code: a client needs the contract, not the harness.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from corral.contract.events import SessionEvent
from corral.contract.session import (
    EventPage,
    EventsQuery,
    SendEventsInput,
    SendEventsResult,
    SessionInfo,
    SessionInput,
)
from corral.names import (
    HARNESS_TASK_QUEUE,
    QUERY_EVENTS,
    QUERY_SESSION,
    SESSION_ID_PREFIX,
    SESSION_WORKFLOW,
    UPDATE_SEND_EVENTS,
)


def new_session_id() -> str:
    return SESSION_ID_PREFIX + uuid.uuid4().hex[:26]


def _summary(input: SessionInput) -> tuple[str, str]:
    """Static summary and details the Temporal Web UI shows for a session."""
    title = input.title or "agent session"
    tools = ", ".join(tool.name for tool in input.agent.resolved_tools()) or "none"
    details = [f"**model** `{input.agent.model}`", f"**tools** {tools}"]
    if input.agent.name:
        details.insert(0, f"**agent** {input.agent.name}")
    details += [f"**{key}** {value}" for key, value in sorted(input.metadata.items())]
    return f"{title} · {input.agent.model}", "\n\n".join(details)


async def start_session(
    client: Client,
    input: SessionInput,
    *,
    session_id: str | None = None,
    task_queue: str = HARNESS_TASK_QUEUE,
) -> WorkflowHandle:
    """Start `SessionWorkflow`; the session id is the workflow id."""
    summary, details = _summary(input)
    return await client.start_workflow(
        SESSION_WORKFLOW,
        input,
        id=session_id or new_session_id(),
        task_queue=task_queue,
        static_summary=summary,
        static_details=details,
    )


async def send_events(handle: WorkflowHandle, events: list[dict[str, Any]]) -> list[str]:
    """The `send_events` update: the ids come back only once the events are in history (or it is rejected)."""
    result = await handle.execute_update(
        UPDATE_SEND_EVENTS, SendEventsInput(events=events), result_type=SendEventsResult
    )
    return result.event_ids


async def send_text(handle: WorkflowHandle, text: str, client_id: str | None = None) -> str:
    """Send one user message through the `send_events` update; returns its event id once it is in history."""
    event: dict[str, Any] = {"type": "user.message", "content": text}
    if client_id:
        event["id"] = client_id
    (event_id,) = await send_events(handle, [event])
    return event_id


async def session_info(handle: WorkflowHandle) -> SessionInfo:
    return await handle.query(QUERY_SESSION, result_type=SessionInfo)


async def read_events(
    handle: WorkflowHandle,
    after: int = 0,
    types: list[str] | None = None,
    before: int | None = None,
    limit: int | None = None,
) -> list[SessionEvent]:
    """The events after `after` (and before `before`, of `types`), at most `limit`, paging through the `events`
    query (pages stay under the query size cap)."""
    events: list[SessionEvent] = []
    while limit is None or len(events) < limit:
        page_size = 1000 if limit is None else min(limit - len(events), 1000)
        query = EventsQuery(after=after, before=before, types=types, limit=page_size)
        page = await handle.query(QUERY_EVENTS, query, result_type=EventPage)
        events.extend(page.events)
        if not page.has_more:
            break
        after = page.next_after
    return events


async def follow_events(
    handle: WorkflowHandle, after: int = 0, poll_interval: float = 0.2
) -> AsyncIterator[SessionEvent]:
    """Yield events as they are written, forever; the caller decides when to stop.

    A query that times out is asked again: while a harness worker that died is being replaced, a query can wait
    for it (queries go to the worker that has the session cached) and expire; the log itself is never at risk."""
    while True:
        try:
            events = await read_events(handle, after=after)
        except RPCError as exc:
            if exc.status not in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.CANCELLED):
                raise
            await asyncio.sleep(poll_interval)
            continue
        for event in events:
            after = event.position
            yield event
        if not events:
            await asyncio.sleep(poll_interval)


async def wait_for_idle(handle: WorkflowHandle, after: int = 0, within_seconds: float = 60) -> list[SessionEvent]:
    """Events up to and including the next `session.status_idle` after position `after`."""
    collected: list[SessionEvent] = []

    async def collect() -> list[SessionEvent]:
        async for event in follow_events(handle, after=after, poll_interval=0.05):
            collected.append(event)
            if event.type == "session.status_idle":
                return collected
        return collected

    return await asyncio.wait_for(collect(), within_seconds)
