"""A workspace's webhook endpoints, and `emit`: hand an event to every endpoint that wants it.

Endpoints live in the embedded database (corral.knowledge_db), beside files and memory stores: the gateway writes
them, and every process that emits reads them. An endpoint's signing secret is not here: it is in the proxy's Vault,
which only the proxy reads (deliveries go out from the proxy role).

`emit` starts one `WebhookDeliveryWorkflow` per (event, subscribed endpoint), with an id made of both
(`delivery_workflow_id`): emitting the same event again (a retried activity, a replayed workflow) starts nothing
new, and the delivery workflow owes its endpoint that delivery until it lands or is given up. An event no enabled
endpoint wants costs one read and starts nothing.

Errors::

    WebhookError                anything refused here
    ├── EndpointNotFound        no such endpoint in the workspace (another workspace's is the same)
    └── InvalidEndpoint         (also a ValueError) a URL or an event type list the rules refuse
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from corral.contract.records import SEARCH_ATTRIBUTE_WORKSPACE
from corral.contract.webhooks import (
    ALL_EVENTS,
    DeliveryPolicy,
    WebhookDeliveryInput,
    WebhookEvent,
    delivery_workflow_id,
    keyed_event_id,
    webhook_event_types_problem,
)
from corral.knowledge_db import KnowledgeDB
from corral.names import (
    ENV_WEBHOOK_FIRST_RETRY,
    ENV_WEBHOOK_GIVE_UP_AFTER,
    ENV_WEBHOOK_LONGEST_WAIT,
    HARNESS_TASK_QUEUE,
    PROXY_TASK_QUEUE,
    SESSION_WORKFLOW,
    SIGNAL_WEBHOOKS,
    WEBHOOK_DELIVERY_WORKFLOW,
    WEBHOOK_ENDPOINT_ID_PREFIX,
    WEBHOOK_EVENT_ID_PREFIX,
)
from corral.record_ids import check_workspace, new_record_id

logger = logging.getLogger(__name__)

ENABLED = "enabled"
DISABLED = "disabled"

_TABLES = (
    """CREATE TABLE IF NOT EXISTS webhook_endpoints (
        id TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        url TEXT NOT NULL,
        events TEXT NOT NULL,
        description TEXT NOT NULL DEFAULT '',
        status TEXT NOT NULL DEFAULT 'enabled',
        disabled_reason TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS webhook_endpoints_workspace ON webhook_endpoints (workspace, id)",
)


class WebhookError(Exception):
    """Anything refused here."""


class EndpointNotFound(WebhookError):
    def __init__(self, endpoint_id: str) -> None:
        super().__init__(f"webhook endpoint {endpoint_id!r} was not found")
        self.endpoint_id = endpoint_id


class InvalidEndpoint(WebhookError, ValueError):
    """A URL or an event type list the rules refuse; the message names the problem."""


@dataclass(frozen=True)
class Endpoint:
    id: str
    workspace: str
    url: str
    events: tuple[str, ...]
    description: str
    status: str
    disabled_reason: str | None
    created_at: str
    updated_at: str

    def wants(self, event_type: str) -> bool:
        return self.status == ENABLED and (ALL_EVENTS in self.events or event_type in self.events)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _endpoint(row: sqlite3.Row) -> Endpoint:
    return Endpoint(row["id"], row["workspace"], row["url"], tuple(json.loads(row["events"])), row["description"],
                    row["status"], row["disabled_reason"], row["created_at"], row["updated_at"])  # fmt: skip


def url_problem(url: object) -> str | None:
    """Why `url` cannot be an endpoint's, or None when it can."""
    if not isinstance(url, str) or not url:
        return "an endpoint's url is a non-empty string"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"an endpoint's url is an http:// or https:// URL with a host, not {url!r}"
    if parts.username or parts.password:
        return "an endpoint's url carries no credentials: deliveries are signed instead"
    return None


