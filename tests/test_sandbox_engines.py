"""Sandbox workers on a second Docker engine: an engine pool serves the sessions whose environment names it.

A second `dockerd` runs on a socket of its own, with the sandbox image loaded into it, and a real sandbox worker
process (`python -m workers.sandbox`) serves it with `DOCKER_HOST` pointing there and `CORRAL_SANDBOX_ENGINE=edge`,
next to the in-process sandbox worker on the default engine. Each session's container is looked up on both engines
by corral's labels. The engine, its containers, its daemon and its directories go at the end, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import docker
import docker.errors
import pytest
import requests
from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.sandbox import engine_task_queue
from corral.client import send_text
from corral.contract.events import AgentToolResult, SessionEvent
from corral.contract.sandbox import Environment
from corral.names import ACTIVITY_PROVISION_SANDBOX, ENV_SANDBOX_ENGINE, SANDBOX_TASK_QUEUE, sandbox_provision_queue
from sandbox.engine import READY_TIMEOUT_S
from sandbox.host import system_env
from sandbox.sessions import SESSION_LABEL
from tests.chaos._processes import RoleProcess, role_process, temporal_env, worker_argv
from tests.conftest import Stack, stop_reason, texts, unique, wait_for_idle
from tests.ports import free_port
from tests.test_gateway import running_gateway
from tests.waits import polled_by, until
from workers.settings import SandboxSettings, SettingsError

pytestmark = pytest.mark.timeout(300)

EDGE = "edge"
TOOLSET = [{"type": "agent_toolset_20260401"}]
WHERE = "cat /etc/hostname"
"""A container's host name is its short id: the output says which container ran the command."""
_POLL_S = 0.25
_STOP_TIMEOUT_S = 30.0
_ENGINE_PREFIX = "corral-edge-"


# ---- the second engine --------------------------------------------------------------------------------------------


@dataclass
class SecondEngine:
    """A `dockerd` of this test's own: its socket, data, exec root and pid file all under `directory`."""

    directory: Path
    process: subprocess.Popen[bytes]
    client: docker.DockerClient

    @property
    def url(self) -> str:
        return f"unix://{self.directory / 'docker.sock'}"


def start_second_engine(dockerd: str, directory: Path) -> SecondEngine:
    """A second engine beside the default one, sharing nothing with it: a bridge of its own and no iptables rules
    (sandboxes run with no network), and a containerd namespace of its own in case both reach one system
    containerd. Not `--bridge=none`: a daemon started so deletes the host's `docker0`, the default engine's bridge."""
    bridge = _make_bridge(directory)
    argv = [
        dockerd,
        f"--host=unix://{directory / 'docker.sock'}",
        f"--data-root={directory / 'data'}",
        f"--exec-root={directory / 'exec'}",
        f"--pidfile={directory / 'docker.pid'}",
        f"--bridge={bridge}",
        "--iptables=false",
        "--ip-masq=false",
        "--containerd-namespace=corral-test-edge",
        "--containerd-plugins-namespace=corral-test-edge-plugins",
        "--exec-opt=native.cgroupdriver=cgroupfs",  # as corral starts the first one (sandbox/engine.py)
    ]
    with (directory / "dockerd.log").open("ab") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=system_env(),
            start_new_session=True,
        )  # fmt: skip
    url = f"unix://{directory / 'docker.sock'}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        with contextlib.suppress(docker.errors.DockerException, requests.RequestException, OSError):
            client = docker.DockerClient(base_url=url)
            client.ping()
            return SecondEngine(directory, process, client)
        if process.poll() is not None or time.monotonic() > deadline:
            log_tail = _log_tail(directory)
            _stop_daemon(process, directory)
            raise AssertionError(f"the second dockerd did not come up within {READY_TIMEOUT_S:g}s:\n{log_tail}")
        time.sleep(_POLL_S)


def stop_second_engine(engine: SecondEngine) -> None:
    """Remove everything on the engine, then stop it and remove its directories."""
    with contextlib.suppress(Exception):
        for container in engine.client.containers.list(all=True):
            container.remove(force=True)
        for volume in engine.client.volumes.list():
            volume.remove(force=True)
    engine.client.close()
    _stop_daemon(engine.process, engine.directory)


