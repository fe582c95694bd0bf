"""A session whose workflow ended is reported as what it is, by every CLI command and every API route.

Three ways to end, each made for real: a start input the contract refuses, sent by the real `temporal` binary (the
run fails at once, and no worker can rebuild it to answer a query: "Expected workflow input"); a terminate; and a
workflow execution timeout. Each CLI command runs as a subprocess against the session and must say how, when and
why, exit non-zero, and print no traceback; the API, driven by the official SDK, answers 410 with the reason where
the session can take or show nothing more, and still lists what its log holds where it has one.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import pytest
from temporalio.client import WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from corral.client import new_session_id, wait_for_idle
from corral.contract.session import AgentConfig, SessionInput
from corral.names import SESSION_WORKFLOW
from corral.temporal import temporal_binary
from gateway.owned import WORKSPACE_KEY
from tests.conftest import Stack
from tests.test_gateway import Gateway, gateway  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(600)

REFUSED = "continue_as_new_after_events: Input should be greater than or equal to 200"
LISTED = 1000
"""`corral ls --limit`: Temporal's visibility lists running workflows before ended ones, and the suite's dev server
holds every earlier test's running sessions, so an ended session is found past them."""
READS = [["events"], ["events", "--json"], ["tail"], ["export"], ["context"]]
WRITES = [["send", "hello"], ["send", "hello", "--follow"], ["interrupt"]]


def corral(stack: Stack, state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    address = stack.client.service_client.config.target_host
    command = [sys.executable, "-m", "cli.main", "--address", address, "--state-dir", str(state_dir), *args]
    wide = {**os.environ, "COLUMNS": "300"}  # a table row on one line
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, env=wide)


def assert_said(completed: subprocess.CompletedProcess[str], code: int, *phrases: str) -> None:
    said = completed.stdout + completed.stderr
    assert completed.returncode == code, (completed.returncode, said)
    assert "Traceback" not in said and "Python SDK bug" not in said, said
    flat = " ".join(said.split())  # rich wraps long lines
    for phrase in phrases:
        assert phrase in flat, (phrase, said)


async def start_refused(stack: Stack, workspace: str) -> str:
    """A session started with the `temporal` CLI and an input the contract refuses; returns once its run failed."""
    session_id = new_session_id()
    start_input = {"agent": {"model": "any"}, "continue_as_new_after_events": 120}
    address = stack.client.service_client.config.target_host
    command = [temporal_binary(), "workflow", "start", "--type", SESSION_WORKFLOW, "--task-queue", stack.harness_queue,
               "--workflow-id", session_id, "--input", json.dumps(start_input),
               "--search-attribute", f"CorralWorkspace={json.dumps(workspace)}", "--address", address]  # fmt: skip
    completed = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    with pytest.raises(WorkflowFailureError):
        await stack.client.get_workflow_handle(session_id).result()
    return session_id


async def start_in(stack: Stack, workspace: str, message: str | None, **options: Any) -> str:
    """A session in `workspace` (so the API sees it), started with the Temporal client."""
    model = stack.script([{"text": "done"}])
    session_input = SessionInput(agent=AgentConfig(model=model), message=message, model_task_queue=stack.model_queue)
    handle = await stack.client.start_workflow(
        SESSION_WORKFLOW, session_input, id=new_session_id(), task_queue=stack.harness_queue,
        search_attributes=TypedSearchAttributes([SearchAttributePair(WORKSPACE_KEY, workspace)]), **options,
    )  # fmt: skip
    stack.started.append(handle)
    return handle.id


async def assert_gone(call: Any, *phrases: str) -> None:
    with pytest.raises(anthropic.APIStatusError) as refused:
        await call
    assert refused.value.status_code == 410, refused.value
    for phrase in phrases:
        assert phrase in refused.value.message, (phrase, refused.value.message)


