"""Recovery after SIGKILL: for each worker role, kill the process doing a session's work mid-turn while a standby
process of the same role runs, and measure how long until the session's next event, and whether anything was
lost or doubled.

For each role (harness, model, sandbox hand), `--kills` times (default 5):
  1. a control turn, not killed: time from the kill point to the next event (what the turn costs anyway);
  2. a killed turn: at the same point, SIGKILL the process that holds the work, found by its Temporal identity
     (`pid@host`: the last workflow task's worker for the harness, the running activity's worker otherwise);
     time from the kill to the next event;
  3. a fresh standby replaces the killed process before the next trial.
Kill points: harness, 0.3 s after the model call started (the workflow sits in the dead worker's cache); model,
0.3 s into the model call (the stream is open, waiting for the first token); sandbox, 0.5 s into a `bash` command
that runs 2 s in the container. The next event's time is its `created_at` (workflow time, the start of the
workflow task that wrote it), read from the log once the turn is over: the client never queries a workflow
whose worker is dead while the clock runs.

What governs the times (corral's settings, read from its code when the report is printed): a lost model worker
is noticed when the model activity's heartbeat timeout (`MODEL_HEARTBEAT_TIMEOUT`) passes, a lost sandbox worker
when the hand's (`SANDBOX_HEARTBEAT_TIMEOUT`) does; Temporal then retries after `INFRASTRUCTURE_RETRY`'s first
interval on the standby, which makes the model call again or resumes the command without running it again. A model
turn routed to the lost worker's own queue (workflows/_hands.py `ModelRoute`) is not retried there: the session
sends it to the shared queue at once, where the standby takes it (`--no-model-routing` runs the model workers on the
shared queue only, as before routing). A lost harness is noticed when its sticky queue's schedule-to-start timeout
(`STICKY_TIMEOUT` in workers/run.py) passes; the standby then replays the history. The report sets beside each
role when the standby would resume if every timer fired exactly when due, and ends with the false heartbeat
timeouts a `bench.load` run found (`--load-report`, default bench/results/load.md: run the load benchmark first).

After all trials each session's log is checked: positions 1..N with no gap and no duplicate, unique ids, one
`agent.message` per user message, and (sandbox) each command ran exactly once (a line per run in the workspace).

    python -m bench.recovery            # 5 kills per role (about 4 minutes)
    python -m bench.recovery --quick    # 2 kills per role

Goal (issue 5; printed, never asserted): the next event within 5 s at p50 and 10 s at p95; 0 lost, 0 duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.models.containers import Container
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle

from activities.sandbox import engine_task_queue
from bench._recovery_report import (
    COMMAND_SECONDS,
    KILL_AFTER,
    RoleResult,
    Trial,
    figure,
    report,
    summary,
)
from bench._report import ROOT, add_run_options, begin_run, write_results
from bench._workers import WorkerConfig, WorkerProcess, spawn_worker, wait_until_polling
from corral.client import read_events, send_text, start_session, wait_for_idle
from corral.contract.events import SessionEvent
from corral.contract.session import AgentConfig, SessionInput
from corral.names import ACTIVITY_EXECUTE, ACTIVITY_MODEL_TURN
from corral.temporal import start_local_temporal
from modelserver import ModelServerThread
from sandbox import ensure_docker_engine, ensure_sandbox_image
from sandbox.sessions import SESSION_LABEL, remove_session

ROLES = ("harness", "model", "sandbox")
COMMAND = f"echo run >> /workspace/runs; sleep {COMMAND_SECONDS}; echo done"


@dataclass
class Rig:
    """The processes serving one role's trials: two of the role under test, one with the roles it needs."""

    client: Client
    config: WorkerConfig
    role: str
    pair: list[WorkerProcess]
    rest: WorkerProcess | None
    spawned: int = 0

    async def add_standby(self) -> None:
        self.spawned += 1
        worker = spawn_worker(self.config, (self.role,), f"{self.role}-{self.spawned}")
        self.pair.append(worker)
        await wait_until_polling(self.client, self.config, worker)

    def by_identity(self, identity: str) -> WorkerProcess:
        for worker in self.pair:
            if worker.identity == identity:
                return worker
        raise LookupError(f"no {self.role} process of this rig has identity {identity!r}")

    def stop(self) -> None:
        for worker in [*self.pair, *([self.rest] if self.rest else [])]:
            worker.stop()


