"""The fault matrix, sandbox faults: a command OOM-killed, a command that fills /tmp, and the Docker engine
restarted, each while N sessions are mid-turn in their containers.

Each command appends a line to a marker file in its workspace, so a command run twice shows; the call after the
fault must work, and the log must stay whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import requests
from temporalio.client import WorkflowHandle

from activities.sandbox import SandboxActivities
from corral.contract.events import SessionEvent
from corral.temporal import cluster_id
from sandbox.host import system_env
from sandbox.sessions import remove_session
from tests.chaos.matrix import assert_whole, chaos_n, record_logs
from tests.conftest import Stack, texts, wait_for_idle
from tests.test_sandbox import TOOLSET, bash, processes, session_containers
from workers.roles import sandbox_workers

WITHIN = 180.0
"""Generous: containers start on a shared machine."""


def tool_results(events: Sequence[SessionEvent]) -> list[tuple[str, bool]]:
    outputs = texts(list(events), "agent.tool_result")
    errors = [bool(getattr(e, "is_error", False)) for e in events if e.type == "agent.tool_result"]
    return list(zip(outputs, errors, strict=True))


async def start_all(stack: Stack, n: int, steps: list[dict[str, Any]], **extra: Any) -> list[WorkflowHandle]:
    return [await stack.start(stack.script(steps), message="go", tools=TOOLSET, **extra) for _ in range(n)]


async def test_command_oom_killed_mid_turn(sandbox_stack: Stack, docker_client: docker.DockerClient) -> None:
    """A command that allocates past the sandbox's memory limit (128 MB) is OOM-killed: the model sees its exit
    code 137 and a note that the memory limit was reached; the container survives and the next call runs in it."""
    n = chaos_n()
    hog = "echo ran >> /workspace/count; python3 -c 'x = bytearray(512 * 1024 * 1024); print(len(x))'"
    steps = [bash(hog), bash("wc -l < /workspace/count"), {"text": "done"}]
    started = time.monotonic()
    handles = await start_all(sandbox_stack, n, steps, environment={"limits": {"memory_mb": 128}})
    logs = await asyncio.gather(*(wait_for_idle(handle, within_seconds=WITHIN) for handle in handles))
    recovery = [time.monotonic() - started] * n
    counts = []
    for handle, log in zip(handles, logs, strict=True):
        (killed, killed_error), (count, count_error) = tool_results(log)
        assert not killed_error and killed.endswith("[exit code 137]"), killed
        assert "[out of memory: the sandbox's memory limit of 128 MB was reached while this command ran" in killed
        assert not count_error
        counts.append(int(count))
        assert texts(log) == ["done"]
        [container] = session_containers(docker_client, handle.id)
        assert container.status == "running", "the container outlives the OOM kill of one command"
    assert counts == [1] * n, "a command ran twice"
    assert_whole(logs)
    record_logs(
        logs,
        recovery,
        fault="a sandbox command OOM-killed (memory limit 128 MB)",
        expected="a result the model sees (exit code 137, an out-of-memory note); same container, next call works",
        observed=f"{n}/{n} commands killed once with the note; the next call ran in the same container",
        extra_runs=sum(counts) - n,
    )


async def test_command_fills_tmp_mid_turn(sandbox_stack: Stack, docker_client: docker.DockerClient) -> None:
    """A command that writes 400 MB to /tmp (a 32 MB tmpfs) gets ENOSPC, which the model reads in its output; the
    file stops at the limit, nothing of it reaches the host's disk, and the next call works after freeing it."""
    n = chaos_n()
    fill = "echo ran >> /workspace/count; head -c 400M /dev/zero > /tmp/fill; echo exit=$?; stat -c %s /tmp/fill"
    after = "rm /tmp/fill; wc -l < /workspace/count; df --output=fstype,size -B1M /tmp | tail -1"
    steps = [bash(fill), bash(after), {"text": "done"}]
    started = time.monotonic()
    handles = await start_all(sandbox_stack, n, steps, environment={"limits": {"tmp_mb": 32}})
    logs = await asyncio.gather(*(wait_for_idle(handle, within_seconds=WITHIN) for handle in handles))
    recovery = [time.monotonic() - started] * n
    counts = []
    for log in logs:
        (filled, _), (checked, checked_error) = tool_results(log)
        lines = filled.splitlines()
        assert lines[0].endswith("No space left on device") and lines[1] == "exit=1", filled
        assert int(lines[2]) <= 32 * 1024 * 1024
        count, filesystem = checked.splitlines()
        assert not checked_error and filesystem.split() == ["tmpfs", "32"], "/tmp lives in memory, never on disk"
        counts.append(int(count))
        assert texts(log) == ["done"]
    assert counts == [1] * n, "a command ran twice"
    assert_whole(logs)
    record_logs(
        logs,
        recovery,
        fault="a sandbox command fills /tmp (32 MB tmpfs)",
        expected="ENOSPC in the output the model sees; the host disk untouched; the next call works",
        observed=f"{n}/{n} writes stopped at 32 MB with ENOSPC; the next call ran",
        extra_runs=sum(counts) - n,
    )


# ---- the Docker engine restarted --------------------------------------------------------------------------------


