"""`corral-proxy`: the only process with Vault access (and no Docker access). Serves the proxy activities on
`corral-proxy`: session bindings and MCP calls made with credentials that never leave this process, and webhook
deliveries signed with secrets that never leave it either (activities/webhook_delivery.py).

It also serves the git smart-HTTP proxy (`CORRAL_GIT_PROXY_HOST`, default 0.0.0.0, and `CORRAL_GIT_PROXY_PORT`,
default 8767) that adds a session's repository token to `git pull`/`git push` made inside its sandbox, and runs
the reaper: the references and git tokens of sessions that closed without releasing them are revoked.

Vault login, from this process's environment only (read by `proxy.login`): `VAULT_ADDR` (or `BAO_ADDR`) and either
`VAULT_TOKEN` (or `BAO_TOKEN`) or AppRole (`VAULT_ROLE_ID` + `VAULT_SECRET_ID`). `CORRAL_VAULT_MOUNT` names the KV
v2 mount (default `corral`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.proxy import ProxyActivities
from activities.webhook_delivery import WebhookDeliveryActivities
from corral.knowledge_db import open_knowledge_db
from corral.names import PROXY_TASK_QUEUE
from corral.webhooks import Webhooks
from proxy import GitProxyServer, ProxyError, VaultStore
from workers._reaper import reap_once, reaping
from workers.run import GRACEFUL_SHUTDOWN, WorkerStartError, connect_to_temporal, run_until_stopped, run_worker
from workers.settings import ProxyWorkerSettings, VaultSettings

log = logging.getLogger("workers.proxy")


def vault_store(settings: VaultSettings) -> VaultStore:
    """The store on an authenticated Vault client, its KV v2 mount made if missing; WorkerStartError if Vault does
    not answer or rejects this process's credentials (the message names the error's type, never a credential)."""
    try:
        return settings.open_store()
    except ProxyError as exc:
        raise WorkerStartError(str(exc)) from exc


class VaultReaper:
    """What the reaper needs of Vault: the sessions holding a reference or a git token, and how to revoke them.
    Only sessions this Temporal server knows as closed are revoked: one not found may not have started yet
    (`corral start` stores a repository token first) or may belong to another server sharing this Vault."""

    def __init__(self, store: VaultStore) -> None:
        self._store = store

    async def sessions(self) -> list[str]:
        return await asyncio.to_thread(self._store.bound_sessions)

    async def revoke(self, closed: list[str]) -> None:
        for session_id in closed:
            await asyncio.to_thread(self._store.revoke_session, session_id)
            log.info("revoked the references and git tokens of closed session %s", session_id)


async def revoke_closed_sessions(temporal: Client, store: VaultStore) -> list[str]:
    """One reaper round: a session that ended without cleaning up (terminated, say) loses its reference and git
    tokens here."""
    reaper = VaultReaper(store)
    return await reap_once(temporal, reaper.sessions, reaper.revoke)


def proxy_worker(
    client: Client,
    activities: ProxyActivities,
    task_queue: str = PROXY_TASK_QUEUE,
    webhooks: WebhookDeliveryActivities | None = None,
) -> Worker:
    """The proxy's activities; with `webhooks`, it also sends webhook deliveries (it alone reads their secrets)."""
    sending: list[Callable[..., Any]] = (
        [webhooks.deliver_webhook, webhooks.give_up_webhook] if webhooks is not None else []
    )
    return Worker(
        client,
        task_queue=task_queue,
        activities=[
            activities.bind_session,
            activities.mcp_list_tools,
            activities.mcp_call_tool,
            activities.release_session,
            activities.validate_credential,
            *sending,
        ],
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
    )


async def _serve(settings: ProxyWorkerSettings) -> None:
    store = await asyncio.to_thread(vault_store, settings.proxy.vault)
    temporal = await connect_to_temporal(settings.temporal)
    # The git proxy: sandboxes reach it (through the egress proxy, or the bridge) at the host's Docker gateway.
    host, port = settings.proxy.git_proxy_host, settings.proxy.git_proxy_port
    git = GitProxyServer(store, host=host, port=port)
    try:
        git.start()
    except OSError as exc:  # the port is taken, or the host is not an address of this machine
        raise WorkerStartError(f"the git proxy cannot listen on {host}:{port} ({exc.strerror})") from exc
    reaper = VaultReaper(store)
    try:
        async with reaping(
            temporal,
            settings.proxy.reap_interval_seconds,
            reaper.sessions,
            reaper.revoke,
            job="revoking the references of closed sessions",
        ):
            webhooks = Webhooks(temporal, open_knowledge_db())  # refresh failures are told as webhook events
            proxy = ProxyActivities(store, webhooks=webhooks)
            sending = WebhookDeliveryActivities(store)  # and it sends every delivery
            await run_until_stopped([proxy_worker(temporal, proxy, webhooks=sending)])
    finally:
        git.stop()


def main() -> None:
    run_worker("corral-proxy", ProxyWorkerSettings.from_environment, _serve)


if __name__ == "__main__":
    main()
