"""Back-pressure a user can see: a turn that no worker is free to take waits in its task queue, and `corral status`
and the API's session retrieve say so (whose worker, for how long, the queue's backlog), then stop saying so once a
worker takes it. The queue backs up for real: the session's model queue has no model worker until the test starts
one; nothing is faked, and every wait is for what the server reports."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import pytest
from temporalio.api.enums.v1 import PendingActivityState, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.worker import Worker

from activities.model import ModelActivities
from corral.client import wait_for_idle
from corral.names import CORRAL_TASK_QUEUES, SIGNAL_INTERRUPT
from corral.queues import ROLE_QUEUES, QueueLoad, Waiting, queue_load, role_of, session_waits
from relay import StreamPublisher
from tests.conftest import Stack, texts, unique
from tests.test_gateway import Gateway, running_gateway
from tests.waits import until
from workers.roles import harness_worker, knowledge_activities, model_worker

pytestmark = pytest.mark.timeout(300)


def model_worker_for(stack: Stack, queue: str) -> Any:
    """A model worker on `queue`, as the `stack` fixture starts one on its own."""
    model = anthropic.AsyncAnthropic(base_url=stack.model_server.base_url, api_key="test-key", max_retries=0)
    publisher = StreamPublisher(str(stack.stream_relay.base_url))
    return model_worker(stack.client, model, queue, stream=publisher, proxy_queue=stack.proxy_queue)


async def corral(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` against the test's Temporal, in its own process, as a terminal 200 columns wide shows it."""
    address = stack.client.service_client.config.target_host
    command = [sys.executable, "-m", "cli.main", "--address", address, "--namespace", stack.client.namespace, *args]
    env = {**os.environ, "COLUMNS": "200"}
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=120, env=env)


async def test_a_turn_no_model_worker_takes_is_shown_waiting_then_clears(stack: Stack, tmp_path: Path) -> None:
    queue = unique("model")  # no model worker polls it yet
    handle = await stack.start(stack.script([{"text": "taken at last"}]), message="hello", model_task_queue=queue)

    async def model_turn_waits() -> list[Any]:
        waits = await session_waits(stack.client, await handle.describe())
        return [wait for wait in waits if wait.activity_type == "model_turn"]

    await until(model_turn_waits, "the session's model turn is scheduled and not started")
    [wait] = await model_turn_waits()
    assert (wait.kind, wait.queue, wait.role, wait.load.pollers) == ("activity", queue, "model", 0)

    async def backlog() -> int:
        return (await queue_load(stack.client, queue, "activity")).backlog

    await until(backlog, "the server counts the waiting turn in the queue's backlog")  # its count is cached a while
    [wait] = await model_turn_waits()
    now = datetime.now(UTC)
    assert (wait.load.backlog, wait.backlog(), wait.ahead(now)) == (1, 1, 0), "alone in its queue"
    assert wait.oldest(now) >= wait.waited(now) > timedelta(0)

    shown = await corral(stack, "--state-dir", str(tmp_path), "status", handle.id)
    assert shown.returncode == 0, shown
    said = " ".join(shown.stdout.split())
    assert f"{handle.id} running" in said
    assert "waiting for a model worker for" in said and f"(model_turn, queue {queue})" in said
    assert "no task ahead of it, ~1 waiting in that queue" in said
    assert "no worker polls that queue" in said

    stack_view = await corral(stack, "--state-dir", str(tmp_path), "status")
    assert stack_view.returncode == 0, stack_view
    assert "no corral processes recorded" in stack_view.stdout
    assert all(role_queue in stack_view.stdout for role_queue, _, _ in ROLE_QUEUES), stack_view.stdout

    async with model_worker_for(stack, queue):
        assert texts(await wait_for_idle(handle)) == ["taken at last"], "the turn that waited was answered once"
        await until(lambda: backlog_is(stack, queue, 0), "the queue's backlog is empty again")
        assert await model_turn_waits() == []
        shown = await corral(stack, "--state-dir", str(tmp_path), "status", handle.id)
        assert shown.returncode == 0 and "not waiting for any worker" in shown.stdout, shown


async def backlog_is(stack: Stack, queue: str, count: int) -> bool:
    return (await queue_load(stack.client, queue, "activity")).backlog == count


@pytest.fixture
async def unserved_model(stack: Stack, tmp_path: Path) -> AsyncIterator[tuple[Gateway, str]]:
    """A gateway whose sessions' model turns go to a queue no model worker polls (until the test starts one)."""
    queue = unique("model")
    async with running_gateway(dataclasses.replace(stack, model_queue=queue), tmp_path) as gateway:
        yield gateway, queue


