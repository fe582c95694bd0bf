"""The hands of a session in a self-hosted environment (corral.contract.work): no container of its own; its
built-in calls are run by a worker on the user's machine, which reads them from the session's log and posts each
result back as `user.tool_result`.

A call is logged as `agent.tool_use` (with its permission evaluated) by the turn, as any call is; here the session
asks its environment's queue for hands (once per work item: the `request_work` activity), then waits, at no cost,
for the worker's result. The result is the call's answer: it joins the conversation as it is, with no
`agent.tool_result` beside it. When the item ends before the worker answered (the worker stopped it, or its lease
lapsed because it died), every call still waiting is answered with an error whose outcome is unknown: the worker
may have run it, so it is never handed to another worker to run again. Workflow code: no I/O here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError

from workflows.policies import CONTROL_TIMEOUT, INFRASTRUCTURE_RETRY

with workflow.unsafe.imports_passed_through():
    from corral.contract.events import AgentToolUse, UserToolResult
    from corral.contract.sandbox import Environment
    from corral.contract.work import (
        ACTIVITY_REQUEST_WORK,
        SIGNAL_RELEASE_WORK,
        SIGNAL_WORK_ENDED,
        RequestWorkInput,
        SelfHostedEnvironment,
        WorkEnded,
        WorkRequest,
        work_queue_id,
    )
    from workflows._log import SessionLog
    from workflows._outcomes import failure_message
    from workflows._sandbox import SessionSandbox

ENDED_RESULTS = {
    "stopped": "Tool error: the self-hosted worker stopped its work item before answering this call. It may have "
    "run the call, so its outcome is unknown: check its effects before running it again.",
    "lease_lost": "Tool error: the self-hosted worker serving this session stopped heartbeating (it died or lost "
    "its connection) before answering this call. It may have run the call, so its outcome is unknown: check its "
    "effects before running it again. The next call goes to another worker.",
    "session_ended": "Tool error: the session ended before a self-hosted worker answered this call.",
}
THREAD_CALL_RESULT = (
    "Tool error: a thread's built-in tool calls cannot run on a self-hosted environment's worker (only the "
    "session's own calls can); use a custom tool, or run the thread in a cloud environment."
)


class SelfHostedHands(SessionSandbox):
    """The session's hands when they are a self-hosted worker's: the same face as `SessionSandbox` to the rest of
    the session (execute, stop, release, carry), with no container behind it."""

    def __init__(self, session_id: str, environment: SelfHostedEnvironment, model_queue: str, log: SessionLog,
                 changed: Callable[[], None]) -> None:  # fmt: skip
        super().__init__(session_id, Environment())
        self._hosted, self._model_queue, self._log, self._changed = environment, model_queue, log, changed
        self.waiting: dict[str, AgentToolUse] = {}
        """Calls waiting for the worker's result, by tool-use id."""
        self._results: dict[str, UserToolResult] = {}
        self._unanswerable: dict[str, str] = {}
        """Calls whose work item ended before the worker answered: the error each is answered with."""
        self._requested = False
        """Whether the queue was asked for hands since the session's last item ended (per run: asking again after a
        hand-over is harmless, the queue makes no second item for a session that has a live one)."""
        self._asking = asyncio.Lock()
        workflow.set_signal_handler(SIGNAL_WORK_ENDED, self._work_ended)

    def waiting_for_result(self) -> set[str]:
        """The tool-use ids a `user.tool_result` may answer now."""
        return set(self.waiting) - set(self._results) - set(self._unanswerable)

    def answered(self, result: UserToolResult) -> None:
        """The worker's result, accepted by the session's inbox (which checked it answers a waiting call)."""
        self._results[result.tool_use_id] = result

    async def execute(self, use: AgentToolUse, lane: str | None = None) -> tuple[str, bool]:
        """A call lent to a thread (the session's own calls go through `serve`)."""
        return THREAD_CALL_RESULT, True

    async def serve(self, use: AgentToolUse) -> tuple[str, bool] | None:
        """Wait for the worker's result of the session's call `use`: None when it came (it is in the conversation
        already), else the error that stands in for it."""
        self.waiting[use.id] = use
        self._changed()
        try:
            async with self._asking:
                if not self._requested:
                    problem = await self._ask_for_hands()
                    if problem is not None:
                        return problem, True
            await workflow.wait_condition(lambda: use.id in self._results or use.id in self._unanswerable)
        finally:  # no workflow call here: a workflow evicted mid-wait runs this outside its event loop
            self.waiting.pop(use.id, None)
        self._changed()
        result = self._results.pop(use.id, None)
        if result is None:
            return self._unanswerable.pop(use.id), True
        result.processed_at = workflow.now()
        self._log.add_to_conversation(result)
        return None

    async def _ask_for_hands(self) -> str | None:
        """Ask the environment's queue for a work item; the error result when it cannot be reached."""
        try:
            await workflow.execute_activity(
                ACTIVITY_REQUEST_WORK,
                RequestWorkInput(
                    environment=self._hosted, session_id=self._session_id, task_queue=workflow.info().task_queue
                ),
                task_queue=self._model_queue,
                start_to_close_timeout=CONTROL_TIMEOUT,
                retry_policy=INFRASTRUCTURE_RETRY,
                summary=f"ask for a self-hosted worker of {self._hosted.environment_id}",
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise
            return f"Tool error: the work queue of environment {self._hosted.environment_id} could not be reached: " \
                   f"{failure_message(err)}"  # fmt: skip
        self._requested = True
        return None

    def _work_ended(self, ended: WorkEnded) -> None:
        """The session's item ended: the calls still waiting will not be answered by its worker."""
        self._requested = False
        for use_id in self.waiting_for_result():
            self._unanswerable[use_id] = ENDED_RESULTS[ended.reason]

    @property
    def running(self) -> bool:
        return False  # nothing to stop while the session idles: the worker is the user's

    async def stop(self) -> None:
        return None

    async def release(self) -> None:
        """The session ended: its live item stops, and its worker learns it at its next heartbeat."""
        queue = workflow.get_external_workflow_handle(work_queue_id(self._hosted.environment_id))
        try:
            await queue.signal(SIGNAL_RELEASE_WORK, WorkRequest(session_id=self._session_id,
                                                                workspace=self._hosted.workspace))  # fmt: skip
        except Exception as exc:  # no queue: the session never asked for hands
            workflow.logger.info("no work queue to release for %s: %s", self._session_id, exc)
