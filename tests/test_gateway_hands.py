"""Hands belong to the operator: through a real gateway process with the official SDK, an agent may name a hand's
task queue only when the operator registered it for the agent's workspace; corral's own queues never; a refusal is
a 400 naming the field and writes nothing; a registered hand serves a session; a revoked one stops new sessions and
new input. The `corral hand` commands run in-process against the real dev server. A Temporal-client user is the
operator and is not bound by the registry (shown with a session started directly)."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from cli.main import app
from corral.client import wait_for_idle
from corral.contract.records import RECORD_ID_PATTERN
from corral.contract.session import AgentConfig
from corral.hand_registry import (
    HAND_KIND,
    OPERATOR_WORKSPACE,
    HandRegistryError,
    InvalidHandQueue,
    hand_queue_problem,
    hand_record_id,
    hand_registration,
    register_hand,
    revoke_hand,
)
from corral.names import (
    CORRAL_TASK_QUEUES,
    HARNESS_TASK_QUEUE,
    SANDBOX_TASK_QUEUE,
    reserved_task_queue,
    sandbox_provision_queue,
)
from corral.records import Records
from tests.conftest import Stack, texts, unique
from tests.test_gateway import Gateway, gateway  # noqa: F401 - the fixture
from workers.roles import harness_worker

pytestmark = pytest.mark.timeout(300)

ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}
LOOKUP: Any = {"type": "custom", "name": "lookup", "description": "the client runs it", "input_schema": {}}
RESERVED = [*CORRAL_TASK_QUEUES, sandbox_provision_queue("edge"), f"{SANDBOX_TASK_QUEUE}@engine-1", "corral-model-eu"]
"""corral's own queues: every role's, a sandbox engine pool's, an engine's, a model pool named by the convention."""


def hand(queue: str, name: str = "echo") -> Any:
    return {"type": "hand", "name": name, "description": "echo text", "task_queue": queue, "input_schema": ECHO_SCHEMA}


def message(text: str) -> Any:
    return {"type": "user.message", "content": [{"type": "text", "text": text}]}


async def refused(call: Awaitable[Any], field: str) -> str:
    """The message of the 400 that `call` must get, which names `field`."""
    with pytest.raises(anthropic.BadRequestError, match=re.escape(field)) as refusal:
        await call
    error = refusal.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    return str(error["message"])


async def eventually(read: Callable[[], Awaitable[Any]], done: Callable[[Any], bool]) -> Any:
    """`read()` again until `done` holds: Temporal visibility lists a record a moment after it is written."""
    for _ in range(200):
        value = await read()
        if done(value):
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"never done: {value!r}")


# ---- pure -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("queue", [*RESERVED, "/_sys/corral-harness/1", " corral-harness"])
def test_corrals_own_queues_are_reserved_and_no_one_may_declare_a_hand_on_one(queue: str) -> None:
    assert reserved_task_queue(queue)
    assert hand_queue_problem(queue) is not None
    with pytest.raises(ValidationError, match=re.escape("agent.tools[1].task_queue")):
        AgentConfig.model_validate({"model": "m", "tools": [LOOKUP, hand(queue)]})


def test_a_hand_of_its_own_queue_and_the_utility_toolset_are_allowed_by_the_contract() -> None:
    agent = AgentConfig.model_validate({"model": "m", "tools": [{"type": "corral_utility"}, hand("notes-hand")]})
    assert [tool.task_queue for tool in agent.resolved_tools() if tool.type == "hand"] == [
        "corral-utility",
        "corral-utility",
        "notes-hand",
    ], "the utility toolset's own tools stay on corral's utility queue"
    assert not reserved_task_queue("notes-hand") and hand_queue_problem("notes-hand") is None
    for bad in ("", "has space", "a;b", "-leading", "x" * 201, "ünïcode"):
        assert hand_queue_problem(bad) is not None, bad
    assert re.match(RECORD_ID_PATTERN, hand_record_id("notes-hand"))
    assert hand_record_id("notes-hand") != hand_record_id("notes-hand2")


# ---- through the gateway ------------------------------------------------------------------------------------------


async def test_an_agent_names_only_a_hand_registered_for_its_workspace(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client, other = await gateway.client("team-a"), await gateway.client("team-b")
    queue, elsewhere = stack.hand_queue, unique("other-hand")
    create = client.beta.agents.create

    # Never registered, and registered for another workspace only: the same 400, so nothing leaks across tenants.
    never = await refused(create(name="x", model="m", tools=[LOOKUP, hand(elsewhere)]), "tools[1].task_queue")
    await gateway.allow_hand(queue, "team-b")
    theirs = await refused(create(name="x", model="m", tools=[LOOKUP, hand(queue)]), "tools[1].task_queue")
    assert never.replace(elsewhere, queue) == theirs, (never, theirs)
    assert "not a hand queue registered for this workspace" in theirs
    # corral's own queues, and this gateway's own harness and model queues: refused whoever asks, registered or not.
    for reserved in [*RESERVED, stack.harness_queue, stack.model_queue]:
        message = await refused(create(name="x", model="m", tools=[hand(reserved)]), "tools[0].task_queue")
        assert "own" in message, message
    with pytest.raises(InvalidHandQueue, match="reserved"):  # nor can the operator register one
        await register_hand(gateway.records, HARNESS_TASK_QUEUE, [f"team-a-{gateway.suffix}"])
    assert await hand_registration(gateway.records, HARNESS_TASK_QUEUE) is None

    # Nothing was written by the refusals: once a later agent is listed, it is the only one.
    sentinel = await create(name="sentinel", model="m")
    listed = await eventually(lambda: _agent_ids(client), lambda ids: sentinel.id in ids)
    assert listed == [sentinel.id]

    # Registered for this workspace: created, and shown as declared. The other workspace may use it too.
    await gateway.allow_hand(queue, "team-a")
    agent = await create(name="with a hand", model="m", tools=[LOOKUP, hand(queue)])
    assert [tool.model_dump().get("task_queue") for tool in agent.tools] == [None, queue]
    assert (await other.beta.agents.create(name="theirs", model="m", tools=[hand(queue)])).version == 1

    # Updates: an unregistered hand is refused and the version stays; a registered one makes version 2.
    update = client.beta.agents.update
    await refused(update(sentinel.id, version=1, tools=[LOOKUP, hand(elsewhere)]), "tools[1].task_queue")
    await refused(update(sentinel.id, version=1, tools=[hand("corral-proxy")]), "tools[0].task_queue")
    assert (await client.beta.agents.retrieve(sentinel.id)).version == 1
    assert [v.version async for v in client.beta.agents.versions.list(sentinel.id)] == [1]
    assert (await update(sentinel.id, version=1, tools=[hand(queue)])).version == 2

    # Revoked for this workspace: an update of the agent that keeps the hand is refused (the agent would still name
    # it), and writes nothing; the other workspace keeps it.
    await revoke_hand(gateway.records, queue, [f"team-a-{gateway.suffix}"])
    await refused(update(agent.id, version=1, name="renamed"), "tools[1].task_queue")
    assert (await client.beta.agents.retrieve(agent.id)).name == "with a hand"
    assert (await update(agent.id, version=1, tools=[LOOKUP])).version == 2
    assert (await other.beta.agents.create(name="still theirs", model="m", tools=[hand(queue)])).version == 1


async def _agent_ids(client: anthropic.AsyncAnthropic) -> list[str]:
    return [agent.id async for agent in client.beta.agents.list()]


async def test_a_registered_hand_serves_a_session_and_a_revoked_one_takes_no_more_work(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client = await gateway.client("team-a")
    canary = f"canary-{uuid.uuid4().hex}"
    model = stack.script([{"tool_uses": [{"name": "echo", "input": {"text": canary}}]}, {"text": "echoed"}])
    await gateway.allow_hand(stack.hand_queue, "team-a")
    agent = await client.beta.agents.create(name="echoer", model=model, tools=[hand(stack.hand_queue)])
    environment = await client.beta.environments.create(name="plain")
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    handle = stack.client.get_workflow_handle(session.id)
    stack.started.append(handle)
    await client.beta.sessions.events.send(session.id, events=[message("echo it")])
    events = await wait_for_idle(handle, within_seconds=120)
    assert texts(events, "agent.tool_result") == [canary], "the hand's worker on the registered queue ran the call"

    # An override that brings a hand of a queue not registered here is refused at session create.
    unregistered: Any = {"type": "agent_with_overrides", "id": agent.id, "tools": [hand(unique("nobody"))]}
    await refused(client.beta.sessions.create(agent=unregistered, environment_id=environment.id),
                  "agent.tools[0].task_queue")  # fmt: skip

    # Revoked: no new session from the agent, and the running session takes no message (nothing is written to its
    # log), only an interrupt, which starts no work.
    await revoke_hand(gateway.records, stack.hand_queue)
    await refused(client.beta.sessions.create(agent=agent.id, environment_id=environment.id),
                  "agent.tools[0].task_queue")  # fmt: skip
    before = [event.id async for event in client.beta.sessions.events.list(session.id)]
    refusal = await refused(client.beta.sessions.events.send(session.id, events=[message("again")]),
                            "agent.tools[0].task_queue")  # fmt: skip
    assert "takes no more events" in refusal
    assert [event.id async for event in client.beta.sessions.events.list(session.id)] == before
    sent = await client.beta.sessions.events.send(session.id, events=[{"type": "user.interrupt"}])
    assert [event.type for event in sent.data or []] == ["user.interrupt"]
    # Nothing was created by the refused creates: once a later session is listed, it and the first are the only ones.
    plain = await client.beta.agents.create(name="plain", model=model)
    sentinel = await client.beta.sessions.create(agent=plain.id, environment_id=environment.id)
    stack.started.append(stack.client.get_workflow_handle(sentinel.id))
    listed = await eventually(lambda: _session_ids(client), lambda ids: sentinel.id in ids)
    assert sorted(listed) == sorted([session.id, sentinel.id])

    # A Temporal-client user is the operator: a session started directly still reaches the (revoked) hand.
    direct_model = stack.script([{"tool_uses": [{"name": "echo", "input": {"text": "direct"}}]}, {"text": "ok"}])
    direct = await stack.start(direct_model, "echo", tools=[hand(stack.hand_queue)])
    assert texts(await wait_for_idle(direct, within_seconds=120), "agent.tool_result") == ["direct"]


async def _session_ids(client: anthropic.AsyncAnthropic) -> list[str]:
    return [session.id async for session in client.beta.sessions.list()]


# ---- the operator's commands ------------------------------------------------------------------------------------


async def test_the_operator_registers_lists_and_revokes_hands_with_the_cli(stack: Stack) -> None:
    """`corral hand register|ls|revoke`, in-process, against the public harness queue (which the CLI uses), served
    here for this test only; its records are deleted at the end."""
    queue, workspace, second = unique("cli-hand"), unique("ws"), unique("ws")
    address = stack.client.service_client.config.target_host
    runner = CliRunner()

    def corral(*args: str) -> Any:
        return runner.invoke(app, ["--address", address, "--namespace", stack.client.namespace, "hand", *args])

    async def run(*args: str) -> Any:
        return await asyncio.to_thread(corral, *args)

    records = Records(stack.client)  # the default queue, as the CLI's
    async with harness_worker(stack.client, HARNESS_TASK_QUEUE):
        try:
            for args, code, words in (
                (("register", "corral-sandbox.edge", "-w", workspace), 2, "reserved"),
                (("register", HARNESS_TASK_QUEUE, "--all-workspaces"), 2, "reserved"),
                (("register", "a;b", "-w", workspace), 2, "not a hand queue name"),
                (("register", queue, "-w", "Not Valid"), 2, "not a workspace name"),
                (("register", queue), 2, "--all-workspaces"),
                (("register", queue, "-w", workspace, "--all-workspaces"), 2, "one of the two"),
                (("revoke", queue), 1, f"no hand is registered on task queue {queue}"),
            ):
                result = await run(*args)
                assert (result.exit_code, "Traceback" in result.output) == (code, False), (args, result.output)
                assert words in result.output, (args, result.output)
            assert await hand_registration(records, queue) is None, "nothing was written"
            key = await asyncio.to_thread(runner.invoke, app, ["--address", address, "--namespace",
                                                               stack.client.namespace, "api-key", "create",
                                                               "--workspace", OPERATOR_WORKSPACE])  # fmt: skip
            assert (key.exit_code, "Traceback" in key.output) == (2, False), key.output
            assert "operator's workspace" in key.output, "no key may open the registry's workspace"
            assert await hand_registration(records, "corral-sandbox.edge") is None

            result = await run("register", queue, "--workspace", workspace)
            assert result.exit_code == 0, result.output
            assert (await hand_registration(records, queue)).allows(workspace)  # type: ignore[union-attr]
            result = await run("register", queue, "-w", second)
            both = ", ".join(sorted([workspace, second]))
            assert result.exit_code == 0 and both in result.output, result.output
            listing = await eventually(lambda: run("ls"), lambda result: queue in result.stdout)
            assert listing.exit_code == 0 and workspace in listing.stdout and second in listing.stdout
            mine = await run("list", "--workspace", second)
            assert mine.exit_code == 0 and queue in mine.stdout

            result = await run("revoke", queue, "-w", workspace)
            assert result.exit_code == 0, result.output
            registration = await hand_registration(records, queue)
            assert registration is not None and not registration.allows(workspace) and registration.allows(second)
            assert queue not in (await run("ls", "--workspace", workspace)).stdout

            result = await run("register", queue, "--all-workspaces")
            assert result.exit_code == 0 and "every workspace" in result.output, result.output
            result = await run("revoke", queue, "-w", second)
            assert result.exit_code == 1 and "revoke it whole" in result.output, result.output
            result = await run("revoke", queue)
            assert result.exit_code == 0 and "revoked" in result.output, result.output
            registration = await hand_registration(records, queue)
            assert registration is not None and registration.revoked and not registration.allows(second)
            versions = await records.versions(hand_record_id(queue), OPERATOR_WORKSPACE, kind=HAND_KIND)
            assert len(versions) == 5, "each change is a version: the record's history says who could use it when"
            with pytest.raises(HandRegistryError):
                await revoke_hand(records, unique("never"))
        finally:
            if await hand_registration(records, queue) is not None:
                await records.delete(hand_record_id(queue), OPERATOR_WORKSPACE)  # nothing stays on the public queue