class WebhookEndpoints:
    """The endpoints of every workspace; each method is one transaction (call it through `db.run`)."""

    def __init__(self, db: KnowledgeDB) -> None:
        self.db = db
        db.migrate("webhook_endpoints", _TABLES)

    def create(self, workspace: str, url: str, events: Sequence[str], description: str = "") -> Endpoint:
        self._check(url, events)
        endpoint_id, now = new_record_id(WEBHOOK_ENDPOINT_ID_PREFIX.rstrip("_")), _now()
        with self.db.write() as db:
            db.execute(
                "INSERT INTO webhook_endpoints (id, workspace, url, events, description, status, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (endpoint_id, workspace, url, json.dumps(sorted(set(events))), description, ENABLED, now, now),
            )
            return self._get(db, workspace, endpoint_id)

    def get(self, workspace: str, endpoint_id: str) -> Endpoint:
        with self.db.read() as db:
            return self._get(db, workspace, endpoint_id)

    def get_any(self, endpoint_id: str) -> Endpoint:
        """Whatever its workspace: for the delivery workflow, which carries the endpoint's id from `emit`."""
        with self.db.read() as db:
            row = db.execute("SELECT * FROM webhook_endpoints WHERE id = ?", (endpoint_id,)).fetchone()
        if row is None:
            raise EndpointNotFound(endpoint_id)
        return _endpoint(row)

    def in_workspace(self, workspace: str) -> list[Endpoint]:
        with self.db.read() as db:
            rows = db.execute("SELECT * FROM webhook_endpoints WHERE workspace = ? ORDER BY id DESC", (workspace,))
            return [_endpoint(row) for row in rows]

    def update(self, workspace: str, endpoint_id: str, *, url: str | None = None,
               events: Sequence[str] | None = None, description: str | None = None) -> Endpoint:  # fmt: skip
        with self.db.write() as db:
            current = self._get(db, workspace, endpoint_id)
            url = current.url if url is None else url
            events = current.events if events is None else events
            self._check(url, events)
            db.execute(
                "UPDATE webhook_endpoints SET url = ?, events = ?, description = ?, updated_at = ? WHERE id = ?",
                (url, json.dumps(sorted(set(events))), current.description if description is None else description,
                 _now(), endpoint_id),
            )  # fmt: skip
            return self._get(db, workspace, endpoint_id)

    def set_status(self, endpoint_id: str, status: str, reason: str | None = None) -> Endpoint:
        """Enable an endpoint again, or disable it with the reason (a delivery given up, or its owner's choice)."""
        if status not in (ENABLED, DISABLED):
            raise InvalidEndpoint(f"an endpoint's status is {ENABLED!r} or {DISABLED!r}, not {status!r}")
        with self.db.write() as db:
            db.execute(
                "UPDATE webhook_endpoints SET status = ?, disabled_reason = ?, updated_at = ? WHERE id = ?",
                (status, reason if status == DISABLED else None, _now(), endpoint_id),
            )
            row = db.execute("SELECT * FROM webhook_endpoints WHERE id = ?", (endpoint_id,)).fetchone()
        if row is None:
            raise EndpointNotFound(endpoint_id)
        return _endpoint(row)

    def delete(self, workspace: str, endpoint_id: str) -> None:
        with self.db.write() as db:
            self._get(db, workspace, endpoint_id)
            db.execute("DELETE FROM webhook_endpoints WHERE id = ?", (endpoint_id,))

    def subscribers(self, workspace: str, event_type: str) -> list[Endpoint]:
        """The enabled endpoints of `workspace` that want `event_type`."""
        return [endpoint for endpoint in self.in_workspace(workspace) if endpoint.wants(event_type)]

    def any_in(self, workspace: str) -> bool:
        """Whether `workspace` has an enabled endpoint (a session made there emits its events, see `emit`)."""
        with self.db.read() as db:
            query = "SELECT 1 FROM webhook_endpoints WHERE workspace = ? AND status = ? LIMIT 1"
            return db.execute(query, (workspace, ENABLED)).fetchone() is not None

    @staticmethod
    def _check(url: object, events: Sequence[str]) -> None:
        problem = url_problem(url) or webhook_event_types_problem(list(events))
        if problem:
            raise InvalidEndpoint(problem)

    @staticmethod
    def _get(db: sqlite3.Connection, workspace: str, endpoint_id: str) -> Endpoint:
        query = "SELECT * FROM webhook_endpoints WHERE id = ? AND workspace = ?"
        row = db.execute(query, (endpoint_id, workspace)).fetchone()
        if row is None:
            raise EndpointNotFound(endpoint_id)
        return _endpoint(row)


def webhook_event_id(key: str | None = None) -> str:
    """A new event id, or, given a `key` (what the event is: `"<run id>/succeeded"`), always the same id for it, so
    that an event made again after a crash is the same event."""
    return new_record_id(WEBHOOK_EVENT_ID_PREFIX.rstrip("_")) if key is None else keyed_event_id(key)


def webhook_event(type: str, subject_id: str, workspace: str, *, key: str | None = None,
                  created_at: datetime | None = None, extra: dict[str, str] | None = None) -> WebhookEvent:  # fmt: skip
    """An event that happens now (outside workflow code, which makes its events with its own id and time)."""
    return WebhookEvent(id=webhook_event_id(key), type=type, subject_id=subject_id, workspace=workspace,
                        created_at=created_at or datetime.now(UTC), extra=extra or {})  # fmt: skip


