"""`CredentialValidationWorkflow`: one live validation of a vault credential, run by the proxy.

The gateway may write credentials but never read one back (proxy/access.py), and a validation needs the secret to
call the credential's server: so the gateway starts this workflow, and the proxy worker, the one process that reads
secrets, runs its single activity. Ids go in and a scrubbed verdict comes out: no secret enters its history.
No I/O here.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from corral.contract.proxy import (
        CREDENTIAL_NOT_FOUND,
        VAULT_NOT_FOUND,
        ValidateCredentialInput,
        ValidateCredentialResult,
    )
    from corral.names import ACTIVITY_PROXY_VALIDATE_CREDENTIAL, CREDENTIAL_VALIDATION_WORKFLOW, PROXY_TASK_QUEUE

VALIDATION_TIMEOUT = timedelta(seconds=90)
"""A probe waits at most 20 s per MCP answer (activities/proxy.py), a refresh about as long: this covers probe,
refresh and probe again."""


# No versioning behaviour of its own: a versioned harness worker gives its default (one activity, nothing pinned).
@workflow.defn(name=CREDENTIAL_VALIDATION_WORKFLOW)
class CredentialValidationWorkflow:
    @workflow.run
    async def run(self, input: ValidateCredentialInput) -> ValidateCredentialResult:
        return await workflow.execute_activity(
            ACTIVITY_PROXY_VALIDATE_CREDENTIAL,
            input,
            task_queue=PROXY_TASK_QUEUE,
            result_type=ValidateCredentialResult,
            start_to_close_timeout=VALIDATION_TIMEOUT,
            schedule_to_start_timeout=VALIDATION_TIMEOUT,
            heartbeat_timeout=timedelta(seconds=10),
            # Vault unavailable is worth one more try; a refused credential is a verdict, not an error.
            retry_policy=RetryPolicy(
                maximum_attempts=2, non_retryable_error_types=[VAULT_NOT_FOUND, CREDENTIAL_NOT_FOUND]
            ),
            summary=f"validate {input.credential_id}",
        )