async def test_a_refused_start_input_is_reported_by_every_command_and_route(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
    tmp_path: Path,
) -> None:
    client = await gateway.client("team-ends")
    session_id = await start_refused(stack, f"team-ends-{gateway.suffix}")
    said = ("failed at start", "its start input was refused", REFUSED)
    for args in [*READS, *WRITES, ["fork", "--at", "1"], ["output", "toolu_x"]]:
        assert_said(await asyncio.to_thread(corral, stack, tmp_path, args[0], session_id, *args[1:]), 1, *said)
    listed = await asyncio.to_thread(corral, stack, tmp_path, "ls", "--limit", str(LISTED))
    assert_said(listed, 0, session_id, "Failed at start")

    await assert_gone(client.beta.sessions.retrieve(session_id), *said)
    await assert_gone(client.beta.sessions.events.list(session_id), *said)
    await assert_gone(client.beta.sessions.events.stream(session_id), *said)
    text: Any = [{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}]
    await assert_gone(client.beta.sessions.events.send(session_id, events=text), *said)
    await assert_gone(client.beta.sessions.update(session_id, title="x"), *said)
    await assert_gone(client.beta.sessions.archive(session_id), *said)
    calls = client.beta.sessions.events.tool_runner(session_id, tools=[], max_idle=1.0)
    await assert_gone(anext(aiter(calls)), *said)  # the SDK's runner stops with the reason, never retries
    listed_ids = {s.id: s.status async for s in client.beta.sessions.list()}
    assert listed_ids == {session_id: "terminated"}
    assert (await client.beta.sessions.delete(session_id)).id == session_id, "it can be cleaned up"


@pytest.mark.parametrize("how", ["terminated", "timed_out"])
async def test_a_session_that_ended_says_how_and_when_and_its_log_stays_readable(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
    tmp_path: Path,
    how: str,
) -> None:
    client = await gateway.client("team-ends")
    workspace = f"team-ends-{gateway.suffix}"
    if how == "terminated":
        session_id = await start_in(stack, workspace, "hello")
        handle = stack.client.get_workflow_handle(session_id)
        await wait_for_idle(handle)
        await handle.terminate(reason="stopped by the operator")
        said: tuple[str, ...] = ("was terminated at", "stopped by the operator")
        logged = ["user.message", "session.status_running"]
    else:  # no message: its log is empty, and the timeout lands whatever the machine's speed
        session_id = await start_in(stack, workspace, None, execution_timeout=timedelta(seconds=2))
        handle = stack.client.get_workflow_handle(session_id)
        said = ("timed out", "workflow execution timeout")
        logged = []
    with pytest.raises(WorkflowFailureError):
        await handle.result()

    for args in READS:  # what the log holds is printed, then how the session ended (exit 3)
        completed = await asyncio.to_thread(corral, stack, tmp_path, args[0], session_id, *args[1:])
        assert_said(completed, 3, *said, "nothing more will happen")
        if args == ["events", "--json"]:
            lines = [json.loads(line)["type"] for line in completed.stdout.splitlines()]
            assert lines[: len(logged)] == logged
    for args in WRITES:
        completed = await asyncio.to_thread(corral, stack, tmp_path, args[0], session_id, *args[1:])
        assert_said(completed, 1, *said, "it takes no more events")
    listed = await asyncio.to_thread(corral, stack, tmp_path, "ls", "--limit", str(LISTED))
    assert_said(listed, 0, session_id, "terminated")

    session = await client.beta.sessions.retrieve(session_id)
    assert session.status == "terminated"
    ended = (session.model_extra or {})["ended"]
    assert ended["type"] == how and ended["at"] and all(phrase in ended["message"] for phrase in said)
    assert [e.type async for e in client.beta.sessions.events.list(session_id)][: len(logged)] == logged
    async with await client.beta.sessions.events.stream(session_id) as stream:
        assert [event async for event in stream] == [], "nothing more will be written: the stream ends"
    text: Any = [{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}]
    await assert_gone(client.beta.sessions.events.send(session_id, events=text), *said)
    await assert_gone(client.beta.sessions.update(session_id, title="x"), *said)
    await assert_gone(client.beta.sessions.archive(session_id), *said)
    calls = [call async for call in client.beta.sessions.events.tool_runner(session_id, tools=[], max_idle=1.0)]
    assert calls == [], "the SDK's runner reads `terminated` and stops"
