"""One function per role that builds its worker; entrypoints and the all-in-one compose them."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import anthropic
from temporalio.client import Client
from temporalio.worker import (
    FixedSizeSlotSupplier,
    Interceptor,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkerTuner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.dreams import DreamActivities
from activities.files import FileActivities
from activities.knowledge import KnowledgeActivities
from activities.log import LogActivities
from activities.model import ModelActivities
from activities.sandbox import SandboxActivities
from activities.webhooks import WebhookActivities
from activities.work import WorkActivities
from corral.blobs import BlobStore
from corral.hands import make_execute_activity
from corral.hands.utility import UTILITY_TOOLS
from corral.names import (
    DEFAULT_MODEL_STALL_TIMEOUT_SECONDS,
    HARNESS_TASK_QUEUE,
    MODEL_TASK_QUEUE,
    PROXY_TASK_QUEUE,
    SANDBOX_TASK_QUEUE,
    UTILITY_HAND_TASK_QUEUE,
)
from relay import StreamPublisher
from workers._slots import SharedSlots
from workers.deployment import worker_config
from workers.run import GRACEFUL_SHUTDOWN, POLLERS, STICKY_TIMEOUT
from workers.settings import HarnessDeployment
from workflows import SessionWorkflow, WorkflowRun
from workflows.deployments import DeploymentFireWorkflow
from workflows.dreams import DreamWorkflow
from workflows.file_expiry import FileExpiryWorkflow
from workflows.records import RecordWorkflow, VersionedRecordWorkflow
from workflows.signals import SignalArgumentsInterceptor
from workflows.validation import CredentialValidationWorkflow
from workflows.webhooks import WebhookDeliveryWorkflow
from workflows.work_queue import EnvironmentWorkQueue, VersionedEnvironmentWorkQueue

HARNESS_WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()
"""What the harness runs workflow code with: no sandbox. The sandbox's checks on non-deterministic calls are paid on
every activation of every session (under `bench.load --profile` its frames are the largest share of the harness's
own workflow work), to catch a mistake that is caught where it costs nothing per turn: a static scan of the
workflow modules for I/O and clock reads (tests/test_invariants.py), every recorded history replayed under the
SDK's full sandbox (tests/test_replay.py), and `corral harness check`, which replays live histories with
`HARNESS_CHECK_RUNNER`. The code runs the same either way: our workflow modules hold no mutable module state, and
the sandbox was already told to import no module anew per run."""

HARNESS_CHECK_RUNNER = SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_all_modules())
"""The harness's workflow code with the sandbox's checks: a call that would break replay (the clock, randomness,
I/O) fails the replay and is named. What `corral harness check` replays with."""


HARNESS_WORKFLOW_SLOTS = 64
"""Workflow tasks (and queries) one harness process holds at once. Its workflow code runs one activation at a time
(the interpreter lock), so more would not run faster: they would wait in this process, where the server's task
timeout counts, rather than in the server's queue."""
HARNESS_MAX_BUSY = 2.0
"""A harness takes no new workflow task while one it holds has been in the process longer than this (seconds;
`SharedSlots`): far enough below the 10 s workflow task timeout for what it holds to finish within it."""


MODEL_ACTIVITY_SLOTS = 200
"""Model turns one model worker process runs at once, over its two queues. Each waits on the model's stream most of
its time, so a full process is one whose event loop is busy, not one with 100 turns (the SDK's default, which made
the 200 sessions of `bench.load` wait in the server's queue, and every turn routed to this worker time out there
after `ROUTED_SCHEDULE_TO_START` and go round by the shared queue: an extra workflow task for nothing). Not more: at
400 a loaded event loop sent some heartbeats late enough to time out (`MODEL_HEARTBEAT_TIMEOUT`) with no worker
lost."""
MODEL_LOOP_LAG = 0.1
"""A model worker takes a new turn only while its event loop goes round within this many seconds (`SharedSlots`).
Without it, 200 turns streaming at once on a machine short of CPU put the loop seconds behind: thousands of turns
missed their heartbeats under `bench.load` and ran again, more work for a process already behind."""
MODEL_HEARTBEAT_THROTTLE = timedelta(seconds=1)
"""The SDK core sends an activity's heartbeats at most this often (by default 0.8 x the heartbeat timeout, which
would leave a heartbeat only 0.4 s to reach a busy server before the 2 s model heartbeat timeout)."""


