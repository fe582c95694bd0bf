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

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ExecuteInput, ModelTurnInput, ModelTurnResult
    from corral.contract.errors import MODEL_FATAL, MODEL_RETRYABLE
    from corral.contract.events import AgentToolUse
    from corral.contract.session import HandTool
    from corral.names import ACTIVITY_EXECUTE, ACTIVITY_MODEL_TURN
    from workflows._outcomes import INFRASTRUCTURE_RETRY, tool_failure

MODEL_TURN_TIMEOUT = timedelta(minutes=10)
MODEL_HEARTBEAT_TIMEOUT = timedelta(seconds=2)
"""A lost model worker is noticed within this time, plus the server's timer lag (about 1.5 s on the dev server). The
model worker sends a heartbeat every second from the SDK core's own thread (workers/roles.py
`MODEL_HEARTBEAT_THROTTLE`), and the activity records one every 0.25 s (activities/model.py), so a heartbeat is
missed only if the worker's event loop stalls for over 1.5 s or one takes over a second to arrive. Was 3 s:
recovery after SIGKILL took 5.9 s p50, over the 5 s target (bench/results/recovery.md); 1.5 s was faster still but
gave false timeouts under bench.load's 200 sessions on 2 cores. The timeout is a command attribute Temporal does
not compare on replay, so histories recorded with 3 s still replay."""
MODEL_ROUTING_PATCH = "model-turn-routing"
ROUTED_SCHEDULE_TO_START = timedelta(seconds=1.5)
"""A turn sent to the worker that served the previous one goes to the shared queue if that worker does not pick it
up within this time (it is gone, or busier than the slowest queue wait measured under load, 0.8 s p99)."""
ROUTED_RETRY = RetryPolicy(maximum_attempts=1, non_retryable_error_types=INFRASTRUCTURE_RETRY.non_retryable_error_types)
"""No retry on the worker's own queue: a lost worker's queue has no one to retry on; the shared queue does it."""
HAND_HEARTBEAT_TIMEOUT = timedelta(seconds=3)
"""Short on purpose: the SDK sends heartbeats at most every 0.8 x this, and a cancel (interrupt) reaches a running
activity only in the answer to a heartbeat. Hands must heartbeat; `make_execute_activity` does it every second."""
HAND_SCHEDULE_TO_START = timedelta(seconds=60)
"""A tool call no hand picks up within this time is an error the model sees, not a stuck session."""


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
