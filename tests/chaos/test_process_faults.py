"""The fault matrix, process deaths: each role's real process SIGKILLed while N sessions are mid-turn.

Each role runs as its own entrypoint (`python -m workers.<role>`, `python -m relay`), configured by its
environment as in production; the other roles run in the test process. After the kill a fresh process of the role
starts, and every session must end its turn exactly as the documented outcome says, with a whole log and no side
effect run twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import docker
import httpx
import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.client import WorkflowHandle

from corral.client import start_session
from corral.contract.events import AgentMcpToolResult, SessionError, SessionEvent
from corral.contract.session import AgentConfig, SessionInput
from corral.names import HARNESS_TASK_QUEUE, MODEL_TASK_QUEUE
from corral.serving import ServerThread
from corral.temporal import cluster_id, connect
from proxy import StaticBearerParams, VaultStore
from relay import StreamPublisher
from sandbox.cleanup import remove_pool_members
from sandbox.sessions import remove_session
from tests.chaos._processes import ROOT, role_process, temporal_env, until_healthy, worker_argv
from tests.chaos.matrix import assert_whole, chaos_n, record_logs
from tests.conftest import Stack, read_events, texts, unique, wait_for_idle
from tests.ports import free_port
from tests.proxy_servers.devvault import shared_dev_vault
from tests.proxy_servers.mcp_server import create_mcp_app
from tests.proxy_servers.tokens import TokenAuthority
from tests.waits import following, polled_by, until
from workers.roles import model_worker

TOOLSET = [{"type": "agent_toolset_20260401"}]
RECOVERY_WITHIN = 120.0
"""Generous: a killed activity is retried once its heartbeat times out, and the machine is shared."""


def use(name: str, **input: Any) -> dict[str, Any]:
    return {"tool_uses": [{"name": name, "input": input}]}


def address(stack: Stack) -> str:
    return stack.client.service_client.config.target_host


async def until_all(
    handles: Sequence[WorkflowHandle], ready: Callable[[WorkflowHandle], Awaitable[bool]], what: str, within: float = 60
) -> None:
    """Wait until every session is at the point the fault is meant to meet it."""
    deadline = time.monotonic() + within
    pending = list(handles)
    while pending:
        pending = [handle for handle in pending if not await ready(handle)]
        if pending and time.monotonic() > deadline:
            raise AssertionError(f"{len(pending)} of {len(handles)} sessions never reached {what}")
        await asyncio.sleep(0.1)


def logged(event_type: str, count: int = 1) -> Callable[[WorkflowHandle], Awaitable[bool]]:
    async def ready(handle: WorkflowHandle) -> bool:
        types: list[str] = [event.type for event in await read_events(handle)]
        return types.count(event_type) >= count

    return ready


async def recover(handles: Sequence[WorkflowHandle], killed_at: float) -> tuple[list[list[SessionEvent]], list[float]]:
    """Each session's whole log once its turn ended (idle), and the seconds from the kill to that idle."""

    async def one(handle: WorkflowHandle) -> float:
        asked = max(event.position for event in await read_events(handle) if event.type == "user.message")
        await wait_for_idle(handle, after=asked, within_seconds=RECOVERY_WITHIN)  # the turn the fault met
        return round(time.monotonic() - killed_at, 2)

    recovery = list(await asyncio.gather(*(one(handle) for handle in handles)))
    return [await read_events(handle) for handle in handles], recovery


def assert_ended_after(logs: Sequence[list[SessionEvent]], fault: datetime) -> None:
    """The fault landed mid-turn: each turn's end was written after it (a turn that had already ended would let the
    test pass without meeting the fault). Event times are the Temporal server's clock, on this machine."""
    for log in logs:
        assert log[-1].type == "session.status_idle" and log[-1].created_at > fault, (
            f"the turn ended at {log[-1].created_at}, before the fault at {fault}"
        )


# ---- harness ------------------------------------------------------------------------------------------------------


