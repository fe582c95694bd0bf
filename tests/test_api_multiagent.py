"""An agent's `multiagent` config over the API, driven by the official `anthropic` SDK against a real gateway process
on the real Temporal dev server: both forms created and read back in the SDK's own types, each bad config refused
with a 400 naming its field and nothing stored, roster agents pinned at their versions, updates merged level by
level, another workspace's agents not found, and a session that resolves the config into full snapshots, shown as
`session.agent.multiagent` and put in the workflow's start input as the harness's `Multiagent`."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types.beta.beta_managed_agents_multiagent20261001 import BetaManagedAgentsMultiagent20261001
from anthropic.types.beta.beta_managed_agents_multiagent_coordinator import BetaManagedAgentsMultiagentCoordinator
from anthropic.types.beta.beta_managed_agents_session_multiagent20261001 import (
    BetaManagedAgentsSessionMultiagent20261001,
)
from anthropic.types.beta.beta_managed_agents_session_multiagent_coordinator import (
    BetaManagedAgentsSessionMultiagentCoordinator,
)
from anthropic.types.beta.beta_managed_agents_session_thread_agent import BetaManagedAgentsSessionThreadAgent

from corral.client import read_events
from corral.contract.events import AgentThreadMessageReceived, SessionEvent, SessionThreadCreated
from corral.contract.session import SessionInput
from corral.hand_registry import revoke_hand
from corral.names import ENV_MAX_THREADS_PER_RUN, ENV_MAX_THREADS_PER_SESSION, ENV_MAX_WORKFLOW_RUNS_PER_SESSION
from tests.conftest import Stack, texts
from tests.test_gateway import Gateway, gateway, running_gateway  # noqa: F401 - the fixture
from tests.waits import until

pytestmark = pytest.mark.timeout(300)

Client = anthropic.AsyncAnthropic
MODEL = "claude-sonnet-4-6"
LOOKUP = {"type": "custom", "name": "lookup", "description": "look a word up",
          "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}}}  # fmt: skip


def ref(agent: Any, version: int | None = None) -> dict[str, Any]:
    return {"type": "agent", "id": agent.id, "version": version or agent.version}


def dumped(multiagent: Any) -> Any:
    return multiagent.model_dump(mode="json") if multiagent is not None else None


async def test_both_forms_are_stored_pinned_and_shown_in_the_sdks_types(gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("ma-forms")
    researcher = await client.beta.agents.create(name="researcher", model=MODEL)
    writer = await client.beta.agents.create(name="writer", model=MODEL)
    writer = await client.beta.agents.update(writer.id, version=1, system="write well")
    assert writer.version == 2

    coordinator = await client.beta.agents.create(
        name="lead", model=MODEL,
        multiagent={"type": "coordinator", "agents": [
            researcher.id, {"type": "agent", "id": writer.id, "version": 1}, {"type": "self"},
            {"type": "advisor", "model": "claude-opus-4-6"},
        ]},
    )  # fmt: skip
    assert isinstance(coordinator.multiagent, BetaManagedAgentsMultiagentCoordinator)
    shown = [ref(researcher), ref(writer, 1), ref(coordinator), {"type": "advisor", "model": "claude-opus-4-6"}]
    assert dumped(coordinator.multiagent) == {"type": "coordinator", "agents": shown}, "ids pinned, self is itself"

    await client.beta.agents.update(researcher.id, version=1, system="newer")  # researcher is at version 2 now
    again = await client.beta.agents.retrieve(coordinator.id)
    assert dumped(again.multiagent) == dumped(coordinator.multiagent), "the roster keeps the version it pinned"

    plain = await client.beta.agents.create(name="defaults", model=MODEL, multiagent={"type": "multiagent_20261001"})
    assert isinstance(plain.multiagent, BetaManagedAgentsMultiagent20261001)
    enabled = {"type": "enabled", "inline_agents": {"type": "enabled"}, "predefined_agents": []}
    assert dumped(plain.multiagent) == {"type": "multiagent_20261001", "advisor": {"type": "disabled"},
                                        "subagents": enabled, "workflows": enabled}  # fmt: skip

    full = await client.beta.agents.create(
        name="full", model=MODEL,
        multiagent={"type": "multiagent_20261001", "advisor": {"type": "enabled", "model": "claude-opus-4-6"},
                    "subagents": {"type": "enabled", "inline_agents": {"type": "disabled"},
                                  "predefined_agents": [researcher.id, {"type": "self"}]},
                    "workflows": {"type": "disabled"}},
    )  # fmt: skip
    assert dumped((await client.beta.agents.retrieve(full.id)).multiagent) == {
        "type": "multiagent_20261001",
        "advisor": {"type": "enabled", "model": "claude-opus-4-6"},
        "subagents": {"type": "enabled", "inline_agents": {"type": "disabled"},
                      "predefined_agents": [ref(researcher, 2), ref(full, 1)]},
        "workflows": {"type": "disabled"},
    }  # fmt: skip
    assert (await client.beta.agents.retrieve(researcher.id)).multiagent is None


async def test_each_bad_config_is_a_400_naming_its_field_and_nothing_is_stored(gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("ma-bad")
    worker = await client.beta.agents.create(name="worker", model=MODEL)
    archived = await client.beta.agents.create(name="gone", model=MODEL)
    await client.beta.agents.archive(archived.id)
    nested = await client.beta.agents.create(name="nested", model=MODEL,
                                             multiagent={"type": "coordinator", "agents": [worker.id]})  # fmt: skip
    environment = await client.beta.environments.create(name="plain")
    existing = await client.beta.agents.create(name="existing", model=MODEL)

    def coordinator(*agents: Any) -> dict[str, Any]:
        return {"type": "coordinator", "agents": list(agents)}

    def subagents(**member: Any) -> dict[str, Any]:
        return {"type": "multiagent_20261001", "subagents": {"type": "enabled", **member}}

    refused: list[tuple[Any, str]] = [
        ({"type": "swarm"}, r"multiagent\.type"),
        ({"type": "coordinator"}, r"multiagent\.agents is required"),
        (coordinator(), r"multiagent\.agents must be a list of 1-20"),
        (coordinator(*[worker.id] * 21), r"multiagent\.agents must be a list of 1-20"),
        (coordinator(worker.id, {"type": "agent", "id": worker.id, "version": 1}), r"multiagent\.agents\[1\]: agent"),
        (coordinator({"type": "self"}, {"type": "self"}), r"multiagent\.agents\[1\]: at most one 'self'"),
        (coordinator({"type": "advisor", "model": "a"}, {"type": "advisor", "model": "b"}),
         r"multiagent\.agents\[1\]: at most one 'advisor'"),
        (coordinator({"type": "advisor"}), r"multiagent\.agents\[0\]\.model is required"),
        (coordinator(environment.id), r"multiagent\.agents\[0\]: .* is an environment id"),
        (coordinator({"type": "agent", "id": worker.id, "version": 0}), r"multiagent\.agents\[0\]\.version"),
        (coordinator({"type": "team"}), r"multiagent\.agents\[0\] must be an agent id"),
        (coordinator(archived.id), r"multiagent\.agents\[0\]: agent .* is archived"),
        (coordinator(nested.id), r"multiagent\.agents\[0\]: agent .* has a multiagent config of its own"),
        (coordinator(worker.id) | {"extra": 1}, r"multiagent: unknown field\(s\) extra"),
        ({"type": "multiagent_20261001", "advisor": {"type": "enabled"}}, r"multiagent\.advisor\.model is required"),
        ({"type": "multiagent_20261001", "advisor": {"model": "a"}}, r"multiagent\.advisor must be an object whose"),
        (subagents(inline_agents={"type": "disabled"}), r"multiagent\.subagents\.predefined_agents must name"),
        (subagents(inline_agents={"type": "disabled"}, predefined_agents=None), r"subagents\.predefined_agents must"),
        ({"type": "multiagent_20261001", "workflows": {"type": "enabled", "inline_agents": {"type": "disabled"}}},
         r"multiagent\.workflows\.predefined_agents must name"),
        (subagents(predefined_agents=[{"type": "advisor", "model": "a"}]),
         r"multiagent\.subagents\.predefined_agents\[0\] must be"),
        (subagents(predefined_agents=[worker.id] * 21), r"multiagent\.subagents\.predefined_agents must be a list"),
        (subagents(predefined_agents=[archived.id]), r"multiagent\.subagents\.predefined_agents\[0\]: .* archived"),
        (subagents(predefined_agents=[nested.id]), r"subagents\.predefined_agents\[0\]: .* multiagent config"),
    ]  # fmt: skip
    for config, field in refused:
        with pytest.raises(anthropic.BadRequestError, match=field) as made:
            await client.beta.agents.create(name="bad", model=MODEL, multiagent=config)
        assert made.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        with pytest.raises(anthropic.BadRequestError, match=field):
            await client.beta.agents.update(existing.id, multiagent=config)
    for missing in ("agent_" + "0" * 26, {"type": "agent", "id": worker.id, "version": 7}):
        with pytest.raises(anthropic.NotFoundError, match=r"multiagent\.agents\[0\]: agent .* was not found"):
            await client.beta.agents.create(name="bad", model=MODEL, multiagent=coordinator(missing))  # type: ignore[arg-type]
    reserved = [{**LOOKUP, "name": "spawn_thread"}]
    with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]\.name: 'spawn_thread' is reserved"):
        await client.beta.agents.create(name="bad", model=MODEL, tools=reserved,  # type: ignore[arg-type]
                                        multiagent={"type": "multiagent_20261001"})  # fmt: skip
    lead = await client.beta.agents.create(name="lead", model=MODEL, multiagent={"type": "multiagent_20261001"})
    with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]\.name: 'consult_advisor' is reserved"):
        await client.beta.agents.update(lead.id, tools=[{**LOOKUP, "name": "consult_advisor"}])  # type: ignore[list-item]
    assert (await client.beta.agents.create(name="single", model=MODEL, tools=reserved)).multiagent is None  # type: ignore[arg-type]

    overridden: Any = {"type": "agent_with_overrides", "id": lead.id, "tools": reserved}
    with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]\.name: 'spawn_thread' is reserved"):
        await client.beta.sessions.create(agent=overridden, environment_id=environment.id)
    assert (await client.beta.agents.retrieve(existing.id)).version == 1, "no refused update wrote a version"
    assert (await client.beta.agents.retrieve(lead.id)).version == 1
    names = [agent.name async for agent in client.beta.agents.list(include_archived=True)]
    assert "bad" not in names, "no refused create made an agent"


async def test_another_workspaces_agent_is_not_found(gateway: Gateway) -> None:  # noqa: F811
    mine, theirs = await gateway.client("ma-tenant-a"), await gateway.client("ma-tenant-b")
    secret = await theirs.beta.agents.create(name="theirs", model=MODEL)
    own = await mine.beta.agents.create(name="own", model=MODEL)
    for config in (
        {"type": "coordinator", "agents": [secret.id]},
        {"type": "coordinator", "agents": [{"type": "agent", "id": secret.id, "version": 1}]},
        {"type": "multiagent_20261001", "subagents": {"type": "enabled", "predefined_agents": [secret.id]}},
        {"type": "multiagent_20261001", "workflows": {"type": "enabled", "predefined_agents": [secret.id]}},
    ):
        with pytest.raises(anthropic.NotFoundError, match="was not found") as refused:
            await mine.beta.agents.create(name="lead", model=MODEL, multiagent=config)  # type: ignore[arg-type]
        assert refused.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
        with pytest.raises(anthropic.NotFoundError, match="was not found"):
            await mine.beta.agents.update(own.id, multiagent=config)  # type: ignore[arg-type]
    assert (await mine.beta.agents.retrieve(own.id)).version == 1
    assert [a.name async for a in mine.beta.agents.list()] == ["own"]


async def test_an_update_merges_level_by_level_and_another_type_replaces(gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("ma-merge")
    first = await client.beta.agents.create(name="first", model=MODEL)
    second = await client.beta.agents.create(name="second", model=MODEL)
    lead = await client.beta.agents.create(
        name="lead", model=MODEL,
        multiagent={"type": "multiagent_20261001", "advisor": {"type": "enabled", "model": "claude-opus-4-6"},
                    "subagents": {"type": "enabled", "predefined_agents": [first.id]},
                    "workflows": {"type": "disabled"}},
    )  # fmt: skip

    async def update(multiagent: Any, **fields: Any) -> Any:
        return dumped((await client.beta.agents.update(lead.id, multiagent=multiagent, **fields)).multiagent)

    merged = await update(
        {"type": "multiagent_20261001", "subagents": {"type": "enabled", "inline_agents": {"type": "disabled"}}}
    )
    assert merged["advisor"] == {"type": "enabled", "model": "claude-opus-4-6"}, "an omitted key keeps its value"
    assert merged["subagents"] == {"type": "enabled", "inline_agents": {"type": "disabled"},
                                   "predefined_agents": [ref(first)]}, "merged one level down too"  # fmt: skip
    assert merged["workflows"] == {"type": "disabled"}

    merged = await update({"type": "multiagent_20261001", "advisor": None, "workflows": None})
    default = {"type": "enabled", "inline_agents": {"type": "enabled"}, "predefined_agents": []}
    assert (merged["advisor"], merged["workflows"]) == ({"type": "disabled"}, default), "null is the default"
    assert merged["subagents"]["predefined_agents"] == [ref(first)]

    merged = await update(
        {"type": "multiagent_20261001", "subagents": {"type": "enabled", "predefined_agents": [second.id]}}
    )
    assert merged["subagents"]["predefined_agents"] == [ref(second)], "a sent list replaces the stored one"
    assert merged["subagents"]["inline_agents"] == {"type": "disabled"}

    await update({"type": "multiagent_20261001", "subagents": {"type": "disabled"}})
    merged = await update({"type": "multiagent_20261001", "subagents": {"type": "enabled"}})
    assert merged["subagents"] == default, "an object of another type replaces: its omitted keys take defaults"

    kept = await client.beta.agents.update(lead.id, system="be brief")
    assert dumped(kept.multiagent) == merged, "an update without multiagent keeps it"

    replaced = await update({"type": "coordinator", "agents": [first.id, {"type": "self"}]})
    assert replaced == {"type": "coordinator", "agents": [ref(first), ref(lead, kept.version + 1)]}
    back = await client.beta.agents.retrieve(lead.id)
    resent = await client.beta.agents.update(lead.id, multiagent=dumped(back.multiagent))
    assert (resent.version, dumped(resent.multiagent)) == (back.version, dumped(back.multiagent)), (
        "its own id sent back is `self` again: the config it shows, sent back, changes nothing"
    )
    assert await update({"type": "multiagent_20261001"}) == {
        "type": "multiagent_20261001", "advisor": {"type": "disabled"}, "subagents": default, "workflows": default,
    }, "another type replaces the whole config"  # fmt: skip
    assert await update(None) is None, "null clears it"


async def start_input(stack: Stack, session_id: str) -> SessionInput:
    """The session workflow's start input, as Temporal recorded it."""
    history = await stack.client.get_workflow_handle(session_id).fetch_history()
    payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
    [decoded] = await stack.client.data_converter.decode(list(payloads), [SessionInput])
    assert isinstance(decoded, SessionInput)
    return decoded


