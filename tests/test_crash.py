"""Kill a real worker process with SIGKILL mid-turn: a fresh worker finishes the session, nothing lost or doubled."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from corral.client import send_text, start_session
from corral.contract.session import AgentConfig, SessionInput
from corral.names import ACTIVITY_EXECUTE
from modelserver import ModelServerThread
from tests.conftest import assert_log_is_whole, read_events, texts, unique, wait_for_idle
from tests.waits import activity_running, attempts_of, polled_by, until

ROOT = Path(__file__).resolve().parent.parent


async def spawn_worker(
    client: Client, model_server: ModelServerThread, queues: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """The worker process, once it polls its queues (a loaded machine may take long to start it)."""
    args = [sys.executable, "-m", "tests.worker_process", "--address", client.service_client.config.target_host]
    args += ["--model-url", str(model_server.base_url)]
    for role, queue in queues.items():
        args += [f"--{role}-queue", queue]
    process = subprocess.Popen(args, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)

    async def polling() -> bool:
        assert process.poll() is None, f"the worker process exited: see {log}"
        harness = await polled_by(client, queues["harness"], process.pid, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
        return harness and all([await polled_by(client, queues[role], process.pid) for role in ("model", "hand")])

    try:
        await until(polling, f"the worker process polling its queues (see {log})", 180)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process


def steps_asked(model_server: ModelServerThread, script: str) -> list[int | None]:
    """The script step each request to the model server was for, in order."""
    return [request["step"] for request in model_server.book.requests_for(script) or []]


async def test_sigkill_mid_turn_then_a_fresh_worker_finishes(
    temporal_env: WorkflowEnvironment, model_server: ModelServerThread, tmp_path: Path
) -> None:
    client = temporal_env.client
    queues = {"harness": unique("harness"), "model": unique("model"), "hand": unique("hand")}
    name = unique("crash")
    model_server.register(
        name,
        {
            "steps": [
                {"text": "first answer"},
                {"text": "second answer, slowly", "first_token_latency": 3, "pace_hits": 1},
                {"tool_uses": [{"name": "sleep", "input": {"seconds": 3}}], "pace_hits": 1},
                {"text": "after the tool"},
            ]
        },
    )
    tools = [
        {"type": "hand", "name": "sleep", "task_queue": queues["hand"], "input_schema": {"type": "object"}},
    ]
    input = SessionInput(
        agent=AgentConfig.model_validate({"model": f"script:{name}", "tools": tools}),
        message="one",
        model_task_queue=queues["model"],
    )
    log = tmp_path / "worker.log"
    first = await spawn_worker(client, model_server, queues, log)
    second: subprocess.Popen[bytes] | None = None
    third: subprocess.Popen[bytes] | None = None
    try:
        handle = await start_session(client, input, task_queue=queues["harness"])
        events = await wait_for_idle(handle, within_seconds=30)
        await send_text(handle, "two")
        await until(lambda: steps_asked(model_server, name).count(1) == 1, "the model stream open (3 s to go)")
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic()
        second = await spawn_worker(client, model_server, queues, log)
        events = await wait_for_idle(handle, after=events[-1].position, within_seconds=60)
        recovery = time.monotonic() - killed_at
        print(f"\nrecovered from SIGKILL mid model turn in {recovery:.1f}s")
        assert texts(events) == ["second answer, slowly"]
        assert steps_asked(model_server, name).count(1) == 2, "killed mid-request: the answer was asked for again"

        # Now kill the replacement while a tool call runs in it.
        await send_text(handle, "three")
        await until(lambda: activity_running(handle, ACTIVITY_EXECUTE), "the tool running in the worker")
        second.send_signal(signal.SIGKILL)
        second.wait()
        killed_at = time.monotonic()
        third = await spawn_worker(client, model_server, queues, log)
        events = await wait_for_idle(handle, after=events[-1].position, within_seconds=60)
        print(f"recovered from SIGKILL mid tool call in {time.monotonic() - killed_at:.1f}s")
        assert texts(events) == ["after the tool"]
        assert texts(events, "agent.tool_result") == ["slept"]
        assert await attempts_of(handle, ACTIVITY_EXECUTE) == [2], "killed mid-call: the tool's first attempt was cut"

        all_events = await read_events(handle)
        assert_log_is_whole(all_events)
        assert texts(all_events) == ["first answer", "second answer, slowly", "after the tool"]
        assert texts(all_events, "user.message") == ["one", "two", "three"]
        assert [e.type for e in all_events].count("agent.tool_use") == 1

        # Graceful shutdown: SIGTERM stops the worker cleanly.
        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=20) == 0
    finally:
        for process in (first, second, third):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=20)
