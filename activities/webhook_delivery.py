"""Webhook delivery activities on `corral-proxy`: the proxy alone reads an endpoint's signing secret, so the signed
POST goes out from here (`proxy.webhooks` signs and sends; this is the Temporal side of it).

`deliver_webhook` is one attempt; its retry policy (workflows/webhooks.py) makes the back-off. Each attempt looks
the endpoint up first, so a delivery to an endpoint disabled or deleted meanwhile stops instead of retrying, and
records itself in the deliveries table (corral.webhook_deliveries), so a delivery that is still being retried
shows why. A failed attempt raises a retryable `ApplicationError` whose message is the reason (a status code, an
error's kind): never the secret, which stays inside `proxy.webhooks`.
"""

from __future__ import annotations

import asyncio
from typing import NoReturn

from temporalio import activity
from temporalio.exceptions import ApplicationError

from corral.contract.webhooks import (
    DELIVERED,
    GAVE_UP,
    STOPPED,
    GiveUpWebhookInput,
    WebhookDeliveryInput,
    WebhookDeliveryResult,
)
from corral.hands.heartbeat import heartbeating
from corral.knowledge_db import KnowledgeDB, open_knowledge_db
from corral.names import ACTIVITY_DELIVER_WEBHOOK, ACTIVITY_GIVE_UP_WEBHOOK
from corral.webhook_deliveries import DELIVERED as ROW_DELIVERED
from corral.webhook_deliveries import FAILED, PENDING, WebhookDeliveries
from corral.webhooks import DISABLED, ENABLED, Endpoint, EndpointNotFound, WebhookEndpoints
from proxy import ProxyError, VaultStore, WebhookSender

DELIVERY_FAILED = "WebhookDeliveryFailed"
"""The error type of a failed attempt (retryable: the workflow's retry policy tries again)."""


class WebhookDeliveryActivities:
    """Holds the sender (the Vault store, one HTTP pool) and the endpoint and delivery tables."""

    def __init__(self, store: VaultStore, db: KnowledgeDB | None = None, sender: WebhookSender | None = None) -> None:
        db = db or open_knowledge_db()
        self._db = db
        self._endpoints = WebhookEndpoints(db)
        self._deliveries = WebhookDeliveries(db)
        self._sender = sender or WebhookSender(store)

    @activity.defn(name=ACTIVITY_DELIVER_WEBHOOK)
    async def deliver_webhook(self, input: WebhookDeliveryInput) -> WebhookDeliveryResult:
        event, endpoint_id = input.event, input.endpoint_id
        endpoint = await self._endpoint(endpoint_id)
        stopped = _stopped_because(endpoint)
        if stopped is not None:
            await self._db.run(self._deliveries.attempt, event.id, endpoint_id, event.workspace, event.type)
            await self._db.run(self._deliveries.outcome, event.id, endpoint_id, FAILED, None, stopped)
            return WebhookDeliveryResult(outcome=STOPPED, reason=stopped, attempts=activity.info().attempt)
        assert endpoint is not None
        attempts = await self._db.run(self._deliveries.attempt, event.id, endpoint_id, event.workspace, event.type)
        try:
            secret = await asyncio.to_thread(self._sender.secret_of, endpoint_id)
        except ProxyError as exc:
            await self._failed(input, None, f"Vault did not answer ({type(exc).__name__})")
        if secret is None:
            await self._failed(input, None, "the endpoint has no signing secret in Vault")
        async with heartbeating():
            outcome = await self._sender.send(secret, endpoint.url, event.id, event.payload())
        if not outcome.delivered:
            await self._failed(input, outcome.status, outcome.error or "failed")
        await self._db.run(self._deliveries.outcome, event.id, endpoint_id, ROW_DELIVERED, outcome.status, None)
        return WebhookDeliveryResult(outcome=DELIVERED, attempts=attempts)

    @activity.defn(name=ACTIVITY_GIVE_UP_WEBHOOK)
    async def give_up_webhook(self, input: GiveUpWebhookInput) -> WebhookDeliveryResult:
        """The delivery kept failing for `give_up_after`: it is failed, and its endpoint disabled (a receiver that
        has been down that long gets no more deliveries until its owner enables it again)."""
        event, endpoint_id = input.event, input.endpoint_id
        row = await self._db.run(self._deliveries.get, event.id, endpoint_id)
        last = row.last_error if row is not None and row.last_error else "no attempt answered"
        reason = f"gave up after {_duration(input.give_up_after.total_seconds())} of failed deliveries: {last}"
        await self._db.run(self._deliveries.outcome, event.id, endpoint_id, FAILED,
                           row.last_status if row else None, reason)  # fmt: skip
        try:
            await self._db.run(self._endpoints.set_status, endpoint_id, DISABLED, f"event {event.id}: {reason}")
        except EndpointNotFound:
            pass  # deleted meanwhile: nothing to disable
        return WebhookDeliveryResult(outcome=GAVE_UP, reason=reason, attempts=row.attempts if row else 0)

    async def _endpoint(self, endpoint_id: str) -> Endpoint | None:
        try:
            return await self._db.run(self._endpoints.get_any, endpoint_id)
        except EndpointNotFound:
            return None

    async def _failed(self, input: WebhookDeliveryInput, status: int | None, reason: str) -> NoReturn:
        """Record a failed attempt and raise the retryable error that schedules the next one."""
        await self._db.run(self._deliveries.outcome, input.event.id, input.endpoint_id, PENDING, status, reason)
        activity.logger.info("webhook %s to %s failed: %s", input.event.id, input.endpoint_id, reason)
        raise ApplicationError(reason, type=DELIVERY_FAILED)


def _stopped_because(endpoint: Endpoint | None) -> str | None:
    if endpoint is None:
        return "the endpoint was deleted"
    if endpoint.status != ENABLED:
        return f"the endpoint is disabled ({endpoint.disabled_reason or 'by its owner'})"
    return None


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