async def test_harness_worker_sigkilled_mid_turn(stack: Stack, tmp_path: Path) -> None:
    """SIGKILL of the harness worker while N sessions wait on a tool call, after another tool already ran: a fresh
    harness replays each session from history and the turn ends cleanly (a clean resume), with no event lost or
    logged twice and the tool that ran before the kill not run again."""
    n = chaos_n()
    harness_stack = dataclasses.replace(stack, harness_queue=HARNESS_TASK_QUEUE)  # the entrypoint's own queue
    tools = [harness_stack.hand_tool("append_line"), harness_stack.hand_tool("sleep")]
    markers = [tmp_path / f"marker-{index}" for index in range(n)]
    with role_process("harness", worker_argv("harness"), tmp_path, **temporal_env(address(stack))) as harness:
        handles = []
        for marker in markers:
            model = stack.script([use("append_line", path=str(marker)), use("sleep", seconds=3), {"text": "done"}])
            handles.append(await harness_stack.start(model, message="go", tools=tools))
        await until_all(handles, logged("agent.tool_use", 2), "the second tool call")
        fault = datetime.now(UTC)
        killed_at = harness.kill()
        harness.start()
        # The sessions are read by query, which the server refuses ("no poller seen") until a harness polls again.
        workflow_tasks = TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
        await until(lambda: polled_by(stack.client, HARNESS_TASK_QUEUE, harness.current.pid, workflow_tasks),
                    "the new harness polls", within=RECOVERY_WITHIN)  # fmt: skip
        logs, recovery = await recover(handles, killed_at)

    assert_whole(logs)
    assert_ended_after(logs, fault)
    for log in logs:
        assert texts(log, "agent.tool_result") == ["1", "slept"]
        assert texts(log) == ["done"]
        assert [event.type for event in log].count("session.status_idle") == 1
    runs = [len(marker.read_text().splitlines()) for marker in markers]
    assert runs == [1] * n, "a tool that ran before the kill ran again"
    record_logs(
        logs,
        recovery,
        fault="harness worker SIGKILLed mid-turn",
        expected="clean resume: a fresh harness replays the session and ends the turn once",
        observed=f"{n}/{n} turns ended once; tools ran once each",
        extra_runs=sum(runs) - n,
    )


# ---- model --------------------------------------------------------------------------------------------------------


async def test_model_worker_sigkilled_mid_stream(stack: Stack, tmp_path: Path) -> None:
    """SIGKILL of the model worker while N sessions' replies stream: the model turn is retried on a fresh worker
    once its heartbeat times out (a clean resume), each reply is logged exactly once, and the tool call before it
    is not run again. The kill lands mid-reply: after each reply's first delta reached the relay's subscriber, and
    before its end (the model server is asked for the reply a second time)."""
    n = chaos_n()
    model_stack = dataclasses.replace(stack, model_queue=MODEL_TASK_QUEUE)  # the entrypoint's own queue
    tools = [model_stack.hand_tool("append_line")]
    markers = [tmp_path / f"marker-{index}" for index in range(n)]
    reply = " ".join(f"word{index}" for index in range(30))
    relay_url = str(stack.stream_relay.base_url)
    environment = temporal_env(address(stack)) | {
        "ANTHROPIC_API_KEY": "test-key",  # the offline model server takes any key
        "ANTHROPIC_BASE_URL": str(stack.model_server.base_url),
        "CORRAL_STREAM_URL": relay_url,  # the deltas show where the stream is when the worker dies
    }
    with role_process("model", worker_argv("model"), tmp_path, **environment) as model_process:
        handles, models = [], []
        for marker in markers:
            model = stack.script(
                [
                    use("append_line", path=str(marker)),
                    {"text": reply, "first_token_latency": 1, "tokens_per_second": 5, "pace_hits": 1},
                ]
            )
            models.append(model)
            handles.append(await model_stack.start(model, message="go", tools=tools))
        async with following(relay_url, [handle.id for handle in handles]) as live:
            await until(lambda: all(live[handle.id].deltas() for handle in handles), "a delta of every reply", 120)
            fault = datetime.now(UTC)
            killed_at = model_process.kill()
            shown_at_kill = {handle.id: live[handle.id].text() for handle in handles}
            ended_at_kill = [handle.id for handle in handles if live[handle.id].ended()]
        model_process.start()
        logs, recovery = await recover(handles, killed_at)

    assert_whole(logs)
    assert_ended_after(logs, fault)
    assert ended_at_kill == [], "a reply had ended before the kill"
    for log, handle, model in zip(logs, handles, models, strict=True):
        assert texts(log) == [reply], "the reply must be logged once, whole"
        assert texts(log, "agent.tool_result") == ["1"]
        shown = shown_at_kill[handle.id]
        assert shown and reply.startswith(shown) and len(shown) < len(reply), f"not mid-reply at the kill: {shown!r}"
        assert len(stack.requests(model)) == 3, "the reply was asked for again: the first stream died unfinished"
    runs = [len(marker.read_text().splitlines()) for marker in markers]
    assert runs == [1] * n
    record_logs(
        logs,
        recovery,
        fault="model worker SIGKILLed mid-stream",
        expected="clean resume: the model turn is retried on a fresh worker; the reply is logged once",
        observed=f"{n}/{n} replies logged once, whole",
        extra_runs=sum(runs) - n,
    )