HARNESS_WORKFLOWS: tuple[type, ...] = (
    SessionWorkflow,
    WorkflowRun,
    RecordWorkflow,
    CredentialValidationWorkflow,
    EnvironmentWorkQueue,
    DreamWorkflow,
    FileExpiryWorkflow,
    WebhookDeliveryWorkflow,
    DeploymentFireWorkflow,
)
"""The workflow classes the harness worker runs (and `corral harness check` replays with)."""


def harness_interceptors() -> list[Interceptor]:
    """The harness worker's interceptors (and the replayer's: they run workflow code the same way)."""
    return [SignalArgumentsInterceptor()]


def harness_worker(
    client: Client,
    task_queue: str = HARNESS_TASK_QUEUE,
    deployment: HarnessDeployment | None = None,
    workflows: Sequence[type] = HARNESS_WORKFLOWS,
) -> Worker:
    """Workflows only: no activities, no credentials, no Docker. With a `deployment`, this worker is one build of
    a versioned harness (workers/deployment.py). `workflows`: other harness code (a test's next build)."""
    if deployment is not None:  # records and work queues always auto-upgrade (workflows/records.py)
        upgrading = {RecordWorkflow: VersionedRecordWorkflow, EnvironmentWorkQueue: VersionedEnvironmentWorkQueue}
        workflows = [upgrading.get(cls, cls) for cls in workflows]
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(workflows),
        interceptors=harness_interceptors(),
        deployment_config=worker_config(deployment) if deployment is not None else None,
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        tuner=WorkerTuner.create_composite(
            workflow_supplier=SharedSlots(HARNESS_WORKFLOW_SLOTS, max_busy=HARNESS_MAX_BUSY),
            activity_supplier=FixedSizeSlotSupplier(1),  # a harness runs no activity
            local_activity_supplier=FixedSizeSlotSupplier(1),
            nexus_supplier=FixedSizeSlotSupplier(1),
        ),
        workflow_task_poller_behavior=POLLERS,
        workflow_runner=HARNESS_WORKFLOW_RUNNER,
    )


def model_worker(
    client: Client,
    model: anthropic.AsyncAnthropic | None = None,
    task_queue: str = MODEL_TASK_QUEUE,
    stream: StreamPublisher | None = None,
    blobs: BlobStore | None = None,
    stall_timeout_seconds: float = DEFAULT_MODEL_STALL_TIMEOUT_SECONDS,
    proxy_queue: str = PROXY_TASK_QUEUE,
) -> Worker:
    """Model-turn activities on one queue, without a queue of its own: sessions' turns are not routed to it (see
    `model_workers` for the deployed role). The only role that holds the model API key. With a stream relay, text
    deltas are published live to clients. Sessions' earlier runs are archived to `blobs` (default:
    `open_blob_store()`). A response stream silent for `stall_timeout_seconds` is retried."""
    activities = ModelActivities(client, model, stream, stall_timeout_seconds)
    logs = LogActivities(client, blobs)
    work = WorkActivities(client)
    return Worker(
        client,
        task_queue=task_queue,
        activities=[
            activities.model_turn,
            logs.read_log,
            logs.archive_log,
            work.request_work,
            *knowledge_activities(client, blobs, proxy_queue),
        ],
        max_heartbeat_throttle_interval=MODEL_HEARTBEAT_THROTTLE,
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
    )


def knowledge_activities(
    client: Client, blobs: BlobStore | None = None, proxy_queue: str = PROXY_TASK_QUEUE
) -> list[Callable[..., Any]]:
    """The knowledge stores' activities (files, memory stores, dreams, webhook events), served by the model workers:
    they hold the blob store and the knowledge database, which sandbox workers never do."""
    knowledge, dreams, files = KnowledgeActivities(blobs), DreamActivities(client, blobs), FileActivities(blobs)
    webhooks = WebhookActivities(client, proxy_queue=proxy_queue)  # the deliveries' attempts go to `proxy_queue`
    return [knowledge.export_memory, knowledge.commit_knowledge, dreams.prepare_dream, dreams.await_session_idle,
            dreams.apply_dream, files.expire_file, webhooks.emit_webhooks]  # fmt: skip


