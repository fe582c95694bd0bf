"""The TTFT benchmark's arms: one session's first message and its next one, timed through the direct SDK call, the
coupled "pet" design and corral as built, with the model server and the relay noting when each request and first
delta arrive; and the workload every arm runs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import anthropic
import docker
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy

from activities.context import build_tools
from bench._peers import PeerProcess
from bench._pet import PetSetupInput, PetSetupWorkflow
from bench._ttft_peer import PEER, PEER_COMMAND, peer_session
from bench._ttft_report import Sample, SessionSpec
from corral.client import new_session_id, read_events, send_text, start_session, wait_for_idle
from corral.contract.events import AgentToolResult
from corral.contract.session import AgentConfig, SendEventsInput, SendEventsResult, SessionInput
from corral.names import ACTIVITY_MODEL_TURN, UPDATE_SEND_EVENTS
from modelserver import ModelServerThread
from modelserver.scripts import ApiError, Plan, ScriptBook
from relay import DeltaRecord, PublishRecord, StreamHub, StreamMessage, StreamRelayThread, subscribe
from workflows import SessionWorkflow

TOOLSET = [{"type": "agent_toolset_20260401"}]
FIRST_MESSAGE = "What is in this repository, and where should I start?"
PREAMBLE = "Let me look at the repository first. "
NEXT_MESSAGE = "Thanks. Which test should I run first?"
NEXT_ANSWER = "Run the package's smoke test first: it is the quickest, and it checks the whole path end to end."
ANSWER = (
    "The repository has a small Python package, its tests and a README. Start with the README, then read the "
    "package's entry point; the tests show how each part is used."
)


# ---- observing the model server and the relay ---------------------------------------------------------------


@dataclass
class TimedBook(ScriptBook):
    """The model server's scripts, noting when each request arrives (wall clock), per script."""

    arrivals: dict[str, list[float]] = field(default_factory=dict)

    def play(self, name: str, body: dict[str, Any], auth: str) -> Plan | ApiError:
        self.arrivals.setdefault(name, []).append(time.time())
        return super().play(name, body, auth)


class TimedHub(StreamHub):
    """The relay's state, noting when the first text delta of each model request (span) arrives (wall clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.first_text: dict[str, dict[str, float]] = {}
        """Per session, per span: the first text delta's arrival."""

    def publish(self, session_id: str, record: PublishRecord) -> list[StreamMessage]:
        if isinstance(record, DeltaRecord) and record.kind == "text" and record.text:
            self.first_text.setdefault(session_id, {}).setdefault(record.span_id, time.time())
        return super().publish(session_id, record)

    def first_text_after(self, session_id: str, after: float) -> float | None:
        times = [at for at in self.first_text.get(session_id, {}).values() if at >= after]
        return min(times) if times else None


# ---- the workload -----------------------------------------------------------------------------------------------


def workload(sessions: int, tool_share: float) -> list[SessionSpec]:
    """Tool-using sessions spread evenly (share 0.5: every other session), identical for every arm."""
    return [SessionSpec(i, int((i + 1) * tool_share) > int(i * tool_share)) for i in range(sessions) if sessions > 0]


def script_steps(spec: SessionSpec, preamble: bool, command: str = "ls -la /workspace") -> list[dict[str, Any]]:
    """The first turn (a tool call first for tool-using sessions), then the answer to the next message."""
    if not spec.uses_tool:
        return [{"text": ANSWER}, {"text": NEXT_ANSWER}]
    call = {"name": "bash", "input": {"command": command}}
    first: dict[str, Any] = {"tool_uses": [call]}
    if preamble:
        first["text"] = PREAMBLE
    return [first, {"text": ANSWER}, {"text": NEXT_ANSWER}]


@dataclass
class Bench:
    args: argparse.Namespace
    client: Client
    model_server: ModelServerThread
    book: TimedBook
    relay: StreamRelayThread
    hub: TimedHub
    engine: docker.DockerClient
    harness_queue: str
    model_queue: str
    pet_queue: str
    model: anthropic.AsyncAnthropic
    peer: PeerProcess | None = None
    """The peer's arm process (`--no-peers`: none)."""
    sessions_made: list[str] = field(default_factory=list)
    peer_threads: list[str] = field(default_factory=list)

    @property
    def relay_url(self) -> str:
        assert self.relay.base_url is not None
        return self.relay.base_url

    def register(self, arm: str, spec: SessionSpec) -> str:
        name = f"{arm}-{spec.index}-{uuid.uuid4().hex[:8]}"
        command = PEER_COMMAND if arm == PEER else "ls -la /workspace"
        self.model_server.register(name, {"steps": script_steps(spec, self.args.preamble, command)})
        return name


