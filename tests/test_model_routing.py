"""A session's model turns go to the model worker that holds its conversation (its own queue), and to any other
worker when that one is gone: stopped between turns, or SIGKILLed mid-turn. Each turn is answered once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import anthropic
import pytest
from temporalio.api.enums.v1 import EventType, TaskQueueType, TimeoutType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import Replayer, SlotMarkUsedContext, SlotReleaseContext, SlotReserveContext

from activities.model import warm_http_client, warm_up
from corral.client import send_text
from corral.contract.events import SessionError
from corral.names import ACTIVITY_MODEL_TURN
from corral.temporal import connect, data_converter
from tests.conftest import Stack, assert_log_is_whole, history_text, read_events, texts, unique, wait_for_idle
from tests.ports import closed_port
from tests.waits import pollers_of, until
from workers.roles import SharedSlots, model_worker_queue, model_workers
from workflows import MODEL_ROUTING_PATCH, SessionWorkflow

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ModelCall:
    """One `model_turn` activity in a session's history: where it was sent and how it ended."""

    task_queue: str
    served_by: str | None
    """The result's `worker_task_queue`; None when it did not complete."""
    timeout: str | None = None


async def model_calls(handle: WorkflowHandle) -> list[ModelCall]:
    calls: dict[int, ModelCall] = {}
    for event in (await handle.fetch_history()).events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled = event.activity_task_scheduled_event_attributes
            if scheduled.activity_type.name == ACTIVITY_MODEL_TURN:
                calls[event.event_id] = ModelCall(scheduled.task_queue.name, None)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            completed = event.activity_task_completed_event_attributes
            if completed.scheduled_event_id in calls:
                result = json.loads(completed.result.payloads[0].data)
                calls[completed.scheduled_event_id].served_by = result.get("worker_task_queue")
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            timed_out = event.activity_task_timed_out_event_attributes
            if timed_out.scheduled_event_id in calls:
                kind = TimeoutType.Name(timed_out.failure.timeout_failure_info.timeout_type)
                calls[timed_out.scheduled_event_id].timeout = kind.removeprefix("TIMEOUT_TYPE_")
    return list(calls.values())


