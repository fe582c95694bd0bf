"""The one slow webhook test: a receiver that is down for five minutes, then comes back. Every delivery arrives,
none twice by `webhook-id`.

It takes five minutes because that is the fault: the receiver is shut (connections refused) until the deliveries'
own record (corral.webhook_deliveries: first attempt to latest) spans five minutes; no sleep stands in for it.
While it waits it checks what a user would look at: each delivery is pending, retried (the attempt count grows),
with the reason its last attempt failed; no endpoint is disabled; and events emitted during the outage queue up
too. The retry policy is read as the emitting process reads it (`CORRAL_WEBHOOK_*`, corral.webhooks.delivery_policy),
with a longest wait of 20 s so the receiver is tried often; it gives up after the default 26 hours.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import pytest
from temporalio.api.enums.v1 import EventType

from activities.proxy import ProxyActivities
from activities.webhook_delivery import WebhookDeliveryActivities
from corral.contract.webhooks import DELIVERED, WebhookDeliveryResult, WebhookEvent
from corral.knowledge_db import open_knowledge_db
from corral.names import ENV_WEBHOOK_FIRST_RETRY, ENV_WEBHOOK_LONGEST_WAIT
from corral.webhook_deliveries import PENDING, WebhookDeliveries
from corral.webhooks import ENABLED, WebhookEndpoints, Webhooks, delivery_policy, webhook_event
from proxy import VaultStore
from tests.conftest import Stack, unique
from tests.proxy_servers.devvault import shared_dev_vault
from tests.proxy_servers.webhook_receiver import WebhookReceiver
from tests.test_webhooks import endpoint
from tests.waits import until
from workers.proxy import proxy_worker

pytestmark = pytest.mark.timeout(900)

OUTAGE_SECONDS = 300.0
TYPES = ["session.status_idled", "session.requires_action", "deployment_run.succeeded", "agent.created"]


def outage_recorded(deliveries: WebhookDeliveries, event_id: str, endpoint_id: str) -> float:
    """Seconds from the delivery's first attempt to its latest, by its own record."""
    row = deliveries.get(event_id, endpoint_id)
    if row is None:
        return 0.0
    return (datetime.fromisoformat(row.updated_at) - datetime.fromisoformat(row.created_at)).total_seconds()


async def test_receiver_down_for_five_minutes(stack: Stack, receiver: WebhookReceiver) -> None:
    dev_vault = shared_dev_vault()
    store = VaultStore(dev_vault.client(), dev_vault.mount)
    workspace = unique("ws")
    everything, _ = endpoint(store, receiver, workspace, ["all"], "/all")
    idles, _ = endpoint(store, receiver, workspace, ["session.status_idled"], "/idles")
    policy = delivery_policy({ENV_WEBHOOK_FIRST_RETRY: "1", ENV_WEBHOOK_LONGEST_WAIT: "20"})
    assert policy.give_up_after.total_seconds() >= 86400, "the default: at least a day"
    proxy_queue = unique("proxy")
    emitter = Webhooks(stack.client, open_knowledge_db(), stack.harness_queue, policy, proxy_queue)
    deliveries = WebhookDeliveries(open_knowledge_db())
    endpoints = WebhookEndpoints(open_knowledge_db())
    receiver.down()

    def batch(n: int) -> list[WebhookEvent]:
        return [webhook_event(TYPES[i % len(TYPES)], f"sesn_{unique('s').replace('-', '')[:26]}", workspace)
                for i in range(n)]  # fmt: skip

    async with proxy_worker(
        stack.client, ProxyActivities(store), proxy_queue, webhooks=WebhookDeliveryActivities(store)
    ):
        first = batch(6)
        started = await emitter.emit(first)
        owed = {(e.id, everything.id) for e in first} | {(e.id, idles.id) for e in first if e.type == TYPES[0]}
        assert len(started) == len(owed)
        probe = (first[0].id, everything.id)
        seen_attempts: list[int] = []

        def still_failing(span: float) -> bool:
            rows = [deliveries.get(*pair) for pair in owed]
            assert all(row is not None and row.status == PENDING for row in rows if row is not None)
            for row in rows:  # an attempt under way has not recorded its outcome yet: its last error is the one before
                if row is not None and row.last_error is not None:
                    assert row.last_status is None and row.last_error == "could not connect (ConnectError)"
            assert {endpoints.get(workspace, e.id).status for e in (everything, idles)} == {ENABLED}
            row = deliveries.get(*probe)
            if row is not None and (not seen_attempts or row.attempts != seen_attempts[-1]):
                seen_attempts.append(row.attempts)
            return outage_recorded(deliveries, *probe) >= span

        await until(lambda: still_failing(OUTAGE_SECONDS / 2), "half the outage by the record", within=OUTAGE_SECONDS)
        second = batch(4)  # emitted while the receiver is down: they wait with the rest
        started += await emitter.emit(second)
        owed |= {(e.id, everything.id) for e in second} | {(e.id, idles.id) for e in second if e.type == TYPES[0]}
        assert len(started) == len(owed)
        await until(lambda: still_failing(OUTAGE_SECONDS), "five minutes of outage by the record",
                    within=OUTAGE_SECONDS)  # fmt: skip
        assert receiver.received == [], "nothing arrived while the receiver was down"
        assert len(seen_attempts) >= 3 and seen_attempts == sorted(seen_attempts), "retried, again and again"
        assert all((row := deliveries.get(*pair)) and row.last_error for pair in owed), "each one failed, and why"

        receiver.up()
        results = [await stack.client.get_workflow_handle(w, result_type=WebhookDeliveryResult).result()
                   for w in started]  # fmt: skip
        assert {r.outcome for r in results} == {DELIVERED}

    paths = {everything.id: "/all", idles.id: "/idles"}
    expected = Counter((paths[endpoint_id], event_id) for event_id, endpoint_id in owed)
    got = Counter((r.path, r.webhook_id) for r in receiver.received if r.verified)
    assert got == expected, "every delivery arrived, none twice by webhook-id"
    assert receiver.ids(verified=False) == []
    assert {r.event.data.type for r in receiver.received if r.path == "/idles"} == {TYPES[0]}
    for pair in owed:
        row = deliveries.get(*pair)
        assert row is not None and row.status == "delivered" and row.last_status == 200
    # The retries are not in the history: each delivery's history is its one activity, however many attempts.
    history = await stack.client.get_workflow_handle(started[0]).fetch_history()
    scheduled = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert len(scheduled) == 1
