"""`SessionWorkflow`: one agent session. Its history is the durable log; this code is the harness loop.

No I/O here (DESIGN.md, invariant 1): time comes from `workflow.now()`, ids from `workflow.uuid4()`, and every
model call or tool call is an activity. Handlers only validate and append to the log; the main loop does the work.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import (
        ModelContext,
        ModelContextQuery,
        ModelTurnInput,
        ModelTurnResult,
    )
    from corral.contract.carry import Phase, SessionCarry
    from corral.contract.context import ContextView
    from corral.contract.errors import ModelErrorInfo
    from corral.contract.events import (
        BudgetReached,
        EndTurn,
        ErrorType,
        ModelUsage,
        Refusal,
        RefusalStopDetails,
        RetriesExhausted,
        RetryStatus,
        SessionDeleted,
        SessionError,
        SessionErrorDetail,
        SessionStatusIdle,
        SessionStatusRescheduled,
        SessionStatusRunning,
        SessionStatusTerminated,
        SpanModelRequestEnd,
        SpanModelRequestStart,
        StopReason,
    )
    from corral.contract.pricing import list_cost
    from corral.contract.search_attributes import MODEL_KEY, STATUS_KEY
    from corral.contract.session import (
        CustomTool,
        EventPage,
        EventsQuery,
        InterruptSignal,
        ResolvedTool,
        SandboxTool,
        SendEventsInput,
        SendEventsResult,
        SessionInfo,
        SessionInput,
        SessionStatus,
        UpdateSessionInput,
        UserInterruptParams,
        UserMessageParams,
        UserMessageSignal,
        parse_user_events,
        web_ui_summary,
    )
    from corral.names import (
        ARCHIVED,
        BUDGET_CREATE_ONLY,
        BUDGET_NOT_RAISED,
        BUSY,
        DELETING,
        EVENT_ID_PREFIX,
        HANDING_OVER,
        QUERY_CONTEXT_VIEW,
        QUERY_EVENTS,
        QUERY_MODEL_CONTEXT,
        QUERY_SESSION,
        SESSION_WORKFLOW,
        SIGNAL_INTERRUPT,
        SIGNAL_USER_MESSAGE,
        UPDATE_SEND_EVENTS,
        UPDATE_SESSION,
        WORKING_STATUSES,
    )
    from workflows._context import SessionContext
    from workflows._fork import start_fork
    from workflows._handover import HandOver, Parts
    from workflows._hands import ModelRoute
    from workflows._inbox import UserInbox
    from workflows._log import SessionLog
    from workflows._mcp import RetryState, SessionMcp
    from workflows._outcomes import ToolUseEvent, add_usage, model_error_info, record_response
    from workflows._sandbox import SessionSandbox
    from workflows._tool_calls import ToolCalls


MAX_CUT_OFF = 3
CUT_OFF_RESULT = (
    "Not run: your reply was cut off at max_tokens ({max_tokens}), so this call may be incomplete. Go on, and make "
    "the call again, complete, if it is still needed."
)

CONFIRMATIONS_PATCH = "tool-confirmations"
"""From here a session evaluates each call's permission policy, and waits for confirmation where it asks."""
MESSAGE_IDS_PATCH = "message-ids-from-request"
"""From here a response's `agent.message` and `agent.thinking` take ids made from their request's span id
(`message_id_of`), the ids their live previews carry, instead of new ones."""

REFUSAL_PATCH = "refusal-stop-reason"
"""From here a response the model refused ends the turn with stop reason `refusal` and the response's details."""
REFUSED_RESULT = "Not run: the model's response was refused."

IDLE_HAND_OVER_PATCH = "idle-hand-over"
"""From here an idle session also wakes to continue as new when updates and signals (renames, dropped messages)
have grown its run's history enough: before, only a turn's end handed over, so an idle session could grow without
bound."""

BUDGET_PATCH = "session-budget"
"""From here a session with a budget stops taking model turns once they have cost it (only sessions with a budget
ask for this patch, and none was recorded before it)."""
BUDGET_SPENT_RESULT = "Not run: the session's budget is spent."


def _count(name: str, description: str, **attributes: str) -> None:
    """One more of a corral metric, through the workflow's meter: no command, no I/O, and nothing while a task is
    replayed, so replays and determinism are untouched (a no-op unless the worker's runtime exports metrics)."""
    workflow.metric_meter().create_counter(name, description).add(1, attributes)


