"""A self-hosted environment's work queue and a session in it, from a Temporal client (the gateway's routes and
the official SDK worker are tested in test_api_work_queue.py and test_self_hosted.py): the session asks for hands
on its first built-in call, a worker's delivery, acknowledgment and heartbeat lease, its `user.tool_result` as
the call's answer, and what happens when the lease lapses (the waiting call is answered once, as an error whose
outcome is unknown, and a late result is refused), plus every refusal of the queue."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from corral.client import read_events, send_events, wait_for_idle
from corral.contract.events import AgentToolResult, AgentToolUse, UserToolResult
from corral.contract.session import SessionInfo
from corral.contract.work import (
    NO_HEARTBEAT,
    ClaimWork,
    HeartbeatWork,
    SelfHostedEnvironment,
    StopWork,
    WorkItem,
    WorkMetadataChange,
)
from corral.work_queue import (
    HeartbeatPreconditionFailed,
    WorkAlreadyStopped,
    WorkNotFound,
    WorkNotQueued,
    WorkQueues,
)
from tests.conftest import Stack
from tests.waits import until

pytestmark = pytest.mark.timeout(240)
TOOLSET = [{"type": "agent_toolset_20260401"}]


def refusal(error: WorkflowUpdateFailedError) -> str:
    """Why the session refused an update (its validator's message)."""
    cause = error.cause
    return cause.message if isinstance(cause, ApplicationError) else str(cause)


def environment() -> SelfHostedEnvironment:
    return SelfHostedEnvironment(environment_id=f"env_{uuid.uuid4().hex[:20]}", workspace="default")


def claim(worker: str, reclaim_ms: int = 5000) -> ClaimWork:
    return ClaimWork(worker_id=worker, reclaim_older_than_ms=reclaim_ms, token_sha256=hashlib.sha256(b"t").hexdigest())


async def queued_item(queues: WorkQueues, environment_id: str) -> WorkItem:
    found: list[WorkItem] = []

    async def queued() -> bool:
        found[:] = [item for item in await queues.items(environment_id) if item.state == "queued"]
        return bool(found)

    await until(queued, "a queued work item")
    return found[0]


async def waiting_call(handle: WorkflowHandle) -> AgentToolUse:
    async def asked() -> bool:
        return (await handle.query("session", result_type=SessionInfo)).awaiting_worker > 0

    await until(asked, "the session waiting for a self-hosted worker")
    return next(e for e in await read_events(handle) if isinstance(e, AgentToolUse))


async def test_a_worker_serves_a_call_and_its_result_is_the_answer(stack: Stack) -> None:
    env = environment()
    queues = WorkQueues(stack.client, stack.harness_queue)
    model = stack.script([{"tool_uses": [{"name": "bash", "input": {"command": "echo hi"}}]}, {"text": "done"}])
    handle = await stack.start(model, "run it", TOOLSET, environment=env)
    item = await queued_item(queues, env.environment_id)
    assert item.session_id == handle.id and item.workspace == "default"
    use = await waiting_call(handle)
    assert use.evaluated_permission == "allow"
    shown = await handle.query("__temporal_workflow_metadata")  # what the Web UI shows
    assert "**running** · waiting for a self-hosted worker (1 call(s))" in shown.current_details

    delivered = await queues.claim(env.environment_id, claim("w1"))
    assert delivered is not None and delivered.id == item.id and delivered.delivered_to == "w1"
    assert await queues.claim(env.environment_id, claim("w2")) is None  # delivered: not before reclaim
    assert (await queues.ack(env.environment_id, item.id)).state == "starting"
    with pytest.raises(WorkNotQueued):
        await queues.ack(env.environment_id, item.id)
    beat = await queues.heartbeat(
        env.environment_id, HeartbeatWork(work_id=item.id, expected_last_heartbeat=NO_HEARTBEAT)
    )
    assert beat.lease_extended and beat.state == "active" and beat.last_heartbeat
    with pytest.raises(HeartbeatPreconditionFailed) as stale:
        await queues.heartbeat(env.environment_id, HeartbeatWork(work_id=item.id, expected_last_heartbeat="nope"))
    assert stale.value.current_state.last_heartbeat == beat.last_heartbeat
    with pytest.raises(HeartbeatPreconditionFailed):  # a second claim while the lease is held
        await queues.heartbeat(env.environment_id, HeartbeatWork(work_id=item.id, expected_last_heartbeat=NO_HEARTBEAT))
    again = await queues.heartbeat(
        env.environment_id, HeartbeatWork(work_id=item.id, expected_last_heartbeat=beat.last_heartbeat)
    )
    assert again.lease_extended and again.last_heartbeat != beat.last_heartbeat

    result = {"type": "user.tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "hi\n"}]}
    await send_events(handle, [result])
    events = await wait_for_idle(handle)
    answers = [e for e in events if getattr(e, "tool_use_id", None) == use.id]
    assert [type(e) for e in answers] == [UserToolResult]  # the worker's result is the answer, alone
    assert answers[0].processed_at is not None
    (answer,) = stack.requests(model)[1]["body"]["messages"][-1]["content"]
    assert (answer["type"], answer["tool_use_id"], answer["content"][0]["text"]) == ("tool_result", use.id, "hi\n")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await send_events(handle, [result])  # answered once
    assert f"no call {use.id!r} is waiting" in refusal(refused.value)

    item = await queues.update_metadata(env.environment_id, WorkMetadataChange(work_id=item.id, metadata={"a": "1"}))
    assert item.metadata == {"a": "1"}
    assert (await queues.stop(env.environment_id, StopWork(work_id=item.id, force=True))).state == "stopped"
    with pytest.raises(WorkAlreadyStopped):
        await queues.stop(env.environment_id, StopWork(work_id=item.id))
    ended = await queues.heartbeat(
        env.environment_id, HeartbeatWork(work_id=item.id, expected_last_heartbeat=again.last_heartbeat)
    )
    assert not ended.lease_extended and ended.state == "stopped"  # the worker learns it is to end
    with pytest.raises(WorkNotFound):
        await queues.ack(env.environment_id, "work_nosuchitem")
    state = await queues.state(env.environment_id, "default")
    assert (state.depth, state.pending) == (0, 0) and set(state.pollers) == {"w1", "w2"}


async def test_a_lapsed_lease_answers_the_waiting_call_once_as_unknown(stack: Stack) -> None:
    env = environment()
    queues = WorkQueues(stack.client, stack.harness_queue)
    bash = {"tool_uses": [{"name": "bash", "input": {"command": "make deploy"}}]}
    model = stack.script([bash, bash, {"text": "done"}])
    handle = await stack.start(model, "deploy", TOOLSET, environment=env)
    first = await queued_item(queues, env.environment_id)
    use = await waiting_call(handle)
    assert await queues.claim(env.environment_id, claim("dies")) is not None
    await queues.ack(env.environment_id, first.id)
    await queues.heartbeat(
        env.environment_id, HeartbeatWork(work_id=first.id, expected_last_heartbeat=NO_HEARTBEAT, ttl_seconds=2)
    )  # and then the worker dies: no more heartbeats

    async def answered() -> bool:
        return any(getattr(e, "tool_use_id", None) == use.id for e in await read_events(handle))

    await until(answered, "the killed worker's call answered")
    (answer,) = [e for e in await read_events(handle) if getattr(e, "tool_use_id", None) == use.id]
    assert isinstance(answer, AgentToolResult) and answer.is_error
    assert "outcome is unknown" in answer.content[0].text
    lapsed = await queues.item(env.environment_id, first.id)
    assert lapsed is not None and lapsed.state == "stopped" and lapsed.end_reason == "lease_lost"
    late = {"type": "user.tool_result", "tool_use_id": use.id, "content": "ran it after all"}
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await send_events(handle, [late])
    assert f"no call {use.id!r} is waiting" in refusal(refused.value)

    # The session's next call asks for a new item, which another worker serves.
    second = await queued_item(queues, env.environment_id)
    assert second.id != first.id and second.session_id == handle.id
    retry = await waiting_call_after(handle, use.id)
    assert await queues.claim(env.environment_id, claim("lives")) is not None
    await send_events(handle, [{"type": "user.tool_result", "tool_use_id": retry.id, "content": "deployed"}])
    events = await wait_for_idle(handle)
    assert [e.id for e in events if isinstance(e, AgentToolUse)] == [use.id, retry.id]
    assert len([e for e in events if isinstance(e, UserToolResult)]) == 1


async def waiting_call_after(handle: WorkflowHandle, previous: str) -> AgentToolUse:
    async def asked() -> bool:
        uses = [e for e in await read_events(handle) if isinstance(e, AgentToolUse) and e.id != previous]
        return bool(uses) and (await handle.query("session", result_type=SessionInfo)).awaiting_worker > 0

    await until(asked, "a second call waiting for a self-hosted worker")
    return [e for e in await read_events(handle) if isinstance(e, AgentToolUse)][-1]


async def test_an_unacknowledged_delivery_is_delivered_again(stack: Stack) -> None:
    env = environment()
    queues = WorkQueues(stack.client, stack.harness_queue)
    model = stack.script([{"tool_uses": [{"name": "bash", "input": {"command": "true"}}]}, {"text": "done"}])
    await stack.start(model, "go", TOOLSET, environment=env)
    item = await queued_item(queues, env.environment_id)
    assert await queues.claim(env.environment_id, claim("a", reclaim_ms=0)) is not None
    again = await queues.claim(env.environment_id, claim("b", reclaim_ms=0))
    assert again is not None and again.id == item.id and again.delivered_to == "b" and again.deliveries == 2


async def test_a_result_for_a_session_without_a_self_hosted_worker_is_refused(stack: Stack) -> None:
    handle = await stack.start(stack.script([{"text": "hello"}]), "hi")
    await wait_for_idle(handle)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await send_events(handle, [{"type": "user.tool_result", "tool_use_id": "toolu_x", "content": "x"}])
    assert "routed to a self-hosted environment's worker" in refusal(refused.value)


async def test_an_interrupt_answers_the_waiting_call_and_an_ended_session_stops_its_item(stack: Stack) -> None:
    env = environment()
    queues = WorkQueues(stack.client, stack.harness_queue)
    model = stack.script([{"tool_uses": [{"name": "bash", "input": {"command": "sleep 1000"}}]}, {"text": "ok"}])
    handle = await stack.start(model, "wait", TOOLSET, environment=env)
    item = await queued_item(queues, env.environment_id)
    use = await waiting_call(handle)
    await queues.claim(env.environment_id, claim("w"))
    beat = await queues.heartbeat(
        env.environment_id, HeartbeatWork(work_id=item.id, expected_last_heartbeat=NO_HEARTBEAT)
    )
    await send_events(handle, [{"type": "user.interrupt"}])
    events = await wait_for_idle(handle)
    (answer,) = [e for e in events if getattr(e, "tool_use_id", None) == use.id]
    assert isinstance(answer, AgentToolResult) and answer.is_error  # the interrupt answered it
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await send_events(handle, [{"type": "user.tool_result", "tool_use_id": use.id, "content": "too late"}])
    assert f"no call {use.id!r} is waiting" in refusal(refused.value)
    assert (await handle.query("session", result_type=SessionInfo)).awaiting_worker == 0

    await handle.cancel()  # the session ends (as a deletion ends it): its item stops, and its worker is told

    async def stopping() -> bool:
        current = await queues.item(env.environment_id, item.id)
        return current is not None and current.state == "stopping" and current.end_reason == "session_ended"

    await until(stopping, "the ended session's item stopping")
    told = await queues.heartbeat(
        env.environment_id, HeartbeatWork(work_id=item.id, expected_last_heartbeat=beat.last_heartbeat)
    )
    assert not told.lease_extended and told.state == "stopping"
