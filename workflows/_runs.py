"""A session's workflow runs, as the session keeps them: starting one, writing what it reports, spawning its threads.

A run (workflows/runs.py) is a child workflow that interprets a plan; the session is its hands and its log. Starting
a run checks the plan here, in workflow code (a malformed plan is a `workflow_run.error` the coordinator reads and
fixes, never a failed workflow), logs `workflow_run.created` and `status_running`, and starts the child. What the run
reports (signal `workflow_run_report`, in order) is written here as its `workflow_run.*` events; the threads it asks
for are spawned as session threads with the ids it chose (taken once by id), and each one's reply, or its end with
none, goes back to the run (`workflow_run_input`), never to the coordinator. A run's end joins the coordinator's
input: it starts a turn when idle, and the model reads the run's report.

The handlers (the `workflow_run_report` signal, the `start_workflow_run` update, the `workflow_runs` query) are
registered on the session from here, so that the session's class keeps only its loop.

Workflow code: no I/O; the child start and signals are commands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from corral.contract.events import (
        ContentBlock,
        RunErrorType,
        TextBlock,
        WorkflowRunCreated,
        WorkflowRunError,
        WorkflowRunErrorObject,
        WorkflowRunPhase,
        WorkflowRunPhaseEnded,
        WorkflowRunPhaseStarted,
        WorkflowRunStatusEnded,
        WorkflowRunStatusIdle,
        WorkflowRunStatusRunning,
    )
    from corral.contract.plans import (
        Plan,
        RunInput,
        RunPhaseInfo,
        RunReport,
        RunsCarry,
        RunSpawn,
        RunThreadDone,
        WorkflowRunInfo,
        WorkflowRunInput,
        allowed_agents,
        check_plan,
        parse_plan,
    )
    from corral.contract.session import SessionInput, normalize_content
    from corral.contract.threads import SpawnedAgent, ThreadInfo, ThreadInput, ThreadReport
    from corral.names import (
        NO_WORKFLOW_RUNS,
        QUERY_WORKFLOW_RUNS,
        SIGNAL_RUN_INPUT,
        SIGNAL_RUN_REPORT,
        SIGNAL_THREAD_INPUT,
        UPDATE_START_WORKFLOW_RUN,
        WORKFLOW_RUN_ID_PREFIX,
        WORKFLOW_RUN_PHASE_ID_PREFIX,
        WORKFLOW_RUN_WORKFLOW,
    )
    from workflows._handover import HandOver
    from workflows._inbox import UserInbox
    from workflows._log import SessionLog
    from workflows._outbox import Outbox
    from workflows._threads import SessionThreads


class PlanRefused(Exception):
    """A plan that starts no run, with the run error type the log shows and the message the model reads."""

    def __init__(self, type: RunErrorType, message: str) -> None:
        super().__init__(message)
        self.type, self.message = type, message


class SessionRuns:
    """The workflow runs of one session, and the session's side of every exchange with them."""

    def __init__(self, input: SessionInput, log: SessionLog, threads: SessionThreads, outbox: Outbox,
                 inbox: UserInbox, hand_over: HandOver, refuse_when_closed: Callable[[], None]) -> None:  # fmt: skip
        self._input, self._log, self._threads, self._outbox, self._inbox = input, log, threads, outbox, inbox
        self._hand_over, self._refuse_when_closed = hand_over, refuse_when_closed
        self.infos: dict[str, WorkflowRunInfo] = {}
        self.thread_runs: dict[str, str] = {}
        """A run's thread that has not answered it yet -> the run's id."""
        self._in_flight = 0
        """Run starts and thread spawns under way: no hand-over meanwhile (their tasks would not be carried)."""
        self._spawning: set[asyncio.Task[None]] = set()
        if input.thread is not None:
            return  # a thread runs no workflow runs
        threads.runs = self
        if input.carry is not None and input.carry.runs is not None:
            self.infos = {info.id: info for info in input.carry.runs.runs}
            self.thread_runs = dict(input.carry.runs.thread_runs)
        workflow.set_signal_handler(SIGNAL_RUN_REPORT, self._on_reports)
        workflow.set_update_handler(UPDATE_START_WORKFLOW_RUN, self._start_update, validator=self._validate)
        workflow.set_query_handler(QUERY_WORKFLOW_RUNS, self._list)

    # ---- across hand-overs ------------------------------------------------------------------------------------

    def carried(self) -> RunsCarry | None:
        if not self.infos:
            return None
        return RunsCarry(runs=list(self.infos.values()), thread_runs=self.thread_runs)

    def busy(self) -> bool:
        return self._in_flight > 0

    # ---- starting a run -----------------------------------------------------------------------------------------

    def _check(self, raw: Any) -> Plan:
        """The plan, or PlanRefused saying why it starts no run (nothing is written)."""
        multiagent = self._input.agent.multiagent
        if multiagent is None or not multiagent.runs:
            raise ApplicationError("this session's agent may not start workflow runs", type=NO_WORKFLOW_RUNS,
                                   non_retryable=True)  # fmt: skip
        try:
            plan = raw if isinstance(raw, Plan) else parse_plan(raw)
        except ValueError as exc:
            raise PlanRefused("program_error", str(exc)) from None
        agents = allowed_agents(multiagent.run_agents, self._input.agent)
        problems = check_plan(plan, agents, multiagent.run_inline_agents)
        if problems:
            raise PlanRefused("program_error", "; ".join(problems))
        if len(self.infos) >= multiagent.max_runs:
            raise PlanRefused("max_workflow_runs_error",
                              f"this session has started {multiagent.max_runs} workflow runs, its limit")  # fmt: skip
        return plan

    async def start_tool(self, raw: Any) -> tuple[str, bool]:
        """The coordinator's `start_workflow_run`: the tool's result, and whether it is an error."""
        try:
            plan = self._check(raw)
        except PlanRefused as refused:
            self._log.append(WorkflowRunError, error=WorkflowRunErrorObject(type=refused.type, message=refused.message))
            return f"start_workflow_run: {refused.message}", True
        except ApplicationError as exc:
            return f"start_workflow_run: {exc.message}", True
        info = await self._start(plan)
        return (f"Started workflow run {info.id} ({len(plan.phases)} phases). Its report reaches you as a message "
                f"when it ends; wait for it with wait_for_threads naming {info.id}."), False  # fmt: skip

    def _validate(self, plan: Plan) -> None:
        self._refuse_when_closed()
        try:
            self._check(plan)
        except PlanRefused as refused:
            raise ValueError(refused.message) from None

    async def _start_update(self, plan: Plan) -> WorkflowRunInfo:
        """Start a run, as the coordinator's tool does (for Temporal-client users)."""
        self._hand_over.requests += 1
        try:
            plan = self._check(plan)
        except PlanRefused as refused:  # the validator refused it already, unless a run started meanwhile
            raise ApplicationError(refused.message, non_retryable=True) from None
        return await self._start(plan)

    async def _start(self, plan: Plan) -> WorkflowRunInfo:
        """Log the run's creation and start it: a child workflow that outlives this run of the session."""
        run_id = WORKFLOW_RUN_ID_PREFIX + workflow.uuid4().hex
        phases = [WorkflowRunPhase(id=WORKFLOW_RUN_PHASE_ID_PREFIX + workflow.uuid4().hex, name=phase.name,
                                   description=phase.description) for phase in plan.phases]  # fmt: skip
        created = self._log.append(WorkflowRunCreated, workflow_run_id=run_id, name=plan.name,
                                   description=plan.description, phases=phases)  # fmt: skip
        self._log.append(WorkflowRunStatusRunning, workflow_run_id=run_id)
        info = WorkflowRunInfo(id=run_id, name=plan.name, description=plan.description, created_at=created.created_at,
                               phases=[RunPhaseInfo(**phase.model_dump()) for phase in phases])  # fmt: skip
        self.infos[run_id] = info
        multiagent = self._input.agent.multiagent
        assert multiagent is not None
        session_id = self._threads.session_id
        start = WorkflowRunInput(
            run_id=run_id,
            session_id=session_id,
            plan=plan,
            phase_ids=[phase.id for phase in phases],
            max_threads=multiagent.max_threads_per_run,
        )
        self._in_flight += 1
        try:
            await workflow.start_child_workflow(
                WORKFLOW_RUN_WORKFLOW,
                start,
                id=run_id,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,  # the session's runs end at each hand-over
                static_summary=f"workflow run {plan.name} of {session_id}",
            )
        finally:
            self._in_flight -= 1
        return info

    # ---- what runs report -------------------------------------------------------------------------------------

    def _on_reports(self, reports: list[RunReport]) -> None:
        """What a run tells its session, in order (one signal carries what it queued meanwhile)."""
        self._hand_over.requests += 1
        for report in reports:
            info = self.infos.get(report.run_id)
            if info is None or info.status == "ended":
                workflow.logger.warning("dropped a report from %s, not a running workflow run", report.run_id)
                continue
            self._on_report(info, report)

    def _on_report(self, info: WorkflowRunInfo, report: RunReport) -> None:
        run_id = info.id
        phases = {phase.id: phase for phase in info.phases}
        if report.phase_ended is not None:
            phase = phases[report.phase_ended]
            self._log.append(WorkflowRunPhaseEnded, workflow_run_id=run_id, workflow_run_phase_id=phase.id,
                             phase_started_id=phase.started_id or "")  # fmt: skip
            phase.status = "ended"
        if report.phase_started is not None:
            phase = phases[report.phase_started]
            phase.started_id = self._log.append(WorkflowRunPhaseStarted, workflow_run_id=run_id,
                                                workflow_run_phase_id=phase.id).id  # fmt: skip
            phase.status = "running"
        for spawn in report.spawn:
            if spawn.thread_id not in phases[spawn.phase_id].thread_ids:
                phases[spawn.phase_id].thread_ids.append(spawn.thread_id)
                self.thread_runs[spawn.thread_id] = run_id
                self._in_flight += 1
                task = asyncio.create_task(self._spawn(run_id, spawn))  # tasks run in the order they are made
                self._spawning.add(task)
                task.add_done_callback(self._spawning.discard)
        for thread_id in report.interrupt:
            self.thread_runs.pop(thread_id, None)
            if thread_id in self._threads.infos and self._threads.infos[thread_id].archived_at is None:
                self._outbox.send(thread_id, SIGNAL_THREAD_INPUT, ThreadInput(interrupt=True))
        if report.idle:
            self._log.append(WorkflowRunStatusIdle, workflow_run_id=run_id)
            info.status = "idle"
        if report.error is not None:
            self._log.append(WorkflowRunError, workflow_run_id=run_id, error=report.error)
        if report.ended is not None:
            ended = self._log.append(WorkflowRunStatusEnded, processed=False, workflow_run_id=run_id,
                                     result=report.ended, report=report.report)  # fmt: skip
            info.status, info.result, info.ended_at = "ended", report.ended, ended.created_at
            self.thread_runs = {tid: rid for tid, rid in self.thread_runs.items() if rid != run_id}
            self._inbox.queue(ended)

    async def _spawn(self, run_id: str, spawn: RunSpawn) -> None:
        """Spawn one of a run's threads (once by its id), or tell the run why it cannot be."""
        try:
            threads = self._threads
            multiagent = self._input.agent.multiagent
            if spawn.thread_id in threads.infos or spawn.thread_id not in self.thread_runs or multiagent is None:
                return  # spawned already, or its run stopped before it could be
            if len(threads.infos) >= multiagent.max_threads:
                failure = f"this session has made its {multiagent.max_threads} threads, its limit"
                self._done(run_id, RunThreadDone(thread_id=spawn.thread_id, failure=failure, limit=True))
                return
            await threads.spawn(self._agent(spawn), normalize_content(spawn.message), spawn.thread_id, run_id)
        except ApplicationError as exc:  # the agent cannot run as a thread
            self._done(run_id, RunThreadDone(thread_id=spawn.thread_id, failure=exc.message))
        finally:
            self._in_flight -= 1

    def _agent(self, spawn: RunSpawn) -> SpawnedAgent:
        """What a task runs: a predefined agent of the run's roster, or one the plan defines inline."""
        coordinator = self._input.agent
        if spawn.inline_agent is not None:
            inline = spawn.inline_agent
            update = {"name": inline.name, "system": inline.system, "model": inline.model or coordinator.model}
            config = coordinator.without_multiagent().model_copy(update=update)
            return SpawnedAgent(type="inline", name=inline.name, config=config)
        assert coordinator.multiagent is not None
        for entry in coordinator.multiagent.run_agents:
            if spawn.agent in (entry.id, entry.name(coordinator)) or (spawn.agent == "self" and entry.type == "self"):
                return SpawnedAgent(type=entry.type, name=entry.name(coordinator), id=entry.id, version=entry.version,
                                    config=entry.config or coordinator.without_multiagent())  # fmt: skip
        raise ApplicationError(f"no predefined agent {spawn.agent!r} may run here", non_retryable=True)

    # ---- what a run's threads do --------------------------------------------------------------------------------

    def claim(self, thread: ThreadInfo, report: ThreadReport) -> bool:
        """Whether a thread's report is a run's thread's: its reply, or its end with none, goes to its run."""
        run_id = self.thread_runs.get(thread.id)
        if run_id is None:
            return False
        if report.reply is not None:
            self._done(run_id, RunThreadDone(thread_id=thread.id, reply=_text(report.reply)))
        elif report.status == "terminated" or (
            report.status == "idle" and report.stop_reason is not None and report.stop_reason.type != "requires_action"
        ):
            why = f"the thread stopped ({report.stop_reason.type if report.stop_reason else report.status}) unanswered"
            self._done(run_id, RunThreadDone(thread_id=thread.id, failure=why))
        return True

    def _done(self, run_id: str, done: RunThreadDone) -> None:
        """Tell a run that one of its threads answered (once: the thread is no longer the run's to answer)."""
        self.thread_runs.pop(done.thread_id, None)
        self._outbox.send(run_id, SIGNAL_RUN_INPUT, RunInput(done=[done]))

    def stop_all(self) -> None:
        """Stop every run still going (an interrupt of everything, the session's end): each ends `stopped`."""
        for run_id, info in self.infos.items():
            if info.status != "ended":
                self.thread_runs = {tid: rid for tid, rid in self.thread_runs.items() if rid != run_id}
                self._outbox.send(run_id, SIGNAL_RUN_INPUT, RunInput(stop=True))

    def _list(self) -> list[WorkflowRunInfo]:
        """The session's workflow runs, oldest first."""
        return list(self.infos.values())

    def ended(self, run_id: str) -> bool:
        return run_id in self.infos and self.infos[run_id].status == "ended"


def _text(content: list[ContentBlock]) -> str:
    return "\n".join(block.text for block in content if isinstance(block, TextBlock))
