"""How a hand says that a tool failed: the model sees the message as an `is_error` tool result.

Here, beside the hand SDK, rather than with the model activity's error mapping: a hand imports this and nothing of
the model SDK.
"""

from __future__ import annotations

from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from corral.contract.errors import TOOL_ERROR


def tool_error(message: str) -> ApplicationError:
    """A tool failure the model should see as an `is_error` result (not retried: the model decides what next)."""
    return ApplicationError(message, type=TOOL_ERROR, non_retryable=True, category=ApplicationErrorCategory.BENIGN)