async def replays(handle: WorkflowHandle) -> None:
    """The session's history, routed and fallen back, replays with today's code (no nondeterminism)."""
    history = WorkflowHistory.from_json(handle.id, (await handle.fetch_history()).to_json())
    replayer = Replayer(workflows=[SessionWorkflow], data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
    assert MODEL_ROUTING_PATCH in await history_text(handle)  # the marker of the routed path


async def answered_once(handle: WorkflowHandle, answers: list[str]) -> None:
    events = await read_events(handle)
    assert_log_is_whole(events)
    assert texts(events, "user.message") == [str(n) for n in range(1, len(answers) + 1)]
    assert texts(events) == answers
    assert not [e for e in events if isinstance(e, SessionError)]  # the fallback is not the user's business


async def turn(handle: WorkflowHandle, text: str) -> None:
    after = (await read_events(handle))[-1].position
    await send_text(handle, text)
    await wait_for_idle(handle, after=after, within_seconds=60)


async def test_turns_stay_on_the_worker_that_served_the_first_and_fall_back_when_it_stops(stack: Stack) -> None:
    """Two model workers: every turn after the first goes to the first one's own queue; once that worker has
    stopped, the next turn is not picked up there and goes to the shared queue, where the other answers it."""
    model = anthropic.AsyncAnthropic(base_url=stack.model_server.base_url, api_key="test-key", max_retries=0)
    queue = unique("routed-model")
    owners = {model_worker_queue(queue, name): name for name in ("a", "b")}
    async with AsyncExitStack() as both:
        stacks = {name: await both.enter_async_context(AsyncExitStack()) for name in ("a", "b")}
        for name, workers in stacks.items():
            # A client of its own per worker, as two processes have (the SDK refuses two workers of one client
            # on one task queue).
            client = await connect(stack.client.service_client.config.target_host)
            for worker in model_workers(client, model, queue, worker_id=name):
                await workers.enter_async_context(worker)
        script = stack.script([{"text": "one"}, {"text": "two"}, {"text": "three"}, {"text": "four"}])
        handle = await stack.start(script, "1", model_task_queue=queue)
        await wait_for_idle(handle, within_seconds=60)
        for text in ("2", "3"):
            await turn(handle, text)
        calls = await model_calls(handle)
        first = calls[0].served_by
        assert calls[0].task_queue == queue and first in owners
        assert [(c.task_queue, c.served_by) for c in calls[1:]] == [(first, first), (first, first)]

        await stacks[owners[first]].aclose()  # that worker stops (gracefully, between turns)
        await turn(handle, "4")
        other = next(q for q in owners if q != first)
        calls = await model_calls(handle)
        assert [(c.task_queue, c.served_by, c.timeout) for c in calls[3:]] == [
            (first, None, "SCHEDULE_TO_START"),
            (queue, other, None),
        ]
    await answered_once(handle, ["one", "two", "three", "four"])
    await replays(handle)


async def test_a_worker_killed_mid_turn_is_replaced_by_the_other_and_the_turn_answered_once(
    stack: Stack, tmp_path: Path
) -> None:
    """SIGKILL of the model worker that holds the conversation while it waits for the first token: its
    heartbeat stops, the routed turn fails with no retry on the dead worker's queue, and goes to the shared
    queue, where the other worker answers it (reading the conversation back)."""
    queue = unique("routed-model")
    doomed = _spawn(stack.client, stack, queue, "doomed", tmp_path / "doomed.log")
    try:
        await _until_polled(stack.client, model_worker_queue(queue, "doomed"))
        script = stack.script(
            [{"text": "one"}, {"text": "two, slowly", "first_token_latency": 30, "pace_hits": 1}, {"text": "three"}]
        )
        handle = await stack.start(script, "1", model_task_queue=queue)
        await wait_for_idle(handle, within_seconds=60)
        model = anthropic.AsyncAnthropic(base_url=stack.model_server.base_url, api_key="test-key", max_retries=0)
        async with AsyncExitStack() as workers:
            client = await connect(stack.client.service_client.config.target_host)
            for worker in model_workers(client, model, queue, worker_id="standby"):
                await workers.enter_async_context(worker)
            after = (await read_events(handle))[-1].position
            await send_text(handle, "2")
            await _until_started(handle)
            doomed.send_signal(signal.SIGKILL)
            await asyncio.to_thread(doomed.wait)
            await wait_for_idle(handle, after=after, within_seconds=60)
            await turn(handle, "3")
    finally:
        with contextlib.suppress(ProcessLookupError):
            doomed.kill()
        await asyncio.to_thread(doomed.wait)
    calls = await model_calls(handle)
    doomed_queue, standby = model_worker_queue(queue, "doomed"), model_worker_queue(queue, "standby")
    assert [(c.task_queue, c.served_by, c.timeout) for c in calls] == [
        (queue, doomed_queue, None),
        (doomed_queue, None, "HEARTBEAT"),
        (queue, standby, None),
        (standby, standby, None),
    ]
    await answered_once(handle, ["one", "two, slowly", "three"])
    await replays(handle)


def _spawn(client: Client, stack: Stack, queue: str, worker_id: str, log: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "tests.model_worker_process", "--address", client.service_client.config.target_host]
    args += ["--model-url", str(stack.model_server.base_url), "--model-queue", queue, "--worker-id", worker_id]
    return subprocess.Popen(args, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)


async def _until_polled(client: Client, queue: str, within: float = 60) -> None:
    """Until a worker polls this activity queue (the process has started)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await pollers_of(client, request):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no worker polled {queue} within {within}s")


async def _until_started(handle: WorkflowHandle, within: float = 30) -> None:
    """Until the session's model activity is running on a worker."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pending = (await handle.describe()).raw_description.pending_activities
        if any(p.activity_type.name == ACTIVITY_MODEL_TURN and p.HasField("last_started_time") for p in pending):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the model activity did not start within {within}s")


async def test_shared_slots_limit_both_workers_together_and_survive_a_cancelled_wait() -> None:
    """The model role's two workers draw on one pool: no more reservations than slots, a release hands the slot
    to the oldest waiter, and a waiter cancelled while waiting takes none."""
    slots = SharedSlots(2)
    context = cast(SlotReserveContext, None)  # the supplier does not look at it
    first, second = await slots.reserve_slot(context), await slots.reserve_slot(context)
    assert (first, second) != (None, None) and slots.try_reserve_slot(context) is None
    cancelled = asyncio.create_task(slots.reserve_slot(context))
    waiting = asyncio.create_task(slots.reserve_slot(context))
    await until(lambda: len(slots._waiters) == 2, "both reservations waiting for a slot")
    assert not cancelled.done() and not waiting.done()
    cancelled.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await cancelled
    # from another thread, as the SDK does
    await asyncio.to_thread(slots.release_slot, SlotReleaseContext(slot_info=None, permit=first))
    third = await asyncio.wait_for(waiting, 5)
    assert slots.free == 0
    slots.release_slot(SlotReleaseContext(slot_info=None, permit=second))
    slots.release_slot(SlotReleaseContext(slot_info=None, permit=third))
    assert slots.free == 2


async def test_a_loop_that_is_behind_takes_no_new_turn_until_it_has_caught_up() -> None:
    """With `max_lag`, a reservation waits while the worker's event loop goes round slower than that (here, a
    callback holds the loop for 0.3 s, as 200 streaming turns on a starved CPU do), then takes its slot."""
    slots = SharedSlots(2, max_lag=0.05)
    context = cast(SlotReserveContext, None)
    await slots.reserve_slot(context)
    assert slots.deferred == 0 and slots.lag <= 0.05  # an idle loop: admitted at once
    reserving = asyncio.create_task(slots.reserve_slot(context))
    asyncio.get_running_loop().call_soon(time.sleep, 0.3)  # runs between the reservation's look and its answer
    await asyncio.wait_for(reserving, 5)
    assert slots.deferred >= 1 and slots.free == 0
    slots.release_slot_now()
    slots.lag = 0.3
    assert slots.try_reserve_slot(context) is None  # the SDK's non-waiting reservation refuses a loop behind
    slots.lag = 0.0
    assert slots.try_reserve_slot(context) is not None and slots.free == 0
    with pytest.raises(ValueError, match="max_lag"):
        SharedSlots(2, max_lag=0)


async def test_a_harness_holding_a_task_too_long_takes_no_new_one_until_it_is_done() -> None:
    """With `max_busy`, no slot is reserved while a task taken has been in the process longer than that: the task
    that would wait behind it stays in the server's queue instead of running past its timeout here. A task held past
    the server's task timeout holds nothing back any more (it has timed out there; one that never returns must not
    stop the harness)."""
    slots = SharedSlots(3, max_busy=0.5)
    context = cast(SlotReserveContext, None)
    held = await slots.reserve_slot(context)
    slots.mark_slot_used(cast(SlotMarkUsedContext, SimpleNamespace(permit=held, slot_info=None)))
    assert await slots.reserve_slot(context) is not None  # held for less than max_busy: the process keeps up
    held.used_since = time.monotonic() - 1  # type: ignore[attr-defined]  # as if its activation had stalled 1 s
    waiting = asyncio.create_task(slots.reserve_slot(context))
    await until(lambda: slots.deferred >= 1, "the reservation held back")
    assert not waiting.done() and slots.try_reserve_slot(context) is None and slots.free == 1
    held.used_since = time.monotonic() - 60  # type: ignore[attr-defined]  # past the task timeout: waited for no more
    await asyncio.wait_for(waiting, 5)
    assert slots.free == 0  # 3 slots: the stalled one, the one taken beside it, and this one
    slots.release_slot(SlotReleaseContext(slot_info=None, permit=held))
    assert slots.free == 1
    with pytest.raises(ValueError, match="max_busy"):
        SharedSlots(2, max_busy=-1)


async def test_warm_up_opens_a_connection_and_an_unreachable_api_does_not_stop_the_worker(stack: Stack) -> None:
    """At start the model worker opens its first connection to the model API (so the first turn does not); an API
    that does not answer is only logged, the worker starts all the same."""
    reachable = anthropic.AsyncAnthropic(
        base_url=stack.model_server.base_url, api_key="test-key", max_retries=0, http_client=warm_http_client()
    )
    assert await warm_up(reachable)
    with closed_port() as port:  # a port nobody listens on
        unreachable = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{port}", api_key="test-key", max_retries=0)
        assert not await warm_up(unreachable, timeout_seconds=2)
