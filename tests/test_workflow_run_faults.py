"""Faults in a workflow run: the process running the harness (with the model worker) is killed with SIGKILL while
the run's second phase works, and a fresh one takes over. The run completes; its first phase, whose tasks each
appended a line to a marker file in the session's one sandbox, ran exactly once; no phase started twice and no
thread was spawned twice. A run is resumed from its history (the phases it reported, the thread ids it chose), and
the session takes a spawn once by its thread id: this test fails if either forgets."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from pathlib import Path
from typing import Any

import docker
from temporalio.testing import WorkflowEnvironment

from corral.client import read_events, start_session
from corral.contract.events import SessionThreadCreated, WorkflowRunPhaseStarted, WorkflowRunStatusEnded
from corral.contract.session import AgentConfig, SessionInput
from modelserver import ModelServerThread
from sandbox.sessions import remove_session
from tests.conftest import assert_log_is_whole, unique
from tests.test_crash import spawn_worker
from tests.test_sandbox import processes, session_containers, spawn_sandbox_worker
from tests.waits import until

FIRST = ("a", "b")
"""Phase 1's tasks, each a predefined agent of its own that appends one line to /workspace/marker_<task>."""
SLOW = "sleep 7.3"
"""Phase 2's command, seen in the sandbox's process list while phase 2 works."""
TOOLSET = [{"type": "agent_toolset_20260401"}]


def bash(command: str) -> dict[str, Any]:
    return {"tool_uses": [{"name": "bash", "input": {"command": command}}]}


def plan() -> dict[str, Any]:
    first = [{"name": task, "agent": task, "message": f"mark {task}"} for task in FIRST]
    second = [{"name": "slow", "agent": "slow", "message": "after {{mark}}"}]
    return {"name": "marked", "phases": [{"name": "mark", "tasks": first}, {"name": "wait", "tasks": second}]}


async def test_a_run_resumes_after_its_harness_is_killed_mid_phase_with_no_phase_or_thread_run_twice(
    temporal_env: WorkflowEnvironment,
    model_server: ModelServerThread,
    docker_client: docker.DockerClient,
    sandbox_image: str,
    tmp_path: Path,
) -> None:
    client = temporal_env.client
    queues = {"harness": unique("harness"), "model": unique("model"), "hand": unique("hand")}
    run_agents = []
    steps = {task: [bash(f"echo x >> /workspace/marker_{task}"), {"text": f"{task} marked"}] for task in FIRST}
    steps["slow"] = [bash(f"{SLOW}; echo done"), {"text": "slow done"}]
    for name, script_steps in steps.items():
        script = unique(name)
        model_server.register(script, {"steps": script_steps})
        config = {"model": f"script:{script}", "name": name, "tools": TOOLSET}
        run_agents.append({"type": "agent", "id": f"agent_{name}", "version": 1, "config": config})
    lead = unique("lead")
    start = {"tool_uses": [{"name": "start_workflow_run", "input": plan()}]}
    model_server.register(lead, {"steps": [start, {"text": "run started"}, {"text": "run finished"}]})
    multiagent = {"type": "multiagent_20261001", "runs": True, "run_agents": run_agents}
    agent = AgentConfig.model_validate({"model": f"script:{lead}", "tools": TOOLSET, "multiagent": multiagent})
    input = SessionInput(agent=agent, message="run the plan", model_task_queue=queues["model"])

    log = tmp_path / "workers.log"
    started: list[subprocess.Popen[bytes]] = []
    handle = None
    try:
        started.append(spawn_sandbox_worker(client, sandbox_image, log))
        harness = await spawn_worker(client, model_server, queues, log)
        started.append(harness)
        handle = await start_session(client, input, task_queue=queues["harness"])
        session = handle

        async def phase_two_working() -> bool:
            phases = await read_events(session, types=["workflow_run.phase_started"])
            return len(phases) == 2 and SLOW in await asyncio.to_thread(processes, docker_client, session.id)

        await until(phase_two_working, "phase 2 started on the log and its thread's command running", 240)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        started.append(await spawn_worker(client, model_server, queues, log))

        async def run_ended() -> bool:
            return bool(await read_events(session, types=["workflow_run.status_ended"]))

        await until(run_ended, "the run's end after a fresh harness took over", 240)
        events = await read_events(handle)
        assert_log_is_whole(events)
        (ended,) = [e for e in events if isinstance(e, WorkflowRunStatusEnded)]
        assert ended.result.type == "completed", ended
        phases = [e.workflow_run_phase_id for e in events if isinstance(e, WorkflowRunPhaseStarted)]
        assert len(phases) == 2 and len(set(phases)) == 2, f"a phase started twice: {phases}"
        created = [e for e in events if isinstance(e, SessionThreadCreated)]
        thread_ids = [e.session_thread_id for e in created]
        assert len(thread_ids) == len(FIRST) + 1 and len(set(thread_ids)) == len(thread_ids), thread_ids
        assert {e.workflow_run_id for e in created} == {ended.workflow_run_id}
        (container,) = session_containers(docker_client, handle.id)
        for task in FIRST:
            marker = container.exec_run(["cat", f"/workspace/marker_{task}"])
            assert marker.exit_code == 0 and marker.output.decode() == "x\n", f"marker_{task}: {marker.output!r}"
    finally:
        for process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=20)
        if handle is not None:
            with contextlib.suppress(Exception):
                await handle.terminate("test finished")
            remove_session(docker_client, handle.id, remove_volume=True)