# ---- finding the process that holds the work ------------------------------------------------------------------


async def running_activity(handle: WorkflowHandle, activity: str, within: float = 30) -> str:
    """The identity of the worker running the session's `activity` (waits until one has started it)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        description = await handle.describe()
        for pending in description.raw_description.pending_activities:
            started = pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            if pending.activity_type.name == activity and started and pending.last_worker_identity:
                return pending.last_worker_identity
        await asyncio.sleep(0.02)
    raise TimeoutError(f"no {activity} activity started within {within}s")


async def last_workflow_task_worker(handle: WorkflowHandle) -> str:
    """The identity of the harness that completed the latest workflow task: it holds the workflow (sticky)."""
    identity = ""
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            identity = event.workflow_task_completed_event_attributes.identity
    return identity


async def until_event(handle: WorkflowHandle, event_type: str, after: int, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if any(event.type == event_type for event in await read_events(handle, after=after)):
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"no {event_type} after position {after} within {within}s")


async def kill_point(rig: Rig, handle: WorkflowHandle, after: int) -> str:
    """Wait for this role's kill point in the turn just sent; returns the identity holding the work."""
    if rig.role == "harness":
        await until_event(handle, "span.model_request_start", after)
        await asyncio.sleep(KILL_AFTER["harness"])
        return await last_workflow_task_worker(handle)
    activity = ACTIVITY_MODEL_TURN if rig.role == "model" else ACTIVITY_EXECUTE
    identity = await running_activity(handle, activity)
    await asyncio.sleep(KILL_AFTER[rig.role])
    return identity


async def history_length(handle: WorkflowHandle) -> int:
    """How many events the workflow's history has (read from the server, no worker involved)."""
    return len([event async for event in handle.fetch_history_events()])


