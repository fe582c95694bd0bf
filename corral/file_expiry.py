"""Start a file's expiry timer: a `FileExpiryWorkflow` (workflows/file_expiry.py) whose start waits out the file's
remaining time. Who makes an expiring file starts its timer (the gateway on an upload with `expires_in_seconds`);
a file's reads refuse it from its expiry time on, whether or not its timer has fired yet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from corral.contract.files import FileExpiryInput, file_expiry_workflow_id
from corral.files import FileRecord, stamp
from corral.names import FILE_EXPIRY_WORKFLOW, HARNESS_TASK_QUEUE, MODEL_TASK_QUEUE


async def schedule_file_expiry(
    client: Client,
    record: FileRecord,
    harness_queue: str = HARNESS_TASK_QUEUE,
    model_queue: str = MODEL_TASK_QUEUE,
) -> str:
    """Start the timer that removes `record` at its `expires_at` (once: a second call finds the first's); its id."""
    if record.expires_at is None:
        raise ValueError(f"file {record.id} does not expire")
    workflow_id = file_expiry_workflow_id(record.id)
    delay = max(record.expires_at - datetime.now(UTC), timedelta(0))
    await client.start_workflow(
        FILE_EXPIRY_WORKFLOW,
        FileExpiryInput(file_id=record.id, workspace=record.workspace, model_task_queue=model_queue),
        id=workflow_id,
        task_queue=harness_queue,
        start_delay=delay,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"expire file {record.id} of workspace {record.workspace} at {stamp(record.expires_at)}",
    )
    return workflow_id