# ---- sandbox ------------------------------------------------------------------------------------------------------


HELD = "cat /tmp/held"
HELD_COMMAND = f"echo ran >> /workspace/count; mkfifo /tmp/held; {HELD} > /dev/null; echo finished"
"""A command that waits on a named pipe until the test writes to it (`_release`), once the fault has landed: every
session is mid-command at the fault, however long the test took to see them all running."""


def _release(engine: docker.DockerClient, handles: Sequence[WorkflowHandle]) -> None:
    """Let each session's held command go on to `echo finished`."""
    from sandbox.sessions import session_containers

    for handle in handles:
        running = [c for c in session_containers(engine, handle.id) if c.status == "running"]
        holding = [c for c in running if HELD in c.exec_run(["ps", "-eo", "args"]).output.decode()]
        assert len(holding) == 1, f"{handle.id}: {len(holding)} of its {len(running)} running containers hold"
        done = holding[0].exec_run(["timeout", "30", "sh", "-c", "echo go > /tmp/held"])
        assert done.exit_code == 0, done.output


def _container_processes(engine: docker.DockerClient, session_id: str) -> str:
    from sandbox.sessions import session_containers

    # The worker process runs a warm pool: a claimed member carries the session's name, not its label.
    running = [c for c in session_containers(engine, session_id) if c.status == "running"]
    return "".join(container.exec_run(["ps", "-eo", "args"]).output.decode() for container in running)