@workflow.defn(name=SESSION_WORKFLOW)
class SessionWorkflow:
    """An agent session: user events in, model turns and tool calls out, every step a typed event."""

    @workflow.init
    def __init__(self, input: SessionInput) -> None:
        self._input = input
        self._tools: dict[str, ResolvedTool] = {t.name: t for t in input.agent.resolved_tools()}
        self._log = SessionLog(new_id=lambda: EVENT_ID_PREFIX + workflow.uuid4().hex, now=workflow.now)
        self._created_at = workflow.now()
        self._inbox = UserInbox(self._log, workflow.now, self._interrupt_turn, self._describe)
        self._status: SessionStatus = "idle"
        self._stop_reason: str | None = None
        self._turns = 0
        self._request_id = ""  # the span id of the model request that produced the latest response
        self._usage = ModelUsage()
        self._delta_start = 0
        self._turn_task: asyncio.Task[None] | None = None
        self._context = SessionContext(self._log, input.agent)
        self._mcp = SessionMcp(
            workflow.info().workflow_id, input.agent, input.vault_ids, needs_binding=bool(input.resources)
        )
        self._sandbox = SessionSandbox(
            workflow.info().workflow_id, input.sandbox_environment(), lambda: self._mcp.clones(input.resources)
        )
        self._runs = HandOver(input)
        self._tool_calls = ToolCalls(
            input.agent, self._tools, self._log, self._inbox, self._sandbox, self._mcp, self._report,
            self._go_idle, self._resume_running, self._hand_over_due, self._hand_over,
        )  # fmt: skip
        self._model_route = ModelRoute(input.model_task_queue)
        self._static = web_ui_summary(input, workflow.info().namespace)
        self._archived_at: datetime | None = None
        self._deleting = False
        if input.carry is not None:
            self._resume(input.carry)
        if input.fork is not None and input.carry is None:
            self._inbox.hold()  # the copy of the source's log takes the first positions
        if input.message is not None:
            self._inbox.accept_message(UserMessageParams(type="user.message", content=input.message))

    # ---- main loop -----------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: SessionInput) -> None:
        workflow.upsert_search_attributes([STATUS_KEY.value_set(self._status), MODEL_KEY.value_set(input.agent.model)])
        self._describe()
        if input.fork is not None and input.carry is None:
            sandboxed = any(isinstance(tool, SandboxTool) for tool in self._tools.values())
            await start_fork(self._log, self._inbox, input, sandboxed, self._report)
            self._delta_start = len(self._log.conversation)  # the model worker reads the copy through a query
        resume = input.carry.phase if input.carry is not None else "idle"
        try:
            while True:
                if resume == "idle":
                    if self._hand_over_due():
                        await self._hand_over("idle")
                    if not await self._wait_for_work():
                        continue
                self._turn_task = asyncio.create_task(self._run_turn(resume))
                resume = "idle"
                await self._turn_task
                self._turn_task = None
        except asyncio.CancelledError:
            # The workflow itself was cancelled (e.g. `temporal workflow cancel`): clean up, record the end, stop.
            await self._sandbox.release()
            await self._mcp.release()
            self._set_status("terminated")
            if not self._deleting:  # a deleted session's last event is its `session.deleted`
                self._log.append(SessionStatusTerminated)
            raise

    # ---- hand-over to the next run (workflows/_handover.py) ----------------------------------------------------

    def _hand_over_due(self) -> bool:
        return self._runs.due()

    async def _hand_over(self, phase: Phase) -> None:
        """Continue as new from here (`phase`). Returns only when the archive could not be written: that is a
        `session.error`, and the session goes on in this run and tries again later."""
        archive = await self._runs.archive_run(self._log, self._input.model_task_queue, self._report)
        if archive is None:
            return
        carry = SessionCarry(
            run=self._runs.run + 1,
            phase=phase,
            archive=archive,
            **self._runs.carried(self._parts(), archive, self._delta_start),
            usage=self._usage,
            turns=self._turns,
            created_at=self._created_at,
            status=self._status,
            stop_reason=self._stop_reason,
            archived_at=self._archived_at,
        )
        moving = workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE if self._runs.moves_build() else None
        workflow.continue_as_new(
            self._input.model_copy(update={"carry": carry, "message": None}), initial_versioning_behavior=moving
        )

    def _resume(self, carry: SessionCarry) -> None:
        """Start from the state the previous run handed over."""
        self._runs.restore(carry, self._parts())
        self._usage, self._turns, self._created_at = carry.usage, carry.turns, carry.created_at
        self._status, self._stop_reason = carry.status, carry.stop_reason
        self._archived_at = carry.archived_at
        self._delta_start = len(self._log.conversation)  # the model worker reads the carried view through a query

    def _parts(self) -> Parts:
        return self._log, self._context, self._inbox, self._sandbox, self._mcp

    # ---- waiting and turns ----------------------------------------------------------------------------------

    async def _wait_for_work(self) -> bool:
        """Zero compute while idle: wait for a message (True: a turn is due); stop a running sandbox once idle long
        enough, or hand over when updates and signals have grown the run's history enough while idle (False)."""
        # Determinism: runs recorded before this woke for a message only. A message already here (a session's first)
        # needs no waiting and asks for no patch: its first workflow task carries no marker.
        waits = not self._inbox.pending and workflow.patched(IDLE_HAND_OVER_PATCH)
        due = self._hand_over_due if waits else (lambda: False)

        def woken() -> bool:
            return bool(self._inbox.pending) or due()

        if not self._sandbox.running:
            await workflow.wait_condition(woken)
            return bool(self._inbox.pending)
        try:
            await workflow.wait_condition(woken, timeout=self._sandbox.idle_stop_after)
        except asyncio.TimeoutError:  # noqa: UP041 - the builtin, not temporalio.exceptions.TimeoutError
            await self._sandbox.stop()
            return False
        return bool(self._inbox.pending)

    async def _run_turn(self, resume: Phase = "idle") -> None:
        """Run model calls and tool calls until the model ends its turn, an error ends it, or an interrupt. A turn
        resumed after a hand-over (`resume`) picks up where the previous run left it."""
        if resume == "idle":
            self._set_status("running")
            self._log.append(SessionStatusRunning)
        try:
            if resume in ("awaiting_custom", "awaiting_confirmation"):
                custom_uses, asked = self._inbox.awaiting_custom.values(), self._inbox.awaiting_confirmation.values()
                await self._tool_calls.await_answers(list(custom_uses), list(asked))
            await self._mcp.prepare(self._report)
            cut_off = 0  # replies in a row cut off at max_tokens with tool calls in them
            while True:
                self._inbox.take_pending()
                if self._hand_over_due():
                    await self._hand_over("turn")
                if self._budget_spent():
                    self._go_idle(BudgetReached())  # no model call: the message waits in the conversation
                    return
                result = await self._call_model()
                if result is None:
                    return
                request_id = self._request_id if workflow.patched(MESSAGE_IDS_PATCH) else None
                uses = record_response(self._log, result, self._mcp.spec, self._is_custom, request_id)
                if self._budget_spent():
                    for use in uses:  # answered, so that the conversation stays valid for a later turn
                        self._log.answer(use, BUDGET_SPENT_RESULT, True)
                    self._go_idle(BudgetReached())
                    return
                # Determinism: histories recorded before refusals ended a turn this way ended it as end_turn.
                if result.stop_reason == "refusal" and workflow.patched(REFUSAL_PATCH):
                    for use in uses:
                        self._log.answer(use, REFUSED_RESULT, True)
                    self._go_idle(Refusal(), result.refusal or RefusalStopDetails())
                    return
                # Determinism: histories recorded before permissions were evaluated have no marker here, and never
                # wait for a confirmation; the patch also keeps their events (and so their sizes) as they were.
                if uses and workflow.patched(CONFIRMATIONS_PATCH):
                    self._tool_calls.evaluate_permissions(uses)
                if uses and result.stop_reason == "max_tokens":
                    cut_off += 1
                    if not self._refuse_cut_off_calls(uses, cut_off):
                        return
                elif uses:
                    cut_off = 0
                    await self._tool_calls.run(uses)
                elif not self._inbox.pending:
                    self._go_idle(EndTurn())
                    return
        except (asyncio.CancelledError, ActivityError):
            if not self._inbox.interrupts:
                raise
            self._finish_interrupt()

    async def _call_model(self) -> ModelTurnResult | None:
        """One model turn, retrying transient model errors visibly; None when the turn ended in an error."""
        self._turns += 1
        summary = await self._context.fit(self._turn_input(), self._model_activity, self._context_note)
        if summary is not None:
            _count("corral_compactions", "Context compactions (a summary replaced the start)", reason="budget")
            self._usage = add_usage(self._usage, summary.usage)
        retry = self._input.model_retry
        stream_id: str | None = None
        for attempt in range(1, retry.max_attempts + 1):
            turn = self._turn_input()  # anew each attempt: a retry may see a shorter context
            span = self._log.append(SpanModelRequestStart)
            stream_id = stream_id or span.id
            self._describe()
            try:
                result = await self._model_activity(
                    turn.model_copy(update={"stream_id": stream_id, "stream_attempt": attempt}),
                    f"model turn {self._turns}" + (f" (attempt {attempt})" if attempt > 1 else ""),
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
                        _count("corral_compactions", "Context compactions (a summary replaced the start)",
                               reason="prompt_too_long")  # fmt: skip
                        self._usage = add_usage(self._usage, summary.usage)
                    if shrunk:
                        self._report_error(error, err, "retrying")
                        continue
                if error.retryable and attempt < retry.max_attempts:
                    delay = error.retry_after
                    if delay is None:
                        delay = min(retry.initial_delay_seconds * 2 ** (attempt - 1), retry.max_delay_seconds)
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
            self._delta_start = turn.conversation_length
            self._context.carried_unseen = None
            self._usage = add_usage(self._usage, result.usage)
            self._log.append(SpanModelRequestEnd, model_request_start_id=span.id, model_usage=result.usage)
            self._request_id = span.id
            return result
        raise AssertionError("unreachable: the last attempt returns or reports")

    def _turn_input(self) -> ModelTurnInput:
        """A reference to the log and the entries the model worker has not seen, never the transcript."""
        info = workflow.info()
        length = len(self._log.conversation)
        delta, by_reference = self._log.delta_for_model(self._delta_start, length)
        return ModelTurnInput(
            session_id=info.workflow_id,
            run_id=info.run_id,
            turn=self._turns,
            conversation_length=length,
            delta_start=self._delta_start,
            delta=delta,
            delta_by_reference=by_reference,
            agent=self._input.agent if self._delta_start == 0 else None,
            mcp_tools=list(self._mcp.tools.values()) if self._delta_start == 0 else [],
            elide_before=self._context.watermark,
            max_block_chars=self._context.max_block_chars,
        )

    async def _model_activity(self, turn: ModelTurnInput, summary: str) -> ModelTurnResult:
        return await self._model_route.call(turn, summary)

    def _context_note(self, message: str) -> None:
        self._report("model_request_failed_error", message, "retrying")

    def _refuse_cut_off_calls(self, uses: list[ToolUseEvent], cut_off: int) -> bool:
        """A reply cut off at `max_tokens` may hold incomplete tool calls: none runs. Each gets an error result and
        the model is asked to go on (True), up to `MAX_CUT_OFF` replies in a row; then the turn ends (False)."""
        for use in uses:
            self._log.answer(use, CUT_OFF_RESULT.format(max_tokens=self._input.agent.max_tokens), True)
        if cut_off < MAX_CUT_OFF:
            return True
        limit = self._input.agent.max_tokens
        message = f"{cut_off} replies in a row were cut off at max_tokens ({limit}) in a tool call: raise it"
        self._report("model_request_failed_error", message, "exhausted")
        self._go_idle(RetriesExhausted())
        return False

    def _list_cost(self) -> int | None:
        """What the model turns have cost so far at list price, in US cents (None: the model has no price)."""
        price = self._input.budget_price()
        return None if price is None else list_cost(self._input.agent.model, self._usage, price)

    def _budget_spent(self) -> bool:
        budget = self._input.budget
        # Determinism: only sessions with a budget take the patch, so recorded histories see no new marker.
        if budget is None or not workflow.patched(BUDGET_PATCH):
            return False
        spent = self._list_cost()
        return spent is not None and spent >= budget.limit_cents

    def _is_custom(self, name: str) -> bool:
        return isinstance(self._tools.get(name), CustomTool)

    def _finish_interrupt(self) -> None:
        """Close what the interrupt cut short so the conversation stays valid, then go idle."""
        for use in self._log.unanswered_tool_uses():
            self._log.answer(use, "Cancelled: the user interrupted this tool call.", True)
        self._inbox.settle_interrupts()
        self._go_idle(EndTurn())

    # ---- status -------------------------------------------------------------------------------------------

    def _go_idle(self, reason: StopReason, details: RefusalStopDetails | None = None) -> None:
        if details is None:  # the events of sessions that never refused stay as they were
            self._log.append(SessionStatusIdle, stop_reason=reason)
        else:
            self._log.append(SessionStatusIdle, stop_reason=reason, stop_details=details)
        self._set_status("idle", reason.type)

    def _resume_running(self) -> None:
        """The turn goes on after a wait for the client."""
        self._set_status("running")
        self._log.append(SessionStatusRunning)

    def _set_status(self, status: SessionStatus, stop_reason: str | None = None) -> None:
        if status != self._status:
            workflow.upsert_search_attributes([STATUS_KEY.value_set(status)])
        self._status = status
        self._stop_reason = stop_reason
        self._describe()

    def _describe(self) -> None:
        """The current details the Temporal Web UI shows for this session."""
        reason = f" ({self._stop_reason})" if self._stop_reason else ""
        run = f" · run {self._runs.run} (positions {self._log.base + 1}-)" if self._runs.run > 1 else ""
        # A run after the first has no static summary (continue-as-new sets none): its details say it instead.
        static = "" if self._runs.run == 1 else "{}\n\n{}\n\n".format(*self._static)
        workflow.set_current_details(
            f"{static}**{self._status}**{reason}{run} · model `{self._input.agent.model}` · "
            f"{self._turns} model turns · "
            f"{self._log.last_position} events · {len(self._inbox.pending)} queued · "
            f"{self._usage.input_tokens} in / {self._usage.output_tokens} out tokens · cache "
            f"{self._usage.cache_read_input_tokens} read / {self._usage.cache_creation_input_tokens} written"
            + self._spent_detail()
        )

    def _spent_detail(self) -> str:
        budget = self._input.budget
        if budget is None:
            return ""
        return f" · spent {self._list_cost()} of {budget.limit_cents} cents (list price)"

    def _report(self, error_type: ErrorType, message: str, retry_status: RetryState) -> None:
        """A typed `session.error` the client sees; the session itself goes on."""
        _count("corral_session_errors", "session.error events, by error type", error_type=error_type)
        self._log.append(
            SessionError,
            error=SessionErrorDetail(type=error_type, message=message, retry_status=RetryStatus(type=retry_status)),
        )

    def _report_error(self, error: ModelErrorInfo, err: ActivityError, retry_status: RetryState) -> None:
        """A model error as a `session.error`, with the activity's own message."""
        message = str(err.cause.message if isinstance(err.cause, ApplicationError) else err.cause or err)
        self._report(error.error_type, message, retry_status)

    # ---- user input ---------------------------------------------------------------------------------------

    @workflow.signal(name=SIGNAL_USER_MESSAGE)
    def user_message(self, input: UserMessageSignal | None = None) -> None:
        """Fire-and-forget message; prefer the `send_events` update to learn whether it was accepted."""
        self._runs.requests += 1
        if self._deleting:
            workflow.logger.warning("dropped a user_message signal: the session is being deleted")
            return
        if input is None:  # a raw client may send the signal with no argument at all
            workflow.logger.warning("dropped a user_message signal with no content")
            return
        try:  # the same checks as a `send_events` batch of one, the size limit included
            (params,) = parse_user_events(
                SendEventsInput(events=[{"type": "user.message", **input.model_dump(exclude_none=True)}])
            )
            self._inbox.accept(params)
        except ValueError as exc:
            workflow.logger.warning("dropped an invalid user_message signal: %s", exc)

    @workflow.signal(name=SIGNAL_INTERRUPT)
    def interrupt(self, input: InterruptSignal | None = None) -> None:
        """Stop the current work; the session goes idle and stays usable."""
        self._runs.requests += 1
        if not self._deleting:
            self._inbox.accept(UserInterruptParams(type="user.interrupt", id=input.id if input else None))

    @workflow.update(name=UPDATE_SEND_EVENTS)
    def send_events(self, input: SendEventsInput) -> SendEventsResult:
        """Append a batch of user events; returns their ids once they are in history."""
        self._runs.requests += 1
        return SendEventsResult(event_ids=self._inbox.accept_batch(input))

    @send_events.validator
    def _validate_send_events(self, input: SendEventsInput) -> None:
        if self._deleting:
            raise ApplicationError("the session is being deleted: it takes no more events", type=DELETING)
        if self._archived_at is not None:
            raise ApplicationError("the session is archived: it takes no more events", type=ARCHIVED)
        if self._runs.handing_over:
            # Nothing is written: the client sends again, and the next run takes it (corral.client.send_events).
            raise ApplicationError("the session is continuing as new: send again", type=HANDING_OVER)
        self._inbox.validate(input)

    @workflow.update(name=UPDATE_SESSION)
    def update_session(self, input: UpdateSessionInput) -> SessionInfo:
        """A new title, a metadata patch, archiving: what the session's API view shows (its memo) changes with
        them; the log does not. An archived session keeps its log and takes no more events. `delete` begins a
        deletion: `session.deleted`, the log's last event, and no more events (the caller then cancels the
        workflow, which releases the sandbox, and deletes the execution)."""
        if input.delete:
            if not self._deleting:
                self._deleting = True
                self._log.append(SessionDeleted)
            return self.session()
        metadata = dict(self._input.metadata)
        for key, value in input.metadata.items():
            if value is None:
                metadata.pop(key, None)
            else:
                metadata[key] = value
        title = input.title if input.title_set else self._input.title
        budget = self._input.budget
        if input.budget_set:  # a new limit at the price the session was made with
            budget = input.budget and input.budget.model_copy(update={"price": budget and budget.price})
        self._input = self._input.model_copy(update={"title": title, "metadata": metadata, "budget": budget})
        if input.archive and self._archived_at is None:
            self._archived_at = workflow.now()
        memo: dict[str, Any] = {"title": title, "metadata": metadata, "archived_at": self._archived_at}
        if input.budget_set:
            memo["budget"] = None if budget is None else budget.model_dump(mode="json", exclude={"price"})
        workflow.upsert_memo(memo)
        self._describe()
        return self.session()

    @update_session.validator
    def _validate_update_session(self, input: UpdateSessionInput) -> None:
        if self._runs.handing_over:  # what it changes is carried into the next run: it is sent again there
            raise ApplicationError("the session is continuing as new: send again", type=HANDING_OVER)
        if input.delete and self._status in WORKING_STATUSES:
            raise ApplicationError(
                f"the session is {self._status}: interrupt it first (send user.interrupt), then delete it once it "
                "is idle",
                type=BUSY,
            )
        if self._deleting and not input.delete:
            raise ApplicationError("the session is being deleted: it can no longer change", type=DELETING)
        if input.budget_set and self._input.budget is None:
            raise ApplicationError(
                "the session has no budget: a budget is set when a session is created, and one removed cannot be "
                "set again",
                type=BUDGET_CREATE_ONLY,
            )
        if input.budget is not None:
            spent = self._list_cost() or 0
            if input.budget.limit_cents <= spent:
                raise ApplicationError(
                    f"the session has already spent {spent} cents at list price: a new max_list_cost must be more",
                    type=BUDGET_NOT_RAISED,
                )
        if self._archived_at is not None and (input.title_set or input.metadata or input.budget_set):
            raise ApplicationError("the session is archived: it can no longer change", type=ARCHIVED)

    def _interrupt_turn(self) -> bool:
        """Cancel the turn in progress, if there is one (the interrupt is then settled when it ends)."""
        if self._turn_task is None or self._turn_task.done():
            return False
        self._turn_task.cancel()
        return True

    # ---- queries ------------------------------------------------------------------------------------------

    @workflow.query(name=QUERY_SESSION)
    def session(self) -> SessionInfo:
        return SessionInfo(
            id=workflow.info().workflow_id,
            status=self._status,
            title=self._input.title,
            model=self._input.agent.model,
            created_at=self._created_at,
            last_position=self._log.last_position,
            turns=self._turns,
            queued_user_events=len(self._inbox.pending),
            usage=self._usage,
            stop_reason=self._stop_reason,
            metadata=self._input.metadata,
            run=self._runs.run,
            archived_through=self._log.base,
            list_cost=self._list_cost(),
            budget=self._input.budget,
            archived_at=self._archived_at,
        )

    @workflow.query(name=QUERY_EVENTS)
    def events(self, query: EventsQuery | None = None) -> EventPage:
        return self._log.page(query or EventsQuery(), self._runs.archive)

    @workflow.query(name=QUERY_CONTEXT_VIEW)
    def context_view(self) -> ContextView:
        """What the model would see on the next turn: which entries, which elided, the token estimate."""
        return self._context.describe()

    @workflow.query(name=QUERY_MODEL_CONTEXT)
    def model_context(self, query: ModelContextQuery) -> ModelContext:
        context = self._log.model_context(self._input.agent, query.start, query.end)
        context.mcp_tools = list(self._mcp.tools.values())
        return context
