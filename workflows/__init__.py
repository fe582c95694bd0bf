"""Workflows: the harness. `SessionWorkflow` (session.py), `WorkflowRun` (runs.py), `RecordWorkflow` (records.py) and
`CredentialValidationWorkflow` (validation.py).

No workflow sets `failure_exception_types`, and no worker sets `workflow_failure_exception_types`, on purpose: a
session must never fail on bad input, and never because of a bug of ours. So:

- Bad input is refused before it reaches history: by an update's validator, by the data converter (a start input
  that does not decode fails the run at its start with `InvalidInput`, corral/converter.py), by the gateway and the
  CLI. What a workflow ends with on purpose it raises as an `ApplicationError`, which fails it whatever the
  worker's settings.
- Any other exception in workflow code (a `KeyError`, a nondeterminism error after a bad deploy) is a bug: with no
  type listed, it fails the workflow *task*, not the workflow, and Temporal retries the task. The session is
  suspended with its history whole, and resumes where it stopped once a fixed harness is deployed. Listing a type
  would turn that bug into a failed session, which no deploy can bring back.

The record and validation workflows follow the same rule: a record is an object's only copy, and a validation is
bounded by the execution timeout its starter gives it (gateway/vault_access.py).
"""

from temporalio import workflow

from workflows.runs import WorkflowRun
from workflows.session import SessionWorkflow

with workflow.unsafe.imports_passed_through():  # as workflows/session.py imports them: one copy of each class
    from workflows._context import SessionContext
    from workflows._hands import MODEL_ROUTING_PATCH
    from workflows._inbox import UserInbox
    from workflows._log import SessionLog, check_answers
    from workflows._outcomes import record_response
    from workflows._tool_calls import DENIED_RESULT, NEW_MESSAGE_RESULT
    from workflows._webhooks import webhook_types

__all__ = [
    "DENIED_RESULT",
    "MODEL_ROUTING_PATCH",
    "NEW_MESSAGE_RESULT",
    "SessionContext",
    "SessionLog",
    "SessionWorkflow",
    "UserInbox",
    "WorkflowRun",
    "check_answers",
    "record_response",
    "webhook_types",
]
