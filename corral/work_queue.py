"""Self-hosted environments' work queues through Temporal: the client side of `EnvironmentWorkQueue`
(workflows/work_queue.py), for the gateway, the CLI and the activity a session asks for hands with.

One queue workflow per environment, started on first need (`ensure`, or a session's request, which is a
signal-with-start). A queue that never started has no items: reads answer empty, and writes naming an item answer
`WorkNotFound`, exactly as for an item of another environment.

Errors (raised here, imported from here)::

    WorkError
    ├── WorkNotFound                  no such item in this environment's queue (or no queue)
    ├── WorkNotQueued                 an ack of an item that is not waiting for one
    ├── WorkAlreadyStopped            a stop of a stopped item
    └── HeartbeatPreconditionFailed   a heartbeat that does not echo the lease's current token (`current_state`)
"""

from __future__ import annotations

from typing import Any, TypeVar

from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from corral.contract.work import (
    HEARTBEAT_PRECONDITION_FAILED,
    QUERY_WORK_ITEMS,
    QUERY_WORK_QUEUE,
    SIGNAL_POLLED,
    SIGNAL_REQUEST_WORK,
    UPDATE_ACK_WORK,
    UPDATE_CLAIM_WORK,
    UPDATE_HEARTBEAT_WORK,
    UPDATE_STOP_WORK,
    UPDATE_WORK_METADATA,
    WORK_ALREADY_STOPPED,
    WORK_NOT_FOUND,
    WORK_NOT_QUEUED,
    WORK_QUEUE_WORKFLOW,
    ClaimWork,
    HeartbeatWork,
    StopWork,
    WorkHeartbeat,
    WorkId,
    WorkItem,
    WorkMetadataChange,
    WorkPolled,
    WorkQueueInput,
    WorkQueueState,
    WorkRequest,
    work_queue_id,
)
from corral.names import HARNESS_TASK_QUEUE

T = TypeVar("T")


class WorkError(Exception):
    """A refused work queue operation; the message says why."""


class WorkNotFound(WorkError):
    pass


class WorkNotQueued(WorkError):
    pass


class WorkAlreadyStopped(WorkError):
    pass


class HeartbeatPreconditionFailed(WorkError):
    def __init__(self, message: str, current_state: WorkHeartbeat) -> None:
        super().__init__(message)
        self.current_state = current_state


class WorkQueues:
    """The work queues of one Temporal namespace; their workflows run on `task_queue` (the harness's)."""

    def __init__(self, client: Client, task_queue: str = HARNESS_TASK_QUEUE) -> None:
        self.client = client
        self.task_queue = task_queue

    async def ensure(self, environment_id: str, workspace: str) -> None:
        """Start the environment's queue unless it runs already."""
        await self.client.start_workflow(
            WORK_QUEUE_WORKFLOW,
            WorkQueueInput(environment_id=environment_id, workspace=workspace),
            id=work_queue_id(environment_id),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            static_summary=f"work queue of self-hosted environment {environment_id} (workspace {workspace})",
        )

    async def request(self, environment_id: str, request: WorkRequest) -> None:
        """A session asks for hands: a new item unless it has a live one (a signal-with-start of the queue)."""
        await self.client.start_workflow(
            WORK_QUEUE_WORKFLOW,
            WorkQueueInput(environment_id=environment_id, workspace=request.workspace),
            id=work_queue_id(environment_id),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            start_signal=SIGNAL_REQUEST_WORK,
            start_signal_args=[request],
            static_summary=f"work queue of self-hosted environment {environment_id} (workspace {request.workspace})",
        )

    async def claim(self, environment_id: str, claim: ClaimWork) -> WorkItem | None:
        """Deliver the oldest claimable item to `claim.worker_id`; None when there is none (any more)."""
        try:
            return await self._update(environment_id, UPDATE_CLAIM_WORK, claim, WorkItem | None)  # type: ignore[arg-type]
        except WorkNotFound:
            return None

    async def ack(self, environment_id: str, work_id: str) -> WorkItem:
        return await self._update(environment_id, UPDATE_ACK_WORK, WorkId(work_id=work_id), WorkItem)

    async def heartbeat(self, environment_id: str, beat: HeartbeatWork) -> WorkHeartbeat:
        return await self._update(environment_id, UPDATE_HEARTBEAT_WORK, beat, WorkHeartbeat)

    async def stop(self, environment_id: str, stop: StopWork) -> WorkItem:
        return await self._update(environment_id, UPDATE_STOP_WORK, stop, WorkItem)

    async def update_metadata(self, environment_id: str, change: WorkMetadataChange) -> WorkItem:
        return await self._update(environment_id, UPDATE_WORK_METADATA, change, WorkItem)

    async def items(self, environment_id: str) -> list[WorkItem]:
        """Every item the queue keeps, newest first ([] when the queue never started)."""
        items: list[WorkItem] | None = await self._query(environment_id, QUERY_WORK_ITEMS, list[WorkItem])
        return items or []

    async def item(self, environment_id: str, work_id: str) -> WorkItem | None:
        return next((item for item in await self.items(environment_id) if item.id == work_id), None)

    async def state(self, environment_id: str, workspace: str) -> WorkQueueState:
        state: WorkQueueState | None = await self._query(environment_id, QUERY_WORK_QUEUE, WorkQueueState)
        if state is None:
            return WorkQueueState(environment_id=environment_id, workspace=workspace, depth=0, pending=0,
                                  oldest_queued_at=None, pollers={})  # fmt: skip
        return state

    async def polled(self, environment_id: str, worker_id: str) -> None:
        """Note that a worker polled (what `workers_polling` counts); nothing when the queue never started."""
        try:
            await self._handle(environment_id).signal(SIGNAL_POLLED, WorkPolled(worker_id=worker_id))
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise

    def _handle(self, environment_id: str) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(work_queue_id(environment_id))

    async def _query(self, environment_id: str, query: str, result_type: Any) -> Any:
        try:
            return await self._handle(environment_id).query(query, result_type=result_type)
        except WorkflowQueryFailedError:
            return None
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            raise

    async def _update(self, environment_id: str, update: str, arg: Any, result_type: type[T]) -> T:
        """Run an update, with its refusals as this module's errors."""
        try:
            result: T = await self._handle(environment_id).execute_update(update, arg, result_type=result_type)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            if not isinstance(cause, ApplicationError):
                raise
            if cause.type == WORK_NOT_FOUND:
                raise WorkNotFound(cause.message) from exc
            if cause.type == WORK_NOT_QUEUED:
                raise WorkNotQueued(cause.message) from exc
            if cause.type == WORK_ALREADY_STOPPED:
                raise WorkAlreadyStopped(cause.message) from exc
            if cause.type == HEARTBEAT_PRECONDITION_FAILED:
                state = WorkHeartbeat.model_validate(cause.details[0] if cause.details else {})
                raise HeartbeatPreconditionFailed(cause.message, state) from exc
            raise
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise WorkNotFound(f"no work queue for environment {environment_id}") from exc
            raise
        return result