async def test_a_session_resolves_the_config_into_snapshots(stack: Stack, tmp_path: Path) -> None:
    async with running_gateway(stack, tmp_path, **{ENV_MAX_THREADS_PER_SESSION: "5"}) as served:
        client = await served.client("ma-session")
        environment = await client.beta.environments.create(name="plain")
        researcher = await client.beta.agents.create(name="researcher", model=MODEL, system="dig deep",
                                                     tools=[LOOKUP])  # type: ignore[list-item]  # fmt: skip
        lead = await client.beta.agents.create(
            name="lead", model=stack.script([{"text": "ok"}]), system="coordinate",
            multiagent={"type": "multiagent_20261001", "advisor": {"type": "enabled", "model": "claude-opus-4-6"},
                        "subagents": {"type": "enabled", "predefined_agents": [researcher.id, {"type": "self"}]},
                        "workflows": {"type": "disabled"}},
        )  # fmt: skip
        await client.beta.agents.update(researcher.id, system="changed after the lead pinned it")
        session = await client.beta.sessions.create(agent=lead.id, environment_id=environment.id)
        stack.started.append(stack.client.get_workflow_handle(session.id))

        shown = session.agent.multiagent
        assert isinstance(shown, BetaManagedAgentsSessionMultiagent20261001)
        assert shown.advisor.model_dump() == {"type": "enabled", "model": "claude-opus-4-6"}
        assert shown.workflows.type == "disabled" and shown.subagents.type == "enabled"
        assert shown.subagents.inline_agents.type == "enabled"
        first, itself = shown.subagents.predefined_agents
        assert (first.id, first.version, first.name, first.system) == (researcher.id, 1, "researcher", "dig deep")
        assert [tool.model_dump(exclude_none=True) for tool in first.tools] == [LOOKUP]
        assert (first.model.id, first.skills, first.mcp_servers) == (MODEL, [], [])
        assert (itself.id, itself.version, itself.system) == (lead.id, 1, "coordinate")
        assert dumped((await client.beta.sessions.retrieve(session.id)).agent.multiagent) == dumped(shown)

        started = (await start_input(stack, session.id)).agent.multiagent
        assert started is not None
        raw = await client.beta.sessions.with_raw_response.retrieve(session.id)
        assert started.view == raw.http_response.json()["agent"]["multiagent"], "the harness has the view shown"
        agent, own = started.agents
        assert (agent.type, agent.id, agent.version, own.type) == ("agent", researcher.id, 1, "self")
        assert agent.config is not None and agent.config.system == "dig deep"
        assert [tool.name for tool in agent.config.tools] == ["lookup"]  # type: ignore[union-attr]
        assert (started.subagents, started.inline_agents, started.advisor_model) == (True, True, "claude-opus-4-6")
        assert (started.workflows, started.max_threads, started.runs) == ({"type": "disabled"}, 5, False)

        roster = await client.beta.agents.create(
            name="roster", model=MODEL,
            multiagent={"type": "coordinator", "agents": [researcher.id, {"type": "advisor", "model": "adv"}]},
        )  # fmt: skip
        session = await client.beta.sessions.create(agent=roster.id, environment_id=environment.id)
        stack.started.append(stack.client.get_workflow_handle(session.id))
        assert isinstance(session.agent.multiagent, BetaManagedAgentsSessionMultiagentCoordinator)
        member, advisor = session.agent.multiagent.agents
        assert isinstance(member, BetaManagedAgentsSessionThreadAgent)
        assert (member.type, member.id, member.version, advisor.model_dump()) == (
            "agent", researcher.id, 2, {"type": "advisor", "model": "adv"})  # fmt: skip
        started = (await start_input(stack, session.id)).agent.multiagent
        assert started is not None and [(a.type, a.id, a.version) for a in started.agents] == [
            ("agent", researcher.id, 2)]  # fmt: skip
        assert (started.type, started.advisor_model, started.inline_agents) == ("coordinator", "adv", False)

        single = await client.beta.sessions.create(agent=researcher.id, environment_id=environment.id)
        stack.started.append(stack.client.get_workflow_handle(single.id))
        assert single.agent.multiagent is None
        assert (await start_input(stack, single.id)).agent.multiagent is None


