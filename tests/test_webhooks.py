"""Webhook deliveries end to end: events emitted through `corral.webhooks.Webhooks.emit` reach a real HTTP receiver
that verifies each one with the SDK (`client.beta.webhooks.unwrap`, as a user's server would), sent by the proxy
worker with the endpoint's secret from the real Vault (OpenBao dev server), retried by Temporal, given up with the
endpoint disabled; and a proxy worker process SIGKILLed while the receiver holds its answer loses no delivery.

A receiver down through many retries is `tests/test_webhooks_outage.py`.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from anthropic.types.beta import (
    BetaWebhookDeploymentRunSucceededEventData,
    BetaWebhookEvent,
    BetaWebhookSessionStatusIdledEventData,
    BetaWebhookSessionThreadIdledEventData,
)
from pydantic import SecretStr
from temporalio.worker import Worker

from activities.proxy import ProxyActivities
from activities.webhook_delivery import WebhookDeliveryActivities
from corral.contract.webhooks import DELIVERED, GAVE_UP, STOPPED, DeliveryPolicy, WebhookDeliveryResult
from corral.knowledge_db import open_knowledge_db
from corral.names import ENV_WEBHOOK_FIRST_RETRY, ENV_WEBHOOK_GIVE_UP_AFTER, ENV_WEBHOOK_LONGEST_WAIT
from corral.webhook_deliveries import DELIVERED as ROW_DELIVERED
from corral.webhook_deliveries import FAILED, WebhookDeliveries
from corral.webhooks import (
    DISABLED,
    ENABLED,
    Endpoint,
    WebhookEndpoints,
    Webhooks,
    delivery_policy,
    webhook_event,
)
from proxy import VaultStore, new_webhook_secret
from tests.chaos._processes import role_process
from tests.conftest import Stack, history_text, unique
from tests.proxy_servers.devvault import scan_for, shared_dev_vault
from tests.proxy_servers.webhook_receiver import WebhookReceiver
from tests.waits import polled_by, until
from workers.proxy import proxy_worker

pytestmark = pytest.mark.timeout(300)

QUICK = DeliveryPolicy(first_retry=timedelta(milliseconds=200), backoff=2.0, longest_wait=timedelta(seconds=1))
"""Retries seconds apart, so a test sees several of them; given up after the default 26 hours."""
THREAD_ID = "sthr_0123456789abcdefghijklmn"


@pytest.fixture
def store() -> VaultStore:
    dev_vault = shared_dev_vault()
    return VaultStore(dev_vault.client(), dev_vault.mount)


@pytest.fixture
def proxy_queue() -> str:
    return unique("proxy")


def sending_proxy(stack: Stack, store: VaultStore, queue: str) -> Worker:
    """A proxy worker, in this process, that sends webhook deliveries (it alone reads their secrets)."""
    return proxy_worker(stack.client, ProxyActivities(store), queue, webhooks=WebhookDeliveryActivities(store))


@pytest.fixture
async def proxy(stack: Stack, store: VaultStore, proxy_queue: str) -> AsyncIterator[None]:
    """The proxy worker, in this process: the one worker that reads the signing secrets."""
    async with proxy_worker(
        stack.client, ProxyActivities(store), proxy_queue, webhooks=WebhookDeliveryActivities(store)
    ):
        yield


def endpoint(store: VaultStore, receiver: WebhookReceiver, workspace: str, events: list[str],
             path: str | None = None) -> tuple[Endpoint, SecretStr]:  # fmt: skip
    """An endpoint at the receiver, its secret in Vault (as the gateway writes it) and in the receiver's keys."""
    path = path or "/" + unique("hook")
    made = WebhookEndpoints(open_knowledge_db()).create(workspace, receiver.url(path), events)
    secret = new_webhook_secret()
    store.store_webhook_secret(made.id, secret)
    receiver.keys[path] = secret.get_secret_value()
    return made, secret


def webhooks(stack: Stack, proxy_queue: str, policy: DeliveryPolicy = QUICK) -> Webhooks:
    return Webhooks(stack.client, open_knowledge_db(), stack.harness_queue, policy, proxy_queue)


async def result_of(stack: Stack, workflow_id: str) -> WebhookDeliveryResult:
    handle = stack.client.get_workflow_handle(workflow_id, result_type=WebhookDeliveryResult)
    return await handle.result()


