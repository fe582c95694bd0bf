"""Following a session's log (`corral.client.follow_events`): what it asks of Temporal.

Every follower of a session (the gateway's event streams, `corral send --wait`, `wait_for_idle`) long-polls the
session's history and reads the log with a query when a workflow task has written to it. A query is a round trip
through the server to the harness and an activation there, so a follower asks only about workflow tasks its last
read did not cover: once when it catches up, then once per page of history that completes a new one. A follow
that starts again in the same process long-polls from where the last one read the history to, instead of reading
the history from its beginning.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, Interceptor, OutboundInterceptor, QueryWorkflowInput

from corral.client import follow_events, send_text
from corral.contract.events import SessionEvent
from corral.reading import HISTORY_POSITIONS
from tests.conftest import Stack, assert_log_is_whole, wait_for_idle
from tests.waits import until


class _Queries(Interceptor):
    def __init__(self) -> None:
        self.count = 0

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _CountingQueries(next, self)


class _CountingQueries(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, queries: _Queries) -> None:
        super().__init__(next)
        self.queries = queries

    async def query_workflow(self, input: QueryWorkflowInput) -> Any:
        self.queries.count += 1
        return await super().query_workflow(input)


class _Reads:
    """Each history read, counted as it is sent: whether it starts from a page token, and the first event id it
    returned (0: none, or not yet returned)."""

    def __init__(self) -> None:
        self.reads: list[tuple[bool, int]] = []

    def __getitem__(self, index: int) -> int:  # reads[0]: how many
        assert index == 0
        return len(self.reads)


async def _counting_client(stack: Stack) -> tuple[Client, _Queries, _Reads]:
    """A client of its own, counting its queries and its history reads (each page, the long polls included)."""
    queries = _Queries()
    client = await Client.connect(
        stack.client.service_client.config.target_host,
        namespace=stack.client.namespace,
        data_converter=stack.client.data_converter,
        interceptors=[queries],
    )
    reads = _Reads()
    service = client.workflow_service
    fetch = service.get_workflow_execution_history

    async def counted(request: Any, *args: Any, **kwargs: Any) -> Any:
        index = len(reads.reads)  # counted as it is sent: a long poll is a read while it waits
        reads.reads.append((bool(request.next_page_token), 0))
        response = await fetch(request, *args, **kwargs)
        events = response.history.events
        reads.reads[index] = (reads.reads[index][0], events[0].event_id if events else 0)
        return response

    service.get_workflow_execution_history = counted  # type: ignore[method-assign,assignment]
    return client, queries, reads


async def test_a_follower_reads_the_log_once_to_catch_up_then_once_per_new_workflow_task(stack: Stack) -> None:
    model = stack.script([{"text": "First."}, {"text": "Second.", "first_token_latency": 0.3}])
    handle = await stack.start(model, message="hi")
    first = await wait_for_idle(handle)
    client, queries, reads = await _counting_client(stack)
    followed: list[SessionEvent] = []
    HISTORY_POSITIONS.forget(client.get_workflow_handle(handle.id))  # no earlier follow to resume from
    async with contextlib.aclosing(follow_events(client.get_workflow_handle(handle.id))) as events:
        for _ in first:
            followed.append(await anext(events))
        parked = asyncio.create_task(anext(events))
        await until(lambda: reads[0] >= 2, "the follower waiting in the history's long poll")
        # The history was read first, then the log once: the query covers every workflow task the history showed.
        assert queries.count == 1, f"{queries.count} reads of the log to catch up on an idle session"
        assert [e.id for e in followed] == [e.id for e in first]

        caught_up = [e async for e in client.get_workflow_handle(handle.id).fetch_history_events()][-1].event_id
        await send_text(handle, "again")
        followed.append(await parked)
        while followed[-1].type != "session.status_idle":
            followed.append(await anext(events))
    assert_log_is_whole(followed)
    history = [e async for e in handle.fetch_history_events()]
    completed = sum(
        1 for e in history if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and e.event_id > caught_up
    )
    # Once per page of history completing a workflow task the last read did not cover: never more than the tasks.
    assert 1 < queries.count <= 1 + completed, (queries.count, completed)


async def test_a_follow_that_starts_again_reads_the_history_from_where_the_last_one_left_it(stack: Stack) -> None:
    model = stack.script([{"text": "First."}, {"text": "Second."}, {"text": "Third."}, {"text": "Fourth."}])
    handle = await stack.start(model, message="hi")
    await wait_for_idle(handle)
    client, queries, reads = await _counting_client(stack)
    followed = client.get_workflow_handle(handle.id)
    HISTORY_POSITIONS.forget(followed)
    first = await wait_for_idle(followed)
    assert reads.reads[0] == (False, 1), "the first follow reads the history from its beginning"

    await send_text(handle, "again")
    other = stack.client.get_workflow_handle(handle.id, run_id=(await handle.describe()).run_id)
    both = await wait_for_idle(other, after=first[-1].position)  # another follower (of the run): this one is behind
    before, asked = reads[0], queries.count
    second: list[SessionEvent] = []
    async with contextlib.aclosing(follow_events(followed)) as events:  # from the start of the log
        while len(second) < len(first) + len(both):
            second.append(await anext(events))
        parked = asyncio.create_task(anext(events))
        await until(lambda: reads[0] >= before + 2, "the follower waiting in the history's long poll")
        # One read of the log, which covers the workflow tasks in the history since its last follow.
        assert queries.count == asked + 1, f"{queries.count - asked} reads of the log to catch up"
        await send_text(handle, "and again")
        second.append(await parked)
        while second[-1].type != "session.status_idle":
            second.append(await anext(events))
    assert [e.id for e in second[: len(first) + len(both)]] == [e.id for e in first + both]
    assert_log_is_whole(second)
    assert all(from_token and first_id != 1 for from_token, first_id in reads.reads[before:]), reads.reads[before:]

    # A position the server does not know (a run gone past its retention, say) is a read from the beginning.
    HISTORY_POSITIONS.put(followed, b"not a page token", 5)
    await send_text(handle, "once more")
    before = reads[0]
    third = await wait_for_idle(followed, after=second[-1].position)
    assert third[-1].type == "session.status_idle"
    assert (False, 1) in reads.reads[before:], reads.reads[before:]
