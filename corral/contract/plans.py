"""Workflow runs: a plan the coordinator writes, run durably as a child workflow of its session.

The plan language is declarative JSON, the input of the coordinator's `start_workflow_run` tool:

    plan   := {name, description?, timeout_seconds?, phases: [phase, ...]}        1 to MAX_PHASES phases
    phase  := {name, description?, tasks: [task, ...]}                             1 to MAX_TASKS tasks
    task   := {name?, agent | inline_agent, message}
    agent  := a predefined agent's name or id, or "self";  inline_agent := {name, system?, model?}
    message:= text, where {{phase}} stands for every reply of an earlier phase and {{phase.task}} for one

Phases run in order; a phase's tasks run at once, each as a session thread on the session's shared hands (fan-out);
a phase ends when every task has replied, and later messages take those replies by reference (fan-in). The run's
report is its last phase's replies. Why declarative: the model writes JSON tool input reliably, a schema checks it
before anything runs (a `program_error` it can read and fix), and a generic interpreter runs it as ordinary
workflow code, so a crash resumes mid-phase from history, with no completed phase run again and no thread spawned
twice. Nothing in a plan is executed as code.

Everything here is pure and persisted in workflow history: add optional fields, never repurpose one.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from corral.contract.agent import AgentConfig, ThreadAgent
from corral.contract.coordinator import InlineAgent
from corral.contract.events import WorkflowRunErrorObject, WorkflowRunResult
from corral.contract.user_events import readable_validation_error
from corral.names import WorkflowRunStatus

MAX_PHASES: Final = 20
MAX_TASKS: Final = 20
DEFAULT_TIMEOUT_SECONDS: Final = 1800
MAX_TIMEOUT_SECONDS: Final = 86_400
REPLY_CHARS: Final = 20_000
"""The most of one reply a later message or the run's report takes."""
_NAME = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
_REFERENCE = re.compile(r"\{\{\s*([A-Za-z][A-Za-z0-9_-]*)(?:\.([A-Za-z][A-Za-z0-9_-]*))?\s*\}\}")


class PlanTask(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, pattern=_NAME)
    """Unique in its phase; default `task<index>` (1-based)."""
    agent: str | None = Field(default=None, min_length=1)
    inline_agent: InlineAgent | None = None
    message: str = Field(min_length=1, max_length=100_000)

    @model_validator(mode="after")
    def _one_agent(self) -> PlanTask:
        if (self.agent is None) == (self.inline_agent is None):
            raise ValueError("a task names exactly one of `agent` and `inline_agent`")
        return self


class PlanPhase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=_NAME)
    description: str | None = Field(default=None, max_length=2_000)
    tasks: list[PlanTask] = Field(min_length=1, max_length=MAX_TASKS)

    def task_names(self) -> list[str]:
        return [task.name or f"task{index}" for index, task in enumerate(self.tasks, 1)]


class Plan(BaseModel):
    """A workflow run's plan (the grammar is in this module's docstring)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    description: str | None = Field(default=None, max_length=2_000)
    timeout_seconds: int = Field(default=DEFAULT_TIMEOUT_SECONDS, ge=1, le=MAX_TIMEOUT_SECONDS)
    phases: list[PlanPhase] = Field(min_length=1, max_length=MAX_PHASES)

    def thread_count(self) -> int:
        return sum(len(phase.tasks) for phase in self.phases)


def parse_plan(raw: Any) -> Plan:
    """The plan in a tool call's input, or ValueError naming every problem (a `program_error` the model reads)."""
    try:
        return Plan.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(readable_validation_error(exc, prefix="plan")) from None


def check_plan(plan: Plan, agents: set[str], inline: bool) -> list[str]:
    """What is wrong with a well-formed plan: duplicate names, agents it may not run, references to phases that do
    not come before (pure; empty when it may run). `agents` holds the names and ids a task may name."""
    problems: list[str] = []
    earlier: dict[str, list[str]] = {}
    for p, phase in enumerate(plan.phases):
        where = f"plan.phases[{p}]"
        if phase.name in earlier:
            problems.append(f"{where}.name: {phase.name!r} names an earlier phase too")
        names = phase.task_names()
        for t, task in enumerate(phase.tasks):
            at = f"{where}.tasks[{t}]"
            if names.count(names[t]) > 1 and names.index(names[t]) == t:
                problems.append(f"{at}.name: {names[t]!r} names more than one task of the phase")
            if task.agent is not None and task.agent not in agents:
                known = ", ".join(sorted(agents)) or "none"
                problems.append(f"{at}.agent: no predefined agent {task.agent!r} may run here (may: {known})")
            if task.inline_agent is not None and not inline:
                problems.append(f"{at}.inline_agent: this agent's workflow runs may not define agents inline")
            for match in _REFERENCE.finditer(task.message):
                phase_name, task_name = match.group(1), match.group(2)
                if phase_name not in earlier:
                    problems.append(f"{at}.message: {match.group(0)} names no earlier phase")
                elif task_name is not None and task_name not in earlier[phase_name]:
                    problems.append(f"{at}.message: {match.group(0)}: phase {phase_name!r} has no such task")
        earlier[phase.name] = names
    return problems