def _stop_daemon(process: subprocess.Popen[bytes], directory: Path) -> None:
    """Stop the daemon (and the containerd it started), unmount what it left mounted, remove its directories."""
    process.terminate()
    try:
        process.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    _remove_leftovers(directory)


def _remove_leftovers(directory: Path) -> None:
    """What a stopped or killed engine leaves: the containerd it supervised, its mounts, its bridge, its files."""
    # A daemon that had to be killed leaves the containerd it supervised: stop that one, by its own pid file.
    with contextlib.suppress(OSError, ValueError):
        pid = int((directory / "exec" / "containerd" / "containerd.pid").read_text().strip())
        if _runs(pid, b"containerd"):
            os.kill(pid, signal.SIGKILL)
    for mount in reversed(_mounts_under(directory)):  # a killed daemon's overlay, shm and netns mounts
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
    with contextlib.suppress(OSError):
        bridge = (directory / "bridge").read_text().strip()
        if Path("/sys/class/net", bridge).exists():
            deleted = subprocess.run(["ip", "link", "delete", bridge], check=False, capture_output=True, text=True)
            assert deleted.returncode == 0, f"the second engine's bridge {bridge} stays: {deleted.stderr.strip()}"
    shutil.rmtree(directory, ignore_errors=True)


def _runs(pid: int, program: bytes) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(program)
    return False


def sweep_killed_engines() -> None:
    """Remove what an earlier run of this module left when it was killed before its teardown (a stopped CI job, a
    session cut short): each `corral-edge-*` directory whose daemon no longer runs, with its mounts and bridge."""
    for directory in Path(tempfile.gettempdir()).glob(f"{_ENGINE_PREFIX}*"):
        with contextlib.suppress(OSError, ValueError):
            if _runs(int((directory / "docker.pid").read_text().strip()), b"dockerd"):
                continue  # an engine some other run still uses
        _remove_leftovers(directory)


def _make_bridge(directory: Path) -> str:
    """A bridge interface for the second engine, its name kept in `directory` for the cleanup."""
    name = f"corral-e{uuid.uuid4().hex[:6]}"
    subnet = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}.1/24"
    for command in (["ip", "link", "add", name, "type", "bridge"], ["ip", "addr", "add", subnet, "dev", name],
                    ["ip", "link", "set", name, "up"]):  # fmt: skip
        subprocess.run(command, check=True, capture_output=True)
    (directory / "bridge").write_text(name)
    return name


def _log_tail(directory: Path) -> str:
    with contextlib.suppress(OSError):
        return "\n".join((directory / "dockerd.log").read_text(errors="replace").splitlines()[-15:])
    return "(no log)"


def _mounts_under(directory: Path) -> list[str]:
    with contextlib.suppress(OSError):
        points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        return [point for point in points if point.startswith(f"{directory}/")]
    return []


def load_image(source: docker.DockerClient, target: docker.DockerClient, image: str) -> None:
    """`docker save | docker load` through the API: the image streams from one engine into the other."""
    for _ in target.api.load_image(source.api.get_image(image)):
        pass
    target.images.get(image)  # NotFound if the load did not take


@pytest.fixture(scope="module")
def edge_engine(docker_client: docker.DockerClient, sandbox_image: str, dockerd: str) -> Iterator[SecondEngine]:
    # A short directory of its own: the engine's socket path must fit in a unix socket address (108 bytes).
    sweep_killed_engines()
    bridges_before = set(os.listdir("/sys/class/net"))
    engine = start_second_engine(dockerd, Path(tempfile.mkdtemp(prefix=_ENGINE_PREFIX)))
    bridge = (engine.directory / "bridge").read_text().strip()
    try:
        load_image(docker_client, engine.client, sandbox_image)
        yield engine
    finally:
        stop_second_engine(engine)
    # The default engine's network interfaces (its docker0 above all) are untouched, and the second's are gone.
    assert set(os.listdir("/sys/class/net")) >= bridges_before - {name for name in bridges_before if "veth" in name}
    assert bridge not in os.listdir("/sys/class/net")


