"""A multi-agent session's threads through the gateway, driven by the official `anthropic` SDK
(`client.beta.sessions.threads`), and through the CLI (`corral threads`, `events --thread`, `tail --thread`).

Real gateway processes (with the real stream relay), the real Temporal dev server, a real harness and model worker,
and the offline model server scripting the coordinator and its subagent. A session is made a coordinator's as a
Temporal client makes one (a `SessionInput` whose agent has a `multiagent` config), filed under the test's
workspace as the gateway files its own; its threads are spawned through the session's `spawn_thread` update or by
the coordinator's own `spawn_thread` tool.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types.beta.sessions import BetaManagedAgentsSessionThread
from temporalio.client import WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from typer.testing import CliRunner

from cli.main import app
from cli.session_ops import list_sessions, sessions_query
from corral.client import new_session_id, read_events, send_text, session_info, start_session
from corral.contract.agent import AgentConfig, Multiagent, ThreadAgent
from corral.contract.events import ModelUsage
from corral.contract.search_attributes import STATUS_KEY, WORKSPACE_KEY
from corral.contract.session import SessionInput
from corral.contract.threads import SpawnedAgent, SpawnThreadInput, ThreadInfo, ThreadStats, primary_thread_id
from corral.threads import is_thread_id, spawn_thread
from gateway.shapes import agent_view
from gateway.threads import thread_view
from tests.conftest import Stack, unique
from tests.test_gateway_stream import Gateways, gateways, relay_followed  # noqa: F401 - the fixture
from tests.waits import until

pytestmark = pytest.mark.timeout(300)

WORKER = "worker"
WORKER_ID = "agent_" + "1" * 26
COORDINATOR_ID = "agent_" + "2" * 26
HELPER = "helper"
HELPER_ID = "agent_" + "3" * 26
LONG_TEXT = " ".join(f"finding{n}" for n in range(40))


# ---- the view, as the SDK reads it (pure) -------------------------------------------------------------------------

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def coordinator_snapshot(model: str) -> dict[str, Any]:
    """The coordinator's snapshot as a session's memo keeps it (what `sessions.create` files)."""
    body = {"name": "coordinator", "model": {"id": model}, "system": "coordinate", "tools": [{"type": "custom",
            "name": "weather", "description": "d", "input_schema": {"type": "object", "properties": {}}}]}  # fmt: skip
    return agent_view(COORDINATOR_ID, 1, body, NOW, NOW, None)


def info(kind: str, thread_id: str, parent: str | None, **extra: Any) -> ThreadInfo:
    config = AgentConfig(model="claude-sonnet-4-6", name=WORKER, system="work")
    saved: dict[str, Any] = {"id": WORKER_ID, "version": 3} if kind == "agent" else {}
    agent = SpawnedAgent.model_validate({"type": kind, "name": WORKER, "config": config, **saved})
    return ThreadInfo(id=thread_id, session_id="sesn_" + "a" * 26, parent_thread_id=parent, agent=agent,
                      created_at=NOW, updated_at=NOW + timedelta(seconds=5), **extra)  # fmt: skip


def test_every_kind_of_thread_is_a_session_thread_the_sdk_reads() -> None:
    memo: dict[str, Any] = {"agent": coordinator_snapshot("claude-opus-4-6")}
    primary = primary_thread_id("sesn_" + "a" * 26)
    usage = ModelUsage(input_tokens=120, output_tokens=30, cache_read_input_tokens=7, cache_creation_input_tokens=5)
    kinds = {
        "primary": info("primary", primary, None, status="idle"),
        "agent": info(
            "agent", "sthr_" + "b" * 32, primary, usage=usage, list_cost=42, stats=ThreadStats(active_seconds=2.5)
        ),
        "inline": info("inline", "sthr_" + "c" * 32, primary),
        "self": info("self", "sthr_" + "d" * 32, primary),
    }
    views = {kind: thread_view(thread, memo, None) for kind, thread in kinds.items()}
    parsed = {kind: BetaManagedAgentsSessionThread.model_validate(view) for kind, view in views.items()}
    for kind, thread in parsed.items():
        assert thread.type == "session_thread" and thread.id == kinds[kind].id and thread.workflow_run_id is None
        assert thread.created_at == NOW and thread.archived_at is None and thread.stats is not None
    assert parsed["primary"].parent_thread_id is None and parsed["agent"].parent_thread_id == primary
    # The primary thread and a thread of the coordinator itself run the session's agent: its snapshot.
    for kind in ("primary", "self"):
        agent = parsed[kind].agent
        assert agent.type == "agent" and (agent.id, agent.version, agent.name) == (COORDINATOR_ID, 1, "coordinator")
        assert agent.model.id == "claude-opus-4-6" and [tool.type for tool in agent.tools] == ["custom"]
        assert "created_at" not in views[kind]["agent"] and "multiagent" not in views[kind]["agent"]
    saved = parsed["agent"].agent
    assert saved.type == "agent" and (saved.id, saved.version, saved.name) == (WORKER_ID, 3, WORKER)
    assert saved.system == "work" and saved.model.id == "claude-sonnet-4-6"
    inline = parsed["inline"].agent
    assert inline.type == "inline" and inline.name == WORKER and "id" not in views["inline"]["agent"]
    thread_usage = parsed["agent"].usage
    assert thread_usage is not None and thread_usage.list_cost is not None
    assert (thread_usage.input_tokens, thread_usage.output_tokens, thread_usage.cache_read_input_tokens) == (120, 30, 7)
    assert thread_usage.cache_creation is not None and thread_usage.cache_creation.ephemeral_5m_input_tokens == 5
    assert (thread_usage.list_cost.amount, thread_usage.active_seconds) == ("42", 2.5)
    assert parsed["agent"].stats is not None and parsed["agent"].stats.active_seconds == 2.5


def test_a_saved_agents_thread_shows_the_snapshot_the_session_resolved() -> None:
    """A session made through the API keeps its roster's snapshots (`session.agent.multiagent`): a thread of a saved
    agent shows that snapshot whole, whichever form the config has."""
    body = {"name": WORKER, "model": {"id": "claude-sonnet-4-6", "speed": "fast"}, "description": "reads code"}
    pinned = {**agent_view(WORKER_ID, 3, body, NOW, NOW, None), "multiagent": None}
    other = agent_view(WORKER_ID, 2, {"name": "older", "model": {"id": "m"}}, NOW, NOW, None)
    thread = info("agent", "sthr_" + "b" * 32, primary_thread_id("sesn_" + "a" * 26))
    for multiagent in (
        {"type": "coordinator", "agents": [other, pinned]},
        {"type": "multiagent_20261001", "subagents": {"type": "enabled", "predefined_agents": [other, pinned]}},
    ):
        memo = {"agent": {**coordinator_snapshot("m"), "multiagent": multiagent}}
        agent = BetaManagedAgentsSessionThread.model_validate(thread_view(thread, memo, None)).agent
        assert agent.type == "agent" and (agent.id, agent.version, agent.description) == (WORKER_ID, 3, "reads code")
        assert "created_at" not in thread_view(thread, memo, None)["agent"]
    bare = thread_view(thread, {"agent": coordinator_snapshot("m")}, None)["agent"]
    assert (bare["id"], bare["version"], bare["description"]) == (WORKER_ID, 3, None), "from the config it runs"


def test_an_archived_thread_or_one_of_an_ended_session_is_terminated() -> None:
    memo: dict[str, Any] = {"agent": coordinator_snapshot("m")}
    primary = primary_thread_id("sesn_" + "a" * 26)
    running = info("agent", "sthr_" + "b" * 32, primary, status="running")
    assert thread_view(running, memo, None)["status"] == "running"
    archived = running.model_copy(update={"archived_at": NOW + timedelta(seconds=60)})
    view = thread_view(archived, memo, None)
    assert view["status"] == "terminated" and view["archived_at"] == "2026-12-03T12:01:00Z"
    assert view["stats"]["duration_seconds"] == 60.0, "frozen when it was archived"
    assert thread_view(running, memo, NOW + timedelta(seconds=9))["status"] == "terminated", "the session closed"
    assert thread_view(running, {**memo, "archived_at": "2026-12-03T12:00:09Z"}, None)["status"] == "terminated"


def test_a_thread_id_has_the_form_the_session_makes() -> None:
    assert is_thread_id("sthr_" + "0" * 32) and is_thread_id(primary_thread_id("sesn_" + "a" * 26))
    for wrong in ("sesn_" + "0" * 26, "sthr_" + "0" * 200, "sthr_é", "sthr_\n", "", "agent_x"):
        assert not is_thread_id(wrong), wrong


def test_a_bad_thread_option_is_a_usage_error(tmp_path: Path) -> None:
    runner = CliRunner()
    for command in ("events", "tail"):
        result = runner.invoke(app, ["--state-dir", str(tmp_path), command, "sesn_x", "--thread", "sesn_y"])
        assert result.exit_code == 2, result.output
        assert "'sesn_y' is not a thread id (sthr_…)" in result.output and "Traceback" not in result.output
    thread = "sthr_" + "0" * 32  # where the session's id belongs: refused before anything is asked of Temporal
    for args in (("threads", thread), ("events", thread, "--thread", thread), ("tail", thread, "--thread", thread)):
        result = runner.invoke(app, ["--state-dir", str(tmp_path), "--address", "127.0.0.1:1", *args])
        assert result.exit_code == 2, (args, result.output)
        assert f"{thread} is a thread id, not a session id" in result.output and "Traceback" not in result.output


# ---- sessions with threads ----------------------------------------------------------------------------------------


async def multiagent_session(
    stack: Stack, workspace: str | None, coordinator: str, worker: str, helper: str | None = None
) -> WorkflowHandle:
    """A coordinator's session whose roster holds one saved agent, `worker` (pinned at version 1), and `helper` when
    given, started as a Temporal client starts one; with `workspace`, filed under it as the gateway files its
    sessions."""
    roster = [ThreadAgent(type="agent", id=WORKER_ID, version=1, config=AgentConfig(model=worker, name=WORKER))]
    if helper is not None:
        roster.append(ThreadAgent(type="agent", id=HELPER_ID, version=1, config=AgentConfig(model=helper, name=HELPER)))
    agent = AgentConfig(model=coordinator, name="coordinator", multiagent=Multiagent(agents=roster))
    memo: dict[str, Any] = {"agent": coordinator_snapshot(coordinator), "environment_id": None, "vault_ids": [],
                            "title": None, "metadata": {}, "resources": [], "budget": None}  # fmt: skip
    attributes = [SearchAttributePair(WORKSPACE_KEY, workspace or ""), SearchAttributePair(STATUS_KEY, "idle")]
    handle = await start_session(
        stack.client,
        SessionInput(agent=agent, model_task_queue=stack.model_queue),
        session_id=new_session_id(),
        task_queue=stack.harness_queue,
        search_attributes=TypedSearchAttributes(attributes) if workspace else None,
        memo=memo if workspace else None,
    )
    stack.started.append(handle)
    return handle


def texts_of(events: list[Any], type_: str) -> list[str]:
    return ["".join(getattr(b, "text", "") for b in e.content) for e in events if e.type == type_]


async def thread_events(client: anthropic.AsyncAnthropic, session_id: str, thread_id: str) -> list[Any]:
    return [e async for e in client.beta.sessions.threads.events.list(thread_id, session_id=session_id)]


async def until_idle(client: anthropic.AsyncAnthropic, session_id: str, thread_id: str, replies: int = 1) -> None:
    """Until the thread has written `replies` messages and is idle again (its reply to the primary thread follows its
    `session.status_idle` in its log)."""
    seen: list[Any] = []

    async def done() -> bool:
        seen[:] = await thread_events(client, session_id, thread_id)
        messages = [e.position for e in seen if e.type == "agent.message"]
        thread = await client.beta.sessions.threads.retrieve(thread_id, session_id=session_id)
        return len(messages) >= replies and thread.status == "idle"

    try:
        await until(done, f"thread {thread_id} replied {replies} time(s) and went idle", within=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its log: {[e.model_dump(exclude_none=True) for e in seen]}") from None


async def test_threads_are_listed_read_paged_filtered_and_archived(stack: Stack, gateways: Gateways) -> None:  # noqa: F811
    url, _ = await gateways.start("gateway")
    workspace = unique("threads")
    client = await gateways.client(url, workspace)
    coordinator = stack.script([{"text": "noted"}], loop=True)
    worker = stack.script([{"text": "the repository has 12 files"}], loop=True)
    handle = await multiagent_session(stack, workspace, coordinator, worker)
    session_id, primary = handle.id, primary_thread_id(handle.id)
    spawned = await spawn_thread(handle, SpawnThreadInput(agent=WORKER, message="count the files"))
    assert is_thread_id(spawned.id) and spawned.id != primary
    await until_idle(client, session_id, spawned.id)
    await until_idle(client, session_id, primary)  # the coordinator read the reply and answered it

    listed = [t async for t in client.beta.sessions.threads.list(session_id)]
    assert [t.id for t in listed] == [primary, spawned.id]
    first, child = listed
    assert (first.parent_thread_id, child.parent_thread_id) == (None, primary)
    assert {first.session_id, child.session_id} == {session_id} and (first.status, child.status) == ("idle", "idle")
    assert first.agent.type == "agent" and (first.agent.id, first.agent.name) == (COORDINATOR_ID, "coordinator")
    assert child.agent.type == "agent" and (child.agent.id, child.agent.version) == (WORKER_ID, 1)
    assert (child.agent.name, child.agent.model.id) == (WORKER, worker)
    assert child.archived_at is None and child.usage is not None and child.stats is not None
    retrieved = await client.beta.sessions.threads.retrieve(spawned.id, session_id=session_id)
    assert (retrieved.id, retrieved.status, retrieved.agent) == (child.id, child.status, child.agent)

    # A page at a time, and by status.
    page = await client.beta.sessions.threads.list(session_id, limit=1)
    assert [t.id for t in page.data] == [primary] and page.has_next_page()
    rest = await page.get_next_page()
    assert [t.id for t in rest.data] == [spawned.id] and not rest.has_next_page()
    assert [t.id async for t in client.beta.sessions.threads.list(session_id, statuses=["running"])] == []
    with pytest.raises(anthropic.BadRequestError, match="statuses"):
        await client.beta.sessions.threads.list(session_id, statuses=["asleep"])  # type: ignore[list-item]

    # The child's log is its own: the coordinator's message, its turn, its reply to the primary thread.
    events = await thread_events(client, session_id, spawned.id)
    assert [e.position for e in events] == list(range(1, len(events) + 1))
    [received] = [e for e in events if e.type == "agent.thread_message_received"]
    assert received.from_session_thread_id == primary and texts_of([received], received.type) == ["count the files"]
    assert texts_of(events, "agent.message") == ["the repository has 12 files"]
    [sent] = [e for e in events if e.type == "agent.thread_message_sent"]
    assert sent.to_session_thread_id == primary
    assert not {e.type for e in events} & {"session.thread_created", "user.message"}, "nothing of the primary's"
    two = await client.beta.sessions.threads.events.list(spawned.id, session_id=session_id, limit=2)
    assert [e.id for e in two.data] == [e.id for e in events[:2]] and two.has_next_page()
    assert [e.id for e in (await two.get_next_page()).data] == [e.id for e in events[2:4]]
    # The primary thread's log is the session's.
    session_log = [e.model_dump() async for e in client.beta.sessions.events.list(session_id, limit=1000)]
    primary_log = [e.model_dump() for e in await thread_events(client, session_id, primary)]
    assert primary_log == session_log and "session.thread_created" in [e["type"] for e in primary_log]

    # Archived: terminated, and archiving again answers the same; the primary thread is archived with its session.
    archived = await client.beta.sessions.threads.archive(spawned.id, session_id=session_id)
    assert archived.archived_at is not None and archived.status == "terminated"
    again = await client.beta.sessions.threads.archive(spawned.id, session_id=session_id)
    assert (again.archived_at, again.status) == (archived.archived_at, "terminated")
    with pytest.raises(anthropic.BadRequestError, match="archive the session"):
        await client.beta.sessions.threads.archive(primary, session_id=session_id)
    terminated = [t.id async for t in client.beta.sessions.threads.list(session_id, statuses=["terminated"])]
    assert terminated == [spawned.id]
    assert (await client.beta.sessions.retrieve(session_id)).status == "idle", "the session itself goes on"


async def test_threads_of_a_session_made_through_the_api_show_the_agents_it_resolved(
    stack: Stack,
    gateways: Gateways,  # noqa: F811
) -> None:
    """Everything through the SDK: a coordinator with a saved subagent and inline agents spawns one of each; each
    thread shows what it runs, the saved agent as the session's resolved snapshot of it, the inline one by name."""
    url, _ = await gateways.start("gateway")
    client = await gateways.client(url, unique("threads"))
    environment = await client.beta.environments.create(name="plain")
    inline_model = stack.script([{"text": "inline done"}], loop=True)
    researcher = await client.beta.agents.create(
        name="researcher", description="finds numbers", model=stack.script([{"text": "found 42"}], loop=True)
    )
    spawns = [
        {"name": "spawn_thread", "input": {"agent": "researcher", "message": "find the number"}},
        {"name": "spawn_thread", "input": {"inline_agent": {"name": "checker", "model": inline_model},
                                           "message": "check it"}},
    ]  # fmt: skip
    lead_model = stack.script([{"tool_uses": spawns}, *[{"text": "noted"}] * 6])
    multiagent: Any = {
        "type": "multiagent_20261001",
        "subagents": {"type": "enabled", "predefined_agents": [researcher.id], "inline_agents": {"type": "enabled"}},
    }
    lead = await client.beta.agents.create(name="lead", model=lead_model, multiagent=multiagent)
    hello: Any = {"type": "user.message", "content": [{"type": "text", "text": "what is the number?"}]}
    session = await client.beta.sessions.create(agent=lead.id, environment_id=environment.id, initial_events=[hello])
    stack.started.append(stack.client.get_workflow_handle(session.id))

    async def both_replied() -> bool:
        threads = [t async for t in client.beta.sessions.threads.list(session.id)]
        replies = [texts_of(await thread_events(client, session.id, t.id), "agent.message") for t in threads[1:]]
        return len(threads) == 3 and all(replies) and all(t.status == "idle" for t in threads[1:])

    await until(both_replied, "both threads replied", within=120)
    primary, saved, inline = [t async for t in client.beta.sessions.threads.list(session.id)]
    resolved = (await client.beta.sessions.retrieve(session.id)).model_dump()["agent"]
    [snapshot] = resolved["multiagent"]["subagents"]["predefined_agents"]
    assert saved.agent.model_dump() == snapshot, "the snapshot the session resolved, whole"
    assert saved.agent.type == "agent" and saved.agent.description == "finds numbers"
    assert (saved.agent.id, saved.agent.version) == (researcher.id, researcher.version)
    assert inline.agent.type == "inline" and (inline.agent.name, inline.agent.model.id) == ("checker", inline_model)
    assert primary.agent.type == "agent" and (primary.agent.id, primary.agent.name) == (lead.id, "lead")
    assert {saved.parent_thread_id, inline.parent_thread_id} == {primary.id} and primary.parent_thread_id is None
    assert texts_of(await thread_events(client, session.id, saved.id), "agent.message") == ["found 42"]
    assert texts_of(await thread_events(client, session.id, inline.id), "agent.message") == ["inline done"]


