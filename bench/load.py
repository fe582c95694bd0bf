"""Load: many sessions doing turns with tool calls at once on this machine, and every event accounted for.

`--sessions` sessions (default 200) each do `--turns` turns (default 10), all sessions at once, each session's
turns back to back. A turn: the client sends a user message with the `send_events` update (a client id per
message), the scripted model streams a one-line preamble and calls one tool, then answers. Most sessions call the
utility hand's `calculate`; `--sandbox-sessions` of them (default 20) call `bash` in their own Docker sandbox,
with a command that appends a line to `/workspace/runs` (so a command run twice shows).

The stack, as `corral up` runs it: the Temporal dev server (in memory), the offline model server (first token after
`--first-token-latency`, default 0.3 s, then `--tokens-per-second`, default 50) and the stream relay as processes
of their own, and one worker process per role (harness, model, utility hand, sandbox hand) built by
`workers.roles` as shipped. The clients run in this process.

Measured:
  - TTFT per turn at the client: the message sent -> the turn's first text delta from the stream relay
    (`relay.subscribe`, opened before the first message and proven live by a probe record);
  - turn latency as the client sees it: the message sent -> the turn's `session.status_idle` read from the log;
  - both also for one session alone (one utility session, then one sandbox session), measured in the same run
    before the load, so the report prints ratios, not absolute times;
  - throughput (turns and events per second), each process's RSS (before, peak, after) and CPU time per turn.
Then every session's whole log is read and checked: positions 1..N with no gap and no repeat, unique ids, exactly
`--turns` user messages carrying the client ids sent, one tool result per tool use, `--turns` idles ending a turn,
and for sandbox sessions `--turns` lines in the marker file. Whatever does not add up is printed as lost or
duplicated. The histories are read for what went wrong under load (workflow task failures and time-outs, activity
retries), and so are the RPC errors the client met and the workers' log warnings. Every session is terminated and
its sandbox removed at the end.

    python -m bench.load            # 200 sessions x 10 turns, 20 with a sandbox
    python -m bench.load --quick    # 20 sessions x 3 turns, 4 with a sandbox: a smoke run

No goal is asserted: the figures are printed beside the single-session baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import httpx
from temporalio.api.enums.v1 import EventType, TimeoutType
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

from activities.sandbox import engine_task_queue
from bench._load_report import report, summary
from bench._report import (
    ROOT,
    add_run_options,
    begin_run,
    child_pid,
    cpu_seconds,
    log_gaps_and_repeats,
    rss_bytes,
    write_results,
)
from bench._workers import (
    WorkerConfig,
    WorkerProcess,
    spawn_server,
    spawn_worker,
    wait_until_healthy,
    wait_until_polling,
)
from bench.recovery import command_runs
from corral.client import read_events, send_text, start_session, wait_for_idle
from corral.contract.events import AgentToolResult, SessionEvent, SessionStatusIdle, UserMessage
from corral.contract.session import AgentConfig, SessionInput
from corral.temporal import start_local_temporal
from relay import DeltaRecord, EndRecord, PublishRecord, StartRecord, StreamPublisher, subscribe
from sandbox import ensure_docker_engine, ensure_sandbox_image
from sandbox.sessions import SESSION_LABEL, remove_session

COMMAND = "echo run >> /workspace/runs"
"""The sandbox sessions' tool call: one line per run, counted by `bench.recovery.command_runs`."""
PREAMBLE = "Let me work that out with a tool first."
ANSWER = "The tool has answered, and its result is in the log above: that is all this turn needed."
TOOLS = {False: [{"type": "corral_utility"}], True: [{"type": "agent_toolset_20260401"}]}
CALLS = {
    False: {"name": "calculate", "input": {"expression": "6*7"}},
    True: {"name": "bash", "input": {"command": COMMAND}},
}
HISTORY_COUNTED = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "workflow task failed",
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "workflow task timed out",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity task failed",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity task timed out",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: "continued as new",
}
LOG = "log: positions 1..N, no gap, no repeated position or event id"
USERS = "user.message: one per client id sent"
LOG_LEVEL = re.compile(r"\b(WARN|WARNING|ERROR|CRITICAL)\b(.*)")


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
class Checked:
    """What reading every log, history and marker file found."""

    lost: Counter[str] = field(default_factory=Counter)
    duplicated: Counter[str] = field(default_factory=Counter)
    findings: Counter[str] = field(default_factory=Counter)
    """Counts of things that went wrong without losing anything (tool errors, task failures, retries)."""
    messages: Counter[str] = field(default_factory=Counter)
    """Distinct failure messages from the histories, with how often each was seen."""
    waits: dict[str, list[float]] = field(default_factory=dict)
    """Seconds each task waited in its queue (scheduled -> started), by queue: workflow tasks, each activity."""
    events: int = 0
    containers_left: int = 0


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

    def pid(self, name: str) -> int:
        process = self.processes[name]
        return process if isinstance(process, int) else process.pid


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
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample(load, stop))
    began = time.monotonic()
    load.load_average.append(os.getloadavg()[0])
    progress = asyncio.create_task(report_progress(load, began))
    await asyncio.gather(*(converse(load, session, args.turns, began) for session in load.loaded))
    load.wall = time.monotonic() - began
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


