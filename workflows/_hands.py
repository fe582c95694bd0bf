"""The activities the harness calls for a turn: the model, and a hand's `execute(name, input) -> string` on the
task queue of the worker that serves it.

Any process that serves the `execute` activity on its own queue is a hand (see corral.hands); the sandbox's
built-in tools go through `_sandbox.py` instead, which provisions the container first.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ExecuteInput, ModelTurnInput, ModelTurnResult
    from corral.contract.events import AgentToolUse
    from corral.contract.session import HandTool
    from corral.names import ACTIVITY_EXECUTE, ACTIVITY_MODEL_TURN
    from workflows._outcomes import INFRASTRUCTURE_RETRY, tool_failure

MODEL_TURN_TIMEOUT = timedelta(minutes=10)
MODEL_HEARTBEAT_TIMEOUT = timedelta(seconds=3)
"""A lost model worker is noticed within this time; the activity heartbeats every second while it waits (the SDK
sends at most every 0.8 x this). 3 s keeps recovery after SIGKILL under the 5 s target (bench/recovery.py)."""
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


async def call_model(turn: ModelTurnInput, summary: str, task_queue: str) -> ModelTurnResult:
    """One model request (a turn, or a summary for compaction); its errors are the caller's to judge."""
    result: ModelTurnResult = await workflow.execute_activity(
        ACTIVITY_MODEL_TURN,
        turn,
        task_queue=task_queue,
        result_type=ModelTurnResult,
        start_to_close_timeout=MODEL_TURN_TIMEOUT,
        heartbeat_timeout=MODEL_HEARTBEAT_TIMEOUT,
        retry_policy=INFRASTRUCTURE_RETRY,
        cancellation_type=workflow.ActivityCancellationType.TRY_CANCEL,
        summary=summary,
    )
    return result
