"""Worker processes for the benchmarks: spawn `bench.worker_process`, wait until it polls, kill or stop it; and
corral's HTTP servers (model server, stream relay) as processes of their own, as `corral up` runs them."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from bench._report import ROOT, rss_bytes
from corral.names import SANDBOX_TASK_QUEUE, UTILITY_HAND_TASK_QUEUE

WORKFLOW = TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
ACTIVITY = TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY


@dataclass
class WorkerConfig:
    """Where worker processes connect and which queues they serve."""

    address: str
    harness_queue: str
    model_queue: str
    model_url: str = ""
    stream_url: str | None = None
    image: str | None = None
    engine_queue: str | None = None
    """The sandbox engine's queue (`corral-sandbox@<engine>`), to know when a sandbox worker polls it."""
    log_dir: Path = field(default_factory=lambda: Path("/tmp"))
    model_routing: bool = True
    """False: model workers serve the shared queue only, with no warm-up (`bench.worker_process --no-model-routing`),
    the layout before routing, for a before/after comparison."""

    @classmethod
    def fresh(
        cls,
        client: Client,
        log_dir: Path,
        *,
        model_url: str = "",
        stream_url: str | None = None,
        image: str | None = None,
        engine_queue: str | None = None,
    ) -> WorkerConfig:
        """Connecting where `client` does, on harness and model queues of their own (no run shares a queue)."""
        suffix = uuid.uuid4().hex[:8]
        return cls(
            client.service_client.config.target_host,
            f"bench-harness-{suffix}",
            f"bench-model-{suffix}",
            model_url,
            stream_url,
            image,
            engine_queue,
            log_dir,
        )

    def queues(self, roles: tuple[str, ...]) -> list[tuple[str, TaskQueueType.ValueType]]:
        """The task queues a process with these roles polls."""
        queues: list[tuple[str, TaskQueueType.ValueType]] = []
        if "harness" in roles:
            queues.append((self.harness_queue, WORKFLOW))
        if "model" in roles:
            queues.append((self.model_queue, ACTIVITY))
        if "sandbox" in roles:
            queues.append((SANDBOX_TASK_QUEUE, ACTIVITY))
            if self.engine_queue:
                queues.append((self.engine_queue, ACTIVITY))
        if "utility" in roles:
            queues.append((UTILITY_HAND_TASK_QUEUE, ACTIVITY))
        return queues


@dataclass
class WorkerProcess:
    """One running `bench.worker_process`."""

    roles: tuple[str, ...]
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def identity(self) -> str:
        """Temporal's default worker identity, which names the process in history and in poller lists."""
        return f"{self.pid}@{socket.gethostname()}"

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> float:
        """SIGKILL, reaped; returns the monotonic time the process was gone."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        return time.monotonic()

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM (graceful shutdown), SIGKILL if it does not exit in time."""
        if not self.alive():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def spawn_worker(config: WorkerConfig, roles: tuple[str, ...], name: str) -> WorkerProcess:
    """Start a worker process with these roles; its output goes to `<log_dir>/<name>.log`."""
    args = [sys.executable, "-m", "bench.worker_process", "--address", config.address, "--roles", ",".join(roles)]
    args += ["--harness-queue", config.harness_queue, "--model-queue", config.model_queue]
    if config.model_url:
        args += ["--model-url", config.model_url]
    if config.stream_url:
        args += ["--stream-url", config.stream_url]
    if config.image:
        args += ["--image", config.image]
    if not config.model_routing:
        args.append("--no-model-routing")
    log = config.log_dir / f"{name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    return WorkerProcess(roles, process, log)


async def pollers(client: Client, queue: str, kind: TaskQueueType.ValueType) -> set[str]:
    """Identities of the workers that polled this task queue recently."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
        task_queue_type=kind,
    )
    answer = await client.workflow_service.describe_task_queue(request)
    return {poller.identity for poller in answer.pollers}


async def wait_until_polling(
    client: Client, config: WorkerConfig, worker: WorkerProcess, within_seconds: float = 60
) -> None:
    """Block until the process polls every queue of its roles (so it can take work at once)."""
    deadline = time.monotonic() + within_seconds
    for queue, kind in config.queues(worker.roles):
        while worker.identity not in await pollers(client, queue, kind):
            if not worker.alive():
                raise RuntimeError(f"worker process {worker.roles} exited; see {worker.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker process {worker.roles} did not poll {queue}; see {worker.log}")
            await asyncio.sleep(0.1)


def spawn_server(module: str, name: str, log_dir: Path, *options: str) -> tuple[WorkerProcess, str]:
    """Start `python -m <module>` (`modelserver`, `relay`) on a free local port; returns the
    process and its base URL. Its output goes to `<log_dir>/<name>.log`."""
    with socket.socket() as probe:  # a free port now; the server binds it a moment later
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = log_dir / f"{name}.log"
    with log.open("ab") as out:
        args = [sys.executable, "-m", module, "--port", str(port), *options]
        process = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    return WorkerProcess((name,), process, log), f"http://127.0.0.1:{port}"


async def wait_until_healthy(server: WorkerProcess, url: str, within_seconds: float = 30) -> None:
    """Block until the server answers `GET /healthz`."""
    deadline = time.monotonic() + within_seconds
    async with httpx.AsyncClient(timeout=2) as http:
        while True:
            try:
                if (await http.get(f"{url}/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if not server.alive():
                raise RuntimeError(f"{server.roles[0]} exited; see {server.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{server.roles[0]} did not answer at {url}; see {server.log}")
            await asyncio.sleep(0.1)