async def until_workflow_task_completed(handle: WorkflowHandle, after_event: int, within: float = 120) -> None:
    """Wait, reading history only, until a workflow task completes after history event `after_event`: a worker
    has written the session's next events. Queries would wait on a dead worker's sticky queue meanwhile."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        async for event in handle.fetch_history_events():
            if event.event_id > after_event and event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no workflow task completed within {within}s")


async def turn(rig: Rig, handle: WorkflowHandle, number: int, kill: bool) -> tuple[float, float]:
    """One user message; returns seconds from the kill point (killing or not) to the session's next event, and
    to the standby resuming the lost work (NaN when nothing was lost)."""
    before = (await read_events(handle))[-1].position
    await send_text(handle, f"turn {number}")
    identity = await kill_point(rig, handle, before)
    last = (await read_events(handle))[-1].position  # nothing is written between here and the next event
    mark = await history_length(handle)
    if kill:
        victim = rig.by_identity(identity)
        rig.pair.remove(victim)
        victim.kill()
    point = time.time()
    await until_workflow_task_completed(handle, mark)
    events = await wait_for_idle(handle, after=last, within_seconds=120)
    return events[0].created_at.timestamp() - point, await resumed_at(handle, mark) - point


async def resumed_at(handle: WorkflowHandle, after_event: int) -> float:
    """When a worker started the work in flight at history event `after_event` anew: the first workflow task
    started after a timed-out one, a retried attempt of an activity (its started event carries the attempt), or
    an activity started after one timed out (a routed model turn falls back to the shared queue as a new
    activity). Without any (no kill), NaN."""
    timed_out = activity_timed_out = False
    for event in [event async for event in handle.fetch_history_events()]:
        if event.event_id <= after_event:
            continue
        at = event.event_time.ToMicroseconds() / 1e6
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            timed_out = True
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            activity_timed_out = True
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and timed_out:
            return at
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            if activity_timed_out or event.activity_task_started_event_attributes.attempt > 1:
                return at
    return float("nan")


# ---- checking the log ---------------------------------------------------------------------------------------


def check_log(result: RoleResult, events: list[SessionEvent], runs: int | None) -> None:
    """Lost and duplicated events: positions, ids, one agent.message per user message, commands run once."""
    positions = [event.position for event in events]
    expected = set(range(1, (max(positions) if positions else 0) + 1))
    result.lost += len(expected - set(positions))
    result.duplicated += len(positions) - len(set(positions))
    result.duplicated += len(events) - len({event.id for event in events})
    kinds = Counter(event.type for event in events)
    users, answers = kinds["user.message"], kinds["agent.message"]
    result.turns = users
    result.lost += max(0, users - answers)
    result.duplicated += max(0, answers - users)
    if runs is not None:
        calls = kinds["agent.tool_use"]
        result.lost += max(0, calls - runs) + max(0, calls - kinds["agent.tool_result"])
        result.duplicated += max(0, runs - calls) + max(0, kinds["agent.tool_result"] - calls)
        result.notes.append(f"{calls} bash calls, the command ran {runs} times")


MARKER_READS = 5
"""How often a marker file is read before giving up: Docker 20.10 sometimes hands back a short exec's output empty
under load (the process ended before the output was attached), which read as "0 lines", a loss that never was."""


COUNT_MARKER_LINES = "if [ -e /workspace/runs ]; then wc -l < /workspace/runs; else echo 0; fi"
"""A file that is there but cannot be read fails the exec (it is read again), rather than counting as none."""


def marker_lines(container: Container) -> tuple[int, int]:
    """How many lines the container's marker file holds (0 if it has none), and how many reads before gave no
    count (an empty output, or an exec that failed). RuntimeError if no read in `MARKER_READS` gave one."""
    said = []
    for empty in range(MARKER_READS):
        result = container.exec_run(["sh", "-c", COUNT_MARKER_LINES])
        text = result.output.decode(errors="replace").strip()
        if result.exit_code == 0 and text.isdigit():
            return int(text), empty
        said.append(f"exit {result.exit_code}: {text[:80]!r}")
    raise RuntimeError(f"the marker file of {container.name} could not be read: {'; '.join(said)}")


def command_runs(engine: docker.DockerClient, session_id: str) -> tuple[int, int]:
    """How many times the benchmark's command ran in the session's container (one line per run; -1: no container),
    and how many reads of it gave no count before one did."""
    containers = engine.containers.list(filters={"label": f"{SESSION_LABEL}={session_id}"})
    if not containers:
        return -1, 0
    return marker_lines(containers[0])


# ---- running -------------------------------------------------------------------------------------------------


async def run_role(
    client: Client,
    base: WorkerConfig,
    model_server: ModelServerThread,
    engine: docker.DockerClient,
    role: str,
    args: argparse.Namespace,
) -> RoleResult:
    suffix = uuid.uuid4().hex[:8]
    config = dataclasses.replace(base, harness_queue=f"bench-harness-{suffix}", model_queue=f"bench-model-{suffix}")
    needs = {"harness": ("model",), "model": ("harness",), "sandbox": ("harness", "model")}[role]
    rest = spawn_worker(config, needs, f"rest-{role}")
    rig = Rig(client, config, role, [], rest)
    result = RoleResult(role, routing=args.model_routing)
    script = f"recovery-{role}-{suffix}"
    if role == "sandbox":
        steps: list[dict[str, Any]] = [
            {"tool_uses": [{"name": "bash", "input": {"command": COMMAND}}]},
            {"text": "The command finished."},
        ]
    else:
        steps = [{"text": "An answer of a dozen words or so, streamed token by token to the client."}]
    model_server.register(script, {"steps": steps, "loop": True})
    agent = AgentConfig.model_validate(
        {"model": f"script:{script}", "tools": [{"type": "agent_toolset_20260401"}] if role == "sandbox" else []}
    )
    handle: WorkflowHandle | None = None
    try:
        await wait_until_polling(client, config, rest)
        for _ in range(2):
            await rig.add_standby()
        input = SessionInput(agent=agent, model_task_queue=config.model_queue)
        handle = await start_session(client, input, task_queue=config.harness_queue)
        number = 1
        await send_text(handle, "warm-up")  # provisions the sandbox, fills caches
        await wait_for_idle(handle, within_seconds=120)
        for trial in range(args.kills):
            number += 1
            control, _ = await turn(rig, handle, number, kill=False)
            number += 1
            killed, resumed = await turn(rig, handle, number, kill=True)
            result.trials.append(Trial(control, killed, resumed))
            print(
                f"{role:<8} kill {trial + 1}/{args.kills}: standby resumed after {resumed:5.2f}s, next event "
                f"after {killed:5.2f}s (without a kill {control:4.2f}s)",
                flush=True,
            )
            await rig.add_standby()
        events = await read_events(handle)
        runs = command_runs(engine, handle.id)[0] if role == "sandbox" else None
        check_log(result, events, runs)
    finally:
        rig.stop()
        if handle is not None:
            with contextlib.suppress(Exception):
                await handle.terminate("benchmark done")
            if role == "sandbox":
                await asyncio.to_thread(remove_session, engine, handle.id, True)
    return result


async def measure(args: argparse.Namespace) -> list[RoleResult]:
    state_dir = ROOT / ".corral"
    engine = ensure_docker_engine(state_dir)
    image = ensure_sandbox_image(engine, state_dir)
    server = ModelServerThread(first_token_latency=args.first_token_latency, tokens_per_second=args.tokens_per_second)
    model_url = server.start()
    env = await start_local_temporal(dev_server_log_level="error")
    base = WorkerConfig(
        address=env.client.service_client.config.target_host,
        harness_queue="",
        model_queue="",
        model_url=model_url,
        image=image,
        engine_queue=engine_task_queue(engine),
        log_dir=Path(tempfile.mkdtemp(prefix="corral-bench-recovery-")),
        model_routing=args.model_routing,
    )
    print(f"worker logs in {base.log_dir}", flush=True)
    try:
        return [await run_role(env.client, base, server, engine, role, args) for role in args.roles]
    finally:
        await env.shutdown()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs per role (default 5)")
    parser.add_argument("--roles", default=",".join(ROLES), help="comma-separated (default all three)")
    parser.add_argument("--first-token-latency", type=float, default=1.0, help="seconds (default 1.0)")
    parser.add_argument("--tokens-per-second", type=float, default=50.0, help="default 50")
    parser.add_argument("--output", default="recovery", help="results file name in bench/results/")
    parser.add_argument("--quick", action="store_true", help="2 kills per role, results in recovery-quick.md")
    parser.add_argument(
        "--no-model-routing",
        dest="model_routing",
        action="store_false",
        help="model workers on the shared queue only (as before routing), to compare",
    )
    parser.add_argument(
        "--load-report",
        default="load",
        help="results of a `bench.load` run to quote for false heartbeat timeouts (default load)",
    )
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    args.roles = [role for role in args.roles.split(",") if role]
    if args.quick:
        args.kills = 2
        args.output = "recovery-quick" if args.output == "recovery" else args.output  # keep the full run's results
    results = asyncio.run(measure(args))
    body = report(args, results)
    print()
    print(body)
    title = "Recovery after SIGKILL of each worker role"
    path = write_results(args.output, title, body, figure(results), summary(args, results))
    print(f"\nwritten to {path.relative_to(ROOT)} and {path.with_suffix('.png').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