def sandbox_worker_environment(client: Client, image: str, docker_host: str | None) -> dict[str, str]:
    """A sandbox worker of the pool `edge`, configured as in production, on `docker_host` (None: the default
    engine). No warm pool: every container is a session's."""
    environment = temporal_env(client.service_client.config.target_host) | {
        ENV_SANDBOX_ENGINE: EDGE,
        "CORRAL_SANDBOX_IMAGE": image,
        "CORRAL_SANDBOX_POOL_SIZE": "0",
        "CORRAL_GIT_PROXY_PORT": str(free_port()),
    }
    return environment | ({"DOCKER_HOST": docker_host} if docker_host else {})


@pytest.fixture
async def edge_worker(
    temporal_env: WorkflowEnvironment, edge_engine: SecondEngine, sandbox_image: str, tmp_path: Path
) -> AsyncIterator[RoleProcess]:
    """The sandbox worker's own entrypoint (`python -m workers.sandbox`) for the pool `edge`, on the second engine."""
    environment = sandbox_worker_environment(temporal_env.client, sandbox_image, edge_engine.url)
    with role_process("sandbox-edge", worker_argv("sandbox"), tmp_path, **environment) as worker:
        await until_polled(temporal_env.client, sandbox_provision_queue(EDGE), worker)
        yield worker


async def until_polled(client: Client, queue: str, worker: RoleProcess) -> None:
    """Until this worker process polls the queue (it has started)."""

    async def polling() -> bool:
        assert worker.alive(), f"the sandbox worker exited: see {worker.log}"
        return await polled_by(client, queue, worker.current.pid)

    await until(polling, f"the sandbox worker polls {queue} (see {worker.log})", within=120)


# ---- helpers ------------------------------------------------------------------------------------------------------


def bash(command: str) -> dict[str, Any]:
    return {"tool_uses": [{"name": "bash", "input": {"command": command}}]}


def labelled(engine: docker.DockerClient, session_id: str) -> list[str]:
    """The short ids of the session's containers on `engine`, by corral's session label."""
    found = engine.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"})
    return sorted(str(container.id)[:12] for container in found)


def tool_results(events: list[SessionEvent]) -> list[AgentToolResult]:
    return [event for event in events if isinstance(event, AgentToolResult)]


def result_text(result: AgentToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content).strip()


async def provision_queues(handle: WorkflowHandle) -> list[str]:
    """The task queue of every `provision_sandbox` the session scheduled, in order."""
    history = await handle.fetch_history()
    return [
        event.activity_task_scheduled_event_attributes.task_queue.name
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == ACTIVITY_PROVISION_SANDBOX
    ]


# ---- tests --------------------------------------------------------------------------------------------------------


async def test_each_session_gets_its_sandbox_on_the_engine_its_environment_names(
    sandbox_stack: Stack, edge_worker: RoleProcess, edge_engine: SecondEngine, docker_client: docker.DockerClient
) -> None:
    """A session whose environment names `edge` runs its tools on the second engine, one that names none on the
    default engine; when its container is gone, the new one is made in the same pool, with the same workspace."""
    stack = sandbox_stack
    # Both daemons report the same engine id (Docker 20.10 takes it from the host's key): their queues still differ.
    assert engine_task_queue(edge_engine.client) != engine_task_queue(docker_client)
    edge_model = stack.script(
        [bash(f"echo kept > /workspace/mark; {WHERE}"), {"text": "first"},
         bash(WHERE), bash(f"cat /workspace/mark; {WHERE}"), {"text": "second"}]
    )  # fmt: skip
    default_model = stack.script([bash(WHERE), {"text": "done"}])
    on_edge = await stack.start(edge_model, message="go", tools=TOOLSET, environment=Environment(engine=EDGE))
    on_default = await stack.start(default_model, message="go", tools=TOOLSET)
    edge_events = await wait_for_idle(on_edge, within_seconds=120)
    default_events = await wait_for_idle(on_default, within_seconds=120)

    [edge_result] = tool_results(edge_events)
    [default_result] = tool_results(default_events)
    assert not edge_result.is_error and not default_result.is_error, (edge_result, default_result)
    assert labelled(edge_engine.client, on_edge.id) == [result_text(edge_result)], "ran in its container on edge"
    assert labelled(docker_client, on_edge.id) == [], "nothing of the edge session on the default engine"
    assert labelled(docker_client, on_default.id) == [result_text(default_result)], "ran on the default engine"
    assert labelled(edge_engine.client, on_default.id) == [], "nothing of the other session on edge"
    assert await provision_queues(on_edge) == [f"{SANDBOX_TASK_QUEUE}.{EDGE}"]
    assert await provision_queues(on_default) == [SANDBOX_TASK_QUEUE]

    # The container is gone: the next call says so, and the one after it gets a new container, in the edge pool.
    first_container = result_text(edge_result)
    edge_engine.client.containers.get(first_container).remove(force=True)
    await send_text(on_edge, "again")
    again = await wait_for_idle(on_edge, after=edge_events[-1].position, within_seconds=120)
    gone, remade = tool_results(again)
    assert gone.is_error and "no longer exists" in result_text(gone), result_text(gone)
    assert not remade.is_error, result_text(remade)
    mark, container = result_text(remade).split()
    assert mark == "kept", "the new container has the session's workspace: it is on the same engine"
    assert labelled(edge_engine.client, on_edge.id) == [container] and container != first_container
    assert labelled(docker_client, on_edge.id) == []
    assert await provision_queues(on_edge) == [f"{SANDBOX_TASK_QUEUE}.{EDGE}"] * 2
    assert texts(again) == ["second"]


