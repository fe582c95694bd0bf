"""Self-hosted environments: the work queue of an environment whose hands run on the user's own machine.

An environment with `config: {type: "self_hosted"}` runs no sandbox of its own. The official SDK's
`EnvironmentWorker` polls the environment's work queue over HTTP (gateway/work.py), claims a work item for a session
with a heartbeat lease, runs that session's built-in tool calls where it runs, and posts each result back as
`user.tool_result`. corral's side of it:

- **The queue** is one `EnvironmentWorkQueue` workflow per environment (workflows/work_queue.py, id
  `work_queue_id(environment_id)`): its items, their states and their leases live in its history, so they are as
  durable as a session. Every change is an update whose validator refuses what must not happen (an ack of an item
  that is not queued, a stale heartbeat, a second stop), so a refusal leaves no trace.
- **A session** in such an environment asks for hands (`ACTIVITY_REQUEST_WORK`, a signal-with-start of the queue)
  when its first built-in call needs them, and again after the item it had has ended. It then waits, at no cost,
  for the worker's `user.tool_result` (workflows/_self_hosted.py).
- **A lease that lapses** (the worker was killed or cut off) puts the item back in the queue for another worker,
  and the queue tells the session (`SIGNAL_WORK_ENDED`): every call the session was waiting on is answered as an
  error whose outcome is unknown, so no call is silently run twice. A stopped item tells the session the same.
- **Tokens.** A work item's `secret` (given on poll only) carries a session-scoped token; the item keeps only its
  SHA-256, and a new delivery of the item replaces it, so the token of a worker that lost the item opens nothing.

Persisted schemas: add optional fields, never repurpose one.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral.names import ENVIRONMENT_ID_PREFIX, WORK_ID_PREFIX

WORK_QUEUE_WORKFLOW: Final = "EnvironmentWorkQueue"
WORK_QUEUE_ID_PREFIX: Final = "workq-"
"""A queue's workflow id is this and its environment's id (not a record id: `corral.records` never lists it)."""

UPDATE_ENQUEUE_WORK: Final = "enqueue_work"
UPDATE_CLAIM_WORK: Final = "claim_work"
UPDATE_ACK_WORK: Final = "ack_work"
UPDATE_HEARTBEAT_WORK: Final = "heartbeat_work"
UPDATE_STOP_WORK: Final = "stop_work"
UPDATE_WORK_METADATA: Final = "update_work_metadata"
SIGNAL_REQUEST_WORK: Final = "request_work"
"""A session asks for hands (`WorkRequest`): a new item unless it has one that has not ended."""
SIGNAL_RELEASE_WORK: Final = "release_work"
"""A session has ended (`WorkRequest`): its live item is stopped, and its worker told so at the next heartbeat."""
SIGNAL_POLLED: Final = "work_polled"
"""A worker polled (`WorkPolled`); the gateway sends it at most once per `POLL_SIGNAL_SECONDS` per worker."""
QUERY_WORK_ITEMS: Final = "work_items"
"""Every item the queue keeps (`list[WorkItem]`), newest first: the live ones and the latest ended ones."""
QUERY_WORK_QUEUE: Final = "work_queue"
"""The queue at a glance (`WorkQueueState`): what the stats route and `corral environment work` show."""

SIGNAL_WORK_ENDED: Final = "work_ended"
"""Sent by the queue to a session whose item ended (`WorkEnded`): stopped by its worker, or its lease lapsed."""
ACTIVITY_REQUEST_WORK: Final = "request_work"
"""The session's request for hands: a signal-with-start of its environment's queue, on the model workers."""

NO_HEARTBEAT: Final = "NO_HEARTBEAT"
"""The `expected_last_heartbeat` of a claim: the first heartbeat, which takes the lease when no one holds it."""
DEFAULT_LEASE_SECONDS: Final = 60.0
"""A lease's time to live when the worker asks for none: a killed worker's item is reclaimed this long after its
last heartbeat. The SDK heartbeats every min(ttl / 2, 30 s). `CORRAL_WORK_LEASE_SECONDS` sets it per gateway."""
MIN_LEASE_SECONDS: Final = 2.0
MAX_LEASE_SECONDS: Final = 3600.0
CLAIM_WINDOW_SECONDS: Final = 300.0
"""How long an acknowledged item waits for its first heartbeat before another worker may take it (the SDK's own
claim timeout)."""
DEFAULT_RECLAIM_MS: Final = 5000
"""A polled item that is not acknowledged within this long is delivered again (the poll's `reclaim_older_than_ms`)."""
POLLERS_WINDOW_SECONDS: Final = 30.0
"""`workers_polling` counts the workers that polled within this long."""
POLL_SIGNAL_SECONDS: Final = 10.0
ENDED_ITEMS_KEPT: Final = 100
"""Ended items a queue keeps for listing; older ones are dropped when it continues as new."""
MAX_UPDATES_PER_RUN: Final = 1000

WorkState = Literal["queued", "starting", "active", "stopping", "stopped"]
LIVE_STATES: Final[frozenset[WorkState]] = frozenset({"queued", "starting", "active", "stopping"})
WorkEndReason = Literal["stopped", "lease_lost", "session_ended"]

# The error types of a refused update (ApplicationError.type): raised by validators, so never in history. The
# gateway maps each to its HTTP answer (gateway/work.py).
WORK_NOT_FOUND: Final = "WorkNotFound"
WORK_NOT_QUEUED: Final = "WorkNotQueued"
"""An ack of an item that is not waiting to be acknowledged (409)."""
WORK_ALREADY_STOPPED: Final = "WorkAlreadyStopped"
"""A stop of a stopped item (409, not to be retried)."""
HEARTBEAT_PRECONDITION_FAILED: Final = "HeartbeatPreconditionFailed"
"""A heartbeat whose `expected_last_heartbeat` is not the item's (412); its details hold `current_state`."""

SESSION_TOKEN_PREFIX: Final = "sk-corral-work-"
"""A session-scoped token reads `sk-corral-work-<environment id>-<work id>-<secret>` (ids have no '-')."""


def work_queue_id(environment_id: str) -> str:
    return f"{WORK_QUEUE_ID_PREFIX}{environment_id}"


class SelfHostedEnvironment(BaseModel):
    """A session's environment when its hands are a self-hosted worker's: the queue its calls go to. The gateway
    sets it from a `self_hosted` environment record; a Temporal client may set it too (and then starts nothing: the
    session's first built-in call starts the queue)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["self_hosted"] = "self_hosted"
    environment_id: str = Field(pattern=rf"^{ENVIRONMENT_ID_PREFIX}[a-z0-9]+$")
    workspace: str = Field(min_length=1, max_length=63)


class WorkRequest(BaseModel):
    """A session's request for hands, or its release of them."""

    model_config = ConfigDict(extra="forbid")
    session_id: str = Field(min_length=1)
    workspace: str


class WorkQueueInput(BaseModel):
    """Start input of `EnvironmentWorkQueue`."""

    model_config = ConfigDict(extra="forbid")
    environment_id: str = Field(pattern=rf"^{ENVIRONMENT_ID_PREFIX}")
    workspace: str
    carry: WorkQueueCarry | None = None
    """Set by the queue itself when it continues as new."""


class WorkItem(BaseModel):
    """One work item: a session's claim on a self-hosted worker. The API shows it as the SDK's `work` object
    (gateway/work.py), without the lease's bookkeeping and never with the token's digest."""

    id: str = Field(pattern=rf"^{WORK_ID_PREFIX}")
    environment_id: str
    workspace: str
    session_id: str
    state: WorkState = "queued"
    metadata: dict[str, str] = Field(default_factory=dict)
    created_at: datetime
    acknowledged_at: datetime | None = None
    started_at: datetime | None = None
    latest_heartbeat_at: datetime | None = None
    stop_requested_at: datetime | None = None
    stopped_at: datetime | None = None
    delivered_at: datetime | None = None
    """When a poll last handed the item out (an un-acknowledged delivery is redelivered after `reclaim_older_than`)."""
    delivered_to: str | None = None
    """The worker id of that poll (`Anthropic-Worker-ID`)."""
    deliveries: int = 0
    last_heartbeat: str = ""
    """The lease's current token ("" while no one holds it), echoed by the next heartbeat."""
    lease_expires_at: datetime | None = None
    ttl_seconds: float = DEFAULT_LEASE_SECONDS
    token_sha256: str | None = None
    """The digest of the session-scoped token of the latest delivery; None before the first."""
    end_reason: WorkEndReason | None = None


class WorkHeartbeat(BaseModel):
    """The SDK's `work_heartbeat`; also the `current_state` of a 412."""

    last_heartbeat: str
    lease_extended: bool
    state: WorkState
    ttl_seconds: float


class ClaimWork(BaseModel):
    """A poll that found something to hand out: deliver the oldest claimable item to `worker_id`."""

    model_config = ConfigDict(extra="forbid")
    worker_id: str = Field(min_length=1, max_length=256)
    reclaim_older_than_ms: int = Field(default=DEFAULT_RECLAIM_MS, ge=0)
    token_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The digest of the token the gateway made for this delivery (the token itself never enters history)."""
    work_id: str | None = None
    """The item to deliver (its token names it), if it is still claimable; None: the oldest claimable one."""


class WorkId(BaseModel):
    model_config = ConfigDict(extra="forbid")
    work_id: str = Field(pattern=rf"^{WORK_ID_PREFIX}")


class HeartbeatWork(WorkId):
    expected_last_heartbeat: str = Field(max_length=256)
    ttl_seconds: float = Field(default=DEFAULT_LEASE_SECONDS, ge=MIN_LEASE_SECONDS, le=MAX_LEASE_SECONDS)


class StopWork(WorkId):
    force: bool = False


class WorkMetadataChange(WorkId):
    metadata: dict[str, str | None]
    """Merged into the item's metadata; a null value deletes its key."""


class WorkPolled(BaseModel):
    model_config = ConfigDict(extra="forbid")
    worker_id: str = Field(min_length=1, max_length=256)


class WorkEnded(BaseModel):
    """What the queue tells a session when its item ends."""

    work_id: str
    reason: WorkEndReason


class WorkQueueState(BaseModel):
    """The queue at a glance. `pollers` are each worker's last poll as the gateway reported it: the reader counts
    those within `POLLERS_WINDOW_SECONDS` of its own clock (the workflow's clock stands still between tasks)."""

    environment_id: str
    workspace: str
    depth: int
    """Items waiting to be picked up (queued, never delivered or delivered again after a lapse)."""
    pending: int
    """Items polled but not acknowledged (as the SDK's `work_queue_stats` counts them)."""
    oldest_queued_at: datetime | None
    """The oldest of both."""
    pollers: dict[str, datetime]


class WorkQueueCarry(BaseModel):
    items: list[WorkItem]
    pollers: dict[str, datetime] = Field(default_factory=dict)
    next_number: int = 1


WorkQueueInput.model_rebuild()


def work_secret(session_token: str) -> str:
    """A work item's `secret` as the SDK reads it: URL-safe base64 of `{"sessions_token": ...}`."""
    payload = json.dumps({"sessions_token": session_token}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def parse_session_token(token: object) -> tuple[str, str, str] | None:
    """(environment id, work id, secret) of a well-formed session token, else None."""
    if not isinstance(token, str) or len(token) > 512 or not token.startswith(SESSION_TOKEN_PREFIX):
        return None
    environment_id, _, rest = token.removeprefix(SESSION_TOKEN_PREFIX).partition("-")
    work_id, _, secret = rest.partition("-")
    if not environment_id.startswith(ENVIRONMENT_ID_PREFIX) or not work_id.startswith(WORK_ID_PREFIX):
        return None
    if not secret or not secret.isascii() or "-" in environment_id + work_id:
        return None
    return environment_id, work_id, secret


class RequestWorkInput(BaseModel):
    """Input of `request_work`: the session that needs hands, and the environment whose queue it asks."""

    model_config = ConfigDict(extra="forbid")
    environment: SelfHostedEnvironment
    session_id: str = Field(min_length=1)
    task_queue: str = Field(min_length=1)
    """Where the queue runs if this request starts it: the session's own harness queue."""
