"""`corral webhook` (cli/webhook_commands.py) on the test run's knowledge database and the OpenBao dev server: an
endpoint added from the CLI gets deliveries signed with the secret the CLI printed (a real receiver verifies them
with the SDK), and `deliveries` shows what failed and why after a delivery was given up."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import timedelta

import pytest

from activities.proxy import ProxyActivities
from activities.webhook_delivery import WebhookDeliveryActivities
from corral.contract.webhooks import GAVE_UP, WEBHOOK_EVENT_TYPES, WebhookDeliveryResult
from corral.knowledge_db import open_knowledge_db
from corral.webhooks import DISABLED, ENABLED, WebhookEndpoints, Webhooks, webhook_event
from proxy import VaultStore
from tests.conftest import Stack, unique
from tests.proxy_servers.devvault import shared_dev_vault
from tests.proxy_servers.webhook_receiver import WebhookReceiver
from tests.test_webhooks import QUICK
from workers.proxy import proxy_worker

pytestmark = pytest.mark.timeout(300)


async def corral(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` with the dev Vault in its environment (as an operator's shell would name theirs)."""
    dev_vault = shared_dev_vault()
    address = stack.client.service_client.config.target_host
    env = {**os.environ, "COLUMNS": "250", "VAULT_ADDR": dev_vault.address,
           "VAULT_TOKEN": dev_vault.root_token.get_secret_value(), "CORRAL_VAULT_MOUNT": dev_vault.mount}  # fmt: skip
    command = [sys.executable, "-m", "cli.main", "--address", address, *args]
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=120, env=env)


async def test_webhook_commands(stack: Stack) -> None:
    workspace = unique("cli-hooks")
    receiver = WebhookReceiver()
    dev_vault = shared_dev_vault()
    store = VaultStore(dev_vault.client(), dev_vault.mount)
    try:
        added = await corral(stack, "webhook", "add", receiver.url("/in"), "--workspace", workspace,
                             "--events", "session.status_idled, deployment_run.failed")  # fmt: skip
        assert added.returncode == 0, added.stderr
        secret = added.stdout.strip()
        assert secret.startswith("whsec_") and "\n" not in secret, "captured: the secret alone"
        [endpoint] = WebhookEndpoints(open_knowledge_db()).in_workspace(workspace)
        assert endpoint.events == ("deployment_run.failed", "session.status_idled")
        receiver.keys["/in"] = secret

        refused = await corral(stack, "webhook", "add", receiver.url("/x"), "--workspace", workspace,
                               "--events", "session.exploded")  # fmt: skip
        assert refused.returncode == 2 and "unknown webhook event type(s): session.exploded" in refused.stderr
        assert len(WebhookEndpoints(open_knowledge_db()).in_workspace(workspace)) == 1, "nothing made"

        listed = await corral(stack, "webhook", "ls", "--workspace", workspace)
        assert endpoint.id in listed.stdout and "enabled" in listed.stdout

        # A delivery signed with the printed secret; then one the receiver refuses until it is given up.
        proxy_queue = unique("proxy")
        policy = QUICK.model_copy(update={"give_up_after": timedelta(seconds=3)})
        emitter = Webhooks(stack.client, open_knowledge_db(), stack.harness_queue, policy, proxy_queue)
        async with proxy_worker(
            stack.client, ProxyActivities(store), proxy_queue, webhooks=WebhookDeliveryActivities(store)
        ):
            good = webhook_event("session.status_idled", "sesn_0123456789abcdefghijklmn", workspace)
            [workflow_id] = await emitter.emit([good])
            await stack.client.get_workflow_handle(workflow_id).result()
            assert receiver.ids("/in") == [good.id]
            receiver.answer = 410
            bad = webhook_event("deployment_run.failed", "drun_0123456789abcdefghijklmn", workspace)
            [workflow_id] = await emitter.emit([bad])
            handle = stack.client.get_workflow_handle(workflow_id, result_type=WebhookDeliveryResult)
            assert (await handle.result()).outcome == GAVE_UP
        assert WebhookEndpoints(open_knowledge_db()).get(workspace, endpoint.id).status == DISABLED

        shown = await corral(stack, "webhook", "deliveries", endpoint.id, "--failed")
        assert shown.returncode == 0, shown.stderr
        assert bad.id in shown.stdout and good.id not in shown.stdout
        assert "failed" in shown.stdout and "HTTP 410" in shown.stdout and "gave up after 3 s" in shown.stdout
        everything = await corral(stack, "webhook", "deliveries", endpoint.id, "--workspace", workspace)
        assert good.id in everything.stdout and "delivered" in everything.stdout
        listed = await corral(stack, "webhook", "ls", "--workspace", workspace)
        assert "disabled" in listed.stdout and "HTTP 410" in listed.stdout
        elsewhere = await corral(stack, "webhook", "enable", endpoint.id, "--workspace", unique("cli-other"))
        assert elsewhere.returncode == 1 and "no webhook endpoint" in elsewhere.stderr

        enabled = await corral(stack, "webhook", "enable", endpoint.id, "--workspace", workspace)
        assert enabled.returncode == 0, enabled.stderr
        assert WebhookEndpoints(open_knowledge_db()).get(workspace, endpoint.id).status == ENABLED

        rotated = await corral(stack, "webhook", "rotate", endpoint.id)
        assert rotated.returncode == 0, rotated.stderr
        new_secret = rotated.stdout.strip()
        assert new_secret.startswith("whsec_") and new_secret != secret
        assert store._webhook_secret(endpoint.id) is not None
        assert store._webhook_secret(endpoint.id).get_secret_value() == new_secret  # type: ignore[union-attr]

        types = await corral(stack, "webhook", "types")
        assert types.stdout.split() == sorted(WEBHOOK_EVENT_TYPES)

        removed = await corral(stack, "webhook", "rm", endpoint.id, "--workspace", workspace)
        assert removed.returncode == 0, removed.stderr
        assert WebhookEndpoints(open_knowledge_db()).in_workspace(workspace) == []
        assert store._webhook_secret(endpoint.id) is None
    finally:
        receiver.close()