async def test_sandbox_worker_sigkilled_mid_command(
    stack: Stack, docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """SIGKILL of the sandbox worker while N sessions' bash commands run in their containers: a fresh worker finds
    each command's own record in its container and reports its output with a `[recovered: …]` note instead of
    running it again (a clean resume); the marker file each command appends to has one line."""
    n = chaos_n()
    command = HELD_COMMAND
    environment = temporal_env(address(stack)) | {
        "CORRAL_SANDBOX_IMAGE": sandbox_image,
        "CORRAL_GIT_PROXY_PORT": str(free_port()),
    }
    handles: list[WorkflowHandle] = []
    try:
        with role_process("sandbox", worker_argv("sandbox"), tmp_path, **environment) as sandbox:
            for _ in range(n):
                model = stack.script(
                    [
                        {"tool_uses": [{"name": "bash", "input": {"command": command}}]},
                        {"tool_uses": [{"name": "bash", "input": {"command": "wc -l < /workspace/count"}}]},
                        {"text": "done"},
                    ]
                )
                handles.append(await stack.start(model, message="go", tools=TOOLSET))

            async def command_runs(handle: WorkflowHandle) -> bool:
                return HELD in await asyncio.to_thread(_container_processes, docker_client, handle.id)

            await until_all(handles, command_runs, "its bash command running in the container", within=120)
            fault = datetime.now(UTC)
            killed_at = sandbox.kill()
            sandbox.start()
            await asyncio.to_thread(_release, docker_client, handles)
            logs, recovery = await recover(handles, killed_at)
            for handle in handles:
                await handle.terminate("test finished")  # before the worker stops: no sandbox activity is left
    finally:
        for handle in handles:
            await asyncio.to_thread(remove_session, docker_client, handle.id, True)
        # The killed worker's warm pool members (one maybe half made, holding its volume with the one-shot that
        # was preparing it): no worker of this scope runs any more, so whatever is unclaimed is a leftover.
        scope = f"{await cluster_id(stack.client)}/{stack.client.namespace}"
        await asyncio.to_thread(remove_pool_members, docker_client, scope)

    assert_whole(logs)
    assert_ended_after(logs, fault)
    counts = []
    for log in logs:
        first, count = texts(log, "agent.tool_result")
        assert first.startswith("finished") and "[recovered: this command had already run" in first, first
        counts.append(int(count))
        assert texts(log) == ["done"]
    assert counts == [1] * n, "a command ran twice"
    record_logs(
        logs,
        recovery,
        fault="sandbox worker SIGKILLed mid-command",
        expected="clean resume: the command's output is recovered from the container, not run again",
        observed=f"{n}/{n} commands ran once; output recovered with a note",
        extra_runs=sum(counts) - n,
    )


# ---- stream relay -------------------------------------------------------------------------------------------------


async def test_stream_relay_sigkilled_mid_stream(stack: Stack, tmp_path: Path) -> None:
    """SIGKILL of the stream relay while N sessions' replies stream live: the turn is not disturbed (live deltas
    are best-effort; the reply is logged once, whole), and after a fresh relay starts on the same address the next
    turn's deltas reach a subscriber again."""
    n = chaos_n()
    port = free_port()
    relay_url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "relay", "--host", "127.0.0.1", "--port", str(port)]
    queue = unique("model-relay")
    model_client = anthropic.AsyncAnthropic(base_url=stack.model_server.base_url, api_key="test-key", max_retries=0)
    relay_stack = dataclasses.replace(stack, model_queue=queue)
    reply = " ".join(f"word{index}" for index in range(30))
    later = "the next turn, live again"
    with role_process("stream-relay", argv, tmp_path) as relay:
        await until_healthy(relay_url, relay)
        publisher = StreamPublisher(relay_url)
        async with model_worker(stack.client, model_client, queue, stream=publisher):
            handles = []
            for _ in range(n):
                model = stack.script(
                    [
                        {"text": reply, "first_token_latency": 0.3, "tokens_per_second": 5},
                        {"text": later, "tokens_per_second": 5},
                    ]
                )
                handles.append(await relay_stack.start(model))
            async with following(relay_url, [handle.id for handle in handles]) as live:
                for handle in handles:
                    await handle.signal("user_message", {"content": "go"})
                await until(lambda: all(live[handle.id].deltas() for handle in handles), "a live delta of each reply")
                killed_at = relay.kill()
                shown_at_kill = [live[handle.id].text() for handle in handles]
                ended_at_kill = [handle.id for handle in handles if live[handle.id].ended()]
                relay.start()
                await until_healthy(relay_url, relay)
                logs, recovery = await recover(handles, killed_at)
                for handle in handles:
                    live[handle.id].events.clear()
                    await handle.signal("user_message", {"content": "again"})
                for log, handle in zip(logs, handles, strict=True):
                    await wait_for_idle(handle, after=log[-1].position, within_seconds=RECOVERY_WITHIN)
                await until(lambda: all(live[handle.id].ended() for handle in handles), "the next turn's live end")
                live_again = [live[handle.id].text() for handle in handles]
            logs = [await read_events(handle) for handle in handles]

    assert_whole(logs)
    assert ended_at_kill == [], "a reply had ended before the relay was killed"
    for shown in shown_at_kill:
        assert shown and reply.startswith(shown) and len(shown) < len(reply), f"not mid-reply at the kill: {shown!r}"
    for log in logs:
        assert texts(log) == [reply, later], "each reply logged once, whole"
    assert live_again == [later] * n, "the next turn's deltas did not reach the subscriber through the new relay"
    record_logs(
        logs,
        recovery,
        fault="stream relay SIGKILLed mid-stream",
        expected="the turn goes on (live deltas are best-effort); a fresh relay serves the next turn live",
        observed=f"{n}/{n} replies logged once, whole; the next turn streamed live through the new relay",
    )


