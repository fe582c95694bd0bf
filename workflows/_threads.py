# Over 400 lines because the session's side of every exchange with its threads (workflow runs' too) is one class.
"""A multi-agent session's threads, as its primary thread (the session workflow) keeps them.

Each thread is a child workflow of the session (`SessionWorkflow` again, its id the thread's id), with its own
history as its log, its own context and its own continue-as-new. The session spawns threads (the coordinator's
`spawn_thread` tool, or the `spawn_thread` update), sends them messages, and learns from their reports (signal
`thread_report`) what they do: each status change, each reply, each tool call (cross-posted to the primary log with
`session_thread_id`), their usage. It routes to them what the client sends for them by tool-use id (custom tool
results, confirmations) and interrupts. It also lends them its hands: a thread's sandbox call runs here, on the
session's sandbox, and its result goes back by signal, so one sandbox serves every brain and the session alone
decides its life.

Workflow code: no I/O; child workflow starts and signals are commands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from corral.contract.events import (
        AgentCustomToolUse,
        AgentMcpToolUse,
        AgentThreadMessageSent,
        AgentToolUse,
        ContentBlock,
        ModelUsage,
        SessionThreadCreated,
        SessionThreadStatusIdle,
        SessionThreadStatusRescheduled,
        SessionThreadStatusRunning,
        SessionThreadStatusTerminated,
        UserCustomToolResult,
        UserInterrupt,
        UserToolConfirmation,
    )
    from corral.contract.pricing import list_cost
    from corral.contract.session import (
        SessionInput,
        UserCustomToolResultParams,
        UserInterruptParams,
        UserToolConfirmationParams,
        normalize_content,
    )
    from corral.contract.threads import (
        ArchiveThreadInput,
        HandResult,
        SpawnedAgent,
        SpawnThreadInput,
        ThreadHandCall,
        ThreadInfo,
        ThreadInput,
        ThreadMessage,
        ThreadReport,
        ThreadsCarry,
        ThreadSeat,
        primary_thread_id,
    )
    from corral.names import (
        NOT_MULTIAGENT,
        SESSION_WORKFLOW,
        SIGNAL_THREAD_INPUT,
        THREAD_ARCHIVED,
        THREAD_ID_PREFIX,
        THREAD_LIMIT_REACHED,
        THREAD_NOT_FOUND,
        WORKING_STATUSES,
        SessionStatus,
    )
    from workflows._log import SessionLog
    from workflows._outbox import Outbox
    from workflows._outcomes import add_usage
    from workflows._sandbox import SessionSandbox
if TYPE_CHECKING:
    from workflows._runs import SessionRuns

USER_SENDER = "user"
"""How `wait`'s `pending` names a user's message queued for the coordinator: it ends the wait too."""
Inbox = Callable[[str, str | None, list[ContentBlock], str], object]
"""Queue another thread's message as input: (from thread, from agent name, content, sender's event id)."""


class SessionThreads:
    """The threads of one session run, and the session's side of every exchange with them."""

    def __init__(self, input: SessionInput, log: SessionLog, sandbox: SessionSandbox, outbox: Outbox,
                 receive: Inbox) -> None:  # fmt: skip
        self._input, self._log, self._sandbox, self._outbox, self._receive = input, log, sandbox, outbox, receive
        self.session_id = workflow.info().workflow_id
        self.primary_id = primary_thread_id(self.session_id)
        self.infos: dict[str, ThreadInfo] = {}
        self.custom_routes: dict[str, str] = {}
        self.confirm_routes: dict[str, str] = {}
        self.replies: dict[str, int] = {}
        self._serving: dict[str, tuple[str, AgentToolUse]] = {}
        """Threads' sandbox calls running here, by tool-use id: (thread id, call)."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        """The task serving each call in `_serving`, to stop it when its thread is interrupted."""
        self.runs: SessionRuns | None = None
        """The session's workflow runs: a run's thread answers its run, not the coordinator."""

    # ---- across hand-overs ------------------------------------------------------------------------------------

    def carried(self) -> ThreadsCarry | None:
        if not self.infos:
            return None
        calls = [ThreadHandCall(thread_id=thread_id, use=use) for thread_id, use in self._serving.values()]
        return ThreadsCarry(threads=list(self.infos.values()), custom_routes=self.custom_routes,
                            confirm_routes=self.confirm_routes, replies=self.replies, hand_calls=calls)  # fmt: skip

    def resume(self, carry: ThreadsCarry | None) -> None:
        if carry is not None:
            self.infos = {info.id: info for info in carry.threads}
            self.custom_routes, self.confirm_routes = dict(carry.custom_routes), dict(carry.confirm_routes)
            self.replies = dict(carry.replies)
            self._serving = {call.use.id: (call.thread_id, call.use) for call in carry.hand_calls}

    def restart(self) -> None:
        """Run again the threads' calls that were running when the previous run handed over."""
        for thread_id, use in self._serving.values():
            self._start(thread_id, use)

    def working(self) -> bool:
        """A thread is at work, or one of its calls runs here: the sandbox is not idle, whatever the session does."""
        return bool(self._serving) or any(info.status in WORKING_STATUSES for info in self.infos.values())

    def busy(self) -> bool:
        """A thread's hand call runs here, or a signal is on its way: not a point to hand over at."""
        return bool(self._serving) or not self._outbox.empty()

    # ---- spawning, messaging, archiving -----------------------------------------------------------------------

    def check_spawn(self, input: SpawnThreadInput) -> SpawnedAgent:
        """The agent a spawn runs, or an ApplicationError that says why it may not (nothing is written)."""
        multiagent = self._input.agent.multiagent
        if multiagent is None or not multiagent.spawns():
            raise ApplicationError("this session's agent spawns no threads (it has no multiagent subagents)",
                                   type=NOT_MULTIAGENT, non_retryable=True)  # fmt: skip
        if len(self.infos) >= multiagent.max_threads:
            raise ApplicationError(f"this session has made its {multiagent.max_threads} threads, its limit",
                                   type=THREAD_LIMIT_REACHED, non_retryable=True)  # fmt: skip
        coordinator = self._input.agent
        if input.inline_agent is not None:
            if not multiagent.inline_agents:
                raise ApplicationError("this agent may not define inline agents: name a predefined one",
                                       type=NOT_MULTIAGENT, non_retryable=True)  # fmt: skip
            inline = input.inline_agent
            update = {"name": inline.name, "system": inline.system, "model": inline.model or coordinator.model}
            config = coordinator.without_multiagent().model_copy(update=update)
            agent = SpawnedAgent(type="inline", name=inline.name, config=config)
        else:
            entry = multiagent.find(coordinator, input.agent or "")
            if entry is None:
                names = ", ".join(sorted(entry.name(coordinator) for entry in multiagent.agents)) or "none"
                raise ApplicationError(f"no predefined agent {input.agent!r}: choose one of {names}",
                                       type=THREAD_NOT_FOUND, non_retryable=True)  # fmt: skip
            agent = SpawnedAgent(type=entry.type, name=entry.name(coordinator), id=entry.id, version=entry.version,
                                 config=entry.config or coordinator.without_multiagent())  # fmt: skip
        seat = ThreadSeat(session_id=self.session_id, thread_id=THREAD_ID_PREFIX, parent_thread_id=self.primary_id,
                          agent=agent)  # fmt: skip
        self._child_input(agent, seat)  # refused now, rather than when the thread starts
        return agent

    def _child_input(self, agent: SpawnedAgent, seat: ThreadSeat) -> SessionInput:
        """A thread's start input: its agent, the session's vaults, model settings, hand-over size and budget (at
        the session's price). An ApplicationError says why there can be none (nothing is started)."""
        parent = self._input
        budget = parent.budget.model_copy(update={"price": parent.budget_price()}) if parent.budget else None
        try:
            return SessionInput(
                agent=agent.config,
                title=f"{agent.name} · thread of {parent.title or self.session_id}",
                vault_ids=parent.vault_ids,
                model_retry=parent.model_retry,
                model_task_queue=parent.model_task_queue,
                continue_as_new_after_events=parent.continue_as_new_after_events,
                budget=budget,
                thread=seat,
            )
        except ValueError as exc:  # pydantic's ValidationError is one
            raise ApplicationError(f"agent {agent.name!r} cannot run as a thread: {exc}", type=NOT_MULTIAGENT,
                                   non_retryable=True) from None  # fmt: skip

    async def spawn(self, agent: SpawnedAgent, message: list[ContentBlock], thread_id: str | None = None,
                    run_id: str | None = None) -> ThreadInfo:  # fmt: skip
        """Start a thread running `agent` on `message`: a child workflow, logged as `session.thread_created` and the
        message as `agent.thread_message_sent`. A workflow run (`run_id`) chose the thread's id."""
        thread_id = thread_id or THREAD_ID_PREFIX + workflow.uuid4().hex
        now = workflow.now()
        info = ThreadInfo(id=thread_id, session_id=self.session_id, parent_thread_id=self.primary_id, agent=agent,
                          status="running", created_at=now, updated_at=now, workflow_run_id=run_id)  # fmt: skip
        self.infos[thread_id] = info
        self._log.append(SessionThreadCreated, session_thread_id=thread_id, agent_name=agent.name,
                         workflow_run_id=run_id)  # fmt: skip
        sent = self._log.append(AgentThreadMessageSent, to_session_thread_id=thread_id, to_agent_name=agent.name,
                                content=message)  # fmt: skip
        seat = ThreadSeat(session_id=self.session_id, thread_id=thread_id, parent_thread_id=self.primary_id,
                          agent=agent, message=message, message_id=sent.id)  # fmt: skip
        child = self._child_input(agent, seat)
        await workflow.start_child_workflow(
            SESSION_WORKFLOW,
            child,
            id=thread_id,
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,  # the session's runs end at each hand-over
            static_summary=f"thread {agent.name} of {self.session_id}",
        )
        return info

    def named(self, wanted: str) -> str:
        """The id of the thread `wanted` names: its id, or the name of the agent of the one open thread running it
        (a model remembers names better than ids); `wanted` itself when it names none or several."""
        if wanted in self.infos:
            return wanted
        running = [tid for tid, info in self.infos.items() if info.agent.name == wanted and info.archived_at is None]
        return running[0] if len(running) == 1 else wanted

    def check_open(self, thread_id: str) -> ThreadInfo:
        info = self.infos.get(thread_id)
        if info is None:
            known = ", ".join(self.infos) or "none"
            raise ApplicationError(f"no thread {thread_id!r} in this session (threads: {known})",
                                   type=THREAD_NOT_FOUND, non_retryable=True)  # fmt: skip
        if info.archived_at is not None:
            raise ApplicationError(f"thread {thread_id} is archived", type=THREAD_ARCHIVED, non_retryable=True)
        return info

    def message(self, wanted: str, content: list[ContentBlock]) -> str:
        """Send a thread (by id, or by its agent's name) a message; the thread's id."""
        thread_id = self.named(wanted)
        info = self.check_open(thread_id)
        sent = self._log.append(AgentThreadMessageSent, to_session_thread_id=thread_id, to_agent_name=info.agent.name,
                                content=content)  # fmt: skip
        message = ThreadMessage(from_thread_id=self.primary_id, content=content, message_id=sent.id)
        self._tell(thread_id, ThreadInput(message=message))
        return thread_id

    def check_archive(self, input: ArchiveThreadInput) -> None:
        if input.thread_id == self.primary_id:
            raise ApplicationError("the primary thread is the session: archive the session instead",
                                   type=THREAD_ARCHIVED, non_retryable=True)  # fmt: skip
        if input.thread_id not in self.infos:
            self.check_open(input.thread_id)

    def archive(self, thread_id: str) -> ThreadInfo:
        """Stop the thread's work and end it; archiving twice is harmless."""
        info = self.infos[thread_id]
        if info.archived_at is None:
            info.archived_at = info.updated_at = workflow.now()
            self._tell(thread_id, ThreadInput(archive=True))
        return info

    def end_all(self) -> None:
        """The session ends: so do its workflow runs and its threads."""
        if self.runs is not None:
            self.runs.stop_all()
        for thread_id, info in self.infos.items():
            if info.archived_at is None:
                self.archive(thread_id)

    # ---- what threads report ----------------------------------------------------------------------------------

    def on_report(self, report: ThreadReport) -> None:
        info = self.infos.get(report.thread_id)
        if info is None:
            workflow.logger.warning("dropped a report from %s, not a thread of this session", report.thread_id)
            return
        now = workflow.now()
        info.updated_at = now
        for use in report.uses:
            self._cross_post(info, use)
        if report.usage is not None:
            info.usage = report.usage
            info.turns = report.turns or info.turns
            info.stats.active_seconds = report.active_seconds or info.stats.active_seconds
        info.stats.duration_seconds = (now - info.created_at).total_seconds()
        claimed = self.runs is not None and self.runs.claim(info, report)  # a run's thread answers its run
        if report.reply is not None and report.reply_id is not None and not claimed:
            if self._receive(info.id, info.agent.name, report.reply, report.reply_id) is not None:
                self.replies[info.id] = self.replies.get(info.id, 0) + 1
        if report.cancel_call is not None and report.cancel_call in self._tasks:
            self._tasks[report.cancel_call].cancel()
        if report.hand_call is not None and report.hand_call.id not in self._serving:
            self._serving[report.hand_call.id] = (info.id, report.hand_call)
            self._start(info.id, report.hand_call)
        if report.status is not None:
            self._status(info, report)

    def _status(self, info: ThreadInfo, report: ThreadReport) -> None:
        fields: dict[str, Any] = {"session_thread_id": info.id, "agent_name": info.agent.name}
        if report.status == "idle" and report.stop_reason is not None:
            if report.stop_details is None:
                self._log.append(SessionThreadStatusIdle, stop_reason=report.stop_reason, **fields)
            else:
                self._log.append(SessionThreadStatusIdle, stop_reason=report.stop_reason,
                                 stop_details=report.stop_details, **fields)  # fmt: skip
            info.stop_reason = report.stop_reason.type
        elif report.status == "running":
            self._log.append(SessionThreadStatusRunning, **fields)
            info.stop_reason = None
        elif report.status == "rescheduling":
            self._log.append(SessionThreadStatusRescheduled, **fields)
        elif report.status == "terminated":
            self._log.append(SessionThreadStatusTerminated, **fields)
        info.status = report.status or info.status

    def _cross_post(self, info: ThreadInfo, use: AgentToolUse | AgentMcpToolUse | AgentCustomToolUse) -> None:
        """A copy of a subagent's call on the primary log, with its id, so the client answers it by that id."""
        fields = use.model_dump(exclude={"id", "type", "position", "created_at", "processed_at", "session_thread_id"})
        self._log.append(type(use), id=use.id, session_thread_id=info.id, **fields)
        if isinstance(use, AgentCustomToolUse):
            self.custom_routes[use.id] = info.id
        elif use.evaluated_permission == "ask":
            self.confirm_routes[use.id] = info.id

    def _start(self, thread_id: str, use: AgentToolUse) -> None:
        self._tasks[use.id] = asyncio.create_task(self._serve(thread_id, use))

    async def _serve(self, thread_id: str, use: AgentToolUse) -> None:
        """Run a thread's sandbox call on the session's sandbox and send the result back."""
        try:
            text, is_error = await self._sandbox.execute(use, lane=thread_id)
        finally:
            self._serving.pop(use.id, None)
            self._tasks.pop(use.id, None)
        self._tell(thread_id, ThreadInput(hand_result=HandResult(tool_use_id=use.id, text=text, is_error=is_error)))

    # ---- what the client sends for a thread ---------------------------------------------------------------------

    def routed(self, params: UserCustomToolResultParams | UserToolConfirmationParams) -> str | None:
        """Log an answer for a subagent's call on the primary log and route it to its thread; its event id, or
        None when the call is not a subagent's."""
        if isinstance(params, UserCustomToolResultParams):
            thread_id = self.custom_routes.pop(params.custom_tool_use_id, None)
            if thread_id is None:
                return None
            content = normalize_content(params.content) if params.content else []
            event: UserCustomToolResult | UserToolConfirmation = self._log.append(
                UserCustomToolResult, custom_tool_use_id=params.custom_tool_use_id, content=content,
                is_error=params.is_error, client_id=params.id, session_thread_id=thread_id,
            )  # fmt: skip
        else:
            thread_id = self.confirm_routes.pop(params.tool_use_id, None)
            if thread_id is None:
                return None
            event = self._log.append(
                UserToolConfirmation, tool_use_id=params.tool_use_id, result=params.result,
                deny_message=params.deny_message, client_id=params.id, session_thread_id=thread_id,
            )  # fmt: skip
        self._tell(thread_id, ThreadInput(answer=params))
        return event.id

    def check_interrupt(self, params: UserInterruptParams) -> None:
        target = params.session_thread_id
        if target is not None and target != self.primary_id and target not in self.infos:
            raise ValueError(f"session_thread_id: no thread {target!r} in this session")

    def interrupt(self, params: UserInterruptParams) -> str | None:
        """Route an interrupt: to one thread (its event id), or to every open thread too (None: the session
        interrupts its primary thread as well)."""
        target = params.session_thread_id
        if target is not None and target != self.primary_id:
            event = self._log.append(UserInterrupt, client_id=params.id, session_thread_id=target)
            if self.infos[target].archived_at is None:
                self._tell(target, ThreadInput(interrupt=True))
            return event.id
        if target is None:
            if self.runs is not None:
                self.runs.stop_all()
            for thread_id, info in self.infos.items():
                if info.archived_at is None:
                    self._tell(thread_id, ThreadInput(interrupt=True))
        return None

    def advisor_model(self) -> str | None:
        multiagent = self._input.agent.multiagent
        return multiagent.advisor_model if multiagent is not None else None

    def total_usage(self, own: ModelUsage) -> ModelUsage:
        """The session's usage: its own model turns' (`own`) and its threads'."""
        for info in self.infos.values():
            own = add_usage(own, info.usage)
        return own

    def list_cost(self, own: ModelUsage) -> int | None:
        """What the session's model turns and its threads' have cost at list price, in US cents (None: no price):
        a multi-agent session's threads spend from its budget too."""
        price = self._input.budget_price()
        if price is None:
            return None
        cost = list_cost(self._input.agent.model, own, price)
        return cost + sum(list_cost(info.agent.config.model, info.usage, price) for info in self.infos.values())

    def _tell(self, thread_id: str, input: ThreadInput) -> None:
        self._outbox.send(thread_id, SIGNAL_THREAD_INPUT, input)


def primary_info(session_id: str, input: SessionInput, status: SessionStatus, stop_reason: str | None,
                 created_at: datetime, archived_at: datetime | None, usage: ModelUsage,
                 turns: int) -> ThreadInfo:  # fmt: skip
    """The primary thread's entry in the session's thread list: the session itself."""
    agent = SpawnedAgent(type="primary", name=input.agent.name or "primary", config=input.agent)
    return ThreadInfo(id=primary_thread_id(session_id), session_id=session_id, agent=agent, status=status,
                      stop_reason=stop_reason, created_at=created_at, updated_at=workflow.now(),
                      archived_at=archived_at, usage=usage, turns=turns)  # fmt: skip
