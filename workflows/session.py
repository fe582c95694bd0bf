# Over 400 lines because the loop, its handlers and its queries must stay on one class, where Temporal finds them.
"""`SessionWorkflow`: one agent session. Its history is the durable log; this code is the harness loop.

No I/O here (docs/invariants.md, invariant 1): time comes from `workflow.now()`, ids from `workflow.uuid4()`, and every
model call or tool call is an activity. Handlers only validate and append to the log; the main loop does the work.

Each job the loop and its handlers lend to has its module: the model turn and its retries (`_model_turn.py`,
`policies.py`), session administration (`_admin.py`), tool calls, user input, context, hand-over, sandbox, MCP
(`_tool_calls.py`, `_inbox.py`, `_context.py`, `_handover.py`, `_sandbox.py`, `_mcp.py`) and the Web UI's details
(`_details.py`).
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ModelContext, ModelContextQuery
    from corral.contract.carry import Phase, SessionCarry
    from corral.contract.context import ContextView
    from corral.contract.events import (
        BudgetReached,
        EndTurn,
        ErrorType,
        ModelUsage,
        Refusal,
        RefusalStopDetails,
        RetryStatus,
        SessionDeleted,
        SessionError,
        SessionErrorDetail,
        SessionStatusIdle,
        SessionStatusRunning,
        SessionStatusTerminated,
        StopReason,
    )
    from corral.contract.search_attributes import MODEL_KEY, STATUS_KEY
    from corral.contract.session import (
        CustomTool,
        EventPage,
        EventsQuery,
        InterruptSignal,
        ResolvedTool,
        SendEventsInput,
        SendEventsResult,
        SessionInfo,
        SessionInput,
        SessionStatus,
        UpdateSessionInput,
        UserInterruptParams,
        UserMessageParams,
        UserMessageSignal,
        normalize_content,
        parse_user_events,
        web_ui_summary,
    )
    from corral.contract.threads import ArchiveThreadInput, SpawnThreadInput, ThreadInfo, ThreadInput, ThreadReport
    from corral.names import (
        ARCHIVED,
        DELETING,
        EVENT_ID_PREFIX,
        HANDING_OVER,
        QUERY_CONTEXT_VIEW,
        QUERY_EVENTS,
        QUERY_MODEL_CONTEXT,
        QUERY_SESSION,
        QUERY_THREADS,
        SESSION_WORKFLOW,
        SIGNAL_INTERRUPT,
        SIGNAL_THREAD_INPUT,
        SIGNAL_THREAD_REPORT,
        SIGNAL_USER_MESSAGE,
        UPDATE_ARCHIVE_THREAD,
        UPDATE_SEND_EVENTS,
        UPDATE_SESSION,
        UPDATE_SPAWN_THREAD,
        WORKING_STATUSES,
    )
    from workflows._admin import apply_update, validate_update
    from workflows._context import SessionContext
    from workflows._coordinator import CoordinatorTools
    from workflows._details import web_ui_details
    from workflows._fork import start_fork
    from workflows._grading import SessionOutcomes
    from workflows._handover import HandOver, Parts
    from workflows._inbox import UserInbox
    from workflows._knowledge import prompted_agent
    from workflows._log import SessionLog
    from workflows._mcp import RetryState, SessionMcp
    from workflows._metrics import count
    from workflows._model_turn import ModelTurns
    from workflows._outbox import Outbox
    from workflows._outcomes import add_usage, record_response
    from workflows._patches import (
        BUDGET_PATCH,
        BUDGET_SPENT_RESULT,
        CONFIRMATIONS_PATCH,
        IDLE_HAND_OVER_PATCH,
        MESSAGE_IDS_PATCH,
        REFUSAL_PATCH,
        REFUSED_RESULT,
    )
    from workflows._runs import SessionRuns
    from workflows._sandbox import SessionSandbox
    from workflows._seat import BorrowedSandbox, ThreadSide
    from workflows._self_hosted import SelfHostedHands
    from workflows._threads import SessionThreads, primary_info
    from workflows._tool_calls import ToolCalls
    from workflows._webhooks import SessionWebhooks


@workflow.defn(name=SESSION_WORKFLOW)
class SessionWorkflow:
    """An agent session: user events in, model turns and tool calls out, every step a typed event."""

    @workflow.init
    def __init__(self, input: SessionInput) -> None:
        self._input = input
        self._prompted = prompted_agent(input.agent, input.knowledge)  # the system prompt names skills and stores
        self._tools: dict[str, ResolvedTool] = {t.name: t for t in input.agent.resolved_tools()}
        self._log = SessionLog(new_id=lambda: EVENT_ID_PREFIX + workflow.uuid4().hex, now=workflow.now)
        self._webhooks = SessionWebhooks(input, self._log)  # what the workspace's endpoints are told (_webhooks)
        self._created_at = workflow.now()
        self._inbox = UserInbox(self._log, workflow.now, self._interrupt_turn, self._describe)
        self._status: SessionStatus = "idle"
        self._stop_reason: str | None = None
        self._turn_task: asyncio.Task[None] | None = None
        self._context = SessionContext(self._log, input.agent)
        self._mcp = SessionMcp(
            workflow.info().workflow_id, input.agent, input.vault_ids, needs_binding=bool(input.resources)
        )
        self._outbox = Outbox()
        self._side = ThreadSide(input.thread, self._log, self._inbox, self._outbox) if input.thread else None
        """Set when this workflow is a thread of a multi-agent session (workflows/_seat.py)."""
        self._sandbox = self._hands(input)
        self._sandbox.knowledge.serve(self._sandbox, self._refuse_when_closed)  # file resources, outputs (_knowledge)
        self._threads = SessionThreads(input, self._log, self._sandbox, self._outbox, self._inbox.accept_thread_message)
        self._outcomes = SessionOutcomes(self._log, input.agent, input.model_task_queue, self._sandbox, self._spend)
        if self._side is None:
            self._inbox.router, self._inbox.goals = self._threads, self._outcomes
        self._runs = HandOver(input)
        self._flows = SessionRuns(
            input, self._log, self._threads, self._outbox, self._inbox, self._runs, self._refuse_when_closed
        )  # workflow runs, with their handlers (_runs.py)
        coordinate = None
        if input.agent.multiagent is not None:
            coordinate = CoordinatorTools(self._threads, self._flows, self._inbox, lambda: self._log.conversation,
                                          input.model_task_queue, self._spend).run  # fmt: skip
        self._tool_calls = ToolCalls(
            input.agent, self._tools, self._log, self._inbox, self._sandbox, self._mcp, self._report,
            self._go_idle, self._resume_running, self._hand_over_due, self._hand_over, coordinate,
        )  # fmt: skip
        self._model = ModelTurns(
            self._prompted, input.model_retry, input.model_task_queue, self._log, self._context, self._mcp, self._inbox,
            self._report, self._set_status, self._go_idle, self._describe,
        )  # fmt: skip
        self._static = web_ui_summary(input, workflow.info().namespace)
        self._archived_at: datetime | None = None
        self._deleting = False
        if input.carry is not None:
            self._resume(input.carry)
        if input.fork is not None and input.carry is None:
            self._inbox.hold()  # the copy of the source's log takes the first positions
        if input.message is not None:
            self._inbox.accept_message(UserMessageParams(type="user.message", content=input.message))
        if self._side is not None and input.carry is None:
            self._side.start()

    def _hands(self, input: SessionInput) -> SessionSandbox:
        """The session's sandbox; a self-hosted worker's hands (`_self_hosted.py`); or, for a thread, its session's."""
        hosted, session_id = input.self_hosted(), workflow.info().workflow_id
        if self._side is not None:
            return BorrowedSandbox(self._side)
        if hosted is None:
            return SessionSandbox.of(session_id, input, lambda: self._mcp.clones(input.resources))
        hands = SelfHostedHands(session_id, hosted, input.model_task_queue, self._log, self._describe)
        self._inbox.worker_calls = hands
        return hands

    # ---- main loop -----------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: SessionInput) -> None:
        workflow.upsert_search_attributes([STATUS_KEY.value_set(self._status), MODEL_KEY.value_set(input.agent.model)])
        self._describe()
        self._threads.restart()
        if input.fork is not None and input.carry is None:
            sandboxed = input.agent.uses_sandbox() and input.self_hosted() is None  # a worker's files are its own
            await start_fork(self._log, self._inbox, input, sandboxed, self._report)
            self._model.delta_start = len(self._log.conversation)  # the model worker reads the copy through a query
        resume = input.carry.phase if input.carry is not None else "idle"
        try:
            while True:
                if resume == "idle":
                    if self._hand_over_due():
                        await self._hand_over("idle")
                    if self._side is not None and self._side.ending:
                        return await self._end_thread()
                    if not await self._wait_for_work():
                        continue
                self._turn_task = asyncio.create_task(self._run_turn(resume))
                resume = "idle"
                await self._turn_task
                self._turn_task = None
                await self._sandbox.keep_knowledge()  # outputs and memory, after every turn that used them
        except asyncio.CancelledError:
            # The workflow itself was cancelled (e.g. `temporal workflow cancel`): clean up, record the end, stop.
            self._threads.end_all()
            await self._sandbox.release()
            await self._mcp.release()
            await self._outbox.drained()
            self._set_status("terminated")
            if not self._deleting:  # a deleted session's last event is its `session.deleted`
                self._log.append(SessionStatusTerminated)
            await self._webhooks.drained()
            raise

    # ---- hand-over to the next run (workflows/_handover.py) ----------------------------------------------------

    def _hand_over_due(self) -> bool:
        return self._runs.due() and not self._threads.busy() and not self._flows.busy()

    async def _hand_over(self, phase: Phase) -> None:
        """Continue as new from here (`phase`). Returns only when the archive could not be written: that is a
        `session.error`, and the session goes on in this run and tries again later."""
        if not self._outbox.empty():
            await self._outbox.drained()
        archive = await self._runs.archive_run(self._log, self._input.model_task_queue, self._report)
        if archive is None:
            return
        if not self._outbox.empty():  # what handlers queued meanwhile (an interrupt for threads) goes before
            await self._outbox.drained()
        await self._webhooks.drained()  # the events this run owes the endpoints are not carried
        carry = SessionCarry(
            run=self._runs.run + 1,
            phase=phase,
            archive=archive,
            **self._runs.carried(self._parts(), archive, self._model.delta_start),
            usage=self._model.usage,
            turns=self._model.turns,
            created_at=self._created_at,
            status=self._status,
            stop_reason=self._stop_reason,
            archived_at=self._archived_at,
            threads=self._threads.carried(),
            outcomes=self._outcomes.carried(),
            runs=self._flows.carried(),
        )
        moving = workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE if self._runs.moves_build() else None
        workflow.continue_as_new(
            self._input.model_copy(update={"carry": carry, "message": None}), initial_versioning_behavior=moving
        )

    def _resume(self, carry: SessionCarry) -> None:
        """Start from the state the previous run handed over."""
        self._runs.restore(carry, self._parts())
        self._model.usage, self._model.turns, self._created_at = carry.usage, carry.turns, carry.created_at
        self._status, self._stop_reason, self._archived_at = carry.status, carry.stop_reason, carry.archived_at
        self._threads.resume(carry.threads)
        self._outcomes.resume(carry.outcomes)
        self._model.delta_start = len(self._log.conversation)  # the model worker reads the carried view through a query

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
            return bool(self._inbox.pending) or due() or (self._side is not None and self._side.ending)

        if not self._sandbox.running:
            await workflow.wait_condition(woken)
            return bool(self._inbox.pending)
        try:
            await workflow.wait_condition(woken, timeout=self._sandbox.idle_stop_after)
        except asyncio.TimeoutError:  # noqa: UP041 - the builtin, not temporalio.exceptions.TimeoutError
            if not self._threads.working():  # the session idles, but its threads use the sandbox
                await self._sandbox.stop()
            return False
        return bool(self._inbox.pending)

    async def _run_turn(self, resume: Phase = "idle") -> None:
        """Run model calls and tool calls until the model ends its turn, an error ends it, or an interrupt. A turn
        resumed after a hand-over (`resume`) picks up where the previous run left it."""
        if resume == "idle":
            if self._side is not None:
                self._side.turn_start = self._log.last_position
            self._set_status("running")
            self._log.append(SessionStatusRunning)
            self._outcomes.started()
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
                result = await self._model.call()
                if result is None:
                    return
                request_id = self._model.request_id if workflow.patched(MESSAGE_IDS_PATCH) else None
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
                if uses and self._side is not None:
                    self._side.cross_post(uses)
                if uses and result.stop_reason == "max_tokens":
                    cut_off += 1
                    if not self._model.refuse_cut_off_calls(uses, cut_off):
                        return
                elif uses:
                    cut_off = 0
                    await self._tool_calls.run(uses)
                elif not self._inbox.pending and not await self._outcomes.after_turn():
                    await self._sandbox.keep_knowledge()  # its outputs are files, its memory versions, by idle
                    self._go_idle(EndTurn())  # (an outcome pursued is graded first: its verdict may ask for more)
                    return
        except (asyncio.CancelledError, ActivityError):
            if not self._inbox.interrupts:
                raise
            self._finish_interrupt()

    def _list_cost(self) -> int | None:
        return self._threads.list_cost(self._model.usage)

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
        self._go_idle(EndTurn(), reply=False)

    # ---- status -------------------------------------------------------------------------------------------

    def _go_idle(self, reason: StopReason, details: RefusalStopDetails | None = None, reply: bool = True) -> None:
        if details is None:  # the events of sessions that never refused stay as they were
            self._log.append(SessionStatusIdle, stop_reason=reason)
        else:
            self._log.append(SessionStatusIdle, stop_reason=reason, stop_details=details)
        self._set_status("idle", reason.type)
        if self._side is not None:  # a thread replies when its turn ends of itself, and reports each idle
            if reply and isinstance(reason, EndTurn):
                self._side.reply()
            self._side.status("idle", reason, details, self._model.usage, self._model.turns)

    def _resume_running(self) -> None:
        """The turn goes on after a wait for the client."""
        self._set_status("running")
        self._log.append(SessionStatusRunning)

    def _set_status(self, status: SessionStatus, stop_reason: str | None = None) -> None:
        if status != self._status:
            workflow.upsert_search_attributes([STATUS_KEY.value_set(status)])
            if self._side is not None and status in WORKING_STATUSES:
                self._side.status(status, None, None, self._model.usage, self._model.turns)
        self._status = status
        self._stop_reason = stop_reason
        self._describe()

    def _describe(self) -> None:
        """The current details the Temporal Web UI shows for this session."""
        workflow.set_current_details(web_ui_details(self.session(), self._static))

    def _report(self, error_type: ErrorType, message: str, retry_status: RetryState) -> None:
        """A typed `session.error` the client sees; the session itself goes on."""
        count("corral_session_errors", "session.error events, by error type", error_type=error_type)
        self._log.append(
            SessionError,
            error=SessionErrorDetail(type=error_type, message=message, retry_status=RetryStatus(type=retry_status)),
        )

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
        """Append a batch of user events; returns their ids (and the events written, when asked) once they are in
        history."""
        self._runs.requests += 1
        end = self._log.last_position
        ids = self._inbox.accept_batch(input)
        if not input.answer_events:
            return SendEventsResult(event_ids=ids)
        written = [event for event in self._log.events[end - self._log.base :] if event.id in ids]
        return SendEventsResult(event_ids=ids, events=written)

    @send_events.validator
    def _validate_send_events(self, input: SendEventsInput) -> None:
        # Handing over: nothing is written; the client sends again, and the next run takes it (corral.client).
        self._refuse_when_closed()
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
        self._input, self._archived_at, memo = apply_update(self._input, input, self._archived_at, workflow.now)
        workflow.upsert_memo(memo)
        self._describe()
        return self.session()

    @update_session.validator
    def _validate_update_session(self, input: UpdateSessionInput) -> None:
        validate_update(
            input,
            status=self._status,
            deleting=self._deleting,
            archived=self._archived_at is not None,
            handing_over=self._runs.handing_over,
            budget=self._input.budget,
            list_cost=self._list_cost,
        )

    def _interrupt_turn(self) -> bool:
        """Cancel the turn in progress, if there is one (the interrupt is then settled when it ends)."""
        return self._turn_task is not None and not self._turn_task.done() and self._turn_task.cancel()

    # ---- threads (workflows/_threads.py: the session's side; workflows/_seat.py: a thread's) -------------------

    @workflow.signal(name=SIGNAL_THREAD_REPORT)
    def thread_report(self, reports: list[ThreadReport]) -> None:
        """What a thread tells its session, in order (one signal carries what it queued meanwhile)."""
        self._runs.requests += 1
        for report in reports:
            self._threads.on_report(report)

    @workflow.signal(name=SIGNAL_THREAD_INPUT)
    def thread_input(self, inputs: list[ThreadInput]) -> None:
        """What the session tells this thread, in order."""
        self._runs.requests += 1
        if self._side is not None:
            for input in inputs:
                self._side.take(input)

    @workflow.update(name=UPDATE_SPAWN_THREAD)
    async def spawn_thread(self, input: SpawnThreadInput) -> ThreadInfo:
        """Start a thread, as the coordinator's `spawn_thread` tool does (for Temporal-client users)."""
        self._runs.requests += 1
        return await self._threads.spawn(self._threads.check_spawn(input), normalize_content(input.message))

    @spawn_thread.validator
    def _validate_spawn_thread(self, input: SpawnThreadInput) -> None:
        self._refuse_when_closed()
        self._threads.check_spawn(input)

    @workflow.update(name=UPDATE_ARCHIVE_THREAD)
    def archive_thread(self, input: ArchiveThreadInput) -> ThreadInfo:
        """Stop a thread's work and end it; it keeps its log."""
        self._runs.requests += 1
        return self._threads.archive(input.thread_id)

    @archive_thread.validator
    def _validate_archive_thread(self, input: ArchiveThreadInput) -> None:
        if self._runs.handing_over:
            raise ApplicationError("the session is continuing as new: send again", type=HANDING_OVER)
        self._threads.check_archive(input)

    def _refuse_when_closed(self) -> None:
        if self._deleting:
            raise ApplicationError("the session is being deleted: it takes no more events", type=DELETING)
        if self._archived_at is not None:
            raise ApplicationError("the session is archived: it takes no more events", type=ARCHIVED)
        if self._runs.handing_over:
            raise ApplicationError("the session is continuing as new: send again", type=HANDING_OVER)

    def _spend(self, usage: ModelUsage) -> None:
        self._model.usage = add_usage(self._model.usage, usage)

    async def _end_thread(self) -> None:
        """This thread was archived: its turn has stopped; say so, and end."""
        assert self._side is not None
        self._set_status("terminated")
        self._log.append(SessionStatusTerminated)
        self._side.status("terminated", None, None, self._model.usage, self._model.turns)
        await self._mcp.release()
        await self._outbox.drained()

    @workflow.query(name=QUERY_THREADS)
    def threads(self) -> list[ThreadInfo]:
        """This session's threads, its primary thread (the session itself) first; none for a thread."""
        if self._side is not None:
            return []
        info = self.session()
        primary = primary_info(info.id, self._input, info.status, info.stop_reason, info.created_at,
                               info.archived_at, self._model.usage, info.turns)  # fmt: skip
        return [primary, *self._threads.infos.values()]

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
            turns=self._model.turns,
            queued_user_events=len(self._inbox.pending),
            usage=self._threads.total_usage(self._model.usage),
            stop_reason=self._stop_reason,
            metadata=self._input.metadata,
            run=self._runs.run,
            archived_through=self._log.base,
            list_cost=self._list_cost(),
            budget=self._input.budget,
            archived_at=self._archived_at,
            outcome_evaluations=self._outcomes.evaluations,
            awaiting_worker=len(self._sandbox.waiting) if isinstance(self._sandbox, SelfHostedHands) else 0,
        )

    @workflow.query(name=QUERY_EVENTS)
    def events(self, query: EventsQuery | None = None) -> EventPage:
        page = self._log.page(query or EventsQuery(), self._runs.archive)
        return page.model_copy(update={"history_length": workflow.info().get_current_history_length()})

    @workflow.query(name=QUERY_CONTEXT_VIEW)
    def context_view(self) -> ContextView:
        """What the model would see on the next turn: which entries, which elided, the token estimate."""
        return self._context.describe()

    @workflow.query(name=QUERY_MODEL_CONTEXT)
    def model_context(self, query: ModelContextQuery) -> ModelContext:
        context = self._log.model_context(self._prompted, query.start, query.end)
        context.mcp_tools = list(self._mcp.tools.values())
        return context