# ---- proxy --------------------------------------------------------------------------------------------------------


async def test_proxy_worker_sigkilled_mid_mcp_call(stack: Stack, tmp_path: Path) -> None:
    """SIGKILL of the proxy worker while N sessions' MCP tool calls are in flight: the call is not made again
    (the server may already have acted on it); once the dead worker's heartbeat times out, the model gets a tool
    error saying the call's outcome is unknown, with a typed `mcp_connection_failed_error` (retry status
    `exhausted`), and the session goes on: the next MCP call works through a fresh proxy worker."""
    n = chaos_n()
    authority = TokenAuthority(client_secret="canary-client-secret-" + uuid.uuid4().hex)
    dev_vault = shared_dev_vault()
    store = VaultStore(dev_vault.client())
    vault = store.create_vault(unique("chaos-proxy"))
    environment = temporal_env(address(stack)) | {
        "VAULT_ADDR": dev_vault.address,
        "VAULT_TOKEN": dev_vault.root_token.get_secret_value(),
        "CORRAL_VAULT_MOUNT": dev_vault.mount,
        "CORRAL_GIT_PROXY_HOST": "127.0.0.1",
        "CORRAL_GIT_PROXY_PORT": str(free_port()),
    }
    app = functools.partial(create_mcp_app, authority)
    with (
        ServerThread(app, name="mcp", lifespan="on", app_takes_url=True) as mcp,
        role_process("proxy", worker_argv("proxy"), tmp_path, **environment) as proxy_process,
    ):
        mcp_url = f"{mcp.base_url}/mcp"
        token = authority.issue_access_token()
        store.add_credential(vault.id, StaticBearerParams(mcp_server_url=mcp_url, token=token))
        agent_tools = {
            "mcp_servers": [{"type": "url", "name": "tools", "url": mcp_url}],
            "tools": [{"type": "mcp_toolset", "mcp_server_name": "tools"}],
        }
        handles = []
        for index in range(n):
            model = stack.script(
                [
                    use("mcp__tools__slow", seconds=4),
                    use("mcp__tools__add", a=index, b=40),
                    {"text": "went on"},
                ]
            )
            agent = {"model": model, **agent_tools}
            handles.append(await stack.start(model, message="go", vault_ids=[vault.id], agent=agent))

        def calls(tool: str) -> int:
            return [called for called, _ in authority.tool_calls].count(tool)

        await until(lambda: calls("slow") >= n, "every session's slow MCP call at the server")
        assert calls("slow") == n
        fault = datetime.now(UTC)
        killed_at = proxy_process.kill()
        proxy_process.start()
        logs, recovery = await recover(handles, killed_at)
        # No wait for a call made again: one would reach the server before its activity ended, so before the
        # session's next call, which every session has made.
        assert calls("add") == n, authority.tool_calls
        made = calls("slow")

    assert_whole(logs)
    assert_ended_after(logs, fault)
    for index, log in enumerate(logs):
        results = [event for event in log if isinstance(event, AgentMcpToolResult)]
        assert [result.is_error for result in results] == [True, False]
        assert "outcome is unknown" in texts(log, "agent.mcp_tool_result")[0]
        assert texts(log, "agent.mcp_tool_result")[1] == str(index + 40)
        errors = [event for event in log if isinstance(event, SessionError)]
        assert [(e.error.type, e.error.retry_status.type) for e in errors] == [
            ("mcp_connection_failed_error", "exhausted")
        ]
        assert texts(log) == ["went on"]
    assert made == n, f"{made - n} MCP calls were made again after the proxy worker died"
    record_logs(
        logs,
        recovery,
        fault="proxy worker SIGKILLed mid MCP call",
        expected="a tool error the model sees (outcome unknown, not made again) and a typed "
        "mcp_connection_failed_error (exhausted); the next MCP call works",
        observed=f"{n}/{n} calls made once, reported unknown; the next call worked",
        extra_runs=made - n,
    )


