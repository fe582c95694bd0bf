"""The load benchmark's clients: the run's state, and what the clients do: open a session and follow its live text,
take turns back to back, all sessions at once while each process's memory and CPU are sampled; and the RPC errors
they meet on the way."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    QueryWorkflowInput,
    StartWorkflowUpdateInput,
    WorkflowHandle,
    WorkflowUpdateHandle,
)
from temporalio.service import RPCError

from bench import _profile as profile
from bench import _server_metrics as server_metrics
from bench._load_accounting import Checked
from bench._report import cpu_seconds, rss_bytes
from bench._workers import WorkerConfig, WorkerProcess
from corral.client import send_text, start_session, wait_for_idle
from corral.contract.session import AgentConfig, SessionInput
from relay import DeltaRecord, EndRecord, PublishRecord, StartRecord, StreamPublisher, subscribe

TOOLS = {False: [{"type": "corral_utility"}], True: [{"type": "agent_toolset_20260401"}]}


# ---- what the client meets ----------------------------------------------------------------------------------


class RpcErrors(Interceptor):
    """Counts the RPC errors the client's updates and queries met. `corral.client` sends again what Temporal did
    not take (RESOURCE_EXHAUSTED past the in-flight update limit) and asks again after a transient error, so they
    are otherwise invisible."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _CountingOutbound(next, self.seen)


class _CountingOutbound(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, seen: Counter[str]) -> None:
        super().__init__(next)
        self.seen = seen

    async def start_workflow_update(self, input: StartWorkflowUpdateInput) -> WorkflowUpdateHandle[Any]:
        try:
            return await super().start_workflow_update(input)
        except RPCError as exc:
            self.seen[f"send_events update: {exc.status.name if exc.status else exc}"] += 1
            raise

    async def query_workflow(self, input: QueryWorkflowInput) -> Any:
        try:
            return await super().query_workflow(input)
        except RPCError as exc:
            self.seen[f"events query: {exc.status.name if exc.status else exc}"] += 1
            raise


@dataclass
class Turn:
    number: int
    ended: float
    """Seconds since the load began (monotonic)."""
    latency: float
    ttft: float | None


@dataclass
class Session:
    index: int
    sandbox: bool
    handle: WorkflowHandle
    deltas: list[tuple[float, str]] = field(default_factory=list)
    """(monotonic time, span id) of each text delta the relay delivered."""
    client_ids: list[str] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    position: int = 0
    problem: str | None = None
    listener: asyncio.Task[None] | None = None

    @property
    def id(self) -> str:
        return self.handle.id


@dataclass
class Load:
    args: argparse.Namespace
    client: Client
    config: WorkerConfig
    relay_url: str
    publisher: StreamPublisher
    engine: docker.DockerClient | None
    processes: dict[str, WorkerProcess | int]
    """The stack's processes by name: ours, or the pid of the Temporal dev server."""
    rpc_errors: RpcErrors
    scripts: dict[bool, str] = field(default_factory=dict)
    """The model server's script for a utility (False) or a sandbox (True) session."""
    sessions: list[Session] = field(default_factory=list)
    rss: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per process: RSS in MB before the load, at its peak, and after it."""
    cpu: dict[str, float] = field(default_factory=dict)
    """Per process: CPU seconds used during the load."""
    baseline: list[Session] = field(default_factory=list)
    loaded: list[Session] = field(default_factory=list)
    wall: float = 0.0
    load_average: list[float] = field(default_factory=list)
    """The machine's 1-minute load average when the load began and when it ended (other jobs included)."""
    checked: Checked = field(default_factory=Checked)
    alone_checked: Checked = field(default_factory=Checked)
    """The same reading of the sessions alone: only their queue waits are reported."""
    logs: dict[str, Path] = field(default_factory=dict)
    """Each process's log, by process name."""
    log_lines: dict[str, Counter[str]] = field(default_factory=dict)
    metrics_url: str | None = None
    """The Temporal dev server's Prometheus metrics: read before and after the load."""
    server: server_metrics.Counters | None = None
    """The server's counters over the load."""
    profile_dir: Path | None = None
    """With `--profile`: py-spy's collapsed stacks of each Python process during the load are written here."""

    def pid(self, name: str) -> int:
        process = self.processes[name]
        return process if isinstance(process, int) else process.pid

    def python_pids(self) -> dict[str, int]:
        """Our own processes (the Temporal dev server is Go: py-spy cannot read it)."""
        return {name: process.pid for name, process in self.processes.items() if isinstance(process, WorkerProcess)}


# ---- one session ----------------------------------------------------------------------------------------------


async def listen(relay_url: str, session: Session) -> None:
    async with contextlib.aclosing(subscribe(relay_url, session.id)) as events:
        async for event in events:
            if event.type == "delta" and event.kind == "text":
                session.deltas.append((time.monotonic(), event.span_id))


