"""A thread's side of a multi-agent session: what a thread (a child `SessionWorkflow`) tells its session, what it
takes from it, and the sandbox it borrows from it.

A thread reports each status change, each tool call (cross-posted to the primary log), its usage, and its reply
when its turn ends (its last message, logged here as `agent.thread_message_sent`). It takes messages from other
threads as input (`agent.thread_message_received`), the client's answers the session routed to it, interrupts and
its archiving. Its sandbox calls run on the session's sandbox: sent up, their results sent back down.

Workflow code: no I/O; signals are commands.
"""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from corral.contract.events import (
        AgentCustomToolUse,
        AgentMcpToolUse,
        AgentMessage,
        AgentThreadMessageSent,
        AgentToolUse,
        ModelUsage,
        RefusalStopDetails,
        StopReason,
        TextBlock,
    )
    from corral.contract.sandbox import Environment
    from corral.contract.session import UserInterruptParams
    from corral.contract.threads import HandResult, ThreadInput, ThreadReport, ThreadSeat, ThreadStatus
    from corral.names import SIGNAL_THREAD_REPORT
    from workflows._inbox import UserInbox
    from workflows._log import SessionLog
    from workflows._outbox import Outbox
    from workflows._sandbox import SessionSandbox

NO_REPLY = "(The thread ended its turn without a message.)"


class ThreadSide:
    """One thread's exchange with its session."""

    def __init__(self, seat: ThreadSeat, log: SessionLog, inbox: UserInbox, outbox: Outbox) -> None:
        self.seat, self._log, self._inbox, self._outbox = seat, log, inbox, outbox
        self.results: dict[str, HandResult] = {}
        self.ending = False
        """Archived by the session: the thread stops its work and ends."""
        self.turn_start = 0
        self.active_seconds = 0.0
        self._running_since: datetime | None = None

    def start(self) -> None:
        """Take the message the thread was spawned with (a first run only)."""
        seat = self.seat
        self._inbox.accept_thread_message(seat.parent_thread_id, None, seat.message, seat.message_id or seat.thread_id)

    def report(self, report: ThreadReport) -> None:
        self._outbox.send(self.seat.session_id, SIGNAL_THREAD_REPORT, report)

    def status(self, status: ThreadStatus, reason: StopReason | None, details: RefusalStopDetails | None,
               usage: ModelUsage, turns: int) -> None:  # fmt: skip
        """Tell the session of a status change (with the usage so far, at each idle)."""
        now = workflow.now()
        if status == "running" and self._running_since is None:
            self._running_since = now
        elif status != "running" and status != "rescheduling" and self._running_since is not None:
            self.active_seconds += (now - self._running_since).total_seconds()
            self._running_since = None
        report = ThreadReport(thread_id=self.seat.thread_id, status=status, stop_reason=reason, stop_details=details)
        if status != "running":
            report.usage, report.turns, report.active_seconds = usage, turns, self.active_seconds
        self.report(report)

    def reply(self) -> None:
        """The turn ended: send its last message to the session as this thread's reply."""
        messages = [e for e in self._log.events if isinstance(e, AgentMessage) and e.position > self.turn_start]
        content = messages[-1].content if messages else [TextBlock(text=NO_REPLY)]
        sent = self._log.append(AgentThreadMessageSent, to_session_thread_id=self.seat.parent_thread_id,
                                content=content)  # fmt: skip
        self.report(ThreadReport(thread_id=self.seat.thread_id, reply=list(content), reply_id=sent.id))

    def cross_post(self, uses: list[AgentToolUse | AgentMcpToolUse | AgentCustomToolUse]) -> None:
        if uses:
            self.report(ThreadReport(thread_id=self.seat.thread_id, uses=uses))

    def take(self, input: ThreadInput) -> None:
        """What the session sent this thread."""
        if input.hand_result is not None:
            self.results[input.hand_result.tool_use_id] = input.hand_result
        if input.message is not None:
            message = input.message
            self._inbox.accept_thread_message(message.from_thread_id, message.from_agent_name, message.content,
                                              message.message_id)  # fmt: skip
        if input.answer is not None:
            self._inbox.accept(input.answer)
        if input.interrupt or input.archive:
            self._inbox.accept(UserInterruptParams(type="user.interrupt"))
        if input.archive:
            self.ending = True


class BorrowedSandbox(SessionSandbox):
    """A thread's sandbox: the session's, reached through the session. The session provisions it, restarts it,
    stops it when idle and releases it; for the thread it is never running (nothing to stop) and carries nothing."""

    def __init__(self, side: ThreadSide) -> None:
        super().__init__(side.seat.session_id, Environment())
        self._side = side

    @property
    def running(self) -> bool:
        return False

    async def execute(self, use: AgentToolUse, lane: str | None = None) -> tuple[str, bool]:
        side = self._side
        side.report(ThreadReport(thread_id=side.seat.thread_id, hand_call=use))
        await workflow.wait_condition(lambda: use.id in side.results)
        result = side.results.pop(use.id)
        return result.text, result.is_error

    async def stop(self) -> None:
        return None

    async def release(self) -> None:
        return None