# ---- the Temporal server ------------------------------------------------------------------------------------------


def corral(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, in its own process."""
    argv = [sys.executable, "-m", "cli.main", *args]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(400)
async def test_temporal_server_sigkilled_mid_turn_then_restarted_by_corral_up(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """SIGKILL of the Temporal server (the local stack's dev server, SQLite file) while N sessions' bash commands run
    in their sandboxes, then `corral up` again, which starts it on the same database and port: the workers, still
    running, reconnect and every turn ends cleanly (a clean resume), the log whole, each command run once."""
    n = chaos_n()
    state = tmp_path / "state"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANTHROPIC_", "CORRAL_", "VAULT_"))}
    env["CORRAL_STATE_DIR"] = str(state)  # offline: the stack's own model server plays the scripts
    ports = [f"--{name}-port" for name in ("temporal", "ui", "model", "stream", "git-proxy", "api")]
    up_args = ["up", *[part for option in ports for part in (option, str(free_port()))]]
    command = HELD_COMMAND
    try:
        up = await asyncio.to_thread(corral, env, *up_args)
        assert up.returncode == 0, up.stdout + up.stderr
        recorded = json.loads((state / "stack.json").read_text())
        client = await connect(recorded["temporal_address"], recorded["namespace"])
        handles = []
        async with httpx.AsyncClient(base_url=recorded["model_url"], timeout=10) as model_server:
            for _ in range(n):
                name = unique("chaos-temporal")
                steps = [
                    {"tool_uses": [{"name": "bash", "input": {"command": command}}]},
                    {"tool_uses": [{"name": "bash", "input": {"command": "wc -l < /workspace/count"}}]},
                    {"text": "done"},
                ]
                (await model_server.put(f"/_corral/scripts/{name}", json={"steps": steps})).raise_for_status()
                agent = AgentConfig.model_validate({"model": f"script:{name}", "tools": TOOLSET})
                handles.append(await start_session(client, SessionInput(agent=agent, message="go")))

        async def command_runs(handle: WorkflowHandle) -> bool:
            return HELD in await asyncio.to_thread(_container_processes, docker_client, handle.id)

        await until_all(handles, command_runs, "its bash command running in the container", within=180)
        temporal_pid = int((state / "pids" / "temporal.pid").read_text())
        fault = datetime.now(UTC)
        os.kill(temporal_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while Path(f"/proc/{temporal_pid}").exists() and "\nState:\tZ" not in _status(temporal_pid):
            await asyncio.sleep(0.05)
        await asyncio.to_thread(_release, docker_client, handles)  # the commands end while the server is down
        again = await asyncio.to_thread(corral, env, *up_args)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "temporal started" in again.stdout, again.stdout
        assert again.stdout.count("already running") >= 1, again.stdout  # the workers were left alone
        client = await connect(recorded["temporal_address"], recorded["namespace"])
        handles = [client.get_workflow_handle(handle.id) for handle in handles]
        logs, recovery = await recover(handles, killed_at)
        for handle in handles:
            await handle.terminate("test finished")
    finally:
        down = await asyncio.to_thread(corral, env, "down", "--sandboxes")
    assert down.returncode == 0, down.stdout + down.stderr

    assert_whole(logs)
    assert_ended_after(logs, fault)
    counts = []
    for log in logs:
        first, count = texts(log, "agent.tool_result")
        assert first.startswith("finished"), first
        counts.append(int(count))
        assert texts(log) == ["done"]
    assert counts == [1] * n, "a command ran twice"
    record_logs(
        logs,
        recovery,
        fault="Temporal server SIGKILLed mid-turn, restarted by `corral up`",
        expected="clean resume: the workers reconnect, every turn ends once, each command runs once",
        observed=f"{n}/{n} turns ended once; commands ran once each",
        extra_runs=sum(counts) - n,
    )


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "\nState:\tZ"
