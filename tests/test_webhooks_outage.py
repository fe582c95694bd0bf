"""A receiver that stays down through many retries, then comes back: every delivery arrives, none twice by
`webhook-id`, and none is given up or disables its endpoint meanwhile.

The outage is a real one: the receiver is shut (connections refused) until the deliveries' own record
(corral.webhook_deliveries: first attempt to latest) spans `OUTAGE_SECONDS`; no sleep stands in for it. What makes
it long is the retry policy, not the clock: it is read as the emitting process reads it (`CORRAL_WEBHOOK_*`,
corral.webhooks.delivery_policy), with a first retry after 0.1 s and a longest wait of 2 s, so the outage lasts
fifteen of the longest waits and the back-off reaches its cap and keeps trying there, as a five-minute outage does
under a 20 s cap (the same scenario, ten times faster). It gives up after the default 26 hours. While it waits it
checks what a user would look at: each delivery is pending, retried (the attempt count grows), with the reason its
last attempt failed; no endpoint is disabled; and events emitted during the outage queue up too.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import pytest
from temporalio.api.enums.v1 import EventType

from activities.proxy import ProxyActivities
from activities.webhook_delivery import WebhookDeliveryActivities
from corral.contract.webhooks import DELIVERED, WebhookDeliveryResult, WebhookEvent, delivery_workflow_id
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

pytestmark = pytest.mark.timeout(300)

FIRST_RETRY_SECONDS = 0.1
LONGEST_WAIT_SECONDS = 2.0
OUTAGE_SECONDS = 15 * LONGEST_WAIT_SECONDS
"""Fifteen of the longest waits: the back-off reaches its cap after five retries and keeps trying there."""
OUTAGE_WAIT = 4 * OUTAGE_SECONDS
"""How long the record may take to span (half) the outage before the test fails: generous, for a loaded machine."""
TYPES = ["session.status_idled", "session.requires_action", "deployment_run.succeeded", "agent.created"]


def outage_recorded(deliveries: WebhookDeliveries, event_id: str, endpoint_id: str) -> float:
    """Seconds from the delivery's first attempt to its latest, by its own record."""
    row = deliveries.get(event_id, endpoint_id)
    if row is None:
        return 0.0
    return (datetime.fromisoformat(row.updated_at) - datetime.fromisoformat(row.created_at)).total_seconds()


async def test_a_receiver_down_through_many_retries_gets_each_delivery_once(
    stack: Stack, receiver: WebhookReceiver
) -> None:
    dev_vault = shared_dev_vault()
    store = VaultStore(dev_vault.client(), dev_vault.mount)
    workspace = unique("ws")
    everything, _ = endpoint(store, receiver, workspace, ["all"], "/all")
    idles, _ = endpoint(store, receiver, workspace, ["session.status_idled"], "/idles")
    policy = delivery_policy(
        {ENV_WEBHOOK_FIRST_RETRY: str(FIRST_RETRY_SECONDS), ENV_WEBHOOK_LONGEST_WAIT: str(LONGEST_WAIT_SECONDS)}
    )
    assert policy.give_up_after.total_seconds() >= 86400, "the default: at least a day"
    assert policy.longest_wait == timedelta(seconds=LONGEST_WAIT_SECONDS)
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

        await until(lambda: still_failing(OUTAGE_SECONDS / 2), "half the outage by the record", within=OUTAGE_WAIT)
        second = batch(4)  # emitted while the receiver is down: they wait with the rest
        started += await emitter.emit(second)
        owed |= {(e.id, everything.id) for e in second} | {(e.id, idles.id) for e in second if e.type == TYPES[0]}
        assert len(started) == len(owed)
        await until(lambda: still_failing(OUTAGE_SECONDS), "the whole outage by the record", within=OUTAGE_WAIT)
        assert receiver.received == [], "nothing arrived while the receiver was down"
        assert len(seen_attempts) >= 3 and seen_attempts == sorted(seen_attempts), "retried, again and again"
        assert all((row := deliveries.get(*pair)) and row.last_error for pair in owed), "each one failed, and why"
        backoffs: list[tuple[int, timedelta]] = []

        async def between_attempts() -> bool:
            """The probe's last attempt failed and its next is scheduled: the server's back-off is the gap."""
            handle = stack.client.get_workflow_handle(delivery_workflow_id(*probe))
            pending = (await handle.describe()).raw_description.pending_activities
            if not pending or not pending[0].HasField("next_attempt_schedule_time"):
                return False
            last, following = pending[0].last_attempt_complete_time, pending[0].next_attempt_schedule_time
            backoffs.append((pending[0].attempt, following.ToDatetime() - last.ToDatetime()))
            return True

        await until(between_attempts, "the probe's delivery waiting for its next attempt")
        attempt, backoff = backoffs[-1]
        # The server stamps the two times microseconds apart; uncapped, the gap would have doubled past 3.2 s.
        assert attempt > 6 and policy.longest_wait <= backoff < policy.longest_wait + policy.first_retry, (
            "the back-off reached its cap and kept trying there",
            attempt,
            backoff,
        )

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
