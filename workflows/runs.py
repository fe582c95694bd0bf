"""`WorkflowRun`: a plan the coordinator wrote (corral/contract/plans.py), run durably as a child workflow of its
session.

The run interprets the plan: phases in order, the tasks of a phase at once, each as a session thread that the
session spawns with the id the run chose (`workflow.uuid4()`: the same on replay, so a thread is never asked for
twice). A phase ends when every task has replied; the next phase's messages take those replies. What the run does
it reports to its session (signal `workflow_run_report`, through an `Outbox`, so in order), which writes the
`workflow_run.*` events on the session's log; what its threads do reaches it from the session (`workflow_run_input`).
Its history records each report and each thread id, so a worker killed mid-phase resumes where it was: no completed
phase runs again, no thread is spawned twice.

Workflow code: no I/O; time from `workflow.now()`, ids from `workflow.uuid4()`, signals are commands.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from functools import partial

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from corral.contract.events import RunErrorType, WorkflowRunErrorObject, WorkflowRunResult
    from corral.contract.plans import (
        PlanPhase,
        RunInput,
        RunReport,
        RunSpawn,
        RunThreadDone,
        WorkflowRunInput,
        phase_replies,
        render_message,
    )
    from corral.names import SIGNAL_RUN_INPUT, SIGNAL_RUN_REPORT, THREAD_ID_PREFIX, WORKFLOW_RUN_WORKFLOW
    from workflows._outbox import Outbox


class RunFailure(Exception):
    """Why a run stops before its plan is done (`type` None: it was stopped)."""

    def __init__(self, type: RunErrorType | None, message: str) -> None:
        super().__init__(message)
        self.type, self.message = type, message


@workflow.defn(name=WORKFLOW_RUN_WORKFLOW)
class WorkflowRun:
    """One workflow run: phases in order, each phase's tasks at once as session threads."""

    @workflow.init
    def __init__(self, input: WorkflowRunInput) -> None:
        self._input = input
        self._outbox = Outbox()
        self._done: dict[str, RunThreadDone] = {}
        self._stop = False
        self._lines: list[str] = [f"{p.name}: pending ({len(p.tasks)} tasks)" for p in input.plan.phases]

    @workflow.signal(name=SIGNAL_RUN_INPUT)
    def take(self, inputs: list[RunInput]) -> None:
        """What the session tells this run, in order: its threads' replies and ends (each taken once), a stop."""
        for input in inputs:
            for done in input.done:
                self._done.setdefault(done.thread_id, done)
            self._stop = self._stop or input.stop

    @workflow.run
    async def run(self, input: WorkflowRunInput) -> WorkflowRunResult:
        plan = input.plan
        deadline = workflow.now() + timedelta(seconds=plan.timeout_seconds)
        results: dict[str, dict[str, str]] = {}
        names: dict[str, list[str]] = {}
        self._details()
        if plan.thread_count() > input.max_threads:
            message = f"the plan needs {plan.thread_count()} threads; a run may spawn {input.max_threads}"
            return await self._end(RunFailure("thread_limit_error", message), None, [])
        phase_id: str | None = None
        threads: dict[str, str] = {}
        try:
            for index, phase in enumerate(plan.phases):
                ended, phase_id = phase_id, input.phase_ids[index]
                spawns = self._spawns(phase, phase_id, results, names)
                threads = {spawn.thread_id: spawn.task for spawn in spawns}
                self._report(RunReport(run_id=input.run_id, phase_ended=ended, phase_started=phase_id, spawn=spawns))
                self._lines[index] = f"{phase.name}: running (0/{len(spawns)} replied)"
                self._details()
                results[phase.name] = await self._phase(threads, deadline, index, phase)
                names[phase.name] = phase.task_names()
                self._lines[index] = f"{phase.name}: ended ({len(spawns)}/{len(spawns)} replied)"
                self._details()
        except RunFailure as failure:
            return await self._end(failure, phase_id, [tid for tid in threads if tid not in self._done])
        last = plan.phases[-1]
        report = phase_replies(last.task_names(), results[last.name])
        self._report(RunReport(run_id=input.run_id, phase_ended=phase_id, idle=True))
        self._report(RunReport(run_id=input.run_id, ended=WorkflowRunResult(type="completed"), report=report))
        await self._outbox.drained()
        return WorkflowRunResult(type="completed")

    def _spawns(self, phase: PlanPhase, phase_id: str, results: dict[str, dict[str, str]],
                names: dict[str, list[str]]) -> list[RunSpawn]:  # fmt: skip
        """The phase's threads, with the ids this run chooses for them and their messages filled in."""
        return [
            RunSpawn(thread_id=THREAD_ID_PREFIX + workflow.uuid4().hex, phase_id=phase_id, task=name,
                     agent=task.agent, inline_agent=task.inline_agent,
                     message=render_message(task.message, results, names))
            for name, task in zip(phase.task_names(), phase.tasks, strict=True)
        ]  # fmt: skip

    async def _phase(self, threads: dict[str, str], deadline: datetime, index: int,
                     phase: PlanPhase) -> dict[str, str]:  # fmt: skip
        """Wait until every thread of the phase replied; their replies by task name, or a RunFailure."""
        replied = 0
        timed_out = f"the run's {self._input.plan.timeout_seconds} s ran out in phase {phase.name}"
        while True:
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining <= 0:
                raise RunFailure("timeout_error", timed_out)
            try:
                await workflow.wait_condition(partial(self._moved, threads, replied), timeout=remaining)
            except asyncio.TimeoutError:  # noqa: UP041 - the builtin, not temporalio.exceptions.TimeoutError
                raise RunFailure("timeout_error", timed_out) from None
            if self._stop:
                raise RunFailure(None, f"stopped in phase {phase.name}")
            for tid, task in threads.items():
                done = self._done.get(tid)
                if done is not None and done.reply is None:
                    kind: RunErrorType = "thread_limit_error" if done.limit else "unknown_error"
                    why = done.failure or "it ended with no reply"
                    raise RunFailure(kind, f"task {task} of phase {phase.name} ({tid}): {why}")
            replied = self._answered(threads)
            self._lines[index] = f"{phase.name}: running ({replied}/{len(threads)} replied)"
            self._details()
            if replied == len(threads):
                return {task: self._done[tid].reply or "" for tid, task in threads.items()}

    def _moved(self, threads: dict[str, str], seen: int) -> bool:
        return self._answered(threads) != seen

    def _answered(self, threads: dict[str, str]) -> int:
        """How many of the threads answered (-1 once the run is stopped: the phase's wait ends)."""
        return -1 if self._stop else sum(tid in self._done for tid in threads)

    async def _end(self, failure: RunFailure, phase_id: str | None, working: list[str]) -> WorkflowRunResult:
        """Stop where the run is: interrupt its threads still working, end the open phase, report why."""
        run_id = self._input.run_id
        if working:
            self._report(RunReport(run_id=run_id, interrupt=working))
        error = None if failure.type is None else WorkflowRunErrorObject(type=failure.type, message=failure.message)
        result = WorkflowRunResult(type="stopped") if error is None else WorkflowRunResult(type="error", error=error)
        verb = "ended" if error is None else f"failed ({failure.type})"
        self._report(RunReport(run_id=run_id, phase_ended=phase_id, error=error))
        self._report(RunReport(run_id=run_id, ended=result, report=f"The workflow run {verb}: {failure.message}."))
        self._details(f"The run {verb}: {failure.message}.")
        await self._outbox.drained()
        return result

    def _report(self, report: RunReport) -> None:
        self._outbox.send(self._input.session_id, SIGNAL_RUN_REPORT, report)

    def _details(self, end: str | None = None) -> None:
        """One line per phase (and how it ended): what the Temporal Web UI shows as this run's current details."""
        lines = [f"{n}. {line}" for n, line in enumerate(self._lines, 1)]
        workflow.set_current_details("\n".join([*lines, *([end] if end else [])]))