async def test_a_thread_streams_its_own_events_with_live_text(stack: Stack, gateways: Gateways) -> None:  # noqa: F811
    url, _ = await gateways.start("gateway")
    workspace = unique("threads")
    client = await gateways.client(url, workspace)
    coordinator = stack.script([{"text": "noted"}], loop=True)
    # Slow to start and slow to write, so that the stream opened after the spawn is open before the reply is written
    # (the relay then catches it up on whatever text it missed, so no pace here is a race).
    worker = stack.script([{"text": LONG_TEXT, "first_token_latency": 5.0, "tokens_per_second": 10}], loop=True)
    handle = await multiagent_session(stack, workspace, coordinator, worker)
    spawned = await spawn_thread(handle, SpawnThreadInput(agent=WORKER, message="look around"))
    seen: list[Any] = []
    stream = await client.beta.sessions.threads.events.stream(
        spawned.id, session_id=handle.id, event_deltas=["agent.message"]
    )
    async with stream:

        async def read() -> None:
            async for event in stream:
                seen.append(event)
                if event.type == "session.thread_status_idle":  # after its message: a thread's own idle
                    return

        reading = asyncio.create_task(read())
        await relay_followed(stack, spawned.id)  # the gateway follows the thread's live text, under its id
        await asyncio.wait_for(reading, 120)
    [message] = [e for e in seen if e.type == "agent.message"]
    assert texts_of([message], "agent.message") == [LONG_TEXT]
    starts = [e for e in seen if e.type == "event_start" and e.event.id == message.id]
    deltas = [e for e in seen if e.type == "event_delta" and e.event_id == message.id]
    assert starts and deltas, f"no live text of {message.id} before it was written: {[e.type for e in seen]}"
    assert "".join(delta.delta.content.text for delta in deltas) == LONG_TEXT
    assert seen.index(deltas[-1]) < seen.index(message)
    own = [e for e in seen if e.type.startswith("session.thread_")]
    assert own and all(e.session_thread_id == spawned.id for e in own), "the thread's stream, not the session's"
    assert not any(e.type.startswith("session.status_") for e in seen), "a thread's statuses are named as its own"

    # The primary thread's stream is the session's: a message sent to the session, then its reply, on it.
    on_primary: list[Any] = []
    primary = primary_thread_id(handle.id)
    async with await client.beta.sessions.threads.events.stream(primary, session_id=handle.id) as stream:

        async def replied() -> None:
            asked = False
            async for event in stream:
                on_primary.append(event)
                asked = asked or (event.type == "user.message" and texts_of([event], event.type) == ["status?"])
                if asked and event.type == "session.status_idle":
                    return

        reading = asyncio.create_task(replied())
        await client.beta.sessions.events.send(
            handle.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "status?"}]}]
        )
        await asyncio.wait_for(reading, 120)
    assert "noted" in texts_of(on_primary, "agent.message")


