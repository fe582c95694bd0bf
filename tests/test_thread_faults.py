"""Faults in a multi-agent session: the process running the harness and the model worker, and the sandbox worker,
are killed with SIGKILL while three threads run commands on the session's one sandbox. Every thread finishes, with
no event lost or written twice, no message between threads lost or taken twice, and no command run twice."""

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
from corral.contract.events import SessionThreadCreated
from corral.contract.session import AgentConfig, SessionInput
from corral.contract.threads import ThreadInfo
from corral.names import QUERY_THREADS
from modelserver import ModelServerThread
from sandbox.sessions import remove_session
from tests.conftest import assert_log_is_whole, texts, unique
from tests.test_crash import spawn_worker
from tests.test_sandbox import processes, session_containers, spawn_sandbox_worker
from tests.waits import until

NAMES = ("alpha", "beta", "gamma")
TOOLSET = [{"type": "agent_toolset_20260401"}]


def bash(command: str) -> dict[str, Any]:
    return {"tool_uses": [{"name": "bash", "input": {"command": command}}]}


async def test_three_threads_finish_through_killed_harness_model_and_sandbox_workers(
    temporal_env: WorkflowEnvironment,
    model_server: ModelServerThread,
    docker_client: docker.DockerClient,
    sandbox_image: str,
    tmp_path: Path,
) -> None:
    client = temporal_env.client
    queues = {"harness": unique("harness"), "model": unique("model"), "hand": unique("hand")}
    roster = []
    for index, name in enumerate(NAMES):
        script = unique(name)
        # Each thread appends its name once (a command run twice would append it twice), then sleeps a while.
        model_server.register(script, {"steps": [bash(f"echo {name} >> /workspace/names; sleep 6.{index}"),
                                                 {"text": f"{name} finished"}]})  # fmt: skip
        config = {"model": f"script:{script}", "name": name, "tools": TOOLSET}
        roster.append({"type": "agent", "id": f"agent_{name}", "version": 1, "config": config})
    lead = unique("lead")
    spawns = [{"name": "spawn_thread", "input": {"agent": name, "message": f"work, {name}"}} for name in NAMES]
    wait = {"tool_uses": [{"name": "wait_for_threads", "input": {}}]}
    model_server.register(lead, {"steps": [{"tool_uses": spawns}, wait, wait, wait, bash("sort /workspace/names"),
                                           {"text": "all three finished"}]})  # fmt: skip
    agent = AgentConfig.model_validate({"model": f"script:{lead}", "tools": TOOLSET, "multiagent": {"agents": roster}})
    input = SessionInput(agent=agent, message="split the work", model_task_queue=queues["model"])

    log = tmp_path / "workers.log"
    processes_started: list[subprocess.Popen[bytes]] = []
    handle = None
    try:
        processes_started.append(spawn_sandbox_worker(client, sandbox_image, log))
        processes_started.append(await spawn_worker(client, model_server, queues, log))
        handle = await start_session(client, input, task_queue=queues["harness"])

        async def all_sleeping() -> bool:
            running = await _ps(docker_client, handle.id)
            return all(f"sleep 6.{index}" in running for index in range(len(NAMES)))

        await until(all_sleeping, "the three threads' commands running side by side in the one sandbox", 180)
        for process in processes_started:  # the harness, the model worker and the sandbox worker, at once
            process.send_signal(signal.SIGKILL)
            process.wait()
        processes_started.append(spawn_sandbox_worker(client, sandbox_image, log))
        processes_started.append(await spawn_worker(client, model_server, queues, log))

        async def finished() -> bool:
            return "all three finished" in texts(await read_events(handle))

        await until(finished, "the coordinator's summary after every thread replied", 240)
        events = await read_events(handle)
        assert_log_is_whole(events)
        assert texts(events, "agent.tool_result")[-1] == "alpha\nbeta\ngamma", "each command ran exactly once"
        created = [e for e in events if isinstance(e, SessionThreadCreated)]
        assert sorted(e.agent_name for e in created) == sorted(NAMES)
        assert sorted(texts(events, "agent.thread_message_received")) == [f"{name} finished" for name in NAMES]
        assert [e.type for e in events].count("agent.thread_message_sent") == len(NAMES)
        threads = (await handle.query(QUERY_THREADS, result_type=list[ThreadInfo]))[1:]
        assert len(threads) == len(NAMES)
        for info in threads:
            thread_log = await read_events(client.get_workflow_handle(info.id))
            assert_log_is_whole(thread_log)
            types = [e.type for e in thread_log]
            assert types.count("agent.thread_message_received") == 1 and types.count("agent.thread_message_sent") == 1
            assert types.count("agent.tool_use") == 1 and types.count("agent.tool_result") == 1, types
            assert session_containers(docker_client, info.id) == [], "a thread has no sandbox of its own"
        assert len(session_containers(docker_client, handle.id)) == 1, "every brain used the session's one sandbox"
    finally:
        for process in processes_started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=20)
        if handle is not None:
            with contextlib.suppress(Exception):
                await handle.terminate("test finished")
            remove_session(docker_client, handle.id, remove_volume=True)


async def _ps(client: docker.DockerClient, session_id: str) -> str:
    return await asyncio.to_thread(processes, client, session_id)
