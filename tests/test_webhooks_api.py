"""Webhook endpoints over HTTP (`/v1/webhook_endpoints`, a corral extension), driven by the official SDK's client
against a real gateway process logged in to the OpenBao dev server with its write-only AppRole: the secret made on
create is the one the proxy signs with (a real receiver verifies with `client.beta.webhooks.unwrap`), a rotation
replaces it (the old one verifies nothing after), bad input gets a 400 naming the problem, and the secret shows in
no later answer, no history and no gateway log line."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from activities.proxy import ProxyActivities
from activities.webhook_delivery import WebhookDeliveryActivities
from corral.apikeys import create_key
from corral.contract.webhooks import DELIVERED, WebhookDeliveryResult
from corral.knowledge_db import open_knowledge_db
from corral.records import Records
from corral.webhooks import Webhooks, webhook_event
from proxy import VaultStore
from tests.chaos._processes import role_process, until_healthy
from tests.conftest import Stack, history_text, unique
from tests.ports import free_port
from tests.proxy_servers.devvault import scan_for, shared_dev_vault
from tests.proxy_servers.webhook_receiver import WebhookReceiver
from tests.test_gateway_vaults import gateway_argv, vault_login_env
from tests.test_webhooks import QUICK
from tests.waits import until
from workers.proxy import proxy_worker

pytestmark = pytest.mark.timeout(300)
JSON = dict[str, Any]


@pytest.fixture
async def gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    port, env = free_port(), vault_login_env()
    with role_process("gateway", gateway_argv(stack, port), tmp_path, **env) as process:
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        yield url, process.log


async def client_for(stack: Stack, url: str, workspace: str) -> anthropic.AsyncAnthropic:
    key, _ = await create_key(Records(stack.client, task_queue=stack.harness_queue), workspace)
    return anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)


async def refused(call: Any) -> tuple[int, str]:
    try:
        await call
    except anthropic.APIStatusError as exc:
        return exc.status_code, exc.body["error"]["message"]  # type: ignore[index]
    raise AssertionError("the request was not refused")


async def test_endpoints_over_http_sign_with_the_secret_shown_once(
    stack: Stack, gateway: tuple[str, Path], receiver: WebhookReceiver
) -> None:
    url, log = gateway
    workspace = unique("ws")
    client = await client_for(stack, url, workspace)
    dev_vault = shared_dev_vault()
    store = VaultStore(dev_vault.client(), dev_vault.mount)
    proxy_queue = unique("proxy")
    made: JSON = await client.post("/v1/webhook_endpoints", cast_to=JSON, body={
        "url": receiver.url("/in"), "events": ["session.status_idled"], "description": "ops"})  # fmt: skip
    assert made["id"].startswith("whep_") and made["secret"].startswith("whsec_")
    assert made["status"] == "enabled" and made["events"] == ["session.status_idled"]
    first_secret = made["secret"]
    receiver.keys["/in"] = first_secret
    endpoint_id = made["id"]
    shown = [await client.get(f"/v1/webhook_endpoints/{endpoint_id}", cast_to=JSON),
             await client.get("/v1/webhook_endpoints", cast_to=JSON)]  # fmt: skip
    assert "secret" not in shown[0] and [e["id"] for e in shown[1]["data"]] == [endpoint_id]

    emitter = Webhooks(stack.client, open_knowledge_db(), stack.harness_queue, QUICK, proxy_queue)

    async def deliver() -> tuple[str, WebhookDeliveryResult]:
        event = webhook_event("session.status_idled", "sesn_0123456789abcdefghijklmn", workspace)
        [workflow_id] = await emitter.emit([event])
        handle = stack.client.get_workflow_handle(workflow_id, result_type=WebhookDeliveryResult)
        return event.id, await handle.result()

    async with proxy_worker(
        stack.client, ProxyActivities(store), proxy_queue, webhooks=WebhookDeliveryActivities(store)
    ):
        event_id, result = await deliver()
        assert result.outcome == DELIVERED and receiver.ids("/in") == [event_id]

        rotated: JSON = await client.post(f"/v1/webhook_endpoints/{endpoint_id}/rotate_secret", cast_to=JSON)
        assert rotated["secret"].startswith("whsec_") and rotated["secret"] != first_secret
        # The receiver still holds the old key: the next delivery is signed with the new one, and fails to verify.
        receiver.answer = 200
        event = webhook_event("session.status_idled", "sesn_0123456789abcdefghijklmn", workspace)
        [workflow_id] = await emitter.emit([event])

        async def refused_by_old_key() -> bool:
            return event.id in receiver.ids("/in", verified=False)

        await until(refused_by_old_key, "a delivery signed with the new secret, which the old key does not verify")
        receiver.keys["/in"] = rotated["secret"]
        handle = stack.client.get_workflow_handle(workflow_id, result_type=WebhookDeliveryResult)
        assert (await handle.result()).outcome == DELIVERED
        assert receiver.ids("/in") == [event_id, event.id]

    deliveries: JSON = await client.get(f"/v1/webhook_endpoints/{endpoint_id}/deliveries", cast_to=JSON)
    by_event = {d["event_id"]: d for d in deliveries["data"]}
    assert by_event[event_id]["status"] == "delivered" and by_event[event_id]["attempts"] == 1
    assert by_event[event.id]["status"] == "delivered" and by_event[event.id]["attempts"] >= 2
    failed: JSON = await client.get(f"/v1/webhook_endpoints/{endpoint_id}/deliveries?status=failed", cast_to=JSON)
    assert failed["data"] == []

    updated: JSON = await client.post(f"/v1/webhook_endpoints/{endpoint_id}", cast_to=JSON,
                                      body={"events": ["all"], "description": "everything"})  # fmt: skip
    assert updated["events"] == ["all"] and updated["description"] == "everything" and "secret" not in updated
    disabled: JSON = await client.post(f"/v1/webhook_endpoints/{endpoint_id}/disable", cast_to=JSON)
    assert disabled["status"] == "disabled" and disabled["disabled_reason"] == "disabled by its owner"
    enabled: JSON = await client.post(f"/v1/webhook_endpoints/{endpoint_id}/enable", cast_to=JSON)
    assert enabled["status"] == "enabled" and enabled["disabled_reason"] is None

    # Bad input: a 400 that names the problem, and nothing made.
    there = "https://x.example/in"
    cases = [
        ({"events": ["all"]}, "url is required"),
        ({"url": "ftp://x.example/in", "events": ["all"]}, "http:// or https://"),
        ({"url": "https://u:p@x.example/in", "events": ["all"]}, "carries no credentials"),
        ({"url": "https://x.example/in"}, "events is required"),
        ({"url": "https://x.example/in", "events": []}, "at least one event type"),
        ({"url": there, "events": ["session.exploded"]}, "unknown webhook event type(s): session.exploded"),
        ({"url": "https://x.example/in", "events": "all"}, "events must be a list"),
        ({"url": there, "events": ["all"], "secret": "mine"}, "unknown webhook endpoint field(s): secret"),
    ]  # fmt: skip
    for body, words in cases:
        status, message = await refused(client.post("/v1/webhook_endpoints", cast_to=JSON, body=body))
        assert status == 400 and words in message, (body, message)
    status, message = await refused(client.get("/v1/webhook_endpoints/vlt_0123456789abcdefghijklmn", cast_to=JSON))
    assert status == 400 and "webhook_endpoint_id" in message
    status, message = await refused(client.get(f"/v1/webhook_endpoints/{endpoint_id}/deliveries?status=odd",
                                               cast_to=JSON))  # fmt: skip
    assert status == 400 and "status must be one of pending, delivered, failed" in message
    listing: JSON = await client.get("/v1/webhook_endpoints", cast_to=JSON)
    assert [e["id"] for e in listing["data"]] == [endpoint_id]

    deleted: JSON = await client.delete(f"/v1/webhook_endpoints/{endpoint_id}", cast_to=JSON)
    assert deleted == {"id": endpoint_id, "type": "webhook_endpoint_deleted"}
    status, _ = await refused(client.get(f"/v1/webhook_endpoints/{endpoint_id}", cast_to=JSON))
    assert status == 404
    assert store._webhook_secret(endpoint_id) is None, "its secret was destroyed with it"

    histories = [await history_text(stack.client.get_workflow_handle(w)) for w in (workflow_id,)]
    secrets = [first_secret, rotated["secret"]]
    assert scan_for(secrets, log.read_text(), *histories) == []


async def test_a_gateway_without_vault_answers_503_on_webhook_endpoints(stack: Stack, tmp_path: Path) -> None:
    port = free_port()
    env = {"VAULT_ADDR": "", "BAO_ADDR": "", "VAULT_TOKEN": "", "BAO_TOKEN": ""}
    with role_process("gateway", gateway_argv(stack, port), tmp_path, **env) as process:
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        client = await client_for(stack, url, unique("ws"))
        body = {"url": "https://x.example/in", "events": ["all"]}
        status, message = await refused(client.post("/v1/webhook_endpoints", cast_to=JSON, body=body))
        assert status == 503 and "no Vault configured" in message
        listing: JSON = await client.get("/v1/webhook_endpoints", cast_to=JSON)
        assert listing["data"] == [], "nothing was made"