async def test_an_interrupt_that_names_a_thread_stops_that_thread_only(stack: Stack, gateways: Gateways) -> None:  # noqa: F811
    url, _ = await gateways.start("gateway")
    client = await gateways.client(url, workspace := unique("threads"))
    coordinator = stack.script([{"text": "noted"}], loop=True)
    slow = stack.script([{"text": LONG_TEXT, "first_token_latency": 120.0, "pace_hits": 1}, {"text": "resumed"}])
    fast = stack.script([{"text": "helped"}], loop=True)
    handle = await multiagent_session(stack, workspace, coordinator, slow, helper=fast)
    stuck = await spawn_thread(handle, SpawnThreadInput(agent=WORKER, message="take your time"))
    helper = await spawn_thread(handle, SpawnThreadInput(agent=HELPER, message="help"))

    async def asking() -> bool:  # the slow thread's model request is under way
        return "span.model_request_start" in [e.type for e in await thread_events(client, handle.id, stuck.id)]

    await until(asking, "the slow thread asked its model")
    interrupt: Any = {"type": "user.interrupt", "session_thread_id": stuck.id}
    [sent] = (await client.beta.sessions.events.send(handle.id, events=[interrupt])).data or []
    assert sent.type == "user.interrupt" and sent.model_dump()["session_thread_id"] == stuck.id
    await until_idle(client, handle.id, helper.id)

    async def stopped() -> bool:
        thread = await client.beta.sessions.threads.retrieve(stuck.id, session_id=handle.id)
        return thread.status == "idle"

    await until(stopped, "the interrupted thread went idle", within=90)
    events = await thread_events(client, handle.id, stuck.id)
    assert "user.interrupt" in [e.type for e in events] and texts_of(events, "agent.message") == []
    assert texts_of(await thread_events(client, handle.id, helper.id), "agent.message") == ["helped"]
    primary = [e async for e in client.beta.sessions.events.list(handle.id, limit=1000)]
    interrupts = [e.model_dump() for e in primary if e.type == "user.interrupt"]
    assert [e.get("session_thread_id") for e in interrupts] == [stuck.id], "routed to that thread only"
    with pytest.raises(anthropic.BadRequestError, match=r"events\[0\]\.session_thread_id"):
        await client.beta.sessions.events.send(
            handle.id,
            events=[{"type": "user.interrupt", "session_thread_id": handle.id}],
        )


