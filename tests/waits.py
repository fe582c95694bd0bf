"""Waiting on what a test can observe (an event in a log, a delta on a stream, a process's state), never on time.

A test that sleeps "long enough" for a fault to land passes on a fast machine without the fault landing where it
says, and fails on a loaded one: these helpers poll a condition instead, and fail naming what never happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Sequence

from temporalio.api.enums.v1 import EventType, PendingActivityState, TaskQueueType
from temporalio.api.taskqueue.v1 import PollerInfo, TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from relay import StreamEvent, subscribe

Condition = Callable[[], object]
"""A plain or an async function whose (awaited) result is true once the awaited thing happened."""

POLL_S = 0.05
"""The pause between two checks of a condition: short, so the wait ends soon after the condition holds."""


async def until(condition: Condition, what: str, within: float = 60.0, every: float = POLL_S) -> None:
    """Return once `condition()` (a plain or an async function) is true; fail saying `what` did not happen."""
    deadline = time.monotonic() + within
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within:g} s")
        await asyncio.sleep(every)


def until_sync(condition: Callable[[], object], what: str, within: float = 60.0, every: float = POLL_S) -> None:
    """`until` for code that runs outside an event loop."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within:g} s")
        time.sleep(every)


async def polled_by(
    client: Client, queue: str, pid: int, kind: TaskQueueType.ValueType = TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
) -> bool:
    """Whether the worker process `pid` polls `queue` (it has started; a worker stopped earlier is still listed for
    a while, so the poller is told by its identity, `<pid>@<host>`, the SDK's default)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
    )
    pollers = await pollers_of(client, request)
    return any(poller.identity.startswith(f"{pid}@") for poller in pollers)


TRANSIENT = (RPCStatusCode.CANCELLED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)
"""What a describe call on a loaded dev server may answer for a moment: the wait asks again, it does not fail."""


async def pollers_of(client: Client, request: DescribeTaskQueueRequest) -> Sequence[PollerInfo]:
    """The queue's pollers now; none when the server answered a transient error (a wait polls again)."""
    try:
        return (await client.workflow_service.describe_task_queue(request)).pollers
    except RPCError as error:
        if error.status in TRANSIENT:
            return []
        raise


async def activity_running(handle: WorkflowHandle, activity_type: str) -> bool:
    """Whether a `activity_type` activity of the session has started on a worker and not ended: a fault meant to
    land mid-call waits for this."""
    pending = (await handle.describe()).raw_description.pending_activities
    started = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
    return any(activity.activity_type.name == activity_type and activity.state == started for activity in pending)


async def attempts_of(handle: WorkflowHandle, activity_type: str) -> list[int]:
    """The attempt that ended each `activity_type` activity of the session, from its history: an attempt above 1
    says an earlier one was cut off (the fault landed while it ran)."""
    scheduled: dict[int, str] = {}
    attempts = []
    for event in (await handle.fetch_history()).events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            if scheduled.get(started.scheduled_event_id) == activity_type:
                attempts.append(started.attempt)
    return attempts


class LiveText:
    """What a subscriber of one session's live text has received from the relay, so far: the condition a test waits
    on when a fault must land mid-reply (after the reply's first delta, before its end). A reply is one model
    request (a span): the latest one to show text is the one the questions below are about."""

    def __init__(self) -> None:
        self.events: list[StreamEvent] = []

    def _reply(self) -> list[StreamEvent]:
        """The events of the latest span that has shown text, from its last `reset` (a retry starts it over)."""
        spans = [event.span_id for event in self.events if event.type == "delta" and event.kind == "text"]
        if not spans:
            return []
        mine = [event for event in self.events if event.span_id == spans[-1]]
        resets = [index for index, event in enumerate(mine) if event.type == "reset"]
        return mine[resets[-1] + 1 :] if resets else mine

    def text(self) -> str:
        """The reply's text shown now."""
        return "".join(event.text for event in self._reply() if event.type == "delta" and event.kind == "text")

    def deltas(self) -> int:
        """How many pieces of the reply's text have come."""
        return sum(1 for event in self._reply() if event.type == "delta" and event.kind == "text")

    def ended(self) -> bool:
        """Whether the reply's stream has ended."""
        return any(event.type == "end" for event in self._reply())


@contextlib.asynccontextmanager
async def following(relay_url: str, session_ids: Sequence[str]) -> AsyncIterator[dict[str, LiveText]]:
    """Follow each session's live text at the relay (reconnecting when it drops) while the block runs. Subscribing
    after the text began loses nothing: the relay hands a new subscriber everything it retains first."""
    live = {session_id: LiveText() for session_id in session_ids}

    async def follow(session_id: str) -> None:
        async with contextlib.aclosing(subscribe(relay_url, session_id, max_retry_delay=0.5)) as events:
            async for event in events:
                live[session_id].events.append(event)

    tasks = [asyncio.create_task(follow(session_id)) for session_id in session_ids]
    try:
        yield live
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