async def test_the_api_shows_a_waiting_turn_in_a_retrieve_then_clears(
    stack: Stack, unserved_model: tuple[Gateway, str]
) -> None:
    gateway, queue = unserved_model
    client = await gateway.client("team-a")
    agent = await client.beta.agents.create(name="helper", model=stack.script([{"text": "taken at last"}]))
    environment = await client.beta.environments.create(name="plain")
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    assert "waiting" not in (session.model_extra or {}), "a session with nothing to wait for looks as upstream's"
    message: Any = {"type": "user.message", "content": [{"type": "text", "text": "hello"}]}
    await client.beta.sessions.events.send(session.id, events=[message])

    async def waiting() -> list[dict[str, Any]]:
        retrieved = await client.beta.sessions.retrieve(session.id)
        return list((retrieved.model_extra or {}).get("waiting") or [])

    async def model_turn_waits() -> bool:
        return any(wait["activity_type"] == "model_turn" for wait in await waiting())

    await until(model_turn_waits, "the retrieve shows the model turn waiting")
    [wait] = [wait for wait in await waiting() if wait["activity_type"] == "model_turn"]
    assert (wait["type"], wait["role"], wait["task_queue"]) == ("activity", "model", queue)
    assert wait["queue"] == {**wait["queue"], "approximate_backlog": 1, "workers_polling": 0}
    assert wait["approximate_tasks_ahead"] == 0 and wait["since"].endswith("Z")
    assert wait["queue"]["oldest_seconds"] >= wait["waited_seconds"] >= 0

    async with model_worker_for(stack, queue):

        async def idle_and_not_waiting() -> bool:
            retrieved = await client.beta.sessions.retrieve(session.id)
            return retrieved.status == "idle" and "waiting" not in (retrieved.model_extra or {})

        await until(idle_and_not_waiting, "the session is idle and waits for nothing")
        replies = [e async for e in client.beta.sessions.events.list(session.id) if e.type == "agent.message"]
        assert len(replies) == 1, "the turn that waited was answered once"


async def turn_started(handle: Any) -> bool:
    """Whether a worker has taken the session's model turn (its activity is pending and started)."""
    pending = (await handle.describe()).raw_description.pending_activities
    return any(a.activity_type.name == "model_turn" and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
               for a in pending)  # fmt: skip


@contextlib.asynccontextmanager
async def held_worker(stack: Stack) -> AsyncIterator[tuple[str, Any]]:
    """A model worker of one slot on a queue of its own, the slot held by a slow turn: (the queue, that session)."""
    queue = unique("model")
    model = anthropic.AsyncAnthropic(base_url=stack.model_server.base_url, api_key="test-key", max_retries=0)
    activities = [ModelActivities(stack.client, model).model_turn, *knowledge_activities(stack.client)]
    async with Worker(stack.client, task_queue=queue, activities=activities, max_concurrent_activities=1):
        slow = stack.script([{"text": "never sent", "first_token_latency": 120.0}])
        holder = await stack.start(slow, message="take your time", model_task_queue=queue)
        await until(lambda: turn_started(holder), "the slow turn holds the worker's one slot")
        yield queue, holder


async def test_turns_behind_a_busy_worker_wait_with_it_polling_and_run_once_it_is_free(stack: Stack) -> None:
    """The machine is full: one model worker with one slot, held by a slow turn. Two more sessions' turns wait in the
    queue, counted, with the worker still listed as polling; once the slow turn is interrupted, both run."""
    async with held_worker(stack) as (queue, holder):
        quick = stack.script([{"text": "done"}], loop=True)
        waiting = [await stack.start(quick, message=f"turn {n}", model_task_queue=queue) for n in range(2)]

        async def counted() -> bool:
            return (await queue_load(stack.client, queue, "activity")).backlog == 2

        await until(counted, "both waiting turns are counted in the queue's backlog")
        for handle in waiting:
            [wait] = [w for w in await session_waits(stack.client, await handle.describe()) if w.activity_type]
            assert (wait.queue, wait.role, wait.backlog(), wait.load.pollers) == (queue, "model", 2, 1)
            assert 0 <= wait.ahead(datetime.now(UTC)) <= 1
        shown = await corral(stack, "status", waiting[-1].id)
        said = " ".join(shown.stdout.split())
        assert shown.returncode == 0 and "~2 waiting in that queue" in said and "1 worker polling" in said, shown

        await holder.signal(SIGNAL_INTERRUPT)
        for handle in waiting:
            assert texts(await wait_for_idle(handle)) == ["done"], "each waiting turn ran, once"
        await until(lambda: backlog_is(stack, queue, 0), "the queue's backlog is empty again")


