"""Kill a real worker process with SIGKILL mid-turn: a fresh worker finishes the session, nothing lost or doubled."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from corral.client import send_text, start_session
from corral.contract.session import AgentConfig, SessionInput
from corral.modelserver import ModelServerThread
from tests.conftest import assert_log_is_whole, read_events, texts, unique, wait_for_idle

ROOT = Path(__file__).resolve().parent.parent


def _spawn(
    client: Client, model_server: ModelServerThread, queues: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "tests.worker_process", "--address", client.service_client.config.target_host]
    args += ["--model-url", str(model_server.base_url)]
    for role, queue in queues.items():
        args += [f"--{role}-queue", queue]
    return subprocess.Popen(args, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)


async def _until(predicate_events: str, handle: WorkflowHandle, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if any(e.type == predicate_events for e in await read_events(handle)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {predicate_events} within {within}s")


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
    first = _spawn(client, model_server, queues, log)
    second: subprocess.Popen[bytes] | None = None
    third: subprocess.Popen[bytes] | None = None
    try:
        handle = await start_session(client, input, task_queue=queues["harness"])
        events = await wait_for_idle(handle, within_seconds=30)
        await send_text(handle, "two")
        await _until("span.model_request_start", handle)
        await asyncio.sleep(0.5)  # the model stream is open, waiting for its first token
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic()
        second = _spawn(client, model_server, queues, log)
        events = await wait_for_idle(handle, after=events[-1].position, within_seconds=60)
        recovery = time.monotonic() - killed_at
        print(f"\nrecovered from SIGKILL mid model turn in {recovery:.1f}s")
        assert texts(events) == ["second answer, slowly"]

        # Now kill the replacement while a tool call runs in it.
        await send_text(handle, "three")
        await _until("agent.tool_use", handle)
        await asyncio.sleep(0.5)
        second.send_signal(signal.SIGKILL)
        second.wait()
        killed_at = time.monotonic()
        third = _spawn(client, model_server, queues, log)
        events = await wait_for_idle(handle, after=events[-1].position, within_seconds=60)
        print(f"recovered from SIGKILL mid tool call in {time.monotonic() - killed_at:.1f}s")
        assert texts(events) == ["after the tool"]
        assert texts(events, "agent.tool_result") == ["slept"]

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
