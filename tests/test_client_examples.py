"""The client examples, run as users run them: a subprocess against corral's public task queues.

The examples hard-code the public queue names (`corral-harness`, `corral-model`, `corral-utility`), so this test
serves those queues itself, for its own duration only; every other test uses fresh queues and never sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import anthropic
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from corral.client import read_events
from corral.contract.events import UserMessage
from corral.contract.plans import WorkflowRunInfo
from modelserver import ModelServerThread
from tests.conftest import texts
from workers.roles import harness_worker, model_worker, utility_hand_worker

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ["examples/temporal_client.py", "examples/temporal_client_typed.py"]
OFFLINE_ANSWER = "[offline stand-in model] Tool result for calculate: 6*7 = 42"
"""What the offline stand-in says after it called `calculate` with the clause after the tool's name."""


@pytest.fixture
async def public_queues(temporal_env: WorkflowEnvironment, model_server: ModelServerThread) -> AsyncIterator[Client]:
    """Harness, model and utility-hand workers on the default task queues, as `corral up` runs them."""
    client = temporal_env.client
    model = anthropic.AsyncAnthropic(base_url=model_server.base_url, api_key="test-key", max_retries=0)
    async with AsyncExitStack() as workers:
        for worker in (harness_worker(client), model_worker(client, model), utility_hand_worker(client)):
            await workers.enter_async_context(worker)
        yield client


async def _run(*args: str) -> tuple[int, str, str]:
    """Run a script without blocking the event loop, where this test's workers run (namespace: the default)."""
    env = {name: value for name, value in os.environ.items() if name != "CORRAL_TEMPORAL_NAMESPACE"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


def _session_ids(stdout: str) -> list[str]:
    return re.findall(r"^session (sesn_[0-9a-f]{26})$", stdout, flags=re.MULTILINE)


async def _terminate(client: Client, session_ids: list[str]) -> None:
    """End the example's sessions, so no later worker on a public queue picks one up."""
    for session_id in session_ids:
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(session_id).terminate("test finished")


@pytest.mark.parametrize("script", EXAMPLES)
async def test_the_client_example_gets_the_agents_reply(public_queues: Client, script: str) -> None:
    code, stdout, stderr = await _run(script, "--address", public_queues.service_client.config.target_host)
    session_ids = _session_ids(stdout)
    try:
        assert code == 0, stderr
        assert f"agent: {OFFLINE_ANSWER}" in stdout.splitlines(), stdout
        assert len(session_ids) == 1, stdout
        # A signal whose input fails to decode is dropped with only a worker warning: check that it arrived.
        messages = await read_events(public_queues.get_workflow_handle(session_ids[0]), types=["user.message"])
        assert [isinstance(m, UserMessage) and m.client_id is not None for m in messages] == [True, False]
        assert [text.split()[0] for text in texts(messages, "user.message")] == ["hello", "please"]
    finally:
        await _terminate(public_queues, session_ids)


@pytest.mark.parametrize("script", EXAMPLES)
async def test_the_client_example_says_when_no_reply_comes(temporal_env: WorkflowEnvironment, script: str) -> None:
    """No worker serves the public queues here, so the update waits until the example gives up."""
    address = temporal_env.client.service_client.config.target_host
    code, stdout, stderr = await _run(script, "--address", address, "--timeout", "2")
    await _terminate(temporal_env.client, _session_ids(stdout))
    assert code == 1, stderr
    assert stderr.strip() == "no reply within 2 s — are corral's workers running? (`corral up`)"


@pytest.mark.parametrize("script", EXAMPLES)
async def test_the_client_example_says_when_temporal_is_unreachable(script: str) -> None:
    code, _, stderr = await _run(script, "--address", "127.0.0.1:1")
    assert code == 1
    assert stderr.strip() == "cannot reach Temporal at 127.0.0.1:1 — run `corral up` first"


def test_the_plain_client_example_imports_nothing_from_corral() -> None:
    source = (ROOT / EXAMPLES[0]).read_text()
    assert not re.search(r"^\s*(import|from)\s+corral\b", source, flags=re.MULTILINE)


async def test_the_workflow_run_example_runs_its_plan_to_a_report(public_queues: Client) -> None:
    code, stdout, stderr = await _run("examples/workflow_run.py", "--address", _address(public_queues))
    session_ids = _session_ids(stdout)
    try:
        assert code == 0, stdout + stderr
        lines = stdout.splitlines()
        assert len(session_ids) == 1 and re.fullmatch(r"run wrun_[0-9a-f]{32}", lines[1]), stdout
        assert lines[-4:-2] == ["ended: 2/2 phases", "result: completed"], stdout
        assert lines[-2:] == ["[task1]", "[offline stand-in model] Tool result for calculate: 42+1024 = 1066"], stdout
        events = await read_events(public_queues.get_workflow_handle(session_ids[0]))
        run = [e.type.removeprefix("workflow_run.") for e in events if e.type.startswith("workflow_run.")]
        phases = ["phase_started", "phase_ended"] * 2
        assert run == ["created", "status_running", *phases, "status_idle", "status_ended"], "docs/workflow_runs.md"
        added = [e for e in events if e.type == "session.thread_created"]
        assert len(added) == 3, "two tasks in the first phase, one in the second, each a thread"
        # What the README shows next: `corral runs SESSION_ID` lists the run.
        cli = ["-m", "cli.main", "--address", _address(public_queues), "--namespace", "default"]
        code, listed, stderr = await _run(*cli, "runs", session_ids[0], "--json")
        assert code == 0, stderr
        (run_info,) = [WorkflowRunInfo.model_validate_json(line) for line in listed.splitlines()]
        assert (run_info.name, run_info.status, run_info.progress()) == ("sums", "ended", "2/2 phases"), listed
    finally:
        await _terminate(public_queues, session_ids)


async def test_the_workflow_run_example_refuses_a_malformed_plan_before_connecting(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"name": "empty", "phases": []}')
    code, stdout, stderr = await _run("examples/workflow_run.py", "--address", "127.0.0.1:1", "--plan", str(plan))
    assert (code, stdout) == (2, "")
    assert stderr.strip() == f"{plan}: plan.phases: List should have at least 1 item after validation, not 0"


def test_the_readme_shows_the_workflow_run_examples_plan_verbatim() -> None:
    plan = (ROOT / "examples" / "workflow_run_plan.json").read_text()
    assert f"```json\n{plan}```" in (ROOT / "README.md").read_text(), "README.md must show the plan file as is"


def _address(client: Client) -> str:
    return client.service_client.config.target_host