# ---- the arms -----------------------------------------------------------------------------------------------


async def direct_session(bench: Bench, spec: SessionSpec) -> Sample:
    """The floor: the SDK's own stream, with the same requests a session's first model call and its next
    message's make."""
    name = bench.register("direct", spec)
    agent = AgentConfig.model_validate({"model": f"script:{name}", "tools": TOOLSET})
    first_request = [{"role": "user", "content": [{"type": "text", "text": FIRST_MESSAGE}]}]
    ttft, stamps = await direct_call(bench, agent, name, first_request)
    if ttft is None:
        return Sample("direct", spec, float("nan"), name, problem="no content delta")
    sample = Sample("direct", spec, ttft, name, stamps)
    await asyncio.sleep(bench.args.think)
    answer = {"role": "assistant", "content": [{"type": "text", "text": ANSWER}]}
    next_request = [*first_request, answer, {"role": "user", "content": [{"type": "text", "text": NEXT_MESSAGE}]}]
    next_ttft, sample.next_stamps = await direct_call(bench, agent, name, next_request)
    if next_ttft is None:
        sample.problem = "no content delta in the next message's response"
    else:
        sample.next_ttft = next_ttft
    return sample


async def direct_call(
    bench: Bench, agent: AgentConfig, name: str, messages: list[dict[str, Any]]
) -> tuple[float | None, dict[str, float]]:
    """One streamed request: seconds to its first content delta (None: there was none), and the timestamps."""
    request: dict[str, Any] = {
        "model": agent.model,
        "max_tokens": agent.max_tokens,
        "messages": messages,
        "tools": build_tools(agent),
    }
    sent_wall, sent = time.time(), time.monotonic()
    first: float | None = None
    first_wall = 0.0
    async with bench.model.messages.stream(**request) as stream:
        async for event in stream:
            if first is None and event.type == "content_block_delta":
                first, first_wall = time.monotonic(), time.time()
        await stream.get_final_message()
    if first is None:
        return None, {}
    arrival = min(at for at in bench.book.arrivals[name] if at >= sent_wall - 0.001)
    return first - sent, {"sent": sent_wall, "model_request": arrival, "client": first_wall}


async def send_first_message(bench: Bench, input: SessionInput, session_id: str) -> WorkflowHandle:
    """Create the session and deliver its first message, the way `--first-message` says."""
    mode = bench.args.first_message
    if mode == "update-with-start":
        operation = WithStartWorkflowOperation(
            SessionWorkflow.run,
            input,
            id=session_id,
            task_queue=bench.harness_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
        update = SendEventsInput(events=[{"type": "user.message", "content": FIRST_MESSAGE}])
        await bench.client.execute_update_with_start_workflow(
            UPDATE_SEND_EVENTS, update, start_workflow_operation=operation, result_type=SendEventsResult
        )
        return await operation.workflow_handle()
    if mode == "start-then-update":
        handle = await start_session(bench.client, input, session_id=session_id, task_queue=bench.harness_queue)
        await send_text(handle, FIRST_MESSAGE)
        return handle
    with_message = input.model_copy(update={"message": FIRST_MESSAGE})
    return await start_session(bench.client, with_message, session_id=session_id, task_queue=bench.harness_queue)


async def session_run(bench: Bench, spec: SessionSpec, arm: str) -> Sample:
    """One session's first turn through corral; `coupled` readies the sandbox before the first message."""
    name = bench.register(arm, spec)
    session_id = new_session_id()
    bench.sessions_made.append(session_id)
    agent = AgentConfig.model_validate({"model": f"script:{name}", "tools": TOOLSET})
    input = SessionInput(agent=agent, model_task_queue=bench.model_queue)
    spans = 2 if spec.uses_tool else 1
    texts: list[tuple[float, float]] = []
    """(monotonic, wall) of each span's first text delta at the client."""
    new_text = asyncio.Event()
    ends = 0
    ended = asyncio.Event()

    async def listen() -> None:
        nonlocal ends
        seen: set[str] = set()
        async with contextlib.aclosing(subscribe(bench.relay_url, session_id)) as events:
            async for event in events:
                if event.type == "delta" and event.kind == "text" and event.span_id not in seen:
                    seen.add(event.span_id)
                    texts.append((time.monotonic(), time.time()))
                    new_text.set()
                elif event.type == "end":
                    ends += 1
                    if ends >= spans:
                        ended.set()

    async def first_text_after(sent: float) -> tuple[float, float]:
        while not any(at >= sent for at, _ in texts):
            new_text.clear()
            await new_text.wait()
        return next((at, wall) for at, wall in texts if at >= sent)

    listener = asyncio.create_task(listen())
    try:
        # Deltas are relayed only to open subscriptions; the relay runs in its own thread, so poll its count.
        while bench.hub.subscriber_count(session_id) < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        sent_wall, sent = time.time(), time.monotonic()
        stamps = {"sent": sent_wall}
        if arm == "coupled":
            await bench.client.execute_workflow(
                PetSetupWorkflow.run,
                PetSetupInput(session_id=session_id, namespace=bench.client.namespace, repo_mb=bench.args.repo_mb),
                id=f"bench-pet-{session_id}",
                task_queue=bench.pet_queue,
            )
            stamps["sandbox_ready"] = time.time()
        handle = await send_first_message(bench, input, session_id)
        first, first_wall = await asyncio.wait_for(first_text_after(sent), 120)
        stamps["client"] = first_wall
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), 120)  # the turn's model calls have streamed; idle follows
        idle = await wait_for_idle(handle, within_seconds=120)
        sample = Sample(arm, spec, first - sent, name, stamps, session_id)
        # The next message, into the same session: the turn a user waits on most often.
        await asyncio.sleep(bench.args.think)
        spans, ended = ends + 1, asyncio.Event()
        next_wall, next_sent = time.time(), time.monotonic()
        await send_text(handle, NEXT_MESSAGE)
        next_first, next_first_wall = await asyncio.wait_for(first_text_after(next_sent), 120)
        sample.next_ttft = next_first - next_sent
        sample.next_stamps = {"sent": next_wall, "client": next_first_wall}
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), 120)
        await wait_for_idle(handle, after=idle[-1].position, within_seconds=120)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    return sample