# ---- accounting ---------------------------------------------------------------------------------------------


def check_log(checked: Checked, session: Session, events: list[SessionEvent], turns: int) -> None:
    """Lost and duplicated events of one session, by what was sent and what each turn must have written."""
    gaps, repeats = log_gaps_and_repeats(events)
    checked.lost[LOG] += gaps
    checked.duplicated[LOG] += repeats
    checked.events += len(events)
    users = [event.client_id for event in events if isinstance(event, UserMessage)]
    logged = Counter(users)
    checked.lost[USERS] += sum(1 for cid in session.client_ids if cid not in logged)
    checked.duplicated[USERS] += sum(count - 1 for count in logged.values())
    checked.duplicated[USERS] += sum(1 for cid in logged if cid not in session.client_ids)
    uses = [event.id for event in events if event.type == "agent.tool_use"]
    checked.lost["agent.tool_use (one per turn)"] += max(0, turns - len(uses))
    checked.duplicated["agent.tool_use (one per turn)"] += max(0, len(uses) - turns)
    results = Counter(event.tool_use_id for event in events if isinstance(event, AgentToolResult))
    checked.lost["agent.tool_result (one per tool use)"] += sum(1 for use in uses if use not in results)
    checked.duplicated["agent.tool_result (one per tool use)"] += sum(count - 1 for count in results.values())
    idles = [event for event in events if isinstance(event, SessionStatusIdle)]
    ends = sum(1 for event in idles if event.stop_reason.type == "end_turn")
    checked.lost["session.status_idle end_turn (one per turn)"] += max(0, turns - ends)
    checked.duplicated["session.status_idle end_turn (one per turn)"] += max(0, ends - turns)
    checked.findings["idle for another reason than end_turn"] += len(idles) - ends
    checked.findings["tool results that are errors"] += sum(
        1 for event in events if isinstance(event, AgentToolResult) and event.is_error
    )
    checked.findings["session.error events"] += sum(1 for event in events if event.type == "session.error")


async def check_history(checked: Checked, load: Load, session: Session) -> None:
    """What went wrong in every run of the session's workflow (failed or timed-out tasks, retried activities), and
    how long each task waited in its queue (scheduled -> started)."""
    run_id: str | None = None
    while True:
        handle = load.client.get_workflow_handle(session.id, run_id=run_id)
        history = await handle.fetch_history()
        scheduled: dict[int, tuple[str, float]] = {}
        for event in history.events:
            at = event.event_time.ToMicroseconds() / 1e6
            kind = HISTORY_COUNTED.get(event.event_type)
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                timeout = event.workflow_task_timed_out_event_attributes.timeout_type
                kind = f"{kind} ({TimeoutType.Name(timeout).removeprefix('TIMEOUT_TYPE_')})"
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                timed_out = event.activity_task_timed_out_event_attributes
                timeout = timed_out.failure.timeout_failure_info.timeout_type
                activity = scheduled.get(timed_out.scheduled_event_id, ("an activity", 0.0))[0]
                kind = f"{activity} timed out ({TimeoutType.Name(timeout).removeprefix('TIMEOUT_TYPE_')})"
            if kind is not None:
                checked.findings[kind] += 1
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                scheduled[event.event_id] = ("workflow task (harness)", at)
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                name = event.activity_task_scheduled_event_attributes.activity_type.name
                scheduled[event.event_id] = (f"`{name}` activity", at)
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                queue, since = scheduled[event.workflow_task_started_event_attributes.scheduled_event_id]
                checked.waits.setdefault(queue, []).append(at - since)
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                started = event.activity_task_started_event_attributes
                queue, since = scheduled[started.scheduled_event_id]
                if started.attempt > 1:
                    checked.findings[f"{queue} started again (attempt > 1)"] += 1
                    checked.messages[f"{queue} retried after: {started.last_failure.message}"] += 1
                else:
                    checked.waits.setdefault(queue, []).append(at - since)
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                attributes = event.workflow_task_failed_event_attributes
                checked.messages[f"workflow task failed ({attributes.cause}): {attributes.failure.message}"] += 1
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
                failure = event.activity_task_failed_event_attributes.failure
                checked.messages[f"activity failed: {failure.message}"] += 1
        first = history.events[0].workflow_execution_started_event_attributes
        if not first.continued_execution_run_id:
            return
        run_id = first.continued_execution_run_id


