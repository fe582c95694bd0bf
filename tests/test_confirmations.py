"""Tools whose permission policy is `always_ask`: the call waits, at no cost, for the client's
`user.tool_confirmation`; `allow` runs it, `deny` gives the model an error result with the client's reason. Through
the Temporal client (the session's own surface) and through the HTTP API with the `anthropic` SDK."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError

from corral.client import read_events, send_events, session_info
from corral.contract.events import (
    AgentMcpToolUse,
    AgentToolUse,
    PermissionEvaluation,
    RequiresAction,
    SessionEvent,
)
from corral.contract.session import AgentConfig, SandboxTool
from corral.names import SIGNAL_INTERRUPT, SIGNAL_USER_MESSAGE
from proxy import StaticBearerParams
from tests.conftest import Stack, assert_log_is_whole, stop_reason, texts, wait_for_idle
from tests.test_gateway import Gateway, gateway  # noqa: F401 - the fixture, shared
from tests.test_mcp_sessions import McpStack, authority, mcp_servers, mcp_stack  # noqa: F401 - the fixtures, shared
from workflows import DENIED_RESULT, NEW_MESSAGE_RESULT

pytestmark = pytest.mark.timeout(300)

ASK = {"type": "always_ask"}


def append_call(path: Path, line: str) -> dict[str, Any]:
    return {"name": "append_line", "input": {"path": str(path), "line": line}}


def ask_tool(stack: Stack) -> dict[str, Any]:
    """The test hand's `append_line` (it leaves a trace of every run), set to ask before each call."""
    return {**stack.hand_tool("append_line"), "permission_policy": ASK}