async def check_and_time(bench: Bench, sample: Sample) -> None:
    """Verify the turn in the session's log, and add the server-side timestamps of the first model call."""
    assert sample.session_id is not None
    handle = bench.client.get_workflow_handle(sample.session_id)
    events = await read_events(handle)
    messages = [e for e in events if e.type == "agent.message"]
    results = [e for e in events if isinstance(e, AgentToolResult)]
    expected = (2 if sample.spec.uses_tool and bench.args.preamble else 1) + 1  # + the next message's answer
    if len(messages) != expected or (sample.spec.uses_tool and (len(results) != 1 or results[0].is_error)):
        sample.problem = f"{len(messages)} agent.message, tool results {[r.is_error for r in results]}"
    history = (await handle.fetch_history()).events
    for stamps in (sample.stamps, sample.next_stamps):
        # The first model call after the message was sent, and the workflow task that scheduled it.
        sent = stamps.get("sent", 0.0)
        scheduled: int | None = None
        task_started = 0.0
        for event in history:
            at = event.event_time.ToMicroseconds() / 1e6
            kind = event.event_type
            if at < sent - 0.001:
                continue
            if scheduled is None and kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                task_started = at
            elif scheduled is None and kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                if event.activity_task_scheduled_event_attributes.activity_type.name == ACTIVITY_MODEL_TURN:
                    scheduled = event.event_id
                    stamps["workflow_task_started"] = task_started
                    stamps["activity_scheduled"] = at
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                if event.activity_task_started_event_attributes.scheduled_event_id == scheduled:
                    stamps["activity_started"] = at
        arrivals = [at for at in bench.book.arrivals.get(sample.script, []) if at >= sent - 0.001]
        if arrivals:
            stamps["model_request"] = min(arrivals)
        relay = bench.hub.first_text_after(sample.session_id, sent)
        if relay is not None:
            stamps["relay"] = relay


async def run_arm(bench: Bench, arm: str, specs: list[SessionSpec]) -> list[Sample]:
    """Every session of `specs` through one arm, `--concurrency` at a time."""
    gate = asyncio.Semaphore(bench.args.concurrency)

    async def one(spec: SessionSpec) -> Sample:
        async with gate:
            # Users do not arrive in lockstep: a pause drawn per session (the same in every arm), not timed.
            await asyncio.sleep(random.Random(spec.index).uniform(0, bench.args.max_pause))
            try:
                if arm == "direct":
                    return await direct_session(bench, spec)
                if arm == PEER:
                    return await peer_session(bench, spec, FIRST_MESSAGE, NEXT_MESSAGE)
                return await session_run(bench, spec, arm)
            except Exception as exc:  # report it with the results, do not lose the run
                return Sample(arm, spec, float("nan"), problem=f"{type(exc).__name__}: {exc}")

    samples = list(await asyncio.gather(*(one(spec) for spec in specs)))
    for sample in samples:
        if sample.session_id is not None and sample.problem is None:
            await check_and_time(bench, sample)
    return samples