async def account(load: Load) -> None:
    """Read every load session's log and history, and count each sandbox command's runs."""
    gate = asyncio.Semaphore(16)
    checked = load.checked

    async def one(session: Session) -> None:
        async with gate:
            events = await read_events(session.handle)
            check_log(checked, session, events, load.args.turns)
            await check_history(checked, load, session)
            if session.sandbox:
                assert load.engine is not None
                runs = await asyncio.to_thread(command_runs, load.engine, session.id)
                if runs < 0:
                    checked.findings["sandbox sessions with no container"] += 1
                checked.lost["sandbox command runs (one per turn)"] += max(0, load.args.turns - max(runs, 0))
                checked.duplicated["sandbox command runs (one per turn)"] += max(0, runs - load.args.turns)

    await asyncio.gather(*(one(session) for session in load.loaded))
    for session in load.baseline:
        await check_history(load.alone_checked, load, session)


def scan_logs(load: Load) -> None:
    """Warnings and errors each process logged, by message."""
    for name, log in load.logs.items():
        lines: Counter[str] = Counter()
        for line in log.read_text(errors="replace").splitlines():
            found = LOG_LEVEL.search(line)
            if found:
                lines[f"{found.group(1)} {log_message(found.group(2))}"] += 1
        load.log_lines[name] = lines