async def test_a_session_made_through_the_api_spawns_a_predefined_agent_by_name(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    """The resolved config runs: the coordinator spawns the pinned snapshot of a saved agent by its name, and the
    thread's reply comes back to it."""
    client = await gateway.client("ma-run")
    environment = await client.beta.environments.create(name="plain")
    researcher = await client.beta.agents.create(name="researcher", model=stack.script([{"text": "found 42"}]))
    spawn = {"name": "spawn_thread", "input": {"agent": "researcher", "message": "find the number"}}
    lead_model = stack.script([{"tool_uses": [spawn]}, {"tool_uses": [{"name": "wait_for_threads", "input": {}}]},
                               {"text": "the researcher says 42"}])  # fmt: skip
    multiagent: Any = {
        "type": "multiagent_20261001",
        "subagents": {"type": "enabled", "predefined_agents": [researcher.id]},
    }
    lead = await client.beta.agents.create(name="lead", model=lead_model, multiagent=multiagent)
    hello = {"type": "user.message", "content": [{"type": "text", "text": "what is the number?"}]}
    session = await client.beta.sessions.create(agent=lead.id, environment_id=environment.id,
                                                initial_events=[hello])  # type: ignore[list-item]  # fmt: skip
    handle = stack.client.get_workflow_handle(session.id)
    stack.started.append(handle)

    async def answered() -> bool:
        return "the researcher says 42" in texts(await read_events(handle))

    await until(answered, "the coordinator's answer")
    events = await read_events(handle)
    assert [e.agent_name for e in events if isinstance(e, SessionThreadCreated)] == ["researcher"]
    replies: list[SessionEvent] = [e for e in events if isinstance(e, AgentThreadMessageReceived)]
    assert texts(replies, "agent.thread_message_received") == ["found 42"]


async def test_a_roster_agents_revoked_hand_refuses_new_sessions_and_new_input(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client = await gateway.client("ma-hands")
    await gateway.allow_hand(stack.hand_queue, "ma-hands")
    environment = await client.beta.environments.create(name="plain")
    echo = {"type": "hand", "name": "echo", "description": "echo", "task_queue": stack.hand_queue,
            "input_schema": {"type": "object", "properties": {}}}  # fmt: skip
    worker = await client.beta.agents.create(name="worker", model=MODEL, tools=[echo])  # type: ignore[list-item]
    lead = await client.beta.agents.create(
        name="lead", model=MODEL,
        multiagent={"type": "multiagent_20261001", "subagents": {"type": "enabled", "predefined_agents": [worker.id]}},
    )  # fmt: skip
    session = await client.beta.sessions.create(agent=lead.id, environment_id=environment.id)
    stack.started.append(stack.client.get_workflow_handle(session.id))

    await revoke_hand(gateway.records, stack.hand_queue)
    field = "agent.multiagent.subagents.predefined_agents[0].tools[0].task_queue"
    with pytest.raises(anthropic.BadRequestError, match=re.escape(field)):
        await client.beta.sessions.create(agent=lead.id, environment_id=environment.id)
    hello = {"type": "user.message", "content": [{"type": "text", "text": "hello"}]}
    with pytest.raises(anthropic.BadRequestError, match=re.escape(field)):
        await client.beta.sessions.events.send(session.id, events=[hello])  # type: ignore[list-item]
    assert [event.id async for event in client.beta.sessions.events.list(session.id)] == []


def test_the_gateway_refuses_a_bad_thread_limit_at_start() -> None:
    for variable in (ENV_MAX_THREADS_PER_SESSION, ENV_MAX_WORKFLOW_RUNS_PER_SESSION, ENV_MAX_THREADS_PER_RUN):
        for value in ("0", "many", "100000"):
            argv = [sys.executable, "-m", "gateway", "--temporal", "127.0.0.1:1"]
            environ = {**os.environ, variable: value}
            ran = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=environ)
            assert ran.returncode == 2, ran.stderr
            assert variable in ran.stderr and "Traceback" not in ran.stderr, ran.stderr


async def test_a_multiagent_session_from_the_sdk_from_spawn_to_summary(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    """Wholly through the SDK: a coordinator with a predefined researcher (a custom tool) and writer (a call that
    asks for confirmation) spawns both, messages the writer again, and sums up their replies. The client answers
    both subagents' calls from the primary stream, by tool-use id, never naming a thread; then lists the threads."""
    client = await gateway.client("ma-e2e")
    await gateway.allow_hand(stack.hand_queue, "ma-e2e")
    environment = await client.beta.environments.create(name="plain")
    echo = {"type": "hand", "name": "echo", "description": "echo", "task_queue": stack.hand_queue,
            "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
            "permission_policy": {"type": "always_ask"}}  # fmt: skip
    researcher = await client.beta.agents.create(
        name="researcher", tools=[LOOKUP],  # type: ignore[list-item]
        model=stack.script([{"tool_uses": [{"name": "lookup", "input": {"word": "x"}}]},
                            {"text": "x means", "echo_last_user": True}]),
    )  # fmt: skip
    writer = await client.beta.agents.create(
        name="writer", tools=[echo],  # type: ignore[list-item]
        model=stack.script([{"tool_uses": [{"name": "echo", "input": {"text": "draft"}}]}, {"text": "drafted"},
                            {"text": "polished"}]),
    )  # fmt: skip
    replies = r"Message from thread sthr_\w+ \((\w+)\):"
    lead_model = stack.script([
        {"tool_uses": [{"name": "spawn_thread", "input": {"agent": "researcher", "message": "look x up"}},
                       {"name": "spawn_thread", "input": {"agent": "writer", "message": "draft it"}}]},
        {"tool_uses": [{"name": "wait_for_threads", "input": {}}], "repeat_until": {"pattern": replies, "count": 2}},
        {"tool_uses": [{"name": "message_thread", "input": {"thread_id": "writer", "message": "polish it"}}]},
        {"tool_uses": [{"name": "wait_for_threads", "input": {}}], "repeat_until": {"pattern": replies, "count": 3}},
        {"text": "summary:", "echo_matches": r"\((\w+)\):\n(.+)"},
    ])  # fmt: skip
    multiagent: Any = {"type": "multiagent_20261001",
                       "subagents": {"type": "enabled", "predefined_agents": [researcher.id, writer.id]}}  # fmt: skip
    lead = await client.beta.agents.create(name="lead", model=lead_model, multiagent=multiagent)
    session = await client.beta.sessions.create(agent=lead.id, environment_id=environment.id)
    stack.started.append(stack.client.get_workflow_handle(session.id))

    seen: list[Any] = []
    async with await client.beta.sessions.events.stream(session.id) as stream:

        async def follow() -> None:
            async for event in stream:
                seen.append(event)
                if event.type == "agent.custom_tool_use":
                    assert event.session_thread_id is not None
                    await client.beta.sessions.events.send(session.id, events=[{
                        "type": "user.custom_tool_result", "custom_tool_use_id": event.id,
                        "content": [{"type": "text", "text": "42"}]}])  # fmt: skip
                elif event.type == "agent.tool_use" and event.evaluated_permission == "ask":
                    assert event.session_thread_id is not None
                    await client.beta.sessions.events.send(session.id, events=[{
                        "type": "user.tool_confirmation", "tool_use_id": event.id, "result": "allow"}])  # fmt: skip
                elif event.type == "agent.message" and any(
                    getattr(b, "text", "").startswith("summary:") for b in event.content
                ):
                    return

        reading = asyncio.create_task(follow())
        await client.beta.sessions.events.send(session.id, events=[
            {"type": "user.message", "content": [{"type": "text", "text": "go"}]}])  # fmt: skip
        await asyncio.wait_for(reading, 180)

    summary = seen[-1].content[0].text
    assert "researcher: x means" in summary and "writer: drafted" in summary and "writer: polished" in summary
    received = [b.text for e in seen if e.type == "agent.thread_message_received" for b in e.content]
    assert "x means\n42" in received, "the custom tool's result, answered on the session, reached the researcher"
    types = [e.type for e in seen]
    assert types.count("session.thread_created") == 2 and types.count("agent.thread_message_sent") == 3
    assert types.count("agent.thread_message_received") == 3
    idle = [e for e in seen if e.type == "session.thread_status_idle" and e.stop_reason.type == "requires_action"]
    assert idle, "a subagent waiting on the client shows on the primary stream"
    threads = [t async for t in client.beta.sessions.threads.list(session.id)]
    assert [getattr(t.agent, "name", None) for t in threads] == ["lead", "researcher", "writer"]
    assert all(t.status == "idle" for t in threads[1:]) and threads[2].usage is not None
    listed = [e async for e in client.beta.sessions.threads.events.list(threads[2].id, session_id=session.id)]
    assert [e.type for e in listed].count("agent.thread_message_received") == 2, "the writer got two messages"
    assert any(e.type == "user.tool_confirmation" for e in listed), "the confirmation reached the writer"
