"""`corral harness check` (workers/harness_check.py): the recent histories on a real Temporal server replay with
this code, and a change that would break them is caught before a deploy.

Each test's sessions and record run on its stack's own harness queue, and the check is narrowed to that queue
(`--task-queue`), so other tests' executions on the shared server are never replayed here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import ReplayerConfig
from typer.testing import CliRunner

from cli.main import app
from corral.client import send_text
from corral.contract.records import RECORD_WORKFLOW
from corral.names import SESSION_WORKFLOW
from corral.records import Records
from tests.conftest import Stack, unique, wait_for_idle
from tests.ports import closed_port
from tests.timer_first_harness import TimerFirstSessionWorkflow
from workers import harness_check
from workers.harness_check import (
    HarnessCheckReport,
    check_harness,
    executions_query,
    harness_replayer,
    list_executions,
    replay_executions,
)
from workers.roles import HARNESS_CHECK_RUNNER, HARNESS_WORKFLOW_RUNNER, harness_worker
from workflows.records import RecordWorkflow

runner = CliRunner()
AGENT = {"name": "researcher", "model": {"id": "claude-sonnet-4-5"}, "tools": []}


@dataclass
class Recent:
    """What ran on one stack's harness queue: sessions closed a moment ago, one left idle, and a record."""

    closed: list[str]
    running: list[str]
    record: str

    @property
    def sessions(self) -> set[str]:
        return {*self.closed, *self.running}


@pytest.fixture
async def recent(stack: Stack) -> Recent:
    model = stack.script([{"text": "Hello."}, {"text": "Again."}], loop=True)
    handles = [await stack.start(model, message=f"hi {n}") for n in range(3)]
    for handle in handles:
        first = await wait_for_idle(handle)
        await send_text(handle, "once more")
        await wait_for_idle(handle, after=first[-1].position)
    closed, running = handles[:2], handles[2]
    for handle in closed:
        await handle.terminate("closed by the test, before the check")
    record = await Records(stack.client, stack.harness_queue).create("agent", unique("ws"), AGENT, "agent")
    await listed_eventually(stack.client, stack.harness_queue, running=2, closed=2)
    return Recent([handle.id for handle in closed], [running.id], record.id)


async def listed_eventually(client: Client, task_queue: str, *, running: int, closed: int) -> None:
    """Wait for visibility (eventually consistent) to list what the check will list; at most 100 reads, a tenth of
    a second apart."""
    queries = executions_query(datetime.now(UTC) - timedelta(hours=1), task_queue=task_queue)
    counts: list[int] = []
    for _ in range(100):
        counts = [(await client.count_workflows(query)).count for query in queries]
        if counts == [running, closed]:
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"visibility never listed {running} running and {closed} closed executions: {counts}")


def corral(client: Client, state_dir: Path, *args: str) -> tuple[int, str]:
    """The CLI in process (typer's runner), against `client`'s server. Call it in a thread: it runs its own loop."""
    options = ["--state-dir", str(state_dir), "--address", client.service_client.config.target_host]
    result = runner.invoke(app, [*options, "--namespace", client.namespace, *args])
    return result.exit_code, result.output


# ---- the check, called directly -----------------------------------------------------------------------------


async def test_recent_sessions_and_records_replay_clean(stack: Stack, recent: Recent, tmp_path: Path) -> None:
    progress: list[tuple[int, int]] = []
    report = await check_harness(
        stack.client,
        task_queue=stack.harness_queue,
        on_progress=lambda done, total, _check: progress.append((done, total)),
    )
    assert report.failures == [] and report.skipped == [] and report.ok
    outcomes = {check.workflow_id: (check.workflow_type, check.outcome) for check in report.checks}
    assert outcomes == {
        **{session: (SESSION_WORKFLOW, "clean") for session in recent.sessions},
        recent.record: (RECORD_WORKFLOW, "clean"),
    }
    # Each type has its own share of the limit, in turn; running executions come first within it: a new worker
    # replays them as soon as it is deployed.
    assert [check.workflow_type for check in report.checks] == [SESSION_WORKFLOW] * 3 + [RECORD_WORKFLOW]
    assert {report.checks[0].workflow_id} == set(recent.running)
    limited = await list_executions(stack.client, limit=1, task_queue=stack.harness_queue)
    assert [execution.workflow_type for execution in limited.executions] == [SESSION_WORKFLOW, RECORD_WORKFLOW]
    assert limited.executions[0].id in recent.running and limited.matched == 4
    assert report.listing.matched == 4
    assert progress == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert {kind: dict(counts) for kind, counts in report.counts().items()} == {
        SESSION_WORKFLOW: {"clean": 3},
        RECORD_WORKFLOW: {"clean": 1},
    }

    code, output = await asyncio.to_thread(
        corral, stack.client, tmp_path, "harness", "check", "--task-queue", stack.harness_queue
    )
    assert code == 0, output
    assert "all 4 replayed cleanly" in output
    assert "4 of 4: clean" in output  # progress, one line per execution when stderr is not a terminal


