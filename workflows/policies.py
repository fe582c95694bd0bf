"""How long each activity the harness schedules may take, and how Temporal retries it: one place to read them all.
The session's own, visible retries of a model turn (`model_retry_delay`) are here too.

Every value here is a command attribute that Temporal does not compare on replay, so changing one keeps recorded
histories replaying; it changes what a running session does from its next command on. The benchmarks quote them
(bench/quote.py), so a figure and the code cannot disagree.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

from corral.contract.errors import MODEL_FATAL, MODEL_RETRYABLE, TOOL_ERROR, ModelErrorInfo
from corral.contract.session import ModelRetryConfig

# ---- every infrastructure activity ---------------------------------------------------------------------------------

INFRASTRUCTURE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=5,
    non_retryable_error_types=[MODEL_RETRYABLE, MODEL_FATAL, TOOL_ERROR],
)
"""Temporal's own retries cover lost workers and timeouts; errors the session must see are non-retryable."""

# ---- the model turn and the hands ----------------------------------------------------------------------------------

MODEL_TURN_TIMEOUT = timedelta(minutes=10)
MODEL_HEARTBEAT_TIMEOUT = timedelta(seconds=2)
"""A lost model worker is noticed within this time, plus the server's timer lag (about 1.5 s on the dev server). The
model worker sends a heartbeat every second from the SDK core's own thread (workers/roles.py
`MODEL_HEARTBEAT_THROTTLE`), and the activity records one every 0.25 s (activities/model.py), so a heartbeat is
missed only if the worker's event loop stalls for over 1.5 s or one takes over a second to arrive. Was 3 s:
recovery after SIGKILL took 5.9 s p50, over the 5 s target (bench/results/recovery.md); 1.5 s was faster still but
gave false timeouts under bench.load's 200 sessions on 2 cores. The timeout is a command attribute Temporal does
not compare on replay, so histories recorded with 3 s still replay."""
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


def model_retry_delay(retry: ModelRetryConfig, error: ModelErrorInfo, attempt: int) -> float | None:
    """Seconds to wait before the next attempt of a model turn after `error` ended attempt `attempt` (from 1), or
    None: give up, because the error is not transient or the session's attempts (`SessionInput.model_retry`) are
    spent. The model's own retry-after wins; else the delay doubles from the first up to the most. The session
    waits on a timer, whose duration Temporal does not compare on replay."""
    if not error.retryable or attempt >= retry.max_attempts:
        return None
    if error.retry_after is not None:
        return error.retry_after
    return min(retry.initial_delay_seconds * 2 ** (attempt - 1), retry.max_delay_seconds)


# ---- the sandbox ---------------------------------------------------------------------------------------------------

PROVISION_TIMEOUT = timedelta(minutes=15)
"""Long enough to build a derived image with the recipe's packages the first time."""
ENGINE_SCHEDULE_TO_START = timedelta(seconds=30)
"""No worker attached to the container's engine for this long: the engine is treated as gone."""
SANDBOX_HEARTBEAT_TIMEOUT = timedelta(seconds=3)
CONTROL_TIMEOUT = timedelta(minutes=1)

# ---- the credential proxy (MCP) and the archive --------------------------------------------------------------------

MCP_CALL_TIMEOUT = timedelta(minutes=5)
PROXY_SCHEDULE_TO_START = timedelta(seconds=60)
ARCHIVE_TIMEOUT = timedelta(minutes=2)
