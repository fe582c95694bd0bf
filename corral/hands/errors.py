"""How a hand says that a tool failed: the model sees the message as an `is_error` tool result.

A hand has one error of its own to raise, made by `tool_error`::

    temporalio.exceptions.ApplicationError
    └── type=ToolError      not retried, BENIGN: the model reads the message and decides what next

Any other exception a hand's tool raises is a fault of the hand: Temporal retries the call (workflows/policies.py,
`INFRASTRUCTURE_RETRY`), and the model sees it only once the retries are spent.

Here, beside the hand SDK, rather than with the model activity's error mapping: a hand imports this and nothing of
the model SDK.
"""

from __future__ import annotations

from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from corral.contract.errors import TOOL_ERROR


def tool_error(message: str) -> ApplicationError:
    """A tool failure the model should see as an `is_error` result (not retried: the model decides what next)."""
    return ApplicationError(message, type=TOOL_ERROR, non_retryable=True, category=ApplicationErrorCategory.BENIGN)
