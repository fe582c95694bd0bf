"""Multi-agent sessions from a Temporal client: a coordinator spawns threads (durable child workflows), messages
them and collects their replies; threads share the session's hands; the client answers a subagent's calls on the
session by tool-use id, interrupts one thread or all, and archives one. The model is the offline scripted server."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError

from corral.client import fork_session, read_events, send_events, wait_for_idle
from corral.contract.events import (
    AgentCustomToolUse,
    AgentThreadMessageReceived,
    AgentThreadMessageSent,
    AgentToolUse,
    SessionEvent,
    SessionThreadCreated,
    SessionThreadStatusIdle,
)
from corral.contract.session import SessionInfo
from corral.contract.threads import ArchiveThreadInput, SpawnThreadInput, ThreadInfo, primary_thread_id
from corral.names import QUERY_THREADS, THREAD_LIMIT_REACHED, UPDATE_ARCHIVE_THREAD, UPDATE_SPAWN_THREAD
from tests.conftest import Stack, assert_log_is_whole, texts
from tests.waits import until

pytestmark = pytest.mark.timeout(300)


def roster_agent(name: str, model: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "agent", "id": f"agent_{name}", "version": 1, "config": {"model": model, "name": name,
                                                                             "tools": tools}}  # fmt: skip


def coordinator(model: str, roster: list[dict[str, Any]], **multiagent: Any) -> dict[str, Any]:
    return {"model": model, "name": "lead", "multiagent": {"agents": roster, **multiagent}}


def spawn(agent: str, message: str) -> dict[str, Any]:
    return {"name": "spawn_thread", "input": {"agent": agent, "message": message}}


WAIT = {"name": "wait_for_threads", "input": {}}


async def threads_of(handle: WorkflowHandle) -> list[ThreadInfo]:
    return await handle.query(QUERY_THREADS, result_type=list[ThreadInfo])


async def all_events(client: Any, workflow_id: str) -> list[SessionEvent]:
    return await read_events(client.get_workflow_handle(workflow_id))


async def until_threads_idle(handle: WorkflowHandle, count: int) -> list[ThreadInfo]:
    async def idle() -> bool:
        threads = (await threads_of(handle))[1:]
        return len(threads) == count and all(t.status == "idle" for t in threads)

    await until(idle, f"{count} threads idle")
    return await threads_of(handle)


async def test_a_coordinator_spawns_two_threads_and_collects_their_replies(stack: Stack) -> None:
    echo = stack.hand_tool("echo", text={"type": "string"})
    alpha = stack.script([{"tool_uses": [{"name": "echo", "input": {"text": "a"}}]}, {"text": "alpha found 1"}])
    beta = stack.script([{"tool_uses": [{"name": "echo", "input": {"text": "b"}}]}, {"text": "beta found 2"}])
    lead = stack.script([
        {"text": "Splitting the work.", "tool_uses": [spawn("alpha", "count a"), spawn("beta", "count b")]},
        {"tool_uses": [WAIT]},
        {"tool_uses": [WAIT]},
        {"text": "Both threads reported: 3 in all."},
    ])  # fmt: skip
    agent = coordinator(lead, [roster_agent("alpha", alpha, [echo]), roster_agent("beta", beta, [echo])])
    handle = await stack.start(lead, "count everything", agent=agent)

    async def summed_up() -> bool:
        return "Both threads reported: 3 in all." in texts(await read_events(handle))

    await until(summed_up, "the coordinator's summary")
    events = await read_events(handle)
    assert_log_is_whole(events)

    created = [e for e in events if isinstance(e, SessionThreadCreated)]
    assert sorted(e.agent_name for e in created) == ["alpha", "beta"]
    sent = [e for e in events if isinstance(e, AgentThreadMessageSent)]
    assert [(e.to_session_thread_id, e.to_agent_name) for e in sent] == [
        (c.session_thread_id, c.agent_name) for c in created
    ]
    received = {e.from_session_thread_id: e for e in events if isinstance(e, AgentThreadMessageReceived)}
    by_name = {c.agent_name: c.session_thread_id for c in created}
    assert texts([received[by_name["alpha"]], received[by_name["beta"]]], "agent.thread_message_received") == [
        "alpha found 1",
        "beta found 2",
    ]
    idles = [e for e in events if isinstance(e, SessionThreadStatusIdle)]
    assert {e.session_thread_id for e in idles} == set(by_name.values())
    cross_posted = [e for e in events if isinstance(e, AgentToolUse) and e.session_thread_id is not None]
    assert sorted(e.input["text"] for e in cross_posted) == ["a", "b"], "each subagent's call is on the primary log"

    # The model saw each reply as a message from its thread.
    last_request = stack.requests(lead)[-1]["body"]["messages"]
    shown = str(last_request)
    assert f"Message from thread {by_name['alpha']} (alpha)" in shown and "beta found 2" in shown

    threads = await until_threads_idle(handle, 2)
    assert threads[0].id == primary_thread_id(handle.id) and threads[0].parent_thread_id is None
    for info in threads[1:]:
        assert info.parent_thread_id == threads[0].id and info.session_id == handle.id
        assert info.usage.output_tokens > 0 and info.turns == 2
        thread_log = await all_events(stack.client, info.id)
        assert_log_is_whole(thread_log)
        assert isinstance(thread_log[0], AgentThreadMessageReceived), "a thread starts on its parent's message"
        reply = [e for e in thread_log if isinstance(e, AgentThreadMessageSent)]
        assert len(reply) == 1 and reply[0].to_session_thread_id == threads[0].id and reply[0].to_agent_name is None
        described = await stack.client.get_workflow_handle(info.id).describe()
        assert described.parent_id == handle.id, "the Web UI shows the thread as the session's child workflow"
        assert await described.static_summary() == f"thread {info.agent.name} of {handle.id}"
    session = await handle.query("session", result_type=SessionInfo)
    assert session.usage.output_tokens == threads[0].usage.output_tokens + sum(
        t.usage.output_tokens for t in threads[1:]
    ), "the session's usage rolls up its threads'"


async def subagent_asking(stack: Stack) -> tuple[Any, AgentCustomToolUse]:
    """A coordinator whose subagent calls a custom tool (`ask_human`): the session, and the call cross-posted to it."""
    ask = {"type": "custom", "name": "ask_human", "input_schema": {"type": "object", "properties": {}}}
    helper = stack.script([{"tool_uses": [{"name": "ask_human", "input": {}}]}, {"text": "the human said yes"}])
    lead = stack.script([{"tool_uses": [spawn("helper", "ask")]}, {"tool_uses": [WAIT]}, {"text": "done"}])
    handle = await stack.start(lead, "go", agent=coordinator(lead, [roster_agent("helper", helper, [ask])]))

    async def cross_posted() -> list[AgentCustomToolUse]:
        return [e for e in await read_events(handle) if isinstance(e, AgentCustomToolUse)]

    await until(cross_posted, "the subagent's custom tool call on the session's log")
    (use,) = await cross_posted()
    return handle, use


async def test_a_subagents_custom_tool_call_is_answered_on_the_session_by_its_id(stack: Stack) -> None:
    handle, use = await subagent_asking(stack)
    assert use.session_thread_id is not None and use.session_thread_id.startswith("sthr_")
    await send_events(handle, [{"type": "user.custom_tool_result", "custom_tool_use_id": use.id,
                                "content": [{"type": "text", "text": "yes"}]}])  # fmt: skip

    async def thread_replied() -> bool:
        return "the human said yes" in texts(await read_events(handle), "agent.thread_message_received")

    # The coordinator's wait may settle while the thread waits on the client, so what shows the answer arrived
    # is the thread's reply, which it writes only after the result.
    await until(thread_replied, "the thread's reply, made after the client's answer reached it")
    thread_log = await all_events(stack.client, use.session_thread_id)
    assert any(e.type == "user.custom_tool_result" for e in thread_log), "the result reached the thread"
    routed = [e for e in await read_events(handle) if e.type == "user.custom_tool_result"]
    assert routed[0].session_thread_id == use.session_thread_id
    with pytest.raises(WorkflowUpdateFailedError):  # answered once; a second answer is refused
        await send_events(handle, [{"type": "user.custom_tool_result", "custom_tool_use_id": use.id}])


async def test_threads_from_a_temporal_client_limit_archive_and_interrupt(stack: Stack) -> None:
    sleeper = stack.script([{"tool_uses": [{"name": "sleep", "input": {"seconds": 120}}]}, {"text": "slept"}])
    lead = stack.script([{"text": "ok"}], loop=True)
    agent = coordinator(lead, [roster_agent("sleeper", sleeper, [stack.hand_tool("sleep")])], max_threads=2)
    handle = await stack.start(lead, agent=agent)
    first = await handle.execute_update(UPDATE_SPAWN_THREAD, SpawnThreadInput(agent="sleeper", message="nap"),
                                        result_type=ThreadInfo)  # fmt: skip
    second = await handle.execute_update(UPDATE_SPAWN_THREAD, SpawnThreadInput(agent="sleeper", message="nap"),
                                         result_type=ThreadInfo)  # fmt: skip
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(UPDATE_SPAWN_THREAD, SpawnThreadInput(agent="sleeper", message="nap"))
    assert getattr(refused.value.cause, "type", None) == THREAD_LIMIT_REACHED

    async def sleeping(thread_id: str) -> bool:
        return any(e.type == "agent.tool_use" for e in await all_events(stack.client, thread_id))

    await until(lambda: sleeping(first.id), "the first thread's call running")
    await until(lambda: sleeping(second.id), "the second thread's call running")
    await send_events(handle, [{"type": "user.interrupt", "session_thread_id": first.id}])

    async def status(thread_id: str) -> str:
        return next(t.status for t in await threads_of(handle) if t.id == thread_id)

    await until(lambda: _is(status(first.id), "idle"), "the interrupted thread idle")
    assert await status(second.id) == "running", "an interrupt naming a thread stops only that thread"
    archived = await handle.execute_update(UPDATE_ARCHIVE_THREAD, ArchiveThreadInput(thread_id=second.id),
                                           result_type=ThreadInfo)  # fmt: skip
    assert archived.archived_at is not None
    await until(lambda: _is(status(second.id), "terminated"), "the archived thread terminated")
    second_log = await all_events(stack.client, second.id)
    assert second_log[-1].type == "session.status_terminated"
    assert any(e.type == "agent.tool_result" and "interrupted" in str(e) for e in second_log), second_log
    description = await stack.client.get_workflow_handle(second.id).describe()
    assert description.status is not None and description.status.name == "COMPLETED"


async def _is(value: Any, wanted: str) -> bool:
    return (await value) == wanted


async def test_the_advisor_answers_mid_turn_and_its_usage_counts(stack: Stack) -> None:
    advisor = stack.script([{"text": "Try the smaller half first."}])
    lead = stack.script([
        {"tool_uses": [{"name": "consult_advisor", "input": {"question": "Which half first?"}}]},
        {"text": "Taking the advice."},
    ])  # fmt: skip
    handle = await stack.start(lead, "plan", agent=coordinator(lead, [], advisor_model=advisor, subagents=False))
    events = await wait_for_idle(handle)
    (result,) = [e for e in events if e.type == "agent.tool_result"]
    assert texts([result], "agent.tool_result") == ["Try the smaller half first."] and not result.is_error
    (asked,) = stack.requests(advisor)
    assert "Which half first?" in str(asked["body"]["messages"]) and "advisor" in str(asked["body"]["system"])
    assert "tools" not in asked["body"], "the advisor runs no tools"
    tools = [tool["name"] for tool in stack.requests(lead)[0]["body"]["tools"]]
    assert tools == ["consult_advisor"], "no thread tools when subagents are disabled"
    session = await handle.query("session", result_type=SessionInfo)
    threads = await threads_of(handle)
    assert threads[0].usage.output_tokens == session.usage.output_tokens
    assert session.turns == 2 and session.usage.output_tokens > 0


async def test_an_inline_agent_and_a_subagents_confirmation_from_the_session(stack: Stack) -> None:
    asked_echo = {**stack.hand_tool("echo", text={"type": "string"}), "permission_policy": {"type": "always_ask"}}
    inline = stack.script([{"tool_uses": [{"name": "echo", "input": {"text": "checked"}}]}, {"text": "inline done"}])
    lead = stack.script([
        {"tool_uses": [{"name": "spawn_thread", "input": {
            "inline_agent": {"name": "checker", "system": "Check one thing.", "model": inline}, "message": "check"}}]},
        {"tool_uses": [WAIT]},
        {"text": "checked by the inline agent"},
    ])  # fmt: skip
    agent = {**coordinator(lead, [], inline_agents=True), "tools": [asked_echo]}
    handle = await stack.start(lead, "go", agent=agent)

    async def waiting_call() -> list[AgentToolUse]:
        events = await read_events(handle)
        idles = [
            e for e in events if isinstance(e, SessionThreadStatusIdle) and e.stop_reason.type == "requires_action"
        ]
        uses = [e for e in events if isinstance(e, AgentToolUse) and e.session_thread_id is not None]
        return uses if idles else []

    await until(waiting_call, "the inline thread's call waiting for confirmation, seen on the session")
    (use,) = await waiting_call()
    assert use.evaluated_permission == "ask" and use.name == "echo"
    await send_events(handle, [{"type": "user.tool_confirmation", "tool_use_id": use.id, "result": "allow"}])

    async def done() -> bool:
        return "checked by the inline agent" in texts(await read_events(handle))

    await until(done, "the coordinator's answer after the inline thread replied")
    (thread,) = (await threads_of(handle))[1:]
    assert (thread.agent.type, thread.agent.name, thread.agent.config.system) == (
        "inline",
        "checker",
        "Check one thing.",
    )
    request = stack.requests(inline)[0]["body"]
    assert "Check one thing." in str(request["system"])
    assert [tool["name"] for tool in request["tools"]] == ["echo"], "an inline agent has the coordinator's own tools"

    # The coordinator's wait settles when the thread idles for its confirmation, so its answer may come before the
    # allowed call has run in the thread: wait for the thread's own result.
    async def ran() -> bool:
        return "checked" in texts(await all_events(stack.client, thread.id), "agent.tool_result")

    await until(ran, "the confirmed call's result in the inline thread's log")


async def test_threads_and_their_session_continue_as_new(stack: Stack) -> None:
    echo = stack.hand_tool("echo", text={"type": "string"})
    rounds = [{"tool_uses": [{"name": "echo", "input": {"text": str(n)}}]} for n in range(40)]
    workers = [stack.script([*rounds, {"text": f"{name} did 40"}]) for name in ("one", "two")]
    lead = stack.script([{"tool_uses": [spawn("one", "go"), spawn("two", "go")]}, {"tool_uses": [WAIT]},
                         {"tool_uses": [WAIT]}, {"tool_uses": [WAIT]}, {"text": "both did 40"}])  # fmt: skip
    roster = [roster_agent("one", workers[0], [echo]), roster_agent("two", workers[1], [echo])]
    handle = await stack.start(lead, "go", agent=coordinator(lead, roster), continue_as_new_after_events=200)

    async def done() -> bool:
        return "both did 40" in texts(await read_events(handle))

    await until(done, "the coordinator's summary", 240)
    events = await read_events(handle)
    assert_log_is_whole(events)
    assert sorted(texts(events, "agent.thread_message_received")) == ["one did 40", "two did 40"]
    threads = (await threads_of(handle))[1:]
    assert len(threads) == 2 and all(t.turns == 41 for t in threads), "the thread list crossed the hand-overs"
    for info in threads:
        thread = stack.client.get_workflow_handle(info.id)
        assert (await thread.query("session", result_type=SessionInfo)).run > 1, "the thread continued as new"
        thread_log = await read_events(thread)
        assert_log_is_whole(thread_log)
        assert texts(thread_log, "agent.tool_result") == [str(n) for n in range(40)]
    assert (await handle.query("session", result_type=SessionInfo)).run > 1, "the session continued as new"


async def test_an_interrupt_without_a_thread_stops_every_thread_and_a_fork_keeps_the_primary_only(
    stack: Stack,
) -> None:
    sleep = stack.hand_tool("sleep")
    sleepers = [stack.script([{"tool_uses": [{"name": "sleep", "input": {"seconds": 120}}]}, {"text": "up"}])
                for _ in range(2)]  # fmt: skip
    lead = stack.script([{"tool_uses": [spawn("a", "nap"), spawn("b", "nap")]}, {"text": "spawned"},
                         {"text": "forked and going on"}])  # fmt: skip
    roster = [roster_agent("a", sleepers[0], [sleep]), roster_agent("b", sleepers[1], [sleep])]
    handle = await stack.start(lead, "go", agent=coordinator(lead, roster))
    await wait_for_idle(handle)

    async def both_sleeping() -> bool:
        threads = (await threads_of(handle))[1:]
        logs = [await all_events(stack.client, t.id) for t in threads]
        return len(threads) == 2 and all(any(e.type == "agent.tool_use" for e in log) for log in logs)

    await until(both_sleeping, "both threads' calls running")
    await send_events(handle, [{"type": "user.interrupt"}])
    threads = await until_threads_idle(handle, 2)
    for info in threads[1:]:
        thread_log = await all_events(stack.client, info.id)
        assert any(e.type == "user.interrupt" for e in thread_log), "the interrupt reached every thread"

    events = await read_events(handle)
    fork = await fork_session(stack.client, handle.id, events[-1].position)
    stack.started.append(fork)
    assert [t.id for t in await threads_of(fork)] == [primary_thread_id(fork.id)], "a fork starts with no thread"
    await send_events(fork, [{"type": "user.message", "content": "and now?"}])
    forked = await wait_for_idle(fork, after=events[-1].position)
    assert texts(forked) == ["forked and going on"]
    messages = stack.requests(lead)[-1]["body"]["messages"]
    calls = [b for m in messages for b in (m["content"] if isinstance(m["content"], list) else [])
             if b["type"] == "tool_use"]  # fmt: skip
    assert [c["name"] for c in calls] == ["spawn_thread", "spawn_thread"], "no subagent's call in the fork's context"


async def test_a_users_message_ends_the_coordinators_wait(stack: Stack) -> None:
    sleeper = stack.script([{"tool_uses": [{"name": "sleep", "input": {"seconds": 120}}]}, {"text": "up"}])
    lead = stack.script([{"tool_uses": [spawn("sleeper", "nap")]}, {"tool_uses": [WAIT]}, {"text": "heard you"}])
    roster = [roster_agent("sleeper", sleeper, [stack.hand_tool("sleep")])]
    handle = await stack.start(lead, "go", agent=coordinator(lead, roster))

    async def waiting() -> bool:
        return any(e.type == "agent.tool_use" and "wait" in str(e) for e in await read_events(handle))

    await until(waiting, "the coordinator waiting for its thread")
    await send_events(handle, [{"type": "user.message", "content": "status?"}])
    events = await wait_for_idle(handle)
    assert texts(events) == ["heard you"]
    assert "The user sent a message" in texts(events, "agent.tool_result")[-1]
    (thread,) = (await threads_of(handle))[1:]
    assert thread.status == "running", "the thread works on"