async def queued(stack: Stack, queue: str, count: int) -> bool:
    """Whether `count` tasks wait in the activity queue's root partition (the one a worker polls first), as the
    partition itself says (the legacy `include_task_queue_status`), not the stats `DescribeTaskQueue` caches."""
    request = DescribeTaskQueueRequest(namespace=stack.client.namespace, task_queue=TaskQueue(name=queue),
                                       task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
                                       include_task_queue_status=True)  # fmt: skip
    status = (await stack.client.workflow_service.describe_task_queue(request)).task_queue_status
    return status.backlog_count_hint == count


async def test_turns_waiting_for_a_busy_worker_are_taken_in_the_order_they_came(stack: Stack) -> None:
    """One model worker with one slot, held by a slow turn; eight sessions' turns then wait behind it, each scheduled
    only once the one before is in the queue. Freed, the worker takes them in that order: the local server keeps one
    partition per task queue (corral/temporal.py `LOCAL_SERVER_ARGS`). With the server's default four, a backlog is
    spread over four partitions, and the worker drains them in no particular order."""
    async with held_worker(stack) as (queue, holder):
        quick = stack.script([{"text": "done"}], loop=True)
        waiting = []
        for n in range(8):
            waiting.append(await stack.start(quick, message=f"turn {n}", model_task_queue=queue))
            in_line = f"turn {n} waiting in the queue's one partition behind the others (corral/temporal.py)"
            await until(functools.partial(queued, stack, queue, n + 1), in_line, within=10)
        await holder.signal(SIGNAL_INTERRUPT)
        for handle in waiting:
            assert texts(await wait_for_idle(handle)) == ["done"], "each waiting turn ran, once"
    taken = [re.findall(r"turn \d", str(request["body"]["messages"]))[0] for request in stack.requests(quick)]
    assert taken == [f"turn {n}" for n in range(8)], "the waiting turns were taken in the order they came"


async def test_a_session_no_harness_worker_has_taken_yet_is_shown_waiting_for_one(stack: Stack, tmp_path: Path) -> None:
    """Its status is read from the server, not asked of the workflow: it answers with no harness worker free."""
    queue = unique("harness")
    handle = await dataclasses.replace(stack, harness_queue=queue).start(stack.script([{"text": "hi"}]), message="hi")

    async def harness_waits() -> list[Waiting]:
        return [w for w in await session_waits(stack.client, await handle.describe()) if w.kind == "workflow"]

    await until(harness_waits, "the session's first workflow task is scheduled and not started")
    [wait] = await harness_waits()
    assert (wait.queue, wait.role, wait.activity_type, wait.load.pollers) == (queue, "harness", None, 0)
    shown = await corral(stack, "--state-dir", str(tmp_path), "status", handle.id)
    said = " ".join(shown.stdout.split())
    assert shown.returncode == 0 and f"{handle.id} idle" in said, shown
    assert "waiting for a harness worker for" in said and f"(the harness's next step, queue {queue})" in said
    async with harness_worker(stack.client, queue):
        await wait_for_idle(handle)
        await until(lambda: harness_waits_are_none(stack, handle), "the session waits for no harness worker")


async def harness_waits_are_none(stack: Stack, handle: Any) -> bool:
    return not [w for w in await session_waits(stack.client, await handle.describe()) if w.kind == "workflow"]


def load(backlog: int, oldest: float) -> QueueLoad:
    return QueueLoad("corral-model", "activity", backlog, timedelta(seconds=oldest), 1, 0.0, 0.0)


def test_tasks_ahead_is_the_share_of_the_backlog_older_than_the_task() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def waited(seconds: float, queue: QueueLoad) -> Waiting:
        return Waiting("activity", queue.queue, "model_turn", now - timedelta(seconds=seconds), queue)

    assert waited(5, load(10, 10)).ahead(now) == 5, "scheduled halfway through the oldest's wait"
    assert waited(10, load(10, 10)).ahead(now) == 0, "the oldest has none ahead"
    assert waited(0, load(10, 10)).ahead(now) == 9, "the newest has every other ahead"
    stale = waited(3, load(0, 1))  # the server's cached count is older than the task
    assert (stale.backlog(), stale.oldest(now), stale.ahead(now)) == (1, timedelta(seconds=3), 0)


def test_a_queue_is_known_by_its_role_whatever_worker_or_pool_it_names() -> None:
    assert [queue for queue, _, _ in ROLE_QUEUES] == list(CORRAL_TASK_QUEUES), "corral status shows every role's queue"
    assert [role_of(q) for q in ("corral-model", "corral-model@w1", "corral-sandbox.gpu", "corral-modelx")] == [
        "model", "model", "sandbox", None
    ]  # fmt: skip


def test_corral_status_of_a_session_id_with_spaces_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "cli.main", "--state-dir", str(tmp_path), "status", "sesn_a b"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    said = " ".join(done.stderr.replace("│", " ").split())
    assert done.returncode == 2 and "it contains whitespace" in said and "Traceback" not in said, done