async def test_thread_routes_check_the_session_the_thread_and_the_workspace(stack: Stack, gateways: Gateways) -> None:  # noqa: F811
    url, _ = await gateways.start("gateway")
    mine, theirs = unique("threads-a"), unique("threads-b")
    client, other = await gateways.client(url, mine), await gateways.client(url, theirs)
    coordinator = stack.script([{"text": "noted"}], loop=True)
    worker = stack.script([{"text": "done"}], loop=True)
    handle = await multiagent_session(stack, mine, coordinator, worker)
    sibling = await multiagent_session(stack, mine, coordinator, worker)  # another session of the same workspace
    spawned = await spawn_thread(handle, SpawnThreadInput(agent=WORKER, message="work"))
    await until_idle(client, handle.id, spawned.id)
    threads = client.beta.sessions.threads

    def routes(c: anthropic.AsyncAnthropic, session_id: str, thread_id: str) -> dict[str, Callable[[], Any]]:
        calls: dict[str, Callable[[], Any]] = {
            "retrieve": lambda: c.beta.sessions.threads.retrieve(thread_id, session_id=session_id),
            "archive": lambda: c.beta.sessions.threads.archive(thread_id, session_id=session_id),
            "events": lambda: c.beta.sessions.threads.events.list(thread_id, session_id=session_id),
            "stream": lambda: c.beta.sessions.threads.events.stream(thread_id, session_id=session_id),
        }
        return calls

    async def refused(call: Callable[[], Any]) -> tuple[int, str]:
        """The status and the error's `type: message` a request got (200 and "" when it was served)."""
        try:
            result = await call()
        except anthropic.APIStatusError as exc:
            error = exc.body.get("error", {}) if isinstance(exc.body, dict) else {}
            return exc.status_code, f"{error.get('type')}: {error.get('message')}"
        if hasattr(result, "close"):
            await result.close()
        return 200, ""

    wrong: list[str] = []
    for name, call in {
        **{f"{n} from another workspace": c for n, c in routes(other, handle.id, spawned.id).items()},
        "list from another workspace": lambda: other.beta.sessions.threads.list(handle.id),
        **{f"{n} of another session": c for n, c in routes(client, sibling.id, spawned.id).items()},
        **{f"{n} of another's primary": c for n, c in routes(client, sibling.id, primary_thread_id(handle.id)).items()},
        **{f"{n} of no thread": c for n, c in routes(client, handle.id, "sthr_" + uuid.uuid4().hex).items()},
    }.items():
        status, body = await refused(call)
        if status != 404 or not body.startswith("not_found_error: session"):
            wrong.append(f"{name}: {status} {body}")
    for name, call in {
        **{f"{n}, a session id for the thread": c for n, c in routes(client, handle.id, sibling.id).items()},
        **{f"{n}, a thread id for the session": c for n, c in routes(client, spawned.id, spawned.id).items()},
        "list, a thread id for the session": lambda: client.beta.sessions.threads.list(spawned.id),
    }.items():
        status, body = await refused(call)
        field = "session_id" if "for the session" in name else "thread_id"
        if status != 400 or not body.startswith(f"invalid_request_error: {field}: "):
            wrong.append(f"{name}: {status} {body}")
    assert wrong == [], "\n".join(wrong)
    [still] = [t async for t in threads.list(handle.id) if t.id == spawned.id]
    assert still.archived_at is None, "no refused archive archived it"
    assert [t.id async for t in threads.list(sibling.id)] == [primary_thread_id(sibling.id)]


