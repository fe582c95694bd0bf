"""Continue-as-new without a seam: when a run's history has grown enough, the session hands itself over to a new
run of the same workflow id, carrying its state (corral.contract.carry) and leaving its events in the archive.

When: Temporal suggests it, or this run's history reached `continue_as_new_after_events`, or it took
`MAX_UPDATES_PER_RUN` updates and signals (Temporal refuses the 2,001st update of a run), or a new build of a
versioned harness became current while this run is pinned to an older one (workers/deployment.py): the next run
starts on the new build (`moves_build`). Where: only at points
where no activity is in flight: waiting for a message, between a tool result and the next model call, or waiting
for the client's custom tool results and tool confirmations (the calls waiting, and the answers already in, are
carried; a confirmed call runs in the next run). How: the run's final events are written to the archive by an
activity (which reads them through this run's `events` query), handlers are let finish, then the run continues as
new. Updates and signals that arrive meanwhile are either taken by this run (their events are in the carried tail)
or retried by Temporal on the new one: none is lost, none is taken twice. What the session has spent against its
budget goes across in its usage, from which it is priced again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError

from workflows.policies import ARCHIVE_TIMEOUT, INFRASTRUCTURE_RETRY

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ArchiveLogInput
    from corral.contract.carry import CLIENT_ID_WINDOW, ArchiveIndex, SessionCarry
    from corral.contract.context import view
    from corral.contract.events import ErrorType
    from corral.contract.session import MAX_UPDATES_PER_RUN, SessionInput
    from corral.names import ACTIVITY_ARCHIVE_LOG
    from workflows._context import SessionContext
    from workflows._inbox import UserInbox
    from workflows._log import SessionLog
    from workflows._mcp import RetryState, SessionMcp
    from workflows._sandbox import SessionSandbox

Parts = tuple[SessionLog, SessionContext, UserInbox, SessionSandbox, SessionMcp]
"""The components whose state crosses a hand-over."""
Report = Callable[[ErrorType, str, RetryState], None]


class HandOver:
    """This run's place in the session (its number, the archive of the runs before it), when it should hand over
    to the next one, and the moving of state across: archiving the run, carrying the components, restoring them."""

    def __init__(self, input: SessionInput) -> None:
        self.run = 1
        self.archive = ArchiveIndex()
        self._after_events = input.continue_as_new_after_events
        self.requests = 0
        """Updates and signals this run took."""
        self.handing_over = False
        """Set from the start of a hand-over: the `send_events` validator refuses updates (the client sends them
        again, to the next run), so that no update is accepted in the workflow task that continues as new."""
        self._not_before = 0

    def due(self) -> bool:
        info = workflow.info()
        length = info.get_current_history_length()
        if length < self._not_before:
            return False
        if info.is_continue_as_new_suggested() or self.moves_build():
            return True
        return length >= self._after_events or self.requests >= MAX_UPDATES_PER_RUN

    @staticmethod
    def moves_build() -> bool:
        """A newer build of the harness is current: the next run starts there, not on this run's pinned build.
        (Always False on an unversioned harness, so recorded histories replay unchanged.)"""
        return workflow.info().is_target_worker_deployment_version_changed()

    def postpone(self) -> None:
        """The hand-over failed: try again once the history has grown by half a run."""
        self._not_before = workflow.info().get_current_history_length() + self._after_events // 2
        self.requests = min(self.requests, MAX_UPDATES_PER_RUN // 2)

    async def archive_run(self, log: SessionLog, task_queue: str, report: Report) -> ArchiveIndex | None:
        """Refuse updates from now on, let handlers finish, and write this run's final events to the archive: the
        archive the next run starts from, or None when it could not be written (reported; tried again later)."""
        self.handing_over = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        through = log.final_through()
        try:
            chunks = await archive_log(log.base, through, task_queue)
        except ActivityError as err:
            self.handing_over = False
            if isinstance(err.cause, CancelledError):
                raise
            report("unknown_error", f"could not continue as new (the session goes on): {err.cause}", "retrying")
            self.postpone()
            return None
        await workflow.wait_condition(workflow.all_handlers_finished)
        return ArchiveIndex(through=through, chunks=self.archive.chunks + chunks)

    @staticmethod
    def carried(parts: Parts, archive: ArchiveIndex, delta_start: int) -> dict[str, Any]:
        """The components' state for `SessionCarry`: the log's tail and the context view, the inbox, the hands."""
        log, context, inbox, sandbox, mcp = parts
        return {
            "tail": log.events[archive.through - log.base :],
            "conversation": view(log.conversation, context.watermark, context.max_block_chars),
            "unseen_from": context.unseen(delta_start),
            "watermark": context.watermark,
            **inbox.carried(CLIENT_ID_WINDOW),
            "sandbox": sandbox.carried(),
            "mcp": mcp.carried(),
        }

    def restore(self, carry: SessionCarry, parts: Parts) -> None:
        """Start the components from the state the previous run handed over."""
        log, context, inbox, sandbox, mcp = parts
        self.run, self.archive = carry.run, carry.archive
        log.resume(carry.archive.through, carry.tail, carry.conversation)
        inbox.resume(carry)
        context.watermark, context.carried_unseen = carry.watermark, carry.unseen_from
        sandbox.resume(carry.sandbox)
        mcp.resume(carry.mcp)


async def archive_log(after: int, through: int, task_queue: str) -> list[int]:
    """Write this run's events `after+1 .. through` to the archive; the first positions of the chunks written."""
    if through <= after:
        return []
    info = workflow.info()
    chunks: list[int] = await workflow.execute_activity(
        ACTIVITY_ARCHIVE_LOG,
        ArchiveLogInput(session_id=info.workflow_id, run_id=info.run_id, after=after, through=through),
        task_queue=task_queue,
        result_type=list[int],
        start_to_close_timeout=ARCHIVE_TIMEOUT,
        retry_policy=INFRASTRUCTURE_RETRY,
        summary=f"archive positions {after + 1}-{through} before continuing as new",
    )
    return chunks