async def open_session(load: Load, index: int, sandbox: bool) -> Session:
    """Start a session and follow its live text; returned once a probe record came back through the relay."""
    agent = AgentConfig.model_validate({"model": f"script:{load.scripts[sandbox]}", "tools": TOOLS[sandbox]})
    input = SessionInput(agent=agent, model_task_queue=load.config.model_queue)
    handle = await start_session(load.client, input, task_queue=load.config.harness_queue)
    session = Session(index, sandbox, handle)
    load.sessions.append(session)
    session.listener = asyncio.create_task(listen(load.relay_url, session))
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    records: list[PublishRecord] = [
        StartRecord(span_id=probe, attempt=1),
        DeltaRecord(span_id=probe, attempt=1, seq=0, block=0, kind="text", text="."),
        EndRecord(span_id=probe, attempt=1),
    ]
    # A subscriber that connects later still gets the retained probe, so its arrival proves the stream is open.
    # Under load the relay can be slow to accept a connection: the probe is published again until it arrives.
    deadline = time.monotonic() + 120
    while not any(span == probe for _, span in session.deltas):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the stream relay did not deliver the probe of {session.id}")
        if not await load.publisher.publish_batch(session.id, records):
            load.rpc_errors.seen["stream relay: probe publish failed, sent again"] += 1
        for _ in range(50):
            if any(span == probe for _, span in session.deltas):
                break
            await asyncio.sleep(0.02)
    return session


async def turn(load: Load, session: Session, number: int, began: float) -> None:
    client_id = f"load-{session.index}-{number}-{uuid.uuid4().hex[:8]}"
    session.client_ids.append(client_id)
    earlier = {span for _, span in session.deltas}
    sent = time.monotonic()
    await send_text(session.handle, f"turn {number}: please run the tool", client_id=client_id)
    idle = await wait_for_idle(session.handle, after=session.position, within_seconds=load.args.turn_timeout)
    ended = time.monotonic()
    session.position = idle[-1].position
    first = next((at for at, span in session.deltas if at >= sent and span not in earlier), None)
    session.turns.append(Turn(number, ended - began, ended - sent, None if first is None else first - sent))


async def converse(load: Load, session: Session, turns: int, began: float) -> None:
    """The session's turns back to back; a failed turn ends them (its log check shows what is missing)."""
    try:
        for number in range(1, turns + 1):
            await turn(load, session, number, began)
    except Exception as exc:  # reported with the results, never hidden
        session.problem = f"turn {len(session.turns) + 1}: {type(exc).__name__}: {exc}"


async def alone(load: Load, sandbox: bool) -> Session:
    session = await open_session(load, -1, sandbox)
    await converse(load, session, load.args.turns, time.monotonic())
    return session


# ---- the load -----------------------------------------------------------------------------------------------


async def sample(load: Load, stop: asyncio.Event) -> None:
    """Each process's RSS every second: the peak over the load."""
    peak = {name: 0.0 for name in load.processes}
    while True:
        for name in load.processes:
            peak[name] = max(peak[name], rss_bytes(load.pid(name)) / 2**20)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        if stop.is_set():
            break
    for name, value in peak.items():
        load.rss[name]["peak"] = value


async def run_load(load: Load) -> None:
    args = load.args
    gate = asyncio.Semaphore(20)

    async def opened(index: int) -> Session:
        async with gate:
            return await open_session(load, index, index < args.sandbox_sessions)

    load.loaded = list(await asyncio.gather(*(opened(index) for index in range(args.sessions))))
    print(f"{args.sessions} sessions open, their streams live; the load begins", flush=True)
    for name in load.processes:
        load.rss[name] = {"before": rss_bytes(load.pid(name)) / 2**20}
    cpu_before = {name: cpu_seconds(load.pid(name)) for name in load.processes}
    counters_before = await server_metrics.read(load.metrics_url) if load.metrics_url else None
    profilers = profile.start(load.python_pids(), load.profile_dir) if load.profile_dir else []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample(load, stop))
    began = time.monotonic()
    load.load_average.append(os.getloadavg()[0])
    progress = asyncio.create_task(report_progress(load, began))
    await asyncio.gather(*(converse(load, session, args.turns, began) for session in load.loaded))
    load.wall = time.monotonic() - began
    for profiler in profilers:
        profiler.stop()
    if load.metrics_url and counters_before is not None:
        load.server = await server_metrics.read(load.metrics_url) - counters_before
    load.load_average.append(os.getloadavg()[0])
    progress.cancel()
    stop.set()
    await sampler
    for name in load.processes:
        load.cpu[name] = cpu_seconds(load.pid(name)) - cpu_before[name]
        load.rss[name]["after"] = rss_bytes(load.pid(name)) / 2**20


async def report_progress(load: Load, began: float) -> None:
    expected = load.args.sessions * load.args.turns
    while True:
        await asyncio.sleep(10)
        done = sum(len(session.turns) for session in load.loaded)
        print(f"  {time.monotonic() - began:6.0f}s: {done}/{expected} turns done", flush=True)