# ---- the CLI ------------------------------------------------------------------------------------------------------


async def corral(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` against the test's Temporal, as a terminal 200 columns wide would show it."""
    address = stack.client.service_client.config.target_host
    command = [sys.executable, "-m", "cli.main", "--address", address, *args]
    env = {**os.environ, "COLUMNS": "200"}
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=120, env=env)


async def test_the_cli_lists_a_sessions_threads_and_reads_and_follows_one(stack: Stack) -> None:
    # The coordinator spawns the thread itself (its `spawn_thread` tool), then sums up when the reply comes.
    coordinator = stack.script(
        [
            {"tool_uses": [{"name": "spawn_thread", "input": {"agent": WORKER, "message": "list the files"}}]},
            {"text": "spawned"},
            {"text": "thanks"},
        ],
        loop=True,
    )
    worker = stack.script([{"text": "three files"}], loop=True)
    handle = await multiagent_session(stack, None, coordinator, worker)
    await send_text(handle, "go")
    primary = primary_thread_id(handle.id)

    async def spawned_and_replied() -> bool:  # and the coordinator answered the reply: its log is still from here
        events = await read_events(handle)
        answered = "thanks" in texts_of(events, "agent.message")
        return answered and (await session_info(handle)).status == "idle"

    await until(spawned_and_replied, "the coordinator spawned a thread, which replied, and it answered", within=120)
    [created] = [e for e in await read_events(handle) if e.type == "session.thread_created"]
    thread_id = created.session_thread_id

    listed = await corral(stack, "threads", handle.id, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [ThreadInfo.model_validate_json(line) for line in listed.stdout.splitlines()]
    assert [row.id for row in rows] == [primary, thread_id] and rows[1].agent.name == WORKER
    table = await corral(stack, "threads", handle.id)
    assert table.returncode == 0 and thread_id in table.stdout and f"{WORKER} (agent)" in table.stdout, table.stdout

    shown = await corral(stack, "events", handle.id, "--thread", thread_id, "--json")
    assert shown.returncode == 0, shown.stderr
    logged = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [e["id"] for e in logged] == [e.id for e in await read_events(stack.client.get_workflow_handle(thread_id))]
    assert "three files" in json.dumps([e for e in logged if e["type"] == "agent.message"])
    as_primary = await corral(stack, "events", handle.id, "--thread", primary, "--json")
    assert as_primary.stdout == (await corral(stack, "events", handle.id, "--json")).stdout, "the session's log"
    followed = await corral(stack, "tail", handle.id, "--thread", thread_id)
    assert followed.returncode == 0 and "three files" in followed.stdout, followed.stderr
    sessions = [row[0] for row in await list_sessions(stack.client, sessions_query(None), limit=1000)]
    assert handle.id in sessions and thread_id not in sessions, "`corral ls` lists sessions, not their threads"

    for args, said in (
        (("events", handle.id, "--thread", "sthr_" + uuid.uuid4().hex), "has no thread"),
        (("tail", handle.id, "--thread", "sthr_" + uuid.uuid4().hex), "has no thread"),
        (("events", handle.id, "--thread", handle.id), "is not a thread id"),
    ):
        refused = await corral(stack, *args)
        assert refused.returncode == 2 and said in refused.stderr, (args, refused.stderr)
        assert "Traceback" not in refused.stderr
