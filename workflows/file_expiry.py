"""`FileExpiryWorkflow`: a file's durable expiry timer.

It is started with its file's remaining time as its start delay (corral.file_expiry), so Temporal holds the wait:
no sweep scans for expired files, and a restart of every process loses no expiry. When it runs, one activity
removes the file (and its blob, when no other file uses it). A file deleted before then is simply not there: the
activity does nothing. No I/O here.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from corral.contract.files import ExpireFileResult, FileExpiryInput
    from corral.names import ACTIVITY_EXPIRE_FILE, FILE_EXPIRY_WORKFLOW

EXPIRE_TIMEOUT = timedelta(minutes=1)
"""One delete of a row and perhaps a blob: seconds at most, even on a remote store."""
MAX_EARLY_WAITS = 10
"""How many times a worker whose clock is behind may say "not yet" before the workflow stops asking."""


# No versioning behaviour of its own: a versioned harness worker gives its default (one activity, nothing pinned).
@workflow.defn(name=FILE_EXPIRY_WORKFLOW)
class FileExpiryWorkflow:
    @workflow.run
    async def run(self, input: FileExpiryInput) -> bool:
        """Whether this timer removed the file (False: it was deleted before its time came)."""
        for _ in range(MAX_EARLY_WAITS):
            result = await workflow.execute_activity(
                ACTIVITY_EXPIRE_FILE,
                input,
                task_queue=input.model_task_queue,
                result_type=ExpireFileResult,
                start_to_close_timeout=EXPIRE_TIMEOUT,
                retry_policy=RetryPolicy(maximum_interval=timedelta(minutes=5)),  # until the store answers
                summary=f"expire {input.file_id}",
            )
            if result.seconds_left <= 0:
                return result.removed
            await workflow.sleep(timedelta(seconds=result.seconds_left))
        return False
