"""How full corral's task queues are, and what a session's turn is waiting for, from Temporal's own figures.

When every worker of a role is busy, Temporal keeps the next task in that role's task queue until a worker is free:
a turn waits there, in order, and is not lost. These figures are how a user sees it wait (`corral status`, and
`waiting` in the API's session view):

- a queue's backlog: `DescribeTaskQueue` with `report_stats`, the server's approximate count of tasks not yet
  handed to a worker and the age of the oldest, and the workers polling it now;
- a session's waits: `DescribeWorkflowExecution`'s pending workflow task and pending activities that are
  scheduled and not yet started, each with the time it was scheduled and the queue it waits in.

Every figure is approximate: the server counts a backlog per partition and caches its answer for a few seconds,
and a harness's workflow tasks mostly go to its own sticky queue, which the shared queue's backlog does not count.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from temporalio.api.enums.v1 import PendingActivityState, PendingWorkflowTaskState, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionDescription

from corral.names import (
    ACTIVITY_MODEL_TURN,
    GATEWAY_TASK_QUEUE,
    HARNESS_TASK_QUEUE,
    MODEL_TASK_QUEUE,
    PROXY_TASK_QUEUE,
    SANDBOX_TASK_QUEUE,
    UTILITY_HAND_TASK_QUEUE,
)

TaskKind = Literal["workflow", "activity"]

ROLE_QUEUES: tuple[tuple[str, str, TaskKind], ...] = (
    (HARNESS_TASK_QUEUE, "harness", "workflow"),
    (MODEL_TASK_QUEUE, "model", "activity"),
    (SANDBOX_TASK_QUEUE, "sandbox", "activity"),
    (PROXY_TASK_QUEUE, "proxy", "activity"),
    (UTILITY_HAND_TASK_QUEUE, "utility", "activity"),
    (GATEWAY_TASK_QUEUE, "gateway", "activity"),
)
"""Each role's shared queue, the role's name and the kind of task its workers take from it (workers/roles.py)."""

_TYPES = {"workflow": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, "activity": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY}


@dataclass(frozen=True)
class QueueLoad:
    """One task queue's backlog and workers, as the server reported them (approximately, see the module)."""

    queue: str
    kind: TaskKind
    backlog: int
    """Tasks added and not yet handed to a worker."""
    oldest: timedelta
    """How long the oldest of them has waited (zero when there is none)."""
    pollers: int
    """Workers that polled the queue lately: none means no worker serves it, and its tasks wait for one to start."""
    add_rate: float
    dispatch_rate: float
    """Tasks a second added to the queue and handed to workers, averaged by the server over the last few seconds."""


@dataclass(frozen=True)
class Waiting:
    """A task of a session that is scheduled and not started: what the session's turn waits for."""

    kind: TaskKind
    queue: str
    activity_type: str | None
    """The activity's type (`model_turn`, `execute`…); None for a workflow task (the harness's next step)."""
    since: datetime
    load: QueueLoad

    def waited(self, now: datetime) -> timedelta:
        return max(now - self.since, timedelta(0))

    def backlog(self) -> int:
        """The queue's backlog, counting this task: the server's count is cached, and may not have it yet."""
        return max(self.load.backlog, 1)

    def oldest(self, now: datetime) -> timedelta:
        """How long the queue's oldest task has waited: at least as long as this one (the server's age may be stale)."""
        return max(self.load.oldest, self.waited(now))

    def ahead(self, now: datetime) -> int:
        """About how many tasks of its queue are older than this one, and so (the queue being first in, first out
        per partition) go before it.

        An estimate: tasks are taken to have arrived evenly since the oldest, so the share of the backlog older than
        this one is the share of the oldest task's wait that came before this one was scheduled.
        """
        oldest, waited = self.oldest(now).total_seconds(), self.waited(now).total_seconds()
        if oldest <= waited:
            return 0
        return min(self.backlog() - 1, round(self.backlog() * (oldest - waited) / oldest))

    @property
    def role(self) -> str | None:
        """Which role's worker would take it: from its queue (corral's own, or one of a role's routed queues such as
        `corral-model@<worker>`), else from what it is; None for any other (a hand's queue)."""
        return (
            role_of(self.queue)
            or ("harness" if self.kind == "workflow" else None)
            or ("model" if self.activity_type == ACTIVITY_MODEL_TURN else None)
        )


def role_of(queue: str) -> str | None:
    """The role whose shared queue `queue` is or derives from (`<queue>@<worker>`, `<queue>.<engine pool>`)."""
    for name, role, _ in ROLE_QUEUES:
        if queue == name or queue.startswith((f"{name}@", f"{name}.")):
            return role
    return None


async def queue_load(client: Client, queue: str, kind: TaskKind) -> QueueLoad:
    """The queue's backlog and pollers (one `DescribeTaskQueue` call)."""
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue),
            task_queue_type=_TYPES[kind],
            report_stats=True,
        ),
        retry=True,
    )
    stats = response.stats
    return QueueLoad(
        queue=queue,
        kind=kind,
        backlog=int(stats.approximate_backlog_count),
        oldest=stats.approximate_backlog_age.ToTimedelta(),  # zero when unset
        pollers=len(response.pollers),
        add_rate=stats.tasks_add_rate,
        dispatch_rate=stats.tasks_dispatch_rate,
    )


async def stack_load(client: Client) -> list[QueueLoad]:
    """Every role's shared queue, in `ROLE_QUEUES` order (the calls run at once)."""
    return list(await asyncio.gather(*(queue_load(client, queue, kind) for queue, _, kind in ROLE_QUEUES)))


async def session_waits(
    client: Client, description: WorkflowExecutionDescription, now: datetime | None = None
) -> list[Waiting]:
    """What the session's workflow waits for a worker to take: its workflow task and its activities that are
    scheduled and not started, oldest first. An activity waiting out a retry's back-off is not in a queue yet, and a
    paused one waits for an operator, not a worker: neither is listed."""
    now = now or datetime.now(UTC)
    raw = description.raw_description
    found: list[tuple[TaskKind, str, str | None, datetime]] = []
    task = raw.pending_workflow_task
    if task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED:
        first = task.original_scheduled_time if task.HasField("original_scheduled_time") else task.scheduled_time
        found.append(("workflow", raw.execution_config.task_queue.name, None, first.ToDatetime(tzinfo=UTC)))
    for activity in raw.pending_activities:
        if activity.state != PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED or activity.paused:
            continue
        scheduled = activity.scheduled_time.ToDatetime(tzinfo=UTC)
        backing_off = activity.HasField("next_attempt_schedule_time") and (
            activity.next_attempt_schedule_time.ToDatetime(tzinfo=UTC) > now
        )
        if scheduled > now or backing_off:
            continue
        queue = activity.activity_options.task_queue.name or raw.execution_config.task_queue.name
        found.append(("activity", queue, activity.activity_type.name, scheduled))
    loads = await asyncio.gather(*(queue_load(client, queue, kind) for kind, queue, _, _ in found))
    waits = [Waiting(*task, load) for task, load in zip(found, loads, strict=True)]
    return sorted(waits, key=lambda wait: wait.since)
