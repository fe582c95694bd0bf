"""Following a session's log (`corral.client.follow_events`): what it asks of Temporal.

Every follower of a session (the gateway's event streams, `corral send --wait`, `wait_for_idle`) long-polls the
session's history and reads the log with a query when a workflow task has written to it. A query is a round trip
through the server to the harness and an activation there, so a follower asks only about workflow tasks its last
read did not cover: once when it catches up, then once per page of history that completes a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, Interceptor, OutboundInterceptor, QueryWorkflowInput

from corral.client import follow_events, send_text
from corral.contract.events import SessionEvent
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


async def _counting_client(stack: Stack) -> tuple[Client, _Queries, list[int]]:
    """A client of its own, counting its queries and its history reads (each page, the long polls included)."""
    queries = _Queries()
    client = await Client.connect(
        stack.client.service_client.config.target_host,
        namespace=stack.client.namespace,
        data_converter=stack.client.data_converter,
        interceptors=[queries],
    )
    reads = [0]
    service = client.workflow_service
    fetch = service.get_workflow_execution_history

    async def counted(*args: Any, **kwargs: Any) -> Any:
        reads[0] += 1
        return await fetch(*args, **kwargs)

    service.get_workflow_execution_history = counted  # type: ignore[method-assign]
    return client, queries, reads


async def test_a_follower_reads_the_log_once_to_catch_up_then_once_per_new_workflow_task(stack: Stack) -> None:
    model = stack.script([{"text": "First."}, {"text": "Second.", "first_token_latency": 0.3}])
    handle = await stack.start(model, message="hi")
    first = await wait_for_idle(handle)
    client, queries, reads = await _counting_client(stack)
    followed: list[SessionEvent] = []
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