def delivery_policy(env: Mapping[str, str] | None = None) -> DeliveryPolicy:
    """The delivery policy of the deliveries this process starts: the defaults (first retry after 5 s, doubling up
    to an hour between tries, given up after 26 hours), or `CORRAL_WEBHOOK_FIRST_RETRY_SECONDS`,
    `CORRAL_WEBHOOK_LONGEST_WAIT_SECONDS` and `CORRAL_WEBHOOK_GIVE_UP_AFTER_SECONDS`. Read once, where emitting
    starts, and carried in each delivery's input: a delivery keeps the policy it was started with. A value that is
    not a positive number, or a longest wait shorter than the first, is a ValueError naming the variable."""
    env = os.environ if env is None else env
    policy = DeliveryPolicy()
    fields = {ENV_WEBHOOK_FIRST_RETRY: "first_retry", ENV_WEBHOOK_LONGEST_WAIT: "longest_wait",
              ENV_WEBHOOK_GIVE_UP_AFTER: "give_up_after"}  # fmt: skip
    changes: dict[str, timedelta] = {}
    for name, field in fields.items():
        raw = env.get(name)
        if not raw:
            continue
        try:
            seconds = float(raw)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < 10 * 365 * 86400:
            raise ValueError(f"{name} is a positive number of seconds, not {raw!r}")
        changes[field] = timedelta(seconds=seconds)
    policy = policy.model_copy(update=changes)
    if policy.longest_wait < policy.first_retry:
        raise ValueError(f"{ENV_WEBHOOK_LONGEST_WAIT} is at least the first retry's wait ({ENV_WEBHOOK_FIRST_RETRY})")
    return policy


class Webhooks:
    """Emits events: what every emitting process (gateway, model workers, proxy) holds, over one Temporal client."""

    def __init__(self, client: Client, db: KnowledgeDB, task_queue: str = HARNESS_TASK_QUEUE,
                 policy: DeliveryPolicy | None = None, proxy_queue: str = PROXY_TASK_QUEUE) -> None:  # fmt: skip
        self.client = client
        self.endpoints = WebhookEndpoints(db)
        self.task_queue = task_queue
        """Where delivery workflows run: the harness queue (they are workflow code; the proxy sends)."""
        self.policy = policy or delivery_policy()
        self.proxy_queue = proxy_queue
        """Where the deliveries' attempts run: the proxy role's queue (it alone holds the signing secrets)."""

    async def emit(self, events: Sequence[WebhookEvent], task_queue: str | None = None) -> list[str]:
        """Start the deliveries `events` are owed (their workflows on `task_queue`, default this emitter's); the
        ids of the delivery workflows, started now or before."""
        started: list[str] = []
        for event in events:
            endpoints = await self.endpoints.db.run(self.endpoints.subscribers, event.workspace, event.type)
            for endpoint in endpoints:
                started.append(await self._deliver(event, endpoint, task_queue or self.task_queue))
        return started

    async def wake_sessions(self, workspace: str) -> int:
        """Tell the workspace's running sessions that it has an endpoint now (`SIGNAL_WEBHOOKS`): a session made
        before emitted nothing, since nobody listened. How many were told."""
        query = (f"WorkflowType = '{SESSION_WORKFLOW}' AND ExecutionStatus = 'Running' "
                 f"AND {SEARCH_ATTRIBUTE_WORKSPACE} = '{check_workspace(workspace)}'")  # fmt: skip
        told = 0
        async for execution in self.client.list_workflows(query):
            try:
                await self.client.get_workflow_handle(execution.id).signal(SIGNAL_WEBHOOKS, True)
                told += 1
            except RPCError as exc:  # ended meanwhile: nothing to tell
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
        return told

    async def tell(self, event: WebhookEvent) -> None:
        """Emit one event of a change already made (an API write): a failure to emit (Temporal unreachable a moment)
        is logged, never turned into an error for a request that did what it asked."""
        try:
            await self.emit([event])
        except Exception as exc:  # any failure to emit is logged: the change stands
            logger.warning("webhook event %s of %s not emitted: %s", event.type, event.subject_id, exc)

    async def _deliver(self, event: WebhookEvent, endpoint: Endpoint, task_queue: str) -> str:
        workflow_id = delivery_workflow_id(event.id, endpoint.id)
        delivery = WebhookDeliveryInput(event=event, endpoint_id=endpoint.id, policy=self.policy,
                                        proxy_task_queue=self.proxy_queue)  # fmt: skip
        try:
            await self.client.start_workflow(
                WEBHOOK_DELIVERY_WORKFLOW, delivery, id=workflow_id, task_queue=task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )  # fmt: skip
        except WorkflowAlreadyStartedError:
            pass  # delivered (or given up) before: once per event and endpoint
        return workflow_id


def endpoint_view(endpoint: Endpoint) -> dict[str, Any]:
    """An endpoint as the API shows it (its secret never: that is shown once, when made or rotated)."""
    return {"type": "webhook_endpoint", "id": endpoint.id, "url": endpoint.url, "events": list(endpoint.events),
            "description": endpoint.description, "status": endpoint.status,
            "disabled_reason": endpoint.disabled_reason, "created_at": endpoint.created_at,
            "updated_at": endpoint.updated_at}  # fmt: skip
