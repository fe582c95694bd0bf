"""Bad input, model errors and interrupts: each leaves the session usable and the log whole."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import httpx
import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from corral.client import send_text, session_info
from corral.contract.events import SessionError
from corral.contract.session import MAX_MESSAGE_BYTES, SendEventsInput, SendEventsResult
from corral.names import (
    ACTIVITY_EXECUTE,
    ACTIVITY_PROXY_BIND_SESSION,
    SESSION_WORKFLOW,
    SIGNAL_INTERRUPT,
    SIGNAL_USER_MESSAGE,
    UPDATE_SEND_EVENTS,
)
from tests.conftest import Stack, assert_log_is_whole, read_events, stop_reason, texts, unique, wait_for_idle
from tests.waits import activity_running, until
from workers.roles import model_worker


async def _send(handle: WorkflowHandle, events: list[dict[str, Any]]) -> SendEventsResult:
    return await handle.execute_update(UPDATE_SEND_EVENTS, SendEventsInput(events=events), result_type=SendEventsResult)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], "send at least one event"),
        ([{"type": "user.shout", "content": "hi"}], "does not match any of the expected tags"),
        ([{"type": "user.message"}], "content: Field required"),
        ([{"type": "user.message", "content": "   "}], "content must not be empty"),
        ([{"type": "user.message", "content": "ok"}, {"type": "user.message", "content": 5}], "events[1]"),
        ([{"type": "user.message", "content": "hi", "colour": "red"}], "colour: Extra inputs are not permitted"),
        ([{"type": "user.custom_tool_result", "custom_tool_use_id": "sevt_x"}], "no custom tool call 'sevt_x'"),
        ([{"type": "user.tool_confirmation", "tool_use_id": "x", "result": "allow"}], "not waiting for confirmation"),
        ([{"type": "user.message", "content": "x" * 17_000_000}] * 2, "over the limit of 33554432 bytes"),
    ],
)
async def test_malformed_send_events_is_rejected_and_nothing_is_written(
    stack: Stack, events: list[dict[str, Any]], expected: str
) -> None:
    model = stack.script([{"text": "fine"}], loop=True)
    handle = await stack.start(model, message="hello")
    await wait_for_idle(handle)
    before = await read_events(handle)
    with pytest.raises(WorkflowUpdateFailedError) as caught:
        await _send(handle, events)
    assert expected in str(caught.value.cause)
    assert await read_events(handle) == before
    # The session goes on.
    await send_text(handle, "still there?")
    after = await wait_for_idle(handle, after=before[-1].position)
    assert texts(after) == ["fine"]
    history = await handle.fetch_history()
    assert not any(e.HasField("workflow_execution_failed_event_attributes") for e in history.events)


def _json_payload(data: bytes) -> Payload:
    """A payload as a raw client (the `temporal` CLI, another SDK) may send it: JSON bytes, unchecked."""
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


async def test_invalid_signal_is_dropped_without_failing_the_session(stack: Stack) -> None:
    model = stack.script([{"text": "fine"}], loop=True)
    handle = await stack.start(model)
    await handle.signal(SIGNAL_USER_MESSAGE, {"content": ""})
    await handle.signal(SIGNAL_USER_MESSAGE, {"text": "wrong field"})
    await handle.signal(SIGNAL_USER_MESSAGE, {"content": "x" * (MAX_MESSAGE_BYTES + 1)})  # what send_events refuses
    await handle.signal(SIGNAL_USER_MESSAGE, RawValue(_json_payload(b'{"content": "lone \\ud800 surrogate"}')))
    with pytest.raises(WorkflowUpdateFailedError, match="Workflow update failed"):
        batch = b'{"events": [{"type": "user.message", "content": "lone \\ud800 surrogate"}]}'
        await handle.execute_update(UPDATE_SEND_EVENTS, RawValue(_json_payload(batch)))
    await handle.signal(SIGNAL_USER_MESSAGE, {"content": "valid"})
    events = await wait_for_idle(handle)
    assert texts(events, "user.message") == ["valid"]


async def test_retryable_model_failure_then_success_has_no_duplicates(stack: Stack) -> None:
    model = stack.script(
        [{"text": "made it", "fail": [{"status": 529, "retry_after": 0.2}, {"status": 500, "retry_after": 0.1}]}]
    )
    handle = await stack.start(model, message="go")
    events = await wait_for_idle(handle)
    assert_log_is_whole(events)
    errors = [e for e in events if e.type == "session.error"]
    assert [(e.error.type, e.error.retry_status.type) for e in errors] == [
        ("model_overloaded_error", "retrying"),
        ("model_request_failed_error", "retrying"),
    ]
    assert [e.type for e in events].count("session.status_rescheduled") == 2
    assert texts(events) == ["made it"]
    assert len(stack.requests(model)) == 3
    assert stop_reason(events[-1]).type == "end_turn"


async def test_mid_stream_model_error_is_retried(stack: Stack) -> None:
    model = stack.script([{"text": "one two three four five six", "fail_mid_stream": True}])
    handle = await stack.start(model, message="go")
    events = await wait_for_idle(handle)
    assert texts(events) == ["one two three four five six"]
    assert [e.error.type for e in events if e.type == "session.error"] == ["model_overloaded_error"]


async def test_401_gives_a_session_error_and_the_next_message_works(stack: Stack) -> None:
    model = stack.script([{"text": "recovered", "fail": [{"status": 401, "type": "authentication_error"}]}])
    handle = await stack.start(model, message="first")
    events = await wait_for_idle(handle)
    error = next(e for e in events if e.type == "session.error")
    assert error.error.type == "model_request_failed_error"
    assert error.error.retry_status.type == "exhausted"
    assert "401" in error.error.message
    assert stop_reason(events[-1]).type == "retries_exhausted"
    assert len(stack.requests(model)) == 1, "a 401 must not be retried"
    await send_text(handle, "second")
    events = await wait_for_idle(handle, after=events[-1].position)
    assert texts(events) == ["recovered"]


async def test_retries_exhausted_after_max_attempts(stack: Stack) -> None:
    model = stack.script([{"text": "never", "fail": [{"status": 429, "retry_after": 0}] * 5}])
    handle = await stack.start(model, message="go", model_retry={"max_attempts": 3})
    events = await wait_for_idle(handle)
    statuses = [e.error.retry_status.type for e in events if e.type == "session.error"]
    assert statuses == ["retrying", "retrying", "exhausted"]
    assert stop_reason(events[-1]).type == "retries_exhausted"


async def test_interrupt_mid_model_turn(stack: Stack) -> None:
    model = stack.script([{"text": "too slow", "first_token_latency": 30, "pace_hits": 1}, {"text": "fast"}])
    cancelled_before = _model_stats(stack)["cancelled_streams"]
    handle = await stack.start(model, message="start something long")
    await until(lambda: len(stack.requests(model)) == 1, "the model stream open, its first token 30 s away")
    await handle.signal(SIGNAL_INTERRUPT)
    events = await wait_for_idle(handle, within_seconds=15)
    assert "agent.message" not in [e.type for e in events]
    end = next(e for e in events if e.type == "span.model_request_end")
    assert end.is_error
    assert (await session_info(handle)).status == "idle"
    for _ in range(100):  # the cancel reaches the model activity with its next heartbeat
        if _model_stats(stack)["cancelled_streams"] > cancelled_before:
            break
        await asyncio.sleep(0.1)
    assert _model_stats(stack)["cancelled_streams"] > cancelled_before, "the model stream was not cancelled"
    await send_text(handle, "now something short")
    events = await wait_for_idle(handle, after=events[-1].position)
    assert texts(events) == ["too slow"]  # step 0 again, no longer paced
    interrupt = next(e for e in await read_events(handle) if e.type == "user.interrupt")
    assert interrupt.processed_at is not None


async def test_interrupt_mid_tool_cancels_it_and_redirects(stack: Stack, tmp_path: Any) -> None:
    model = stack.script(
        [
            {"tool_uses": [{"name": "sleep", "input": {"seconds": 60, "marker": str(tmp_path / "marker")}}]},
            {"text": "after:", "echo_last_user": True},
        ]
    )
    handle = await stack.start(model, message="sleep a while", tools=[stack.hand_tool("sleep")])
    await until(lambda: activity_running(handle, ACTIVITY_EXECUTE), "the tool running in the hand")
    result = await _send(handle, [{"type": "user.interrupt"}, {"type": "user.message", "content": "do this instead"}])
    assert len(result.event_ids) == 2
    interrupted = await wait_for_idle(handle, within_seconds=15)
    assert (tmp_path / "marker").read_text() == "cancelled", "the hand's activity was not cancelled"
    tool_result = next(e for e in interrupted if e.type == "agent.tool_result")
    assert tool_result.is_error and "interrupted" in tool_result.content[0].text
    # The redirecting message, sent in the same batch after the interrupt, runs a new turn.
    redirected = await wait_for_idle(handle, after=interrupted[-1].position)
    assert texts(redirected) == ["after:\nCancelled: the user interrupted this tool call.\ndo this instead"]
    assert_log_is_whole(await read_events(handle))


def _model_stats(stack: Stack) -> dict[str, int]:
    stats: dict[str, int] = httpx.get(f"{stack.model_server.base_url}/_corral/stats").json()
    return stats


async def test_unreachable_model_endpoint_is_retried_then_exhausted(stack: Stack) -> None:
    dead = anthropic.AsyncAnthropic(base_url="http://127.0.0.1:9", api_key="test-key", max_retries=0)
    queue = f"{stack.model_queue}-dead"
    async with model_worker(stack.client, dead, queue):
        handle = await stack.start(
            "any-model",
            message="hello?",
            model_task_queue=queue,
            model_retry={"max_attempts": 2, "initial_delay_seconds": 0.1},
        )
        events = await wait_for_idle(handle)
    errors = [e for e in events if isinstance(e, SessionError)]
    assert [(e.error.type, e.error.retry_status.type) for e in errors] == [
        ("model_request_failed_error", "retrying"),
        ("model_request_failed_error", "exhausted"),
    ]
    assert "connection error" in errors[0].error.message
    assert stop_reason(events[-1]).type == "retries_exhausted"


async def test_an_interrupt_while_the_session_binds_at_the_proxy_is_honoured(stack: Stack) -> None:
    """No proxy worker answers here, so the bind waits; an interrupt then ends the turn like any other: processed,
    no error, the model not called, and the next turn binds again."""
    model = stack.script([{"text": "should not be reached"}], loop=True)
    mcp = {"mcp_servers": [{"type": "url", "name": "tools", "url": "http://127.0.0.1:9/mcp"}]}
    agent = {"model": model, **mcp, "tools": [{"type": "mcp_toolset", "mcp_server_name": "tools"}]}
    handle = await stack.start(model, "hello", agent=agent)
    async with asyncio.timeout(30):
        while ACTIVITY_PROXY_BIND_SESSION not in (await handle.fetch_history()).to_json():
            await asyncio.sleep(0.1)
    await handle.signal(SIGNAL_INTERRUPT)
    events = await wait_for_idle(handle, within_seconds=30)
    assert stop_reason(events[-1]).type == "end_turn"
    assert not [e for e in events if e.type == "session.error"], [e.model_dump() for e in events]
    (interrupt,) = [e for e in events if e.type == "user.interrupt"]
    assert interrupt.processed_at is not None and not stack.requests(model), "the model was not called"
    await send_text(handle, "again")
    async with asyncio.timeout(30):  # the next turn asks the proxy again
        while (await handle.fetch_history()).to_json().count(f'"{ACTIVITY_PROXY_BIND_SESSION}"') < 2:
            await asyncio.sleep(0.1)


async def test_a_bad_start_input_fails_the_session_at_once_saying_why(stack: Stack) -> None:
    """What the `temporal` CLI (or any raw client) can send: a start input that fails validation ends the workflow
    with a typed, non-retryable failure listing each problem, instead of a workflow task retried forever."""
    bad = {"agent": {"model": "m", "max_tokens": 0}, "colour": "red"}
    handle = await stack.client.start_workflow(SESSION_WORKFLOW, bad, id=unique("bad"), task_queue=stack.harness_queue)
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 30)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput" and cause.non_retryable
    assert "agent.max_tokens: Input should be greater than or equal to 1" in cause.message
    assert "colour: Extra inputs are not permitted" in cause.message
