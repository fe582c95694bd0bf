"""One model turn as a session makes it: fit the context, call the model activity, and retry a transient error in
the client's view (`session.error` retrying, `session.status_rescheduled`) with the back-off of
`workflows.policies.model_retry_delay`, or end the turn when retries are spent. It keeps what the turns add up to
(their count, usage, the model worker's delta start), which the session shows and carries into its next run."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ModelTurnInput, ModelTurnResult
    from corral.contract.errors import ModelErrorInfo
    from corral.contract.events import (
        ModelUsage,
        RetriesExhausted,
        SessionStatusRescheduled,
        SessionStatusRunning,
        SpanModelRequestEnd,
        SpanModelRequestStart,
        StopReason,
    )
    from corral.contract.session import AgentConfig, ModelRetryConfig, SessionStatus
    from workflows._context import SessionContext
    from workflows._hands import ModelRoute
    from workflows._inbox import UserInbox
    from workflows._log import SessionLog
    from workflows._mcp import ReportError, RetryState, SessionMcp
    from workflows._metrics import count
    from workflows._outcomes import ToolUseEvent, add_usage, model_error_info
    from workflows.policies import model_retry_delay

MAX_CUT_OFF = 3
CUT_OFF_RESULT = (
    "Not run: your reply was cut off at max_tokens ({max_tokens}), so this call may be incomplete. Go on, and make "
    "the call again, complete, if it is still needed."
)


class ModelTurns:
    """The model turns of one session run. The session lends it its log, context, MCP tools and inbox, and what it
    does to its status: report an error (`report`), set the status (`set_status`), go idle (`go_idle`) and show
    its details (`describe`)."""

    def __init__(
        self,
        agent: AgentConfig,
        retry: ModelRetryConfig,
        model_task_queue: str,
        log: SessionLog,
        context: SessionContext,
        mcp: SessionMcp,
        inbox: UserInbox,
        report: ReportError,
        set_status: Callable[[SessionStatus], None],
        go_idle: Callable[[StopReason], None],
        describe: Callable[[], None],
    ) -> None:
        self._agent, self._retry, self._log, self._context = agent, retry, log, context
        self._mcp, self._inbox, self._report = mcp, inbox, report
        self._set_status, self._go_idle, self._describe = set_status, go_idle, describe
        self._model_route = ModelRoute(model_task_queue)
        self.turns = 0
        self.request_id = ""  # the span id of the model request that produced the latest response
        self.usage = ModelUsage()
        self.delta_start = 0

    async def call(self) -> ModelTurnResult | None:
        """One model turn, retrying transient model errors visibly; None when the turn ended in an error."""
        self.turns += 1
        summary = await self._context.fit(self.turn_input(), self._model_activity, self._context_note)
        if summary is not None:
            count("corral_compactions", "Context compactions (a summary replaced the start)", reason="budget")
            self.usage = add_usage(self.usage, summary.usage)
        retry = self._retry
        stream_id: str | None = None
        for attempt in range(1, retry.max_attempts + 1):
            turn = self.turn_input()  # anew each attempt: a retry may see a shorter context
            span = self._log.append(SpanModelRequestStart)
            stream_id = stream_id or span.id
            self._describe()
            try:
                result = await self._model_activity(
                    turn.model_copy(update={"stream_id": stream_id, "stream_attempt": attempt}),
                    f"model turn {self.turns}" + (f" (attempt {attempt})" if attempt > 1 else ""),
                )
            except ActivityError as err:
                self._log.append(
                    SpanModelRequestEnd,
                    model_request_start_id=span.id,
                    model_usage=ModelUsage(),
                    is_error=True,
                )
                if isinstance(err.cause, CancelledError) and self._inbox.interrupts:
                    raise
                error = model_error_info(err)
                if error.context_too_long and attempt < retry.max_attempts:
                    shrunk, summary = await self._context.shrink(turn, self._model_activity, self._context_note)
                    if summary is not None:
                        count("corral_compactions", "Context compactions (a summary replaced the start)",
                               reason="prompt_too_long")  # fmt: skip
                        self.usage = add_usage(self.usage, summary.usage)
                    if shrunk:
                        self._report_error(error, err, "retrying")
                        continue
                delay = model_retry_delay(retry, error, attempt)
                if delay is not None:
                    self._report_error(error, err, "retrying")
                    self._set_status("rescheduling")
                    self._log.append(SessionStatusRescheduled)
                    await workflow.sleep(timedelta(seconds=delay), summary=f"retry model turn in {delay:.1f}s")
                    self._set_status("running")
                    self._log.append(SessionStatusRunning)
                    continue
                self._report_error(error, err, "exhausted")
                self._go_idle(RetriesExhausted())
                return None
            self.delta_start = turn.conversation_length
            self._context.carried_unseen = None
            self.usage = add_usage(self.usage, result.usage)
            self._log.append(SpanModelRequestEnd, model_request_start_id=span.id, model_usage=result.usage)
            self.request_id = span.id
            return result
        raise AssertionError("unreachable: the last attempt returns or reports")

    def turn_input(self) -> ModelTurnInput:
        """A reference to the log and the entries the model worker has not seen, never the transcript."""
        info = workflow.info()
        length = len(self._log.conversation)
        delta, by_reference = self._log.delta_for_model(self.delta_start, length)
        return ModelTurnInput(
            session_id=info.workflow_id,
            run_id=info.run_id,
            turn=self.turns,
            conversation_length=length,
            delta_start=self.delta_start,
            delta=delta,
            delta_by_reference=by_reference,
            agent=self._agent if self.delta_start == 0 else None,
            mcp_tools=list(self._mcp.tools.values()) if self.delta_start == 0 else [],
            elide_before=self._context.watermark,
            max_block_chars=self._context.max_block_chars,
        )

    async def _model_activity(self, turn: ModelTurnInput, summary: str) -> ModelTurnResult:
        return await self._model_route.call(turn, summary)

    def _context_note(self, message: str) -> None:
        self._report("model_request_failed_error", message, "retrying")

    def refuse_cut_off_calls(self, uses: list[ToolUseEvent], cut_off: int) -> bool:
        """A reply cut off at `max_tokens` may hold incomplete tool calls: none runs. Each gets an error result and
        the model is asked to go on (True), up to `MAX_CUT_OFF` replies in a row; then the turn ends (False)."""
        for use in uses:
            self._log.answer(use, CUT_OFF_RESULT.format(max_tokens=self._agent.max_tokens), True)
        if cut_off < MAX_CUT_OFF:
            return True
        limit = self._agent.max_tokens
        message = f"{cut_off} replies in a row were cut off at max_tokens ({limit}) in a tool call: raise it"
        self._report("model_request_failed_error", message, "exhausted")
        self._go_idle(RetriesExhausted())
        return False

    def _report_error(self, error: ModelErrorInfo, err: ActivityError, retry_status: RetryState) -> None:
        """A model error as a `session.error`, with the activity's own message."""
        message = str(err.cause.message if isinstance(err.cause, ApplicationError) else err.cause or err)
        self._report(error.error_type, message, retry_status)