async def test_a_non_deterministic_change_is_caught(
    stack: Stack, recent: Recent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    changed = [TimerFirstSessionWorkflow, RecordWorkflow]
    report = await check_harness(stack.client, task_queue=stack.harness_queue, workflows=changed)
    assert not report.ok
    assert {check.workflow_id for check in report.failures} == recent.sessions
    for check in report.failures:
        assert check.nondeterminism, check
        assert "nondeterminism" in check.message.lower(), check.message
        assert "Failure {" not in check.message  # the core's message, not its debug dump around it
        assert 0 < len(check.message.splitlines()) <= 2
    # The record's code did not change: it still replays.
    assert [check.outcome for check in report.checks if check.workflow_type == RECORD_WORKFLOW] == ["clean"]

    # The CLI replays with what `HARNESS_WORKFLOWS` names: here, the changed code.
    monkeypatch.setattr(harness_check, "HARNESS_WORKFLOWS", changed)
    code, output = await asyncio.to_thread(
        corral, stack.client, tmp_path, "harness", "check", "--task-queue", stack.harness_queue
    )
    assert code == 1, output
    assert "3 of 4 did not replay" in output
    assert output.count("non-determinism: ") == 3
    for session in recent.sessions:
        assert session in output
    assert "Traceback" not in output


async def test_a_history_deleted_meanwhile_is_skipped_not_failed(stack: Stack, recent: Recent) -> None:
    listing = await list_executions(stack.client, task_queue=stack.harness_queue)
    # A run the server no longer has: the dev server deletes a history half a minute after it is asked to, so a
    # listed run whose id no history has stands in for one deleted between the listing and its fetch.
    listed = listing.executions[-1]
    gone = dataclasses.replace(listed, run_id=str(uuid.uuid4()))
    checks = await replay_executions(stack.client, [gone, *listing.executions])
    assert [(check.run_id, check.outcome) for check in checks if check.outcome != "clean"] == [(gone.run_id, "skipped")]
    assert "gone" in checks[0].message
    assert len(checks) == 5 and HarnessCheckReport(listing, checks).ok


async def test_the_replayer_runs_workflows_as_the_harness_worker_does(stack: Stack) -> None:
    """`HARNESS_WORKFLOWS` and the replayer's settings are those of `roles.harness_worker`, whatever it becomes."""
    async with harness_worker(stack.client, unique("harness-config")) as worker:
        worker_config = worker.config()
    replayer_config = harness_replayer(stack.client).config()
    assert set(replayer_config["workflows"]) == set(worker_config["workflows"])
    assert worker_config["workflow_runner"] is HARNESS_WORKFLOW_RUNNER
    assert replayer_config["workflow_runner"] is HARNESS_CHECK_RUNNER  # the same code, with the sandbox's checks
    assert [type(i) for i in replayer_config["interceptors"]] == [type(i) for i in worker_config["interceptors"]]
    assert replayer_config["data_converter"] is stack.client.data_converter  # a worker's is its client's
    for key in ("workflow_failure_exception_types", "debug_mode", "disable_safe_workflow_eviction"):
        assert key in ReplayerConfig.__annotations__
        assert replayer_config.get(key) == worker_config.get(key), key


# ---- the CLI without Temporal -----------------------------------------------------------------------------------


def test_unreachable_temporal_is_a_clear_error(tmp_path: Path) -> None:
    with closed_port() as port:  # nothing listens here
        address = f"127.0.0.1:{port}"
        result = runner.invoke(app, ["--state-dir", str(tmp_path), "--address", address, "harness", "check"])
    assert result.exit_code == 1, result.output
    assert f"cannot reach Temporal at {address}" in result.output
    assert "corral up" in result.output
    assert "Traceback" not in result.output


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    for args in (["--since", "yesterday"], ["--workflow-type", "ClockWorkflow"], ["--task-queue", "a'b"]):
        result = runner.invoke(app, ["--state-dir", str(tmp_path), "harness", "check", *args])
        assert result.exit_code == 2, (args, result.output)
