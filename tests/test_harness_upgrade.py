"""Safe harness upgrades (workers/deployment.py): a new harness build is deployed while sessions are mid-turn.

Two deployments, one per upgrade policy, each on its own harness queue of a real Temporal dev server:
- `auto-upgrade` with a compatible change (behind `workflow.patched`): the session mid-turn moves to the new build
  at its next workflow task, and its turn ends there;
- `pinned` with an incompatible change (a timer first: no history of the old build replays with it): the session
  mid-turn stays on its build, then moves at its next safe point by continuing as new, and the new build never
  replays the old history; an idle session moves the same way when its next message comes.
No session breaks: no workflow task fails, every log is whole, each reply is written once.

The turn is held mid-way by a tool of the test's own hand that waits for the test to open it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer, Worker
from typer.testing import CliRunner

from cli.main import app
from corral.client import read_events, send_text, wait_for_idle
from corral.contract.session import SessionInput
from corral.hands import make_execute_activity
from corral.names import SESSION_WORKFLOW
from corral.records import Records
from corral.temporal import data_converter
from tests.conftest import Stack, assert_log_is_whole, texts, unique
from tests.timer_first_harness import TimerFirstSessionWorkflow
from workers.deployment import become_current_if_first, describe_deployment, set_current_build
from workers.roles import HARNESS_WORKFLOW_RUNNER, harness_interceptors, harness_worker
from workers.settings import HarnessDeployment, HarnessSettings, SettingsError
from workflows import SessionWorkflow
from workflows.records import RecordWorkflow

BUILD_QUERY = "test_harness_build"


@workflow.defn(name=SESSION_WORKFLOW)
class CompatibleSessionWorkflow(SessionWorkflow):
    """A compatible change: a new query (no command changes, so every old history replays with it)."""

    @workflow.run
    async def run(self, input: SessionInput) -> None:
        await super().run(input)

    @workflow.query(name=BUILD_QUERY)
    def harness_build(self) -> str:
        return "v2"


class Gate:
    """A tool that holds the turn until the test opens it (the hand runs in this test's event loop)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()
        self.calls = 0

    async def __call__(self, input: dict[str, Any]) -> str:
        self.calls += 1
        self.entered.set()
        await self.opened.wait()
        return "the gate is open"


@dataclass
class Upgrade:
    """One deployment of the harness on its own queue, and a gate tool for its sessions."""

    stack: Stack
    client: Client
    name: str
    gate: Gate
    gate_queue: str
    workers: contextlib.AsyncExitStack

    def deployment(self, build_id: str, upgrade: str) -> HarnessDeployment:
        return HarnessDeployment(self.name, build_id, upgrade)  # type: ignore[arg-type]

    async def run_build(self, build: HarnessDeployment, workflows: tuple[type, ...]) -> None:
        worker = harness_worker(self.client, self.stack.harness_queue, build, workflows)
        await self.workers.enter_async_context(worker)

    def tool(self) -> dict[str, Any]:
        return {"type": "hand", "name": "gate", "description": "waits until opened",
                "input_schema": {"type": "object", "properties": {}}, "task_queue": self.gate_queue}  # fmt: skip

    async def start_mid_turn(self) -> WorkflowHandle:
        """A session whose first turn is held at the gate (its model called the tool, the tool runs)."""
        self.gate.entered.clear()
        model = self.stack.script(
            [
                {"text": "Opening.", "tool_uses": [{"name": "gate", "input": {}}]},
                {"text": "Done.", "echo_last_user": True},
            ],
            loop=True,
        )
        handle = await self.stack.start(model, "open the gate", tools=[self.tool()])
        await asyncio.wait_for(self.gate.entered.wait(), 60)
        return handle


@pytest.fixture
async def upgrade(stack: Stack) -> AsyncIterator[Upgrade]:
    gate, gate_queue = Gate(), unique("gate")
    own = replace(stack, harness_queue=unique("harness-versioned"), started=[])
    async with contextlib.AsyncExitStack() as workers:
        await workers.enter_async_context(
            Worker(stack.client, task_queue=gate_queue, activities=[make_execute_activity({"gate": gate})])
        )
        yield Upgrade(own, stack.client, unique("harness"), gate, gate_queue, workers)
        gate.opened.set()
        for handle in own.started:
            with contextlib.suppress(Exception):
                await handle.terminate("test finished")


# ---- what the histories say ----------------------------------------------------------------------------------------


@dataclass
class Run:
    run_id: str
    history: History
    builds: list[str]
    """The build of each completed workflow task, in order."""

    def has(self, event_type: int) -> bool:
        return any(event.event_type == event_type for event in self.history.events)

    @property
    def continued_to(self) -> str | None:
        last = self.history.events[-1]
        if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            return None
        return last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id


async def runs_of(client: Client, handle: WorkflowHandle) -> list[Run]:
    """Every run of a session, first to last, from their histories."""
    runs: list[Run] = []
    run_id: str | None = (await handle.describe()).raw_description.workflow_execution_info.first_run_id
    while run_id is not None:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        builds = [
            event.workflow_task_completed_event_attributes.deployment_version.build_id
            for event in history.events
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        ]
        run = Run(run_id, History(events=history.events), builds)
        runs.append(run)
        run_id = run.continued_to
    return runs


def assert_nothing_broke(runs: list[Run]) -> None:
    for run in runs:
        assert not run.has(EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED), f"a workflow task failed in run {run.run_id}"
        assert not run.has(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED)


async def whole_log(handle: WorkflowHandle, replies: int) -> None:
    """One log across the runs, no gap and no repeat; each turn's tool call and reply written once."""
    events = await read_events(handle)
    assert_log_is_whole(events)
    assert [text.split("\n")[0] for text in texts(events)] == ["Opening.", "Done."] * replies
    assert [e.type for e in events].count("session.status_idle") == replies


# ---- the two policies --------------------------------------------------------------------------------------------


async def test_a_compatible_build_takes_over_a_turn_under_auto_upgrade(upgrade: Upgrade) -> None:
    v1, v2 = upgrade.deployment("v1", "auto-upgrade"), upgrade.deployment("v2", "auto-upgrade")
    await upgrade.run_build(v1, (SessionWorkflow, RecordWorkflow))
    assert await become_current_if_first(upgrade.client, v1)
    handle = await upgrade.start_mid_turn()

    await upgrade.run_build(v2, (CompatibleSessionWorkflow, RecordWorkflow))
    await set_current_build(upgrade.client, upgrade.name, "v2")
    upgrade.gate.opened.set()
    events = await wait_for_idle(handle)
    assert texts(events)[-1].startswith("Done.")

    runs = await runs_of(upgrade.client, handle)
    assert_nothing_broke(runs)
    assert len(runs) == 1, "under auto-upgrade the session moves within its run"
    builds = runs[0].builds
    assert builds[0] == "v1" and builds[-1] == "v2", builds
    assert builds == sorted(builds), f"once on v2, never back on v1: {builds}"
    assert await handle.query(BUILD_QUERY) == "v2", "the session runs on the new build's code"
    assert upgrade.gate.calls == 1

    await send_text(handle, "and again")
    await wait_for_idle(handle, after=events[-1].position)
    runs = await runs_of(upgrade.client, handle)
    assert runs[-1].builds[-1] == "v2"
    assert_nothing_broke(runs)
    await whole_log(handle, replies=2)


async def test_an_incompatible_build_waits_for_pinned_sessions_to_reach_a_safe_point(upgrade: Upgrade) -> None:
    v1, v3 = upgrade.deployment("v1", "pinned"), upgrade.deployment("v3", "pinned")
    await upgrade.run_build(v1, (SessionWorkflow, RecordWorkflow))
    assert await become_current_if_first(upgrade.client, v1)
    records = Records(upgrade.client, upgrade.stack.harness_queue)
    record = await records.create("agent", unique("ws"), {"name": "a", "model": "m"}, "agent")
    idle = await upgrade.stack.start(upgrade.stack.script([{"text": "Done."}], loop=True), "hello")
    idle_first = await wait_for_idle(idle)
    mid_turn = await upgrade.start_mid_turn()

    await upgrade.run_build(v3, (TimerFirstSessionWorkflow, RecordWorkflow))
    await set_current_build(upgrade.client, upgrade.name, "v3")
    state = await describe_deployment(upgrade.client, upgrade.name)
    assert state is not None and state.current == "v3"
    assert {build.build_id: build.status for build in state.builds}["v1"] == "draining"  # pinned sessions on it

    # The session mid-turn finishes its tool call on v1, then moves to v3 by continuing as new before its next
    # model call: the old build's history is never replayed by the new build.
    upgrade.gate.opened.set()
    events = await wait_for_idle(mid_turn)
    assert texts(events)[-1].startswith("Done.")
    runs = await runs_of(upgrade.client, mid_turn)
    assert_nothing_broke(runs)
    assert len(runs) == 2, [run.builds for run in runs]
    assert set(runs[0].builds) == {"v1"}, "pinned: every task of the first run on the build it started on"
    assert set(runs[1].builds) == {"v3"}, "the next run starts on the current build"
    await whole_log(mid_turn, replies=1)
    assert upgrade.gate.calls == 1

    # The change really is incompatible: v3 cannot replay the first run's history. Staying pinned is what saved it.
    replayed = await replayer(TimerFirstSessionWorkflow).replay_workflow(
        workflow_history(mid_turn.id, runs[0].history), raise_on_replay_failure=False
    )
    assert replayed.replay_failure is not None
    replayed = await replayer(SessionWorkflow).replay_workflow(workflow_history(mid_turn.id, runs[0].history))
    assert replayed.replay_failure is None, "the old build's own code replays it (the move is deterministic)"

    # An idle session stays on v1 until its next message, then moves at once (its new run answers it on v3).
    await send_text(idle, "are you there?")
    await wait_for_idle(idle, after=idle_first[-1].position)
    runs = await runs_of(upgrade.client, idle)
    assert_nothing_broke(runs)
    assert set(runs[0].builds) == {"v1"} and set(runs[-1].builds) == {"v3"}, [run.builds for run in runs]
    events = await read_events(idle)
    assert_log_is_whole(events)
    assert [e.type for e in events].count("user.message") == 2
    assert texts(events) == ["Done.", "Done."]

    # A record (an agent, here) moves at its next update whatever the policy: records always auto-upgrade.
    await records.put(record.id, record.workspace, {"name": "b", "model": "m"})
    (record_run,) = await runs_of(upgrade.client, upgrade.client.get_workflow_handle(record.id))
    assert record_run.builds[0] == "v1" and record_run.builds[-1] == "v3", record_run.builds
    assert_nothing_broke([record_run])

    # A session started now starts on v3.
    fresh = await upgrade.stack.start(upgrade.stack.script([{"text": "Done."}]), "hi")
    await wait_for_idle(fresh)
    assert {build for run in await runs_of(upgrade.client, fresh) for build in run.builds} == {"v3"}


def replayer(session_class: type) -> Replayer:
    return Replayer(workflows=[session_class], interceptors=harness_interceptors(),
                    workflow_runner=HARNESS_WORKFLOW_RUNNER, data_converter=data_converter())  # fmt: skip


def workflow_history(workflow_id: str, history: History) -> Any:
    from temporalio.client import WorkflowHistory

    return WorkflowHistory(workflow_id, list(history.events))


# ---- the CLI and the settings ---------------------------------------------------------------------------------------

runner = CliRunner()


def corral(client: Client, tmp_path: Path, *args: str) -> tuple[int, str]:
    options = ["--state-dir", str(tmp_path), "--address", client.service_client.config.target_host]
    result = runner.invoke(app, [*options, "--namespace", client.namespace, *args])
    return result.exit_code, result.output


async def test_the_cli_lists_builds_and_promotes_one(upgrade: Upgrade, tmp_path: Path) -> None:
    v1, v2 = upgrade.deployment("v1", "pinned"), upgrade.deployment("v2", "pinned")
    await upgrade.run_build(v1, (SessionWorkflow, RecordWorkflow))
    assert await become_current_if_first(upgrade.client, v1)
    await upgrade.run_build(v2, (SessionWorkflow, RecordWorkflow))
    assert not await become_current_if_first(upgrade.client, v2), "a later build waits to be promoted"

    code, output = await asyncio.to_thread(corral, upgrade.client, tmp_path, "harness", "builds", "--deployment",
                                           upgrade.name)  # fmt: skip
    assert code == 0, output
    assert "v1" in output and "current" in output and "v2" in output

    code, output = await asyncio.to_thread(
        corral, upgrade.client, tmp_path, "harness", "promote", "v2", "--deployment", upgrade.name
    )
    assert code == 0, output
    assert "v2 is the current build" in output
    state = await describe_deployment(upgrade.client, upgrade.name)
    assert state is not None and state.current == "v2"

    code, output = await asyncio.to_thread(
        corral, upgrade.client, tmp_path, "harness", "promote", "v9", "--deployment", upgrade.name, "--timeout", "2"
    )
    assert code == 1 and "v9" in output and "Traceback" not in output, output
    code, output = await asyncio.to_thread(corral, upgrade.client, tmp_path, "harness", "builds", "--deployment",
                                           unique("nothing"))  # fmt: skip
    assert code == 1 and "no deployment" in output, output


def test_settings_of_a_versioned_harness() -> None:
    assert HarnessSettings.from_environment({}).deployment is None
    settings = HarnessSettings.from_environment({"CORRAL_HARNESS_DEPLOYMENT": "corral-harness"})
    assert settings.deployment is not None
    assert settings.deployment.upgrade == "pinned"
    assert settings.deployment.build_id.startswith("code-")  # a hash of the harness code
    same = HarnessSettings.from_environment({"CORRAL_HARNESS_DEPLOYMENT": "corral-harness"})
    assert same.deployment == settings.deployment
    chosen = HarnessSettings.from_environment(
        {
            "CORRAL_HARNESS_DEPLOYMENT": "h",
            "CORRAL_HARNESS_BUILD_ID": "2026.12.02+1",
            "CORRAL_HARNESS_UPGRADE": "auto-upgrade",
        }
    )
    assert chosen.deployment == HarnessDeployment("h", "2026.12.02+1", "auto-upgrade")
    for environ, named in (
        ({"CORRAL_HARNESS_DEPLOYMENT": "a.b"}, "CORRAL_HARNESS_DEPLOYMENT"),
        ({"CORRAL_HARNESS_DEPLOYMENT": "h", "CORRAL_HARNESS_BUILD_ID": "a b"}, "CORRAL_HARNESS_BUILD_ID"),
        ({"CORRAL_HARNESS_DEPLOYMENT": "h", "CORRAL_HARNESS_UPGRADE": "sometimes"}, "CORRAL_HARNESS_UPGRADE"),
        ({"CORRAL_HARNESS_BUILD_ID": "v2"}, "CORRAL_HARNESS_DEPLOYMENT"),
    ):
        with pytest.raises(SettingsError, match=named):
            HarnessSettings.from_environment(environ)