def tool_results(request: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """The tool results a model request carried: tool-use id -> (text, is_error)."""
    results = {}
    for message in request["body"]["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block["type"] == "tool_result":
                text = "".join(part.get("text", "") for part in block["content"])
                results[block["tool_use_id"]] = (text, bool(block.get("is_error")))
    return results


async def waiting_calls(handle: WorkflowHandle, after: int = 0) -> tuple[list[SessionEvent], list[AgentToolUse]]:
    """The events up to the session's `requires_action` idle, and the calls it waits for."""
    events = await wait_for_idle(handle, after=after)
    requires = stop_reason(events[-1])
    assert isinstance(requires, RequiresAction), requires
    uses = {e.id: e for e in events if isinstance(e, AgentToolUse)}
    return events, [uses[event_id] for event_id in requires.event_ids]


async def test_allow_runs_the_call_and_deny_tells_the_model_why(stack: Stack, tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"
    calls = [append_call(a, "allowed"), append_call(b, "denied"), append_call(c, "denied"),
             {"name": "echo", "input": {"text": "ran at once"}}]  # fmt: skip
    model = stack.script([{"text": "Working.", "tool_uses": calls}, {"text": "done"}])
    handle = await stack.start(model, "go", tools=[ask_tool(stack), stack.hand_tool("echo")])
    events, waiting = await waiting_calls(handle)

    uses = [e for e in events if isinstance(e, AgentToolUse)]
    assert [(u.name, u.evaluated_permission, u.evaluation) for u in uses] == [
        ("append_line", "ask", PermissionEvaluation(type="always_ask")),
        ("append_line", "ask", PermissionEvaluation(type="always_ask")),
        ("append_line", "ask", PermissionEvaluation(type="always_ask")),
        ("echo", "allow", PermissionEvaluation(type="always_allow")),
    ]
    assert waiting == uses[:3], "the idle event names exactly the calls that wait, in call order"
    assert texts(events, "agent.tool_result") == ["ran at once"], "the allowed call did not wait for the others"
    assert not any(path.exists() for path in (a, b, c)), "nothing that asks ran before its confirmation"
    info = await session_info(handle)
    assert (info.status, info.stop_reason) == ("idle", "requires_action")

    ids = await send_events(handle, [
        {"type": "user.tool_confirmation", "tool_use_id": waiting[0].id, "result": "allow"},
        {"type": "user.tool_confirmation", "tool_use_id": waiting[1].id, "result": "deny", "deny_message": "not b"},
        {"type": "user.tool_confirmation", "tool_use_id": waiting[2].id, "result": "deny"},
    ])  # fmt: skip
    done = await wait_for_idle(handle, after=events[-1].position)
    assert stop_reason(done[-1]).type == "end_turn" and texts(done) == ["done"]
    assert a.read_text() == "allowed\n" and not b.exists() and not c.exists()

    results = tool_results(stack.requests(model)[-1])
    assert results[waiting[0].id] == ("1", False)
    assert results[waiting[1].id] == ("not b", True)
    assert results[waiting[2].id] == (DENIED_RESULT, True)
    log = await read_events(handle)
    assert_log_is_whole(log)
    confirmations = [e for e in log if e.type == "user.tool_confirmation"]
    assert [e.id for e in confirmations] == ids and all(e.processed_at is not None for e in confirmations)


async def test_a_confirmation_no_call_waits_for_is_rejected_and_writes_nothing(stack: Stack, tmp_path: Path) -> None:
    calls = [append_call(tmp_path / "a.txt", "a"), append_call(tmp_path / "b.txt", "b"),
             {"name": "echo", "input": {"text": "x"}}]  # fmt: skip
    model = stack.script([{"tool_uses": calls}, {"text": "done"}])
    handle = await stack.start(model, "go", tools=[ask_tool(stack), stack.hand_tool("echo")])
    events, (first, second) = await waiting_calls(handle)
    echo = next(e for e in events if isinstance(e, AgentToolUse) and e.name == "echo")

    async def refused(batch: list[dict[str, Any]], expected: str) -> None:
        before = await read_events(handle)
        with pytest.raises(WorkflowUpdateFailedError) as caught:
            await send_events(handle, batch)
        assert expected in str(caught.value.cause)
        assert await read_events(handle) == before, "a refused batch wrote nothing"

    def confirm(use_id: str, result: str = "allow", **extra: Any) -> dict[str, Any]:
        return {"type": "user.tool_confirmation", "tool_use_id": use_id, "result": result, **extra}

    await refused([confirm("sevt_nosuchcall")], "'sevt_nosuchcall' is not waiting for confirmation")
    await refused([confirm(echo.id)], "is not waiting for confirmation")  # an always_allow call: it already ran
    await refused([confirm(first.id), confirm(first.id, "deny")], "events[1]")
    await refused([confirm(first.id, deny_message="why")], "deny_message goes with result 'deny' only")
    await refused([confirm(first.id), {"type": "user.message", "content": "   "}], "content must not be empty")

    await send_events(handle, [confirm(first.id)])
    relisted = await wait_for_idle(handle, after=events[-1].position)
    assert [e.type for e in relisted] == ["user.tool_confirmation", "session.status_idle"]
    assert stop_reason(relisted[-1]) == RequiresAction(event_ids=[second.id]), "the new idle lists the call left"
    await refused([confirm(first.id, "deny")], f"tool call {first.id!r} is not waiting for confirmation")
    assert (await session_info(handle)).stop_reason == "requires_action", "one of two answered: still waiting"
    await send_events(handle, [confirm(second.id, "deny")])
    done = await wait_for_idle(handle, after=relisted[-1].position)
    assert stop_reason(done[-1]).type == "end_turn"
    assert (tmp_path / "a.txt").exists() and not (tmp_path / "b.txt").exists()


async def test_a_new_message_answers_the_waiting_calls_as_denied(stack: Stack, tmp_path: Path) -> None:
    model = stack.script([{"tool_uses": [append_call(tmp_path / "a.txt", "a")]}, {"text": "ok, something else"}])
    handle = await stack.start(model, "go", tools=[ask_tool(stack)])
    events, (waiting,) = await waiting_calls(handle)
    await send_events(handle, [{"type": "user.message", "content": "never mind, do something else"}])
    done = await wait_for_idle(handle, after=events[-1].position)
    assert stop_reason(done[-1]).type == "end_turn"
    assert not (tmp_path / "a.txt").exists()
    assert tool_results(stack.requests(model)[-1])[waiting.id] == (NEW_MESSAGE_RESULT, True)
    with pytest.raises(WorkflowUpdateFailedError) as late:
        await send_events(handle, [{"type": "user.tool_confirmation", "tool_use_id": waiting.id, "result": "allow"}])
    assert "not waiting for confirmation" in str(late.value.cause)


async def test_the_wait_carries_over_to_the_next_run(stack: Stack, tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    model = stack.script([{"tool_uses": [append_call(target, "after the hand-over")]}, {"text": "done"}])
    handle = await stack.start(model, "go", tools=[ask_tool(stack)], continue_as_new_after_events=200)
    events, (waiting,) = await waiting_calls(handle)

    # While the session waits, its history grows (signals it drops: empty messages) until it hands over.
    async with asyncio.timeout(90):
        while (await session_info(handle)).run == 1:
            await handle.signal(SIGNAL_USER_MESSAGE, {"content": " "})
            await asyncio.sleep(0.02)
    info = await session_info(handle)
    assert info.run > 1 and (info.status, info.stop_reason) == ("idle", "requires_action"), info
    assert not target.exists()

    await send_events(handle, [{"type": "user.tool_confirmation", "tool_use_id": waiting.id, "result": "allow"}])
    done = await wait_for_idle(handle, after=events[-1].position)
    assert stop_reason(done[-1]).type == "end_turn" and texts(done) == ["done"]
    assert target.read_text() == "after the hand-over\n", "the call ran once, in the new run"
    log = await read_events(handle)
    assert_log_is_whole(log)
    assert [e.type for e in log].count("user.tool_confirmation") == 1


async def test_an_interrupt_cancels_the_waiting_calls(stack: Stack, tmp_path: Path) -> None:
    model = stack.script([{"tool_uses": [append_call(tmp_path / "a.txt", "a")]}, {"text": "after"}])
    handle = await stack.start(model, "go", tools=[ask_tool(stack)])
    events, (waiting,) = await waiting_calls(handle)
    await handle.signal(SIGNAL_INTERRUPT)
    stopped = await wait_for_idle(handle, after=events[-1].position)
    assert stop_reason(stopped[-1]).type == "end_turn"
    with pytest.raises(WorkflowUpdateFailedError) as late:
        await send_events(handle, [{"type": "user.tool_confirmation", "tool_use_id": waiting.id, "result": "allow"}])
    assert "not waiting for confirmation" in str(late.value.cause)
    await send_events(handle, [{"type": "user.message", "content": "something else"}])
    done = await wait_for_idle(handle, after=stopped[-1].position)
    assert texts(done) == ["after"] and not (tmp_path / "a.txt").exists()
    text, is_error = tool_results(stack.requests(model)[-1])[waiting.id]
    assert is_error and "interrupted" in text
    log = await read_events(handle)
    assert_log_is_whole(log)
    assert all(e.processed_at is not None for e in log)


async def test_an_mcp_tool_that_asks_is_called_only_once_allowed(mcp_stack: McpStack) -> None:  # noqa: F811
    stack, authority = mcp_stack.stack, mcp_stack.authority  # noqa: F811
    token = authority.issue_access_token()
    mcp_stack.store.add_credential(
        mcp_stack.vault.id, StaticBearerParams(mcp_server_url=mcp_stack.mcp_url, token=token)
    )
    calls = [
        {"name": "mcp__tools__add", "input": {"a": 2, "b": 40}},
        {"name": "mcp__tools__echo", "input": {"text": "hi"}},
    ]
    model = stack.script([{"tool_uses": calls}, {"text": "sum:", "echo_last_user": True}])
    toolset = {"type": "mcp_toolset", "mcp_server_name": "tools", "default_config": {"permission_policy": ASK},
               "configs": [{"name": "echo", "permission_policy": {"type": "always_allow"}}]}  # fmt: skip
    agent = {**mcp_stack.agent_tools(), "model": model, "tools": [toolset]}
    handle = await stack.start(model, "add", agent=agent, vault_ids=[mcp_stack.vault.id])
    events = await wait_for_idle(handle, within_seconds=60)
    add, echo = [e for e in events if isinstance(e, AgentMcpToolUse)]
    assert (add.evaluated_permission, add.evaluation) == ("ask", PermissionEvaluation(type="always_ask"))
    assert (echo.evaluated_permission, echo.evaluation) == ("allow", PermissionEvaluation(type="always_allow"))
    assert stop_reason(events[-1]) == RequiresAction(event_ids=[add.id])
    assert authority.tool_calls == [("echo", token)], "the call that asks has not reached the server"

    await send_events(handle, [{"type": "user.tool_confirmation", "tool_use_id": add.id, "result": "allow"}])
    done = await wait_for_idle(handle, after=events[-1].position, within_seconds=60)
    assert texts(done) == ["sum:\nhi\n42"], "the model got both results, the allowed call's once it ran"
    assert authority.tool_calls == [("echo", token), ("add", token)]


def test_policies_corral_cannot_run_are_refused_before_a_session_starts() -> None:
    def agent(policy: dict[str, Any], where: str = "default_config") -> dict[str, Any]:
        toolset: dict[str, Any] = {"type": "agent_toolset_20260401"}
        if where == "default_config":
            toolset["default_config"] = {"permission_policy": policy}
        else:
            toolset["configs"] = [{"name": "bash", "permission_policy": policy}]
        return {"model": "m", "tools": [toolset]}

    for where in ("default_config", "configs"):
        with pytest.raises(ValidationError, match="'auto' is not supported: corral has no classifier"):
            AgentConfig.model_validate(agent({"type": "auto"}, where))
        with pytest.raises(ValidationError, match="always_allow or always_ask, not 'sometimes'"):
            AgentConfig.model_validate(agent({"type": "sometimes"}, where))
    mcp = {"model": "m", "mcp_servers": [{"type": "url", "name": "docs", "url": "http://127.0.0.1:1/mcp"}]}
    for auto in ({"default_config": {"permission_policy": {"type": "auto"}}},
                 {"configs": [{"name": "search", "permission_policy": {"type": "auto"}}]}):  # fmt: skip
        with pytest.raises(ValidationError, match="'auto' is not supported"):
            AgentConfig.model_validate({**mcp, "tools": [{"type": "mcp_toolset", "mcp_server_name": "docs", **auto}]})
    asked = AgentConfig.model_validate(agent(ASK, "configs"))
    policies = {tool.name: tool.permission_policy for tool in asked.resolved_tools() if isinstance(tool, SandboxTool)}
    assert policies["bash"] == ASK and policies["read"] == {"type": "always_allow"}


async def test_the_api_shows_the_policy_the_session_runs(stack: Stack, gateway: Gateway, tmp_path: Path) -> None:  # noqa: F811
    client = await gateway.client("team-a")
    server = {"type": "url", "name": "docs", "url": "http://127.0.0.1:1/mcp"}
    with_mcp = await client.beta.agents.create(
        name="mcp", model="m", mcp_servers=[server],  # type: ignore[list-item]
        tools=[{"type": "agent_toolset_20260401"}, {"type": "mcp_toolset", "mcp_server_name": "docs"}],
    )  # fmt: skip
    shown = [tool.model_dump() for tool in with_mcp.tools]
    assert [tool["default_config"]["permission_policy"] for tool in shown] == [
        {"type": "always_allow"}, {"type": "always_ask"}
    ]  # fmt: skip
    stored = await gateway.records.get(with_mcp.id, f"team-a-{gateway.suffix}")
    assert [tool["default_config"]["permission_policy"] for tool in stored.body["tools"]] == [
        {"type": "always_allow"}, {"type": "always_ask"}
    ], "the stored agent holds the policies corral runs"  # fmt: skip
    with pytest.raises(Exception, match="no classifier") as refused:
        await client.beta.agents.create(
            name="auto", model="m",
            tools=[{"type": "agent_toolset_20260401", "default_config": {"permission_policy": {"type": "auto"}}}],
        )  # fmt: skip
    assert getattr(refused.value, "status_code", None) == 400

    # A sandbox-free tool set to ask: the test hand's, declared by the API agent.
    target = tmp_path / "a.txt"
    model = stack.script([{"tool_uses": [append_call(target, "via the API")]}, {"text": "done"}])
    await gateway.allow_hand(stack.hand_queue, "team-a")  # the operator's registration of the test hand
    agent = await client.beta.agents.create(name="asks", model=model, tools=[ask_tool(stack)])  # type: ignore[list-item]
    environment = await client.beta.environments.create(name="plain")
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    await client.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "go"}]}]
    )
    listed: list[dict[str, Any]] = []
    async with asyncio.timeout(60):
        while not listed or listed[-1]["type"] != "session.status_idle":
            await asyncio.sleep(0.2)
            listed = [e.model_dump() async for e in client.beta.sessions.events.list(session.id)]
    use = next(e for e in listed if e["type"] == "agent.tool_use")
    assert (use["evaluated_permission"], use["evaluation"]) == ("ask", {"type": "always_ask"})
    assert listed[-1]["stop_reason"] == {"type": "requires_action", "event_ids": [use["id"]]}
    assert (await client.beta.sessions.retrieve(session.id)).status == "idle"
    assert not target.exists()

    sent = await client.beta.sessions.events.send(
        session.id, events=[{"type": "user.tool_confirmation", "tool_use_id": use["id"], "result": "allow"}]
    )
    assert [e.type for e in sent.data or []] == ["user.tool_confirmation"]
    async with asyncio.timeout(60):
        while listed[-1]["type"] != "session.status_idle" or listed[-1]["stop_reason"]["type"] != "end_turn":
            await asyncio.sleep(0.2)
            listed = [e.model_dump() async for e in client.beta.sessions.events.list(session.id)]
    assert target.read_text() == "via the API\n"
    result = next(e for e in listed if e["type"] == "agent.tool_result")
    assert result["tool_use_id"] == use["id"] and not result["is_error"]