class PrivateEngine:
    """A `dockerd` of this test's own (data root, exec root, pid file and socket in a temporary folder; a bridge of
    its own, no iptables), so restarting it disturbs no other test run on the machine's shared engine.

    Not `--bridge=none`: a dockerd started so deletes the host's `docker0` interface, which the shared engine's
    containers need (found the hard way). The bridge given instead is made here and deleted at the end.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "docker.sock"
        self.log = root / "dockerd.log"
        self.bridge = f"crl{root.name[-8:]}".replace("_", "0")[:15]
        self.process: subprocess.Popen[bytes] | None = None

    def make_bridge(self) -> None:
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
        subnet = next(f"10.213.{n}" for n in range(1, 255) if f" 10.213.{n}." not in used)
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"{subnet}.1/24", "dev", self.bridge], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)

    def remove_bridge(self) -> None:
        subprocess.run(["ip", "link", "del", self.bridge], check=False, capture_output=True)

    def start(self, dockerd: str) -> docker.DockerClient:
        command = [
            dockerd,
            f"--host=unix://{self.socket}",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'dockerd.pid'}",
            f"--bridge={self.bridge}",
            "--iptables=false",
            "--ip-masq=false",
            "--exec-opt=native.cgroupdriver=cgroupfs",
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=system_env(),
                start_new_session=True,
            )
        for _ in range(240):
            with contextlib.suppress(docker.errors.DockerException, requests.RequestException, OSError):
                client = docker.DockerClient(base_url=f"unix://{self.socket}")
                client.ping()
                return client
            assert self.process.poll() is None, f"the private dockerd exited: see {self.log}"
            time.sleep(0.25)
        pytest.fail(f"the private dockerd did not answer within 60 s: see {self.log}")

    def stop(self) -> None:
        """SIGTERM, as a service manager restarting the engine does: dockerd stops its containers, then exits."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def private_engine() -> Iterator[PrivateEngine]:
    root = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))  # short: a unix socket path holds at most 107 bytes
    engine = PrivateEngine(root)
    engine.make_bridge()
    try:
        yield engine
    finally:
        engine.stop()
        engine.remove_bridge()
        shutil.rmtree(root, ignore_errors=True)


def copy_image(source: docker.DockerClient, target: docker.DockerClient, tag: str) -> None:
    """`docker save | docker load`: the private engine gets the sandbox image without any registry."""
    for _ in target.api.load_image(source.images.get(tag).save(named=True)):
        pass


async def test_docker_engine_restarted_mid_command(
    stack: Stack, docker_client: docker.DockerClient, sandbox_image: str, dockerd: str
) -> None:
    """The Docker engine restarted (stopped, which stops its containers, then started) while N sessions' commands
    run: each running call ends as a tool error the model sees (the container stopped; /workspace survives), the
    next call gets a fresh container on the same workspace, and no command ran twice."""
    n = chaos_n()
    command = "echo ran >> /workspace/count; sleep 30; echo finished"
    steps = [bash(command), bash("wc -l < /workspace/count; echo alive"), {"text": "done"}]
    handles: list[WorkflowHandle] = []
    shared_bridge = Path("/sys/class/net/docker0")
    had_shared_bridge = shared_bridge.exists()
    with private_engine() as engine:
        client = await asyncio.to_thread(engine.start, dockerd)
        try:
            await asyncio.to_thread(copy_image, docker_client, client, sandbox_image)
            activities = SandboxActivities(client, sandbox_image, await cluster_id(stack.client))
            async with AsyncExitStack() as workers:
                for worker in sandbox_workers(stack.client, activities):
                    await workers.enter_async_context(worker)
                handles = await start_all(stack, n, steps)
                for handle in handles:
                    for _ in range(1200):
                        if "sleep 30" in await asyncio.to_thread(processes, client, handle.id):
                            break
                        await asyncio.sleep(0.1)
                    else:
                        pytest.fail("the command never ran in its container")
                restarted_at = time.monotonic()
                await asyncio.to_thread(engine.stop)
                # The worker keeps its client, as in production.
                (await asyncio.to_thread(engine.start, dockerd)).close()
                logs = await asyncio.gather(*(wait_for_idle(handle, within_seconds=WITHIN) for handle in handles))
                recovery = [time.monotonic() - restarted_at] * n
                containers = [await asyncio.to_thread(session_containers, client, h.id) for h in handles]
                for handle in handles:
                    await handle.terminate("test finished")  # before the workers stop: no sandbox activity is left
        finally:
            for handle in handles:
                with contextlib.suppress(docker.errors.DockerException, requests.RequestException):
                    await asyncio.to_thread(remove_session, client, handle.id, True)
            client.close()
    assert shared_bridge.exists() == had_shared_bridge, "the private engine must leave the shared engine's bridge"
    counts = []
    for log, made in zip(logs, containers, strict=True):
        (stopped, stopped_error), (after, after_error) = tool_results(log)
        assert stopped_error and "the sandbox container stopped" in stopped, stopped
        assert "Files under /workspace survive" in stopped
        count, alive = after.splitlines()
        assert not after_error and alive == "alive"
        counts.append(int(count))
        assert texts(log) == ["done"]
        assert len(made) == 2, "the next call ran in a fresh container"
    assert counts == [1] * n, "a command ran twice"
    assert_whole(logs)
    record_logs(
        logs,
        recovery,
        fault="the Docker engine restarted mid-command",
        expected="a tool error the model sees (the container stopped; /workspace kept); the next call gets a "
        "fresh container",
        observed=f"{n}/{n} running calls ended as tool errors; the next call ran in a new container",
        extra_runs=sum(counts) - n,
    )
