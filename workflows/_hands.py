"""The activities the harness calls for a turn: the model, and a hand's `execute(name, input) -> string` on the
task queue of the worker that serves it.

Any process that serves the `execute` activity on its own queue is a hand (see corral.hands); the sandbox's
built-in tools go through `_sandbox.py` instead, which provisions the container first.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

from workflows.policies import (
    HAND_HEARTBEAT_TIMEOUT,
    HAND_SCHEDULE_TO_START,
    INFRASTRUCTURE_RETRY,
    MODEL_HEARTBEAT_TIMEOUT,
    MODEL_TURN_TIMEOUT,
    ROUTED_RETRY,
    ROUTED_SCHEDULE_TO_START,
)

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ExecuteInput, ModelTurnInput, ModelTurnResult
    from corral.contract.errors import MODEL_FATAL, MODEL_RETRYABLE
    from corral.contract.events import AgentToolUse
    from corral.contract.session import HandTool
    from corral.names import ACTIVITY_EXECUTE, ACTIVITY_MODEL_TURN
    from workflows._outcomes import tool_failure

MODEL_ROUTING_PATCH = "model-turn-routing"


async def execute_on_hand(tool: HandTool, use: AgentToolUse) -> tuple[str, bool]:
    """(output, is_error): a failure is a result the model sees; a cancellation (interrupt) propagates."""
    try:
        output: str = await workflow.execute_activity(
            ACTIVITY_EXECUTE,
            ExecuteInput(session_id=workflow.info().workflow_id, tool_use_id=use.id, name=use.name, input=use.input),
            task_queue=tool.task_queue,
            result_type=str,
            start_to_close_timeout=timedelta(seconds=tool.timeout_seconds),
            schedule_to_start_timeout=HAND_SCHEDULE_TO_START,
            heartbeat_timeout=HAND_HEARTBEAT_TIMEOUT,
            retry_policy=INFRASTRUCTURE_RETRY,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"tool {use.name}",
        )
    except ActivityError as err:
        if isinstance(err.cause, CancelledError):
            raise
        return tool_failure(use.name, tool.task_queue, err), True
    return output, False


class ModelRoute:
    """Sends a session's model turns to the model worker that already holds its conversation in its cache, the
    way the sandbox routes calls to its engine (workflows/_sandbox.py).

    A model worker serves the shared queue and one of its own (`<queue>@<worker id>`), and says in its result
    which one it is. The next turn goes there with a short schedule-to-start timeout and no retry of its own; if
    that worker is gone (not picked up in time, or its heartbeat stopped) or failed in any way that is not the
    model's own answer, the turn goes to the shared queue, where any worker serves it (reading the conversation
    back through a query), with Temporal's usual retries. With one model worker every turn is a cache hit either
    way; with several, routing is what makes the hits."""

    def __init__(self, shared_queue: str) -> None:
        self.shared_queue = shared_queue
        self.worker_queue: str | None = None
        """Not carried over continue-as-new: the next run is a new cache key (session, run) on every worker."""

    async def call(self, turn: ModelTurnInput, summary: str) -> ModelTurnResult:
        """One model request (a turn, or a summary for compaction); its errors are the caller's to judge."""
        # Determinism: histories recorded before routing have no `worker_task_queue` in their results, so they
        # never get here; the patch marks where a new history first took the routed path.
        if self.worker_queue is not None and workflow.patched(MODEL_ROUTING_PATCH):
            try:
                result = await _model_turn(
                    turn.model_copy(update={"routed": True}),
                    summary,
                    self.worker_queue,
                    schedule_to_start_timeout=ROUTED_SCHEDULE_TO_START,
                    retry_policy=ROUTED_RETRY,
                )
            except ActivityError as err:
                if not _worker_lost(err):
                    raise
                self.worker_queue = None
            else:
                self.worker_queue = result.worker_task_queue
                return result
        result = await _model_turn(turn, summary, self.shared_queue, retry_policy=INFRASTRUCTURE_RETRY)
        self.worker_queue = result.worker_task_queue
        return result


async def _model_turn(
    turn: ModelTurnInput,
    summary: str,
    task_queue: str,
    *,
    retry_policy: RetryPolicy,
    schedule_to_start_timeout: timedelta | None = None,
) -> ModelTurnResult:
    result: ModelTurnResult = await workflow.execute_activity(
        ACTIVITY_MODEL_TURN,
        turn,
        task_queue=task_queue,
        result_type=ModelTurnResult,
        start_to_close_timeout=MODEL_TURN_TIMEOUT,
        schedule_to_start_timeout=schedule_to_start_timeout,
        heartbeat_timeout=MODEL_HEARTBEAT_TIMEOUT,
        retry_policy=retry_policy,
        cancellation_type=workflow.ActivityCancellationType.TRY_CANCEL,
        summary=summary,
    )
    return result


def _worker_lost(err: ActivityError) -> bool:
    """A routed turn that failed for any reason but an interrupt or the model's own error: on the shared queue
    it would have been retried (INFRASTRUCTURE_RETRY), so it is, there."""
    cause = err.cause
    if isinstance(cause, CancelledError):
        return False
    return not (isinstance(cause, ApplicationError) and cause.type in (MODEL_RETRYABLE, MODEL_FATAL))