async def test_a_sandbox_whose_engine_is_gone_is_made_again_in_its_pool(
    sandbox_stack: Stack,
    edge_engine: SecondEngine,
    sandbox_image: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
) -> None:
    """The engine that held a stopped sandbox is gone (no worker serves its queue any more): the restart is not
    picked up, and the sandbox is made again by a worker of the same pool, here one on the default engine. The
    default pool, which serves that engine too, is never asked: the history says which queue each provision used."""
    stack = sandbox_stack
    client = stack.client
    model = stack.script([bash(WHERE), {"text": "first"}, bash(WHERE), {"text": "second"}])
    pool = sandbox_provision_queue(EDGE)
    environment = Environment(engine=EDGE, idle_stop_seconds=5)
    on_edge = sandbox_worker_environment(client, sandbox_image, edge_engine.url)
    with role_process("sandbox-edge", worker_argv("sandbox"), tmp_path, **on_edge) as worker:
        await until_polled(client, pool, worker)
        handle = await stack.start(model, message="go", tools=TOOLSET, environment=environment)
        first = await wait_for_idle(handle, within_seconds=120)
        [held] = labelled(edge_engine.client, handle.id)
        for _ in range(600):  # the idle stop: the container stops, its workspace stays
            if edge_engine.client.containers.get(held).status == "exited":
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the idle sandbox was never stopped")
    # The edge engine's only worker has stopped: that engine is gone as far as the session can tell.
    on_default = sandbox_worker_environment(client, sandbox_image, None)
    with role_process("sandbox-edge-elsewhere", worker_argv("sandbox"), tmp_path, **on_default) as worker:
        await until_polled(client, pool, worker)
        await send_text(handle, "again")
        second = await wait_for_idle(handle, after=first[-1].position, within_seconds=180)
        await handle.terminate("test finished")  # before its worker stops: no sandbox activity is left
    [result] = tool_results(second)
    assert not result.is_error, result_text(result)
    assert labelled(docker_client, handle.id) == [result_text(result)], "made again on the default engine"
    assert labelled(edge_engine.client, handle.id) == [held], "the stopped one is still on edge, not restarted"
    engine_queue = engine_task_queue(edge_engine.client)
    assert await provision_queues(handle) == [pool, engine_queue, pool], "never the default pool's queue"
    assert texts(second) == ["second"]


async def test_an_engine_pool_that_no_worker_serves_is_a_clear_tool_error(stack: Stack) -> None:
    """No worker serves the pool: the provision is not picked up, the tool result names the pool, and the session
    stays usable (its next message is answered). No Docker engine is involved."""
    pool = unique("nowhere")
    model = stack.script([bash("true"), {"text": "no sandbox today"}, {"text": "still here"}])
    handle = await stack.start(model, message="go", tools=TOOLSET, environment=Environment(engine=pool))
    events = await wait_for_idle(handle, within_seconds=120)
    [result] = tool_results(events)
    message = result_text(result)
    assert result.is_error
    assert f"no sandbox worker serves the engine pool {pool!r}" in message, message
    assert f"{SANDBOX_TASK_QUEUE}.{pool}" in message and f"CORRAL_SANDBOX_ENGINE={pool}" in message, message
    assert stop_reason(events[-1]).type == "end_turn"
    await send_text(handle, "are you there?")
    more = await wait_for_idle(handle, after=events[-1].position)
    assert texts(more) == ["still here"]


