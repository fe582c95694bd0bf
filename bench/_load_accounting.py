"""The load benchmark's accounting: every session's log, history and marker file read back, and what each process
logged; whatever does not add up is counted as lost or duplicated, whatever went wrong without loss as a finding."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import docker
from docker.models.containers import Container
from temporalio.api.enums.v1 import EventType, TimeoutType

from bench._report import log_gaps_and_repeats
from bench.recovery import MARKER_READS, command_runs, marker_lines
from corral.client import read_events
from corral.contract.events import AgentToolResult, SessionError, SessionEvent, SessionStatusIdle, UserMessage
from corral.names import ACTIVITY_EXECUTE, ACTIVITY_MODEL_TURN, ACTIVITY_PROVISION_SANDBOX
from sandbox.sessions import SESSION_LABEL
from sandbox.workspace import SANDBOX_GID, SANDBOX_UID

if TYPE_CHECKING:
    from bench._load_clients import Load, Session

HISTORY_COUNTED = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "workflow task failed",
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "workflow task timed out",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity task failed",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity task timed out",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: "continued as new",
}
ROUTED_FALLBACK = "routed model turns sent on to the shared queue (not started on their worker's queue in time)"
"""A model turn on the queue of the worker that served the session's last turn that no worker took within
`ROUTED_SCHEDULE_TO_START`: the workflow sends it again on the shared queue (workflows/_hands.py). Counted apart
from the time-outs, which count it too: it is a turn that waited again, at the back of another queue."""
LOG = "log: positions 1..N, no gap, no repeated position or event id"
USERS = "user.message: one per client id sent"
LOG_LEVEL = re.compile(r"\b(WARN|WARNING|ERROR|CRITICAL)\b(.*)")


@dataclass
class Checked:
    """What reading every log, history and marker file found."""

    lost: Counter[str] = field(default_factory=Counter)
    duplicated: Counter[str] = field(default_factory=Counter)
    findings: Counter[str] = field(default_factory=Counter)
    """Counts of things that went wrong without losing anything (tool errors, task failures, retries)."""
    messages: Counter[str] = field(default_factory=Counter)
    """Distinct failure messages from the histories, with how often each was seen."""
    short_markers: list[str] = field(default_factory=list)
    """What was found of each sandbox session whose marker file is short, and of each uneven container (whole)."""
    waits: dict[str, list[float]] = field(default_factory=dict)
    """Seconds each task waited in its queue (scheduled -> started), by queue: workflow tasks, each activity."""
    events: int = 0
    containers_left: int = 0
    history: Counter[str] = field(default_factory=Counter)
    """Per session run, summed: history events, workflow tasks completed, activity tasks scheduled, and the server's
    state transitions (from each run's description: the unit a hosted Temporal bills by)."""


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
    turn = 0
    for event in events:
        turn += isinstance(event, UserMessage)
        if isinstance(event, SessionError):  # which session, and when in it: a short marker file may be the same one
            checked.findings["session.error events"] += 1
            checked.messages[f"{session.id}: session.error in turn {turn}: {event.error.message[:120]}"] += 1


async def check_history(checked: Checked, load: Load, session: Session) -> None:
    """What went wrong in every run of the session's workflow (failed or timed-out tasks, retried activities), and
    how long each task waited in its queue (scheduled -> started)."""
    run_id: str | None = None
    while True:
        handle = load.client.get_workflow_handle(session.id, run_id=run_id)
        history = await handle.fetch_history()
        described = await handle.describe()
        checked.history["state transitions"] += described.raw_description.workflow_execution_info.state_transition_count
        scheduled: dict[int, tuple[str, float]] = {}
        routed: set[int] = set()
        for event in history.events:
            at = event.event_time.ToMicroseconds() / 1e6
            checked.history["history events"] += 1
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                checked.history["workflow tasks completed"] += 1
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                checked.history["activity tasks scheduled"] += 1
            kind = HISTORY_COUNTED.get(event.event_type)
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                timeout = event.workflow_task_timed_out_event_attributes.timeout_type
                kind = f"{kind} ({TimeoutType.Name(timeout).removeprefix('TIMEOUT_TYPE_')})"
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                timed_out = event.activity_task_timed_out_event_attributes
                timeout = timed_out.failure.timeout_failure_info.timeout_type
                activity = scheduled.get(timed_out.scheduled_event_id, ("an activity", 0.0))[0]
                kind = f"{activity} timed out ({TimeoutType.Name(timeout).removeprefix('TIMEOUT_TYPE_')})"
                if timed_out.scheduled_event_id in routed and timeout == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START:
                    checked.findings[ROUTED_FALLBACK] += 1
            if kind is not None:
                checked.findings[kind] += 1
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                scheduled[event.event_id] = ("workflow task (harness)", at)
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduling = event.activity_task_scheduled_event_attributes
                name = scheduling.activity_type.name
                scheduled[event.event_id] = (f"`{name}` activity", at)
                if name == ACTIVITY_MODEL_TURN and "@" in scheduling.task_queue.name:
                    routed.add(event.event_id)
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
                try:
                    runs, empty = await asyncio.to_thread(command_runs, load.engine, session.id)
                except RuntimeError as exc:  # counted as lost: a run not confirmed is not counted as done
                    runs, empty = 0, MARKER_READS
                    checked.short_markers.append(str(exc))
                if empty:
                    checked.findings["marker file reads that gave no count (read again)"] += empty
                if runs < 0:
                    checked.findings["sandbox sessions with no container"] += 1
                elif runs < load.args.turns:  # which sessions, so that a short count can be looked into
                    checked.findings["sandbox sessions whose marker file is short"] += 1
                    containers = await asyncio.to_thread(session_containers, load.engine, session.id)
                    trail = await sandbox_trail(session)
                    looked = await asyncio.to_thread(look_inside, load.engine, session.id)
                    checked.short_markers.append(
                        f"{session.id}: {runs} marker lines for {load.args.turns} turns; containers: {containers}; "
                        f"its history: {trail}; inside: {looked}"
                    )
                checked.lost["sandbox command runs (one per turn)"] += max(0, load.args.turns - max(runs, 0))
                checked.duplicated["sandbox command runs (one per turn)"] += max(0, runs - load.args.turns)

    await asyncio.gather(*(one(session) for session in load.loaded))
    for session in load.baseline:
        await check_history(load.alone_checked, load, session)
    if checked.findings["sandbox sessions whose marker file is short"] and load.engine is not None:
        # Where did the short sessions' lines go: any container, of any session of the run (the baseline's too),
        # whose marker file does not hold one line per turn.
        for line in await asyncio.to_thread(uneven_containers, load.engine, load.args.turns):
            checked.short_markers.append(f"marker file not of {load.args.turns} lines: {line}")


async def sandbox_trail(session: Session) -> str:
    """What the session's history says of its sandbox: each container a `provision_sandbox` returned (name and
    id), and each `execute` that completed: its call, the container it was sent to, its attempt, the worker that
    ran it and what it returned."""
    said: list[str] = []
    history = await session.handle.fetch_history()
    scheduled: dict[int, tuple[str, bytes]] = {}
    attempts: dict[int, int] = {}
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            payloads = attributes.input.payloads
            scheduled[event.event_id] = (attributes.activity_type.name, payloads[0].data if payloads else b"")
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            attempts[started.scheduled_event_id] = started.attempt
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            kind, sent = scheduled.get(done.scheduled_event_id, ("", b""))
            data = done.result.payloads[0].data if done.result.payloads else b""
            if kind == ACTIVITY_PROVISION_SANDBOX:
                handle = json.loads(data)
                said.append(f"provisioned {handle.get('container_name')} ({str(handle.get('container_id'))[:10]})")
            elif kind == ACTIVITY_EXECUTE:
                call = json.loads(sent) if sent else {}
                target = str((call.get("sandbox") or {}).get("container_id"))[:10]
                attempt = attempts.get(done.scheduled_event_id)
                what = f"execute {call.get('tool_use_id')} in {target} (attempt {attempt})"
                said.append(f"{what} by {done.identity}: {data[:80]!r}")
    return "; ".join(said) or "no sandbox activity completed"


LOOK = (
    "id; ls -la /workspace; grep workspace /proc/mounts; cat /workspace/runs; "
    "for call in /run/corral/calls/*; do "
    "echo \"$call: $(ls $call | tr '\\n' ' ')exit=$(cat $call/exit 2>/dev/null)\"; done"
)
"""What a short session's container holds: who the exec is, the workspace and its mount, the marker file, and the
runner's record of each call (its files, and its exit code if it has one)."""


def look_inside(engine: docker.DockerClient, session_id: str) -> str:
    """`LOOK` run in the session's running container, as root and as the sandbox's user: exit code and output."""
    found = engine.containers.list(filters={"label": f"{SESSION_LABEL}={session_id}"})
    if not found:
        return "no running container"
    said = []
    for user in ("root", f"{SANDBOX_UID}:{SANDBOX_GID}"):
        result = found[0].exec_run(["sh", "-c", LOOK], user=user)
        said.append(f"as {user}: exit {result.exit_code}: {result.output.decode(errors='replace')[:2000]!r}")
    return "; ".join(said)


def session_containers(engine: docker.DockerClient, session_id: str) -> str:
    """Every container of the session, stopped ones too, by its label or its name (a claimed pool member has only
    the name): its name (with its generation), id, state, and a running one's marker lines."""
    labelled = engine.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"}, ignore_removed=True)
    named = engine.containers.list(all=True, filters={"name": session_id}, ignore_removed=True)
    said = []
    for container in {str(c.id): c for c in [*labelled, *named]}.values():
        runs = f", {lines_or_why(container)} lines" if container.status == "running" else ""
        label = "labelled" if SESSION_LABEL in container.labels else "no session label"
        said.append(f"{container.name} ({container.short_id}, {label}, {container.status}{runs})")
    return ", ".join(said) or "none"


def lines_or_why(container: Container) -> str:
    """A running container's marker lines, or why they could not be read."""
    try:
        return str(marker_lines(container)[0])
    except RuntimeError as exc:
        return str(exc)


def uneven_containers(engine: docker.DockerClient, turns: int) -> list[str]:
    """Every session container, stopped ones too, whose marker file does not hold `turns` lines: its name, id,
    state, when it was made, and its line count (a stopped one's is not read: it says "not running"). Warm pool
    members are looked at too: a claimed one carries its session's name, not its label, and an unclaimed one's
    marker file must be empty."""
    labelled = engine.containers.list(all=True, filters={"label": SESSION_LABEL}, ignore_removed=True)
    named = engine.containers.list(all=True, filters={"name": "corral-"}, ignore_removed=True)
    found = []
    sandboxes = [c for c in named if str(c.name).startswith(("corral-sesn_", "corral-pool-"))]
    for container in {str(c.id): c for c in [*labelled, *sandboxes]}.values():
        runs = lines_or_why(container) if container.status == "running" else "not running"
        unclaimed = str(container.name).startswith("corral-pool-")
        if runs != (str(0) if unclaimed else str(turns)):
            made = container.attrs.get("Created", "?")
            label = container.labels.get(SESSION_LABEL, "no session label")
            said = f"{container.name} ({container.short_id}, {label}, {container.status}, made {made})"
            found.append(f"{said}: {runs} lines")
    return found


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