async def test_emitted_events_arrive_signed_in_the_sdk_types(
    stack: Stack, store: VaultStore, receiver: WebhookReceiver, proxy: None, proxy_queue: str
) -> None:
    workspace = unique("ws")
    picky, picky_secret = endpoint(store, receiver, workspace, ["session.status_idled", "deployment_run.succeeded"])
    everything, all_secret = endpoint(store, receiver, workspace, ["all"])
    other_workspace, _ = endpoint(store, receiver, unique("ws"), ["all"])
    events = [
        webhook_event("session.status_idled", "sesn_0123456789abcdefghijklmn", workspace),
        webhook_event("deployment_run.succeeded", "drun_0123456789abcdefghijklmn", workspace),
        webhook_event(
            "session.thread_idled",
            "sesn_0123456789abcdefghijklmn",
            workspace,
            extra={"session_thread_id": THREAD_ID},
        ),
    ]
    sender = webhooks(stack, proxy_queue)
    started = await sender.emit(events)
    assert len(started) == 5, "two events to both endpoints, the thread event to `all` only"
    assert await sender.emit(events) == started, "emitting again starts nothing new"
    results = [await result_of(stack, workflow_id) for workflow_id in started]
    assert {result.outcome for result in results} == {DELIVERED}

    picky_path, all_path = (e.url.removeprefix(receiver.url("")) for e in (picky, everything))
    assert sorted(receiver.ids(picky_path)) == sorted(e.id for e in events[:2])
    assert sorted(receiver.ids(all_path)) == sorted(e.id for e in events)
    assert receiver.ids(verified=False) == [], "every delivery verifies with its endpoint's secret"
    assert not [r for r in receiver.received if r.path not in (picky_path, all_path)], "no other workspace's"
    by_id = {event.id: event for event in receiver.events(all_path)}
    for sent in events:
        got = by_id[sent.id]
        assert isinstance(got, BetaWebhookEvent)
        assert got.data.id == sent.subject_id and getattr(got.data, "workspace_id", None) == workspace
    assert isinstance(by_id[events[0].id].data, BetaWebhookSessionStatusIdledEventData)
    assert isinstance(by_id[events[1].id].data, BetaWebhookDeploymentRunSucceededEventData)
    thread = by_id[events[2].id].data
    assert isinstance(thread, BetaWebhookSessionThreadIdledEventData)
    assert thread.session_thread_id == THREAD_ID

    deliveries = WebhookDeliveries(open_knowledge_db())
    rows = deliveries.of_endpoint(everything.id)
    assert {row.event_id for row in rows} == {e.id for e in events}
    assert {(row.status, row.attempts, row.last_status) for row in rows} == {(ROW_DELIVERED, 1, 200)}
    assert deliveries.of_endpoint(other_workspace.id) == []

    # The secrets are nowhere but in Vault: not in the deliveries' histories, nor in the database.
    secrets = [picky_secret.get_secret_value(), all_secret.get_secret_value()]
    histories = [await history_text(stack.client.get_workflow_handle(w)) for w in started]
    assert scan_for(secrets, *histories) == []
    # Through SQLite, never by reading the file: another open and close of it would drop this process's locks.
    dump = "\n".join(open_knowledge_db().connection().iterdump())
    assert "webhook_deliveries" in dump and scan_for(secrets, dump) == []


async def test_a_failing_endpoint_is_retried_then_given_up_and_disabled(
    stack: Stack, store: VaultStore, receiver: WebhookReceiver, proxy: None, proxy_queue: str
) -> None:
    workspace = unique("ws")
    failing, _ = endpoint(store, receiver, workspace, ["all"])
    receiver.answer = 503
    policy = QUICK.model_copy(update={"give_up_after": timedelta(seconds=4)})
    event = webhook_event("session.status_idled", "sesn_0123456789abcdefghijklmn", workspace)
    [workflow_id] = await webhooks(stack, proxy_queue, policy).emit([event])

    deliveries = WebhookDeliveries(open_knowledge_db())

    def retried() -> bool:
        row = deliveries.get(event.id, failing.id)
        return row is not None and row.attempts >= 2

    await until(retried, "a second attempt after the first got 503")
    pending = deliveries.get(event.id, failing.id)
    assert pending is not None and pending.status == "pending" and pending.last_status == 503
    assert pending.last_error == "the endpoint answered HTTP 503"

    result = await result_of(stack, workflow_id)
    assert result.outcome == GAVE_UP
    assert result.reason is not None and "HTTP 503" in result.reason and "4 s" in result.reason
    row = deliveries.get(event.id, failing.id)
    assert row is not None and row.status == FAILED and row.last_status == 503 and row.attempts >= 2
    assert set(receiver.ids()) == {event.id}, "every attempt sent the same webhook-id"
    disabled = WebhookEndpoints(open_knowledge_db()).get(workspace, failing.id)
    assert disabled.status == DISABLED
    assert disabled.disabled_reason is not None and event.id in disabled.disabled_reason
    assert "HTTP 503" in disabled.disabled_reason
    later = webhook_event("session.status_idled", "sesn_0123456789abcdefghijklmn", workspace)
    assert await webhooks(stack, proxy_queue).emit([later]) == [], "a disabled endpoint is owed nothing new"


