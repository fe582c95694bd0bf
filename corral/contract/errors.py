"""Error types that cross from activities to the workflow (`ApplicationError.type`) and their details.

They live in the contract, not in the activity modules, so the workflow code imports no I/O library to read them.
Every corral error type is a CamelCase name, as Temporal's own; who raises them, and where they are defined (in
corral/contract/ unless the path says otherwise)::

    raised by an activity, read by a workflow (recorded in histories: never renamed)
    ├── ModelRetryableError       a model error worth another attempt (details: ModelErrorInfo)   errors.py
    ├── ModelFatalError           a model error no retry cures                                    errors.py
    ├── ToolError                 a hand's tool failed: the model sees an `is_error` result       errors.py
    ├── SandboxGone               the session's container died or was removed                     errors.py
    ├── SandboxUnavailable        this machine cannot give sandboxes (no engine, no image)        errors.py
    ├── McpConnectionFailed       an MCP server is down or unreachable (retryable)                proxy.py
    ├── McpAuthenticationFailed   no credential for an MCP server, or it stays rejected           proxy.py
    ├── ProxyRejected             the proxy refused the call (a binding, a vault it cannot use)   proxy.py
    ├── VaultNotFound, CredentialNotFound    a validation's vault or credential is gone           proxy.py
    └── VaultUnavailable          Vault does not answer (retryable: Temporal tries again)         proxy.py
    raised by a workflow's update validator or query, read by a client (never in history)
    ├── SessionArchived, SessionDeleting, SessionBusy, SessionHandingOver,
    │   BudgetCreateOnly, BudgetNotRaised                                                         corral/names.py
    └── VersionConflict, RecordArchived, RecordDeleted, NoSuchVersion                             records.py
    raised by the data converter
    └── InvalidInput              a payload does not decode: refused, or the run fails at start   corral/converter.py

`NotBudgetable` (a `ValueError`, below) is the contract's one Python exception: a budget on a model with no price.
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


class NotBudgetable(ValueError):
    """The model has no list price, so a budget on it cannot be enforced (upstream's `model_not_budgetable`)."""
