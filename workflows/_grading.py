"""Outcomes (`user.define_outcome`): the session's side of grading its own work until a goal is met.

An outcome is input, as a message is: the agent starts on it. At each end of turn while one is pursued, a grader (a
model call of its own, `corral/contract/outcomes.py`) judges the work since the outcome (or its last revision)
against the rubric. Its verdict ends the span it opened; `needs_revision` and `max_iterations_reached` also join
the conversation, so the agent revises, or acknowledges, in the same turn loop.

Workflow code: no I/O; the grader is the model activity and a file the rubric names is read through the hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import cast

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ModelToolUseOutput, ModelTurnInput
    from corral.contract.agent import AgentConfig, CustomTool
    from corral.contract.events import (
        AgentToolUse,
        ModelUsage,
        SpanOutcomeEvaluationEnd,
        SpanOutcomeEvaluationOngoing,
        SpanOutcomeEvaluationStart,
        TextBlock,
        TextRubric,
        UserDefineOutcome,
        UserMessage,
    )
    from corral.contract.outcomes import (
        GRADER_ATTEMPTS,
        GRADER_MAX_TOKENS,
        GRADER_SCHEMA,
        GRADER_SYSTEM,
        GRADER_TOOL,
        HEARTBEAT_SECONDS,
        GradeOutcome,
        OutcomeEvaluation,
        OutcomesCarry,
        Verdict,
        files_named,
        grader_prompt,
    )
    from corral.contract.user_events import DEFAULT_OUTCOME_ITERATIONS, UserDefineOutcomeParams
    from corral.names import OUTCOME_ID_PREFIX, OUTCOME_IN_PROGRESS
    from workflows._advisor import transcript_lines
    from workflows._hands import ModelRoute
    from workflows._log import SessionLog
    from workflows._outcomes import add_usage, failure_message
    from workflows._sandbox import SessionSandbox


class SessionOutcomes:
    """Every outcome a session was given, and the one it pursues (at most one at a time)."""

    def __init__(self, log: SessionLog, agent: AgentConfig, model_queue: str, sandbox: object,
                 spend: Callable[[ModelUsage], None]) -> None:  # fmt: skip
        self._log = log
        self._agent = agent
        self._model_queue = model_queue
        self._sandbox = sandbox
        self._spend = spend
        self.evaluations: list[OutcomeEvaluation] = []
        self._active: UserDefineOutcome | None = None
        self._acknowledging = False
        self._since = 0
        self._open_span: SpanOutcomeEvaluationStart | None = None

    # ---- across a hand-over -----------------------------------------------------------------------------------

    def carried(self) -> OutcomesCarry | None:
        if not self.evaluations:
            return None
        return OutcomesCarry(
            evaluations=self.evaluations,
            active=self._active,
            acknowledging=self._acknowledging,
            since_position=self._since,
        )

    def resume(self, carry: OutcomesCarry | None) -> None:
        if carry is None:
            return
        self.evaluations = list(carry.evaluations)
        self._active = carry.active
        if self._active is not None and self._active.position > self._log.base:
            self._active = cast(UserDefineOutcome, self._log.at(self._active.position))  # the log's own object
        self._acknowledging, self._since = carry.acknowledging, carry.since_position

    # ---- input ------------------------------------------------------------------------------------------------

    def check(self, params: UserDefineOutcomeParams) -> None:
        """Refuse a second outcome while one is pursued (raised by the update's validator: nothing is written)."""
        if self._active is not None:
            raise ApplicationError(
                f"outcome {self._active.outcome_id} is still being pursued: interrupt the session to end it, or wait "
                "until its evaluation ends, before defining another",
                type=OUTCOME_IN_PROGRESS,
                non_retryable=True,
            )

    def accept(self, params: UserDefineOutcomeParams, client_id: str | None) -> UserDefineOutcome:
        """Log the outcome (unprocessed: it waits for the next turn, as a message does) and pursue it."""
        rubric = params.rubric
        assert isinstance(rubric, TextRubric)  # a file rubric is refused at the edge
        event = self._log.append(
            UserDefineOutcome,
            processed=False,
            outcome_id=OUTCOME_ID_PREFIX + workflow.uuid4().hex,
            description=params.description,
            rubric=TextRubric(content=rubric.content),
            max_iterations=params.max_iterations or DEFAULT_OUTCOME_ITERATIONS,
            client_id=client_id,
        )
        if self._active is not None:  # a signal bypasses the validator: the newer outcome replaces the older
            self._end("interrupted", "Another outcome was defined.")
        self.evaluations.append(OutcomeEvaluation(outcome_id=event.outcome_id, description=event.description))
        self._active, self._acknowledging, self._since = event, False, event.position
        return event

    @property
    def pursued(self) -> bool:
        return self._active is not None

    def started(self) -> None:
        """A turn started: the pursued outcome is being worked on."""
        current = self._current()
        if current is not None and current.result == "pending":
            current.result = "running"

    # ---- grading ----------------------------------------------------------------------------------------------

    async def after_turn(self) -> bool:
        """The agent ended its turn: grade the work if an outcome is pursued. True when the agent takes another
        cycle (the verdict's prompt is in the conversation); False when the session goes idle."""
        active, current = self._active, self._current()
        if active is None or current is None:
            return False
        if self._acknowledging:  # the acknowledgment turn is not graded
            self._active = None
            return False
        iteration = current.iteration
        current.result = "evaluating"
        start = self._log.append(SpanOutcomeEvaluationStart, outcome_id=active.outcome_id, iteration=iteration)
        self._open_span = start
        grade = await self._grade_with_heartbeat(active, iteration)
        self._open_span = None
        self._spend(grade.usage)
        result = grade.result
        if result == "needs_revision" and iteration + 1 >= active.max_iterations:
            result = "max_iterations_reached"  # type: ignore[assignment]
        end = self._log.append(
            SpanOutcomeEvaluationEnd, outcome_id=active.outcome_id, iteration=iteration,
            outcome_evaluation_start_id=start.id, result=result, explanation=grade.explanation, usage=grade.usage,
        )  # fmt: skip
        current.explanation = grade.explanation
        if result == "needs_revision":
            current.iteration, current.result = iteration + 1, "running"
            self._since = end.position
            self._log.add_to_conversation(end)
            return True
        self._finish(current, result)
        if result == "max_iterations_reached":
            self._acknowledging = True
            self._active = active  # kept until the acknowledgment turn ends
            self._log.add_to_conversation(end)
            return True
        self._active = None
        return False

    def interrupted(self) -> None:
        """The user interrupted: a pursued outcome ends `interrupted` (its open span too)."""
        if self._active is None:
            return
        if self._acknowledging:
            self._active, self._acknowledging = None, False
            return
        self._end("interrupted", "The user interrupted the session.")

    def _end(self, result: str, explanation: str) -> None:
        active, current = self._active, self._current()
        if active is None or current is None:
            return
        if self._open_span is not None:
            self._log.append(
                SpanOutcomeEvaluationEnd, outcome_id=active.outcome_id, iteration=self._open_span.iteration,
                outcome_evaluation_start_id=self._open_span.id, result=result, explanation=explanation,
                usage=ModelUsage(),
            )  # fmt: skip
            self._open_span = None
        current.explanation = explanation
        self._finish(current, result)
        self._active, self._acknowledging = None, False

    def _finish(self, current: OutcomeEvaluation, result: str) -> None:
        current.result = result  # type: ignore[assignment]
        current.completed_at = workflow.now()

    def _current(self) -> OutcomeEvaluation | None:
        if self._active is None:
            return None
        return next((e for e in self.evaluations if e.outcome_id == self._active.outcome_id), None)

    async def _grade_with_heartbeat(self, active: UserDefineOutcome, iteration: int) -> GradeOutcome:
        """The grader's verdict, with a `span.outcome_evaluation_ongoing` every `HEARTBEAT_SECONDS` meanwhile."""
        task = asyncio.create_task(self._grade(active, iteration))
        try:
            while not task.done():
                try:
                    await workflow.wait_condition(task.done, timeout=HEARTBEAT_SECONDS)
                except asyncio.TimeoutError:  # noqa: UP041 - the builtin, not temporalio.exceptions.TimeoutError
                    self._log.append(SpanOutcomeEvaluationOngoing, outcome_id=active.outcome_id, iteration=iteration)
            return task.result()
        finally:
            if not task.done():  # the turn was cancelled (an interrupt): so is the grader's call
                task.cancel()

    async def _grade(self, active: UserDefineOutcome, iteration: int) -> GradeOutcome:
        files = await self._read_files(files_named(active.rubric.content))
        work = [e for e in self._log.conversation if e.position >= self._since]
        prompt = grader_prompt(active.description, active.rubric.content, transcript_lines(work), files, iteration,
                               active.max_iterations)  # fmt: skip
        usage = ModelUsage()
        for attempt in range(GRADER_ATTEMPTS):
            try:
                result = await ModelRoute(self._model_queue).call(self._turn(prompt, attempt), "grade the outcome")
            except ActivityError as err:
                return GradeOutcome(result="failed", explanation=f"The grader could not run: {failure_message(err)}",
                                    usage=usage)  # fmt: skip
            usage = add_usage(usage, result.usage)
            verdict = _verdict(result.content)
            if verdict is not None:
                return GradeOutcome(result=verdict.result, explanation=verdict.explanation, usage=usage)
        return GradeOutcome(result="failed", explanation="The grader gave no verdict.", usage=usage)

    def _turn(self, prompt: str, attempt: int) -> ModelTurnInput:
        info = workflow.info()
        asked = UserMessage(
            id="grader_request", position=1, created_at=workflow.now(), content=[TextBlock(text=prompt)]
        )
        grader = AgentConfig(
            model=self._agent.model, system=GRADER_SYSTEM, max_tokens=GRADER_MAX_TOKENS,
            tools=[CustomTool(name=GRADER_TOOL, description="Your verdict on the work.", input_schema=GRADER_SCHEMA)],
        )  # fmt: skip
        return ModelTurnInput(
            session_id=info.workflow_id,
            run_id=f"{info.run_id}/grader/{workflow.uuid4().hex}",  # its own conversation in the model worker's cache
            turn=attempt,
            conversation_length=1,
            delta_start=0,
            delta=[asked],
            agent=grader,
        )

    async def _read_files(self, paths: list[str]) -> dict[str, str]:
        """The files the rubric names, read through the session's hand; none while it has no sandbox (the agent
        wrote nothing there), and a file that cannot be read shows why."""
        sandbox = self._sandbox
        if not paths or not isinstance(sandbox, SessionSandbox) or sandbox.handle is None:
            return {}
        files: dict[str, str] = {}
        for path in paths:
            use = AgentToolUse(id=f"grader_read_{workflow.uuid4().hex}", position=0, created_at=workflow.now(),
                               name="read", input={"file_path": path})  # fmt: skip
            text, is_error = await sandbox.execute(use)
            files[path] = f"(could not read: {text})" if is_error else text
        return files


def _verdict(content: Sequence[object]) -> Verdict | None:
    for block in content:
        if isinstance(block, ModelToolUseOutput) and block.name == GRADER_TOOL:
            try:
                return Verdict.model_validate(block.input)
            except ValueError:
                return None
    return None