async def test_a_delivery_stops_when_its_endpoint_is_deleted_or_disabled(
    stack: Stack, store: VaultStore, receiver: WebhookReceiver, proxy: None, proxy_queue: str
) -> None:
    workspace = unique("ws")
    endpoints = WebhookEndpoints(open_knowledge_db())
    doomed, _ = endpoint(store, receiver, workspace, ["all"])
    paused, _ = endpoint(store, receiver, workspace, ["all"])
    receiver.answer = 500
    event = webhook_event("session.status_idled", "sesn_0123456789abcdefghijklmn", workspace)
    started = await webhooks(stack, proxy_queue).emit([event])
    assert len(started) == 2
    deliveries = WebhookDeliveries(open_knowledge_db())
    await until(lambda: all((row := deliveries.get(event.id, e.id)) and row.attempts >= 1 for e in (doomed, paused)),
                "a first attempt to each endpoint")  # fmt: skip
    endpoints.delete(workspace, doomed.id)
    endpoints.set_status(paused.id, DISABLED, "paused by its owner")
    results = {r.reason for r in [await result_of(stack, w) for w in started] if r.outcome == STOPPED}
    assert results == {"the endpoint was deleted", "the endpoint is disabled (paused by its owner)"}
    row = deliveries.get(event.id, paused.id)
    assert (
        row is not None and row.status == FAILED and row.last_error == "the endpoint is disabled (paused by its owner)"
    )
    endpoints.set_status(paused.id, ENABLED)


async def test_a_proxy_worker_killed_mid_delivery_loses_nothing(
    stack: Stack, store: VaultStore, receiver: WebhookReceiver, proxy_queue: str, tmp_path: Path
) -> None:
    """The receiver has the request and holds its answer; the proxy worker process is SIGKILLed; a new one starts.
    The delivery lands, with the same webhook-id (so the receiver, which did get the first, can de-duplicate)."""
    dev_vault = shared_dev_vault()
    workspace = unique("ws")
    hook, secret = endpoint(store, receiver, workspace, ["all"])
    address = stack.client.service_client.config.target_host
    argv = [sys.executable, "-m", "tests.webhook_proxy_process", "--address", address, "--queue", proxy_queue]
    env = {"VAULT_ADDR": dev_vault.address, "VAULT_TOKEN": dev_vault.root_token.get_secret_value(),
           "CORRAL_VAULT_MOUNT": dev_vault.mount}  # fmt: skip
    receiver.hold()
    with role_process("proxy", argv, tmp_path, **env) as worker:
        event = webhook_event("session.requires_action", "sesn_0123456789abcdefghijklmn", workspace)
        [workflow_id] = await webhooks(stack, proxy_queue).emit([event])
        await until(receiver.held.is_set, "the receiver got the delivery (and holds its answer)")
        first_pid = worker.current.pid
        worker.kill()
        receiver.release()  # its answer goes to a dead connection: the delivery's outcome is unknown to corral
        worker.start()
        await until(lambda: polled_by(stack.client, proxy_queue, worker.current.pid), "the new proxy worker polls")
        assert worker.current.pid != first_pid
        result = await result_of(stack, workflow_id)
        assert result.outcome == DELIVERED and result.attempts >= 2
        assert receiver.ids() == [event.id, event.id], "the same webhook-id both times"
        row = WebhookDeliveries(open_knowledge_db()).get(event.id, hook.id)
        assert row is not None and row.status == ROW_DELIVERED and row.attempts >= 2
    log = worker.log.read_text()
    history = await history_text(stack.client.get_workflow_handle(workflow_id))
    assert scan_for([secret.get_secret_value()], log, history) == []


def test_the_delivery_policy_is_read_from_the_environment_and_checked() -> None:
    assert delivery_policy({}) == DeliveryPolicy()
    assert DeliveryPolicy().give_up_after >= timedelta(days=1), "retried for at least a day by default"
    read = delivery_policy({ENV_WEBHOOK_FIRST_RETRY: "0.5", ENV_WEBHOOK_LONGEST_WAIT: "20",
                            ENV_WEBHOOK_GIVE_UP_AFTER: "600"})  # fmt: skip
    assert (read.first_retry, read.longest_wait, read.give_up_after) == (
        timedelta(seconds=0.5),
        timedelta(seconds=20),
        timedelta(minutes=10),
    )
    for env, words in (
        ({ENV_WEBHOOK_FIRST_RETRY: "soon"}, "CORRAL_WEBHOOK_FIRST_RETRY_SECONDS is a positive number of seconds"),
        ({ENV_WEBHOOK_GIVE_UP_AFTER: "-1"}, "CORRAL_WEBHOOK_GIVE_UP_AFTER_SECONDS is a positive number of seconds"),
        (
            {ENV_WEBHOOK_FIRST_RETRY: "10", ENV_WEBHOOK_LONGEST_WAIT: "5"},
            "CORRAL_WEBHOOK_LONGEST_WAIT_SECONDS is at least",
        ),
    ):
        with pytest.raises(ValueError, match=words):
            delivery_policy(env)
