"""What a finished activity means for the session (pure functions of activity errors and results)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

from corral.contract.errors import MODEL_FATAL, MODEL_RETRYABLE, TOOL_ERROR, ModelErrorInfo
from corral.contract.events import ModelUsage

INFRASTRUCTURE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=5,
    non_retryable_error_types=[MODEL_RETRYABLE, MODEL_FATAL, TOOL_ERROR],
)
"""Temporal's own retries cover lost workers and timeouts; errors the session must see are non-retryable."""


def model_error_info(err: ActivityError) -> ModelErrorInfo:
    """What a failed model activity means; lost workers and timeouts that outlived retries count as retryable."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in (MODEL_RETRYABLE, MODEL_FATAL) and cause.details:
        detail: Any = cause.details[0]
        return detail if isinstance(detail, ModelErrorInfo) else ModelErrorInfo.model_validate(detail)
    retryable = isinstance(cause, TimeoutError) or not (isinstance(cause, ApplicationError) and cause.non_retryable)
    return ModelErrorInfo(error_type="model_request_failed_error", status=None, retryable=retryable)


def tool_failure(name: str, task_queue: str, err: ActivityError) -> str:
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type == TOOL_ERROR:
        return cause.message
    if isinstance(cause, TimeoutError):
        if cause.type is not None and cause.type.name == "SCHEDULE_TO_START":
            return f"Tool {name!r} is unavailable: no hand is serving task queue {task_queue!r}."
        return f"Tool {name!r} timed out ({cause.type.name.lower() if cause.type else 'timeout'})."
    return f"Tool {name!r} failed: {cause.message if cause is not None and hasattr(cause, 'message') else err}"


def add_usage(total: ModelUsage, usage: ModelUsage) -> ModelUsage:
    return ModelUsage(
        input_tokens=total.input_tokens + usage.input_tokens,
        output_tokens=total.output_tokens + usage.output_tokens,
        cache_creation_input_tokens=total.cache_creation_input_tokens + usage.cache_creation_input_tokens,
        cache_read_input_tokens=total.cache_read_input_tokens + usage.cache_read_input_tokens,
    )