def clip(text: str) -> str:
    return text if len(text) <= REPLY_CHARS else text[:REPLY_CHARS] + " […]"


def phase_replies(names: list[str], replies: dict[str, str]) -> str:
    """A phase's replies as one text, each under its task's name."""
    return "\n\n".join(f"[{name}]\n{clip(replies.get(name, ''))}" for name in names)


def render_message(message: str, results: dict[str, dict[str, str]], names: dict[str, list[str]]) -> str:
    """A task's message with its references to earlier phases' replies filled in (pure)."""

    def fill(match: re.Match[str]) -> str:
        phase, task = match.group(1), match.group(2)
        if task is not None:
            return clip(results.get(phase, {}).get(task, ""))
        return phase_replies(names.get(phase, []), results.get(phase, {}))

    return _REFERENCE.sub(fill, message)


# ---- between a session and its runs (internal; persisted in history) ---------------------------------------------


class WorkflowRunInput(BaseModel):
    """A run's start input: its plan, its session, and the ids its phases have (from `workflow_run.created`)."""

    run_id: str
    session_id: str
    plan: Plan
    phase_ids: list[str]
    max_threads: int


class RunSpawn(BaseModel):
    """A thread a run asks its session to spawn, with the id the run chose (a spawn is taken once by its id)."""

    thread_id: str
    phase_id: str
    task: str
    agent: str | None = None
    inline_agent: InlineAgent | None = None
    message: str


class RunReport(BaseModel):
    """What a run tells its session (signal `workflow_run_report`); each field set is one thing to act on, in this
    order: the phase it ended, the phase it started, threads to spawn, threads to interrupt, its end."""

    run_id: str
    phase_ended: str | None = None
    phase_started: str | None = None
    spawn: list[RunSpawn] = Field(default_factory=list)
    interrupt: list[str] = Field(default_factory=list)
    """Its threads still working when it stops or fails: the session interrupts them."""
    idle: bool = False
    error: WorkflowRunErrorObject | None = None
    ended: WorkflowRunResult | None = None
    report: str | None = None
    """With `ended`: what the coordinator reads of the run (its last phase's replies, or why it stopped)."""


class RunThreadDone(BaseModel):
    """A run's thread replied (`reply`), or ended with none (`failure`)."""

    thread_id: str
    reply: str | None = None
    failure: str | None = None
    limit: bool = False
    """The thread was never spawned: the session's thread limit was reached."""


class RunInput(BaseModel):
    """What a session tells one of its runs (signal `workflow_run_input`)."""

    done: list[RunThreadDone] = Field(default_factory=list)
    stop: bool = False


RunPhaseStatus = Literal["pending", "running", "ended"]


class RunPhaseInfo(BaseModel):
    id: str
    name: str
    description: str | None = None
    status: RunPhaseStatus = "pending"
    thread_ids: list[str] = Field(default_factory=list)
    started_id: str | None = None
    """The id of the phase's `workflow_run.phase_started` event."""


class WorkflowRunInfo(BaseModel):
    """One workflow run, as its session knows it (the `workflow_runs` query, `corral runs`)."""

    id: str
    name: str
    description: str | None = None
    status: WorkflowRunStatus = "running"
    result: WorkflowRunResult | None = None
    phases: list[RunPhaseInfo] = Field(default_factory=list)
    created_at: datetime
    ended_at: datetime | None = None

    def progress(self) -> str:
        """`2/3 phases`, as a person reads it."""
        ended = sum(1 for phase in self.phases if phase.status == "ended")
        return f"{ended}/{len(self.phases)} phases"


class RunsCarry(BaseModel):
    """A session's workflow runs across a hand-over."""

    runs: list[WorkflowRunInfo] = Field(default_factory=list)
    thread_runs: dict[str, str] = Field(default_factory=dict)
    """A run's thread id -> the run's id (where its reply goes)."""
    spawns: list[RunSpawn] = Field(default_factory=list)
    """Threads runs asked for while the session was handing over, not spawned yet: the next run spawns them."""


def allowed_agents(agents: list[ThreadAgent], coordinator: AgentConfig) -> set[str]:
    """What a plan's task may name: each predefined agent's name and id, and `self` where it is one."""
    names: set[str] = set()
    for entry in agents:
        names.add("self" if entry.type == "self" else entry.name(coordinator))
        if entry.id is not None:
            names.add(entry.id)
    return names