def cloud_config(engine: Any) -> Any:
    """A `cloud` config with corral's `engine` key (the SDK's typed parameters have no such key)."""
    return {"type": "cloud", "engine": engine}


def engine_of(environment: Any) -> Any:
    """`config.engine` as the SDK parsed it (an extension key: kept among the model's extra fields)."""
    return environment.config.to_dict().get("engine")


async def test_an_environment_names_its_engine_pool_over_the_api(
    sandbox_stack: Stack,
    edge_worker: RoleProcess,
    edge_engine: SecondEngine,
    docker_client: docker.DockerClient,
    tmp_path: Path,
) -> None:
    """`config.engine` is validated at the edge (a 400 that says what a name may be), shown on retrieve and list
    when set (and only then), cleared by null; a session made from the environment gets its sandbox on that engine."""
    stack = sandbox_stack
    async with running_gateway(stack, tmp_path) as gateway:
        client = await gateway.client("team-edge")
        for bad in ("Edge", "e" * 33, "-edge", "edge_1", 7):
            with pytest.raises(anthropic.BadRequestError, match=r"config\.engine"):
                await client.beta.environments.create(name="bad", config=cloud_config(bad))
        edge = await client.beta.environments.create(name="edge", config=cloud_config(EDGE))
        plain = await client.beta.environments.create(name="plain")
        assert engine_of(edge) == EDGE and engine_of(await client.beta.environments.retrieve(edge.id)) == EDGE
        assert "engine" not in plain.config.to_dict(), "an environment without the extension looks as upstream's"
        listed = {environment.id: engine_of(environment) async for environment in client.beta.environments.list()}
        assert (listed[edge.id], listed[plain.id]) == (EDGE, None)
        moved = await client.beta.environments.update(plain.id, config=cloud_config(EDGE))
        assert engine_of(moved) == EDGE
        back = await client.beta.environments.update(plain.id, config=cloud_config(None))
        assert "engine" not in back.config.to_dict()
        with pytest.raises(anthropic.BadRequestError, match=r"config\.engine"):
            await client.beta.environments.update(plain.id, config=cloud_config("no way"))

        model = stack.script([bash(WHERE), {"text": "done"}])
        agent = await client.beta.agents.create(name="edge", model=model, tools=TOOLSET)  # type: ignore[arg-type]
        session = await client.beta.sessions.create(agent=agent.id, environment_id=edge.id)
        handle = stack.client.get_workflow_handle(session.id)
        stack.started.append(handle)  # terminated, and its default-engine leftovers (none expected) removed
        await client.beta.sessions.events.send(
            session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "where?"}]}]
        )
        events = await wait_for_idle(handle, within_seconds=120)
    [result] = tool_results(events)
    assert not result.is_error, result_text(result)
    assert labelled(edge_engine.client, session.id) == [result_text(result)]
    assert labelled(docker_client, session.id) == []


def test_an_engine_pool_name_is_checked_where_it_enters() -> None:
    """A worker's `CORRAL_SANDBOX_ENGINE` and an environment's `engine`: one rule, each refusal naming what to fix."""
    assert SandboxSettings.from_environment({ENV_SANDBOX_ENGINE: EDGE}).engine == EDGE
    assert SandboxSettings.from_environment({ENV_SANDBOX_ENGINE: ""}).engine is None, "empty counts as unset"
    assert Environment(engine="eu-west-2").engine == "eu-west-2"
    for bad in ("Edge", "e" * 33, "-edge", "edge-", "edge.1", "a@b"):
        with pytest.raises(SettingsError, match=f"^{ENV_SANDBOX_ENGINE}: .*lowercase letters"):
            SandboxSettings.from_environment({ENV_SANDBOX_ENGINE: bad})
        with pytest.raises(ValidationError, match="lowercase letters"):
            Environment(engine=bad)
    assert sandbox_provision_queue(None) == SANDBOX_TASK_QUEUE
    assert "engine" not in Environment().model_dump_json(), "a recipe without an engine reads as before the field"
