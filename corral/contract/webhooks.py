"""Webhook events: what corral tells a workspace's endpoints, in the SDK's payload shape (`BetaWebhookEvent`).

An event names its subject by id only, never the object: a receiver reads the object through the API. Its `id`
(`wevt_…`) is the payload's `id` and the `webhook-id` header of every delivery of it, retries included, so a
receiver de-duplicates by it. Events are made where the change happens (the gateway for what the API writes, the
session workflow for what a session does, the deployment fire for runs, the proxy for credentials) and handed to
`Webhooks.emit` (corral/webhooks.py), which starts one `WebhookDeliveryWorkflow` per subscribed endpoint.

Persisted schemas (they are workflow inputs): add optional fields, never repurpose one.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any, Final

from pydantic import BaseModel, Field

from corral.names import PROXY_TASK_QUEUE, WEBHOOK_EVENT_ID_PREFIX

ORGANIZATION_ID: Final = "corral"
"""The payload's `organization_id`: one corral installation is one organisation (workspaces are its tenants)."""

SESSION_EVENT_TYPES: Final = (
    "session.created",
    "session.pending",
    "session.running",
    "session.idled",
    "session.requires_action",
    "session.archived",
    "session.deleted",
    "session.updated",
    "session.budget_reached",
    "session.outcome_evaluation_ended",
    "session.status_run_started",
    "session.status_idled",
    "session.status_rescheduled",
    "session.status_terminated",
)
THREAD_EVENT_TYPES: Final = ("session.thread_created", "session.thread_idled", "session.thread_terminated")
"""Their data adds `session_thread_id`; `id` is the session's."""
RECORD_EVENT_TYPES: Final = (
    *(
        f"{kind}.{change}"
        for kind in ("agent", "environment")
        for change in ("created", "updated", "archived", "deleted")
    ),
    *(f"{kind}.{change}" for kind in ("memory_store", "vault") for change in ("created", "archived", "deleted")),
)
CREDENTIAL_EVENT_TYPES: Final = (
    "vault_credential.created",
    "vault_credential.archived",
    "vault_credential.deleted",
    "vault_credential.refresh_failed",
)
"""Their data adds `vault_id`; `id` is the credential's."""
DEPLOYMENT_EVENT_TYPES: Final = (
    *(f"deployment.{change}" for change in ("created", "updated", "paused", "unpaused", "archived", "deleted")),
    "deployment_run.started",
    "deployment_run.succeeded",
    "deployment_run.failed",
)
WEBHOOK_EVENT_TYPES: Final = frozenset(
    (*SESSION_EVENT_TYPES, *THREAD_EVENT_TYPES, *RECORD_EVENT_TYPES, *CREDENTIAL_EVENT_TYPES, *DEPLOYMENT_EVENT_TYPES)
)
"""Every type corral delivers: all the SDK's workspace event types (`BetaWebhookEventData`). The SDK's
organisation events (`external_key.*`, `external_storage.*`, `user_profile.*`) name things corral does not have."""
ALL_EVENTS: Final = "all"
"""What an endpoint subscribes with to receive every type, including types added later."""


def webhook_event_types_problem(types: list[str]) -> str | None:
    """Why `types` cannot be an endpoint's subscription, or None when it can; one message for every edge."""
    if not types:
        return "an endpoint subscribes to at least one event type (or `all`)"
    unknown = sorted({t for t in types if t != ALL_EVENTS and t not in WEBHOOK_EVENT_TYPES})
    if unknown:
        return f"unknown webhook event type(s): {', '.join(unknown)} (see `corral webhook types`)"
    return None


class WebhookEvent(BaseModel):
    """One thing that happened, to be delivered to every endpoint of its workspace that subscribes to its type."""

    id: str
    """`wevt_…`: made once where the event happens (deterministically in workflow code), kept across retries."""
    type: str
    """One of `WEBHOOK_EVENT_TYPES`: the payload's `data.type`."""
    subject_id: str
    """The payload's `data.id`: the session, agent, deployment run, ... the event is about."""
    workspace: str
    created_at: datetime
    extra: dict[str, str] = Field(default_factory=dict)
    """More of `data`: `session_thread_id` for thread events, `vault_id` for credential events."""

    def payload(self) -> dict[str, Any]:
        """The JSON a receiver gets (`client.beta.webhooks.unwrap` parses it as `BetaWebhookEvent`)."""
        data = {"type": self.type, "id": self.subject_id, "organization_id": ORGANIZATION_ID,
                "workspace_id": self.workspace, **self.extra}  # fmt: skip
        stamp = self.created_at.isoformat().replace("+00:00", "Z")
        return {"type": "event", "id": self.id, "created_at": stamp, "data": data}


class DeliveryPolicy(BaseModel):
    """How long and how often a delivery is tried: exponential back-off, for at least a day by default."""

    first_retry: timedelta = timedelta(seconds=5)
    backoff: float = 2.0
    longest_wait: timedelta = timedelta(hours=1)
    give_up_after: timedelta = timedelta(hours=26)
    """A delivery still failing this long after its event gives up, and disables its endpoint."""


class WebhookDeliveryInput(BaseModel):
    """The input of `WebhookDeliveryWorkflow`, whose id is `delivery_workflow_id(event.id, endpoint_id)`."""

    event: WebhookEvent
    endpoint_id: str
    policy: DeliveryPolicy = Field(default_factory=DeliveryPolicy)
    proxy_task_queue: str = PROXY_TASK_QUEUE
    """Where the attempts run: the proxy's queue (`corral.names.PROXY_TASK_QUEUE`; a test's own, in tests)."""


def delivery_workflow_id(event_id: str, endpoint_id: str) -> str:
    """One delivery workflow per (event, endpoint): starting it twice (a retried emit, a replayed workflow) is a
    no-op, so an event is never delivered twice to one endpoint by corral's doing."""
    return f"webhook-{event_id}-{endpoint_id}"


def keyed_event_id(key: str) -> str:
    """The id of the event `key` names (`"<session event id>/session.idled"`, `"<run id>/succeeded"`): the same key
    always gives the same id, so an event made again (a replayed workflow, a retried activity) is the same event.
    Pure, so workflow code uses it too."""
    return WEBHOOK_EVENT_ID_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:26]


class EmitWebhooks(BaseModel):
    """The input of the `emit_webhooks` activity (model workers): a session's events, in order."""

    events: list[WebhookEvent]
    task_queue: str
    """Where the delivery workflows run: the harness queue of the session that emits."""


DELIVERED = "delivered"
STOPPED = "stopped"
GAVE_UP = "gave_up"


class WebhookDeliveryResult(BaseModel):
    """How a delivery ended: `delivered` (a 2xx), `stopped` (its endpoint was disabled or deleted meanwhile) or
    `gave_up` (still failing after `give_up_after`: the endpoint is disabled). The activity's result too."""

    outcome: str
    reason: str | None = None
    """Why it stopped or gave up, for the deliveries view; never a secret."""
    attempts: int = 0


class GiveUpWebhookInput(BaseModel):
    """What `give_up_webhook` needs: the delivery's event and endpoint, and the attempts made."""

    event: WebhookEvent
    endpoint_id: str
    give_up_after: timedelta
