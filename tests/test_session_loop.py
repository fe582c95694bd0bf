"""The session loop end to end: real dev server, real workers, real HTTP to the offline model."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.api.enums.v1 import EventType

from corral.client import send_text, session_info
from corral.contract.events import AgentToolResult, RequiresAction, SessionError
from corral.contract.session import SendEventsInput, SendEventsResult, UserMessageSignal
from corral.names import SIGNAL_USER_MESSAGE, UPDATE_SEND_EVENTS
from tests.conftest import Stack, assert_log_is_whole, read_events, stop_reason, texts, wait_for_idle
from tests.waits import until
from workflows.session import MODEL_KEY, STATUS_KEY


async def test_multi_turn_conversation(stack: Stack) -> None:
    model = stack.script([{"text": "Hello, I am scripted."}, {"text": "You said:", "echo_last_user": True}])
    handle = await stack.start(model, message="hi there")
    first = await wait_for_idle(handle)
    await send_text(handle, "second message")
    await wait_for_idle(handle, after=first[-1].position)
    events = await read_events(handle)
    assert_log_is_whole(events)
    assert [e.type for e in events] == [
        "user.message",
        "session.status_running",
        "span.model_request_start",
        "span.model_request_end",
        "agent.message",
        "session.status_idle",
        "user.message",
        "session.status_running",
        "span.model_request_start",
        "span.model_request_end",
        "agent.message",
        "session.status_idle",
    ]
    assert texts(events) == ["Hello, I am scripted.", "You said:\nsecond message"]
    assert all(e.processed_at is not None for e in events)
    ends = [e for e in events if e.type == "span.model_request_end"]
    assert all(e.model_usage.input_tokens > 0 and e.model_usage.output_tokens > 0 for e in ends)
    # The second request carried the whole conversation, in order, rebuilt from the log.
    second = stack.requests(model)[1]["body"]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    info = await session_info(handle)
    assert (info.status, info.turns, info.stop_reason) == ("idle", 2, "end_turn")
    assert info.usage.output_tokens == sum(e.model_usage.output_tokens for e in ends)


async def test_tool_use_loop_routes_through_execute(stack: Stack) -> None:
    model = stack.script(
        [
            {"text": "Let me compute.", "tool_uses": [{"name": "calculate", "input": {"expression": "2*(3+4)"}}]},
            {"tool_uses": [{"name": "echo", "input": {"text": "done"}}, {"name": "nope", "input": {}}]},
            {"text": "Result:", "echo_last_user": True},
        ]
    )
    tools = [stack.hand_tool("calculate", expression={"type": "string"}), stack.hand_tool("echo")]
    handle = await stack.start(model, message="what is 2*(3+4)?", tools=tools)
    events = await wait_for_idle(handle)
    assert_log_is_whole(events)
    uses = [e for e in events if e.type == "agent.tool_use"]
    results = [e for e in events if e.type == "agent.tool_result"]
    assert [u.name for u in uses] == ["calculate", "echo", "nope"]
    assert [r.tool_use_id for r in results] == [u.id for u in uses]
    assert texts(events, "agent.tool_result")[0] == "2*(3+4) = 14"
    assert [r.is_error for r in results] == [False, False, True]
    assert "Unknown tool 'nope'" in texts(events, "agent.tool_result")[2]
    assert texts(events)[-1].startswith("Result:\ndone")
    # The model saw tool results keyed by the event ids of the tool uses.
    last = stack.requests(model)[-1]["body"]["messages"]
    sent_ids = {
        b["tool_use_id"] for m in last if m["role"] == "user" for b in m["content"] if b["type"] == "tool_result"
    }
    assert sent_ids == {u.id for u in uses}


async def test_messages_sent_mid_turn_are_queued_and_processed_in_order(stack: Stack) -> None:
    model = stack.script(
        [{"text": "slow answer", "first_token_latency": 1.5}, {"text": "Got:", "echo_last_user": True}]
    )
    handle = await stack.start(model, message="first")
    await until(lambda: len(stack.requests(model)) == 1, "the first answer asked for (1.5 s to its first token)")
    ids = [await send_text(handle, f"queued {n}") for n in range(3)]
    queued = await session_info(handle)
    assert queued.status == "running" and queued.queued_user_events == 3
    await wait_for_idle(handle)
    events = await read_events(handle)
    assert_log_is_whole(events)
    messages = [e for e in events if e.type == "user.message"]
    assert [m.id for m in messages[1:]] == ids
    assert all(m.processed_at is not None for m in messages)
    assert texts(events) == ["slow answer", "Got:\nqueued 0\nqueued 1\nqueued 2"]
    # One running/idle pair: the queued messages continued the same turn.
    assert [e.type for e in events].count("session.status_idle") == 1


async def test_user_message_signal_is_deduplicated_by_client_id(stack: Stack) -> None:
    model = stack.script([{"text": "ok"}], loop=True)
    handle = await stack.start(model)
    for _ in range(3):
        await handle.signal(SIGNAL_USER_MESSAGE, UserMessageSignal(content="once", id="client-1"))
    result = await handle.execute_update(
        UPDATE_SEND_EVENTS,
        SendEventsInput(events=[{"type": "user.message", "content": "once", "id": "client-1"}]),
        result_type=SendEventsResult,
    )
    events = await wait_for_idle(handle)
    messages = [e for e in events if e.type == "user.message"]
    assert len(messages) == 1 and messages[0].client_id == "client-1"
    assert result.event_ids == [messages[0].id]


async def test_custom_tool_waits_for_the_client(stack: Stack) -> None:
    model = stack.script(
        [
            {"tool_uses": [{"name": "lookup", "input": {"key": "color"}}]},
            {"text": "Client said:", "echo_last_user": True},
        ]
    )
    custom = {"type": "custom", "name": "lookup", "description": "ask the client"}
    handle = await stack.start(model, message="what color?", tools=[custom])
    events = await wait_for_idle(handle)
    use = next(e for e in events if e.type == "agent.custom_tool_use")
    assert stop_reason(events[-1]).type == "requires_action"
    requires = stop_reason(events[-1])
    assert isinstance(requires, RequiresAction) and requires.event_ids == [use.id]
    await handle.execute_update(
        UPDATE_SEND_EVENTS,
        SendEventsInput(events=[{"type": "user.custom_tool_result", "custom_tool_use_id": use.id, "content": "blue"}]),
        result_type=SendEventsResult,
    )
    events = await wait_for_idle(handle, after=events[-1].position)
    assert texts(events) == ["Client said:\nblue"]
    assert stop_reason(events[-1]).type == "end_turn"


async def test_web_ui_summary_details_and_search_attributes(stack: Stack) -> None:
    model = stack.script([{"text": "ok"}])
    handle = await stack.start(model, message="hi", title="UI check", metadata={"team": "search"})
    await wait_for_idle(handle)
    description = await handle.describe()
    assert await description.static_summary() == f"UI check · {model}"
    details = await description.static_details()
    assert details is not None and "**team** search" in details
    current = await handle.query("__temporal_workflow_metadata")
    assert "**idle** (end_turn)" in current.current_details
    for _ in range(50):  # visibility is eventually consistent
        attributes = (await handle.describe()).typed_search_attributes
        if attributes.get(STATUS_KEY) == "idle":
            break
        await asyncio.sleep(0.1)
    assert attributes.get(STATUS_KEY) == "idle" and attributes.get(MODEL_KEY) == model
    history = await handle.fetch_history()
    summaries = [
        event.user_metadata.summary.data.decode()
        for event in history.events
        if event.HasField("activity_task_scheduled_event_attributes")
    ]
    assert summaries == ['"model turn 1"']


async def test_tool_calls_of_a_reply_cut_off_at_max_tokens_do_not_run(stack: Stack, tmp_path: Path) -> None:
    """As the API says: a `max_tokens` stop may cut a tool call short, so none runs; the model is told, and goes on."""
    marker = tmp_path / "runs.txt"
    cut = {"text": "Writing", "tool_uses": [{"name": "append_line", "input": {"path": str(marker)}}]}
    model = stack.script([{**cut, "stop_reason": "max_tokens"}, {"text": "Going on."}])
    tool = stack.hand_tool("append_line", path={"type": "string"})
    handle = await stack.start(model, "write it", tools=[tool])
    events = await wait_for_idle(handle)
    assert stop_reason(events[-1]).type == "end_turn" and texts(events)[-1] == "Going on."
    (result,) = [e for e in events if isinstance(e, AgentToolResult)]
    assert result.is_error and "cut off at max_tokens" in texts([result], "agent.tool_result")[0]
    assert not marker.exists(), "the cut-off call did not run"
    assert "cut off at max_tokens" in str(stack.requests(model)[1]["body"]["messages"]), "the model was told"

    # Cut off every time: after three replies in a row the turn ends, with a typed error that says what to do.
    always = stack.script([{**cut, "stop_reason": "max_tokens"}], loop=True)
    handle = await stack.start(always, "write it", tools=[tool])
    events = await wait_for_idle(handle)
    assert stop_reason(events[-1]).type == "retries_exhausted" and not marker.exists()
    (error,) = [e for e in events if isinstance(e, SessionError)]
    assert error.error.retry_status.type == "exhausted" and "raise it" in error.error.message
    assert len(stack.requests(always)) == 3


async def test_sixty_concurrent_sends_and_signals_into_one_session_each_land_once(stack: Stack) -> None:
    """Past the server's ten in-flight updates per workflow: every send is taken (the client sends again on
    RESOURCE_EXHAUSTED), each message is logged once under the id returned, and no workflow task fails."""
    model = stack.script([{"text": "Reply.", "echo_last_user": True}], loop=True)
    handle = await stack.start(model)
    sent = [f"burst {number}" for number in range(40)]
    signalled = [f"signal {number}" for number in range(20)]
    ids = await asyncio.gather(
        *(send_text(handle, text, client_id=text) for text in sent),
        *(handle.signal(SIGNAL_USER_MESSAGE, UserMessageSignal(content=text)) for text in signalled),
    )
    events: list = []
    for _ in range(600):
        events = await read_events(handle)
        logged = [e for e in events if e.type == "user.message"]
        if len(logged) == len(sent) + len(signalled) and events[-1].type == "session.status_idle":
            break
        await asyncio.sleep(0.1)
    assert_log_is_whole(events)
    logged = [e for e in events if e.type == "user.message"]
    by_client_id = {e.client_id: e.id for e in logged if e.client_id}
    assert by_client_id == dict(zip(sent, ids[: len(sent)], strict=True))
    assert sorted(texts(events, "user.message")) == sorted(sent + signalled)
    history = await handle.fetch_history()
    failed = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    assert not failed, failed[0]