def log_message(text: str) -> str:
    """What a logged line says, without what varies (times, ids, numbers); of the Temporal server's logfmt lines,
    their `msg` and `error`."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # the SDK core's colours
    fields = re.findall(r'\b(msg|error)="([^"]*)"', text)
    if fields:
        text = " ".join(f"{key}={value}" for key, value in fields)
    return re.sub(r"[0-9a-f]{8,}|\d+(\.\d+)?", "#", text.strip())[:160]


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Point this process's stdout and stderr at `log` while a child process starts, so that the child writes
    there: the SDK starts the Temporal dev server with our own output and has no option to change it."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with log.open("ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


async def clean_up(load: Load) -> None:
    """Terminate every session made and remove the sandboxes; counts the containers of ours left behind."""
    gate = asyncio.Semaphore(8)

    async def one(session: Session) -> None:
        async with gate:
            if session.listener is not None:
                session.listener.cancel()
            with contextlib.suppress(Exception):  # already closed
                await session.handle.terminate("load benchmark done")
            if session.sandbox and load.engine is not None:
                await asyncio.to_thread(remove_session, load.engine, session.id, True)

    await asyncio.gather(*(one(session) for session in load.sessions))
    if load.engine is not None:
        ours = {session.id for session in load.sessions}
        left = await asyncio.to_thread(load.engine.containers.list, all=True, filters={"label": SESSION_LABEL})
        load.checked.containers_left = sum(1 for c in left if c.labels.get(SESSION_LABEL) in ours)


# ---- main ---------------------------------------------------------------------------------------------------


async def register_script(model_url: str, name: str, sandbox: bool) -> None:
    script = {"steps": [{"text": PREAMBLE, "tool_uses": [CALLS[sandbox]]}, {"text": ANSWER}], "loop": True}
    async with httpx.AsyncClient() as http:
        (await http.put(f"{model_url}/_corral/scripts/{name}", json=script)).raise_for_status()


async def measure(args: argparse.Namespace) -> Load:
    log_dir = Path(tempfile.mkdtemp(prefix="corral-bench-load-"))
    engine = image = None
    if args.sandbox_sessions:
        engine = ensure_docker_engine(ROOT / ".corral")
        image = ensure_sandbox_image(engine, ROOT / ".corral")
    paced = [f"--first-token-latency={args.first_token_latency}", f"--tokens-per-second={args.tokens_per_second}"]
    model_server, model_url = spawn_server("modelserver", "model-server", log_dir, *paced, "--log-level=warning")
    relay, relay_url = spawn_server("relay", "stream-relay", log_dir, "--log-level=warning")
    with output_to(log_dir / "temporal.log"):
        env = await start_local_temporal(dev_server_log_level="warn")
    rpc_errors = RpcErrors()
    client = Client(
        env.client.service_client,
        namespace=env.client.namespace,
        data_converter=env.client.data_converter,
        interceptors=[rpc_errors],
    )
    engine_queue = engine_task_queue(engine) if engine is not None else None
    config = WorkerConfig.fresh(
        env.client, log_dir, model_url=model_url, stream_url=relay_url, image=image, engine_queue=engine_queue
    )
    roles = ["harness", "model", "utility"] + (["sandbox"] if engine is not None else [])
    workers = {f"{role} worker": spawn_worker(config, (role,), role) for role in roles}
    processes: dict[str, WorkerProcess | int] = {**workers, "model server": model_server, "stream relay": relay}
    temporal = child_pid("temporal")
    if temporal is not None:
        processes["Temporal dev server"] = temporal
    load = Load(args, client, config, relay_url, StreamPublisher(relay_url), engine, processes, rpc_errors)
    load.logs = {name: process.log for name, process in processes.items() if isinstance(process, WorkerProcess)}
    load.logs["Temporal dev server"] = log_dir / "temporal.log"
    try:
        for server, url in ((model_server, model_url), (relay, relay_url)):
            await wait_until_healthy(server, url)
        for worker in workers.values():
            await wait_until_polling(client, config, worker)
        kinds = (False, True) if engine is not None else (False,)
        for sandbox in kinds:
            load.scripts[sandbox] = f"load-{uuid.uuid4().hex[:8]}-{'sandbox' if sandbox else 'utility'}"
            await register_script(model_url, load.scripts[sandbox], sandbox)
        print(f"stack up (logs in {log_dir}); warming up, then one session alone", flush=True)
        for sandbox in kinds:
            warm = await open_session(load, -2, sandbox)
            await converse(load, warm, 1, time.monotonic())
            load.baseline.append(await alone(load, sandbox))
        await run_load(load)
        print(f"load done in {load.wall:.1f}s; reading every log and history", flush=True)
        await account(load)
    finally:
        with contextlib.suppress(Exception):
            await clean_up(load)
        await load.publisher.aclose()
        for worker in workers.values():
            worker.stop()
        await env.shutdown()
        relay.stop()
        model_server.stop()
    scan_logs(load)
    return load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200, help="sessions at once (default 200)")
    parser.add_argument("--turns", type=int, default=10, help="turns per session (default 10)")
    parser.add_argument(
        "--sandbox-sessions", type=int, default=None, help="of them, calling bash in a sandbox (default 20; 0: none)"
    )
    parser.add_argument("--first-token-latency", type=float, default=0.3, help="model, seconds (default 0.3)")
    parser.add_argument("--tokens-per-second", type=float, default=50.0, help="model streaming rate (default 50)")
    parser.add_argument("--turn-timeout", type=float, default=600.0, help="seconds a turn may take (default 600)")
    parser.add_argument("--output", default="load", help="results file name in bench/results/ (default load)")
    parser.add_argument("--quick", action="store_true", help="20 sessions x 3 turns, 4 with a sandbox: a smoke run")
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    if args.quick:
        args.sessions, args.turns = 20, 3
        args.output = "load-quick" if args.output == "load" else args.output  # keep the full run's results
    if args.sandbox_sessions is None:
        args.sandbox_sessions = 4 if args.quick else 20
    args.sandbox_sessions = min(args.sandbox_sessions, args.sessions)
    load = asyncio.run(measure(args))
    body = report(load)
    print()
    print(body)
    path = write_results(args.output, "Load: concurrent sessions with tool calls", body, summary=summary(load))
    print(f"\nwritten to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
