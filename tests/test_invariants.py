"""Workflow code does no I/O (docs/invariants.md, invariant 1). Checked two ways: the workflow modules import
nothing that does I/O (a static scan), and the sandbox that `corral harness check` replays with still rejects a
non-deterministic call (the harness itself runs without it: workers/roles.py `HARNESS_WORKFLOW_RUNNER`)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.worker import Worker

from tests.conftest import Stack, unique
from workers.roles import HARNESS_CHECK_RUNNER

WORKFLOWS = sorted((Path(__file__).resolve().parents[1] / "workflows").glob("*.py"))
assert WORKFLOWS, "the workflow modules moved: this test would check nothing"
IO_MODULES = {
    "os", "sys", "time", "random", "socket", "subprocess", "threading", "uuid", "pathlib", "io",
    "httpx", "requests", "anthropic", "docker", "hvac", "mcp", "uvicorn", "starlette",
}  # fmt: skip
IO_PACKAGES_OF_CORRAL = (
    "activities", "sandbox", "proxy", "relay", "cli", "modelserver",
)  # fmt: skip


@pytest.mark.parametrize("path", WORKFLOWS, ids=[path.name for path in WORKFLOWS])
def test_workflow_modules_import_nothing_that_does_io(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
    bad = [name for name in imported if name.split(".")[0] in IO_MODULES or name.startswith(IO_PACKAGES_OF_CORRAL)]
    assert bad == [], f"{path.name} imports modules that do I/O: {bad}"
    calls = [ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert not [c for c in calls if c.endswith(("datetime.now", "datetime.utcnow", "uuid4")) and "workflow." not in c]


@workflow.defn(name="ClockReadingWorkflow")
class ClockReadingWorkflow:
    @workflow.run
    async def run(self) -> str:
        import datetime

        return str(datetime.datetime.now())  # forbidden: not workflow time


async def test_the_harness_checks_sandbox_still_rejects_a_non_deterministic_call(stack: Stack) -> None:
    queue = unique("invariant")
    probe = Worker(
        stack.client, task_queue=queue, workflows=[ClockReadingWorkflow], workflow_runner=HARNESS_CHECK_RUNNER
    )
    async with probe:
        handle = await stack.client.start_workflow(ClockReadingWorkflow.run, id=unique("clock"), task_queue=queue)
        for _ in range(100):
            history = await handle.fetch_history()
            failures = [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
            if failures:
                break
            await asyncio.sleep(0.05)
        assert failures, "the workflow read the clock and was not stopped"
        assert "datetime.datetime.now" in failures[0].workflow_task_failed_event_attributes.failure.message
        await handle.terminate()
