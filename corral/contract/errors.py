"""Error types that cross from activities to the workflow (`ApplicationError.type`) and their details.

They live in the contract, not in the activity modules, so the workflow code imports no I/O library to read them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

MODEL_RETRYABLE = "ModelRetryableError"
MODEL_FATAL = "ModelFatalError"
TOOL_ERROR = "ToolError"
SANDBOX_GONE = "SandboxGone"
SANDBOX_UNAVAILABLE = "SandboxUnavailable"

ModelErrorType = Literal[
    "model_overloaded_error", "model_rate_limited_error", "model_request_failed_error", "billing_error"
]


class ModelErrorInfo(BaseModel):
    """Details of a model error, carried in the ApplicationError's details (no secret in them)."""

    error_type: ModelErrorType
    status: int | None
    retryable: bool
    retry_after: float | None = None
    context_too_long: bool = False
    """The prompt was over the model's input window (400 "prompt is too long"): elide more and retry."""