def model_workers(
    client: Client,
    model: anthropic.AsyncAnthropic | None = None,
    task_queue: str = MODEL_TASK_QUEUE,
    stream: StreamPublisher | None = None,
    blobs: BlobStore | None = None,
    stall_timeout_seconds: float = DEFAULT_MODEL_STALL_TIMEOUT_SECONDS,
    worker_id: str | None = None,
) -> list[Worker]:
    """The model role as deployed: one set of activities (one conversation cache, one HTTP pool) on the shared
    queue and on this worker's own, `<task_queue>@<worker_id>`, which sessions use for their next turn so it finds
    the conversation cached (workflows/_hands.py `ModelRoute`). `worker_id` defaults to host, pid and a random
    part, so two workers in one process get two queues."""
    own_queue = model_worker_queue(task_queue, worker_id)
    activities = ModelActivities(client, model, stream, stall_timeout_seconds, worker_task_queue=own_queue)
    logs = LogActivities(client, blobs)
    work = WorkActivities(client)
    # Both queues draw on one pool of slots, taken only while the loop keeps pace: a burst on both queues runs no
    # more model turns in this event loop than one worker would (more would starve their heartbeats).
    slots = SharedSlots(MODEL_ACTIVITY_SLOTS, max_lag=MODEL_LOOP_LAG)
    tuner = WorkerTuner.create_composite(
        workflow_supplier=FixedSizeSlotSupplier(1),
        activity_supplier=slots,
        local_activity_supplier=FixedSizeSlotSupplier(1),
        nexus_supplier=FixedSizeSlotSupplier(1),
    )
    return [
        Worker(
            client,
            task_queue=task_queue,
            activities=[
                activities.model_turn,
                logs.read_log,
                logs.archive_log,
                work.request_work,
                *knowledge_activities(client, blobs),
            ],
            tuner=tuner,
            activity_task_poller_behavior=POLLERS,
            max_heartbeat_throttle_interval=MODEL_HEARTBEAT_THROTTLE,
            graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        ),
        Worker(
            client,
            task_queue=own_queue,
            activities=[activities.model_turn],
            tuner=tuner,
            activity_task_poller_behavior=POLLERS,
            max_heartbeat_throttle_interval=MODEL_HEARTBEAT_THROTTLE,
            graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        ),
    ]


def model_worker_queue(task_queue: str, worker_id: str | None = None) -> str:
    """A model worker's own task queue."""
    return f"{task_queue}@{worker_id or f'{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}'}"


def utility_hand_worker(client: Client, task_queue: str = UTILITY_HAND_TASK_QUEUE) -> Worker:
    """The utility hand: `get_time` and `calculate`, no sandbox, no credential."""
    return Worker(
        client,
        task_queue=task_queue,
        activities=[make_execute_activity(UTILITY_TOOLS)],
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
    )


def sandbox_workers(
    client: Client, activities: SandboxActivities, shared_queue: str = SANDBOX_TASK_QUEUE
) -> list[Worker]:
    """The sandbox hand: provisioning on the shared queue, container calls on the engine's own queue."""
    engine_activities: list[Callable[..., Any]] = [
        activities.provision_sandbox,
        activities.execute,
        activities.collect_knowledge,
        activities.stop_sandbox,
        activities.release_sandbox,
    ]
    return [
        Worker(
            client,
            task_queue=shared_queue,
            # release too: a session whose container was lost (no handle) releases through its pool's queue
            activities=[activities.provision_sandbox, activities.fork_workspace, activities.release_sandbox],
            graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        ),
        Worker(
            client,
            task_queue=activities.task_queue,
            activities=engine_activities,
            graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        ),
    ]
