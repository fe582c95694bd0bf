"""`corral-proxy`: the only process with Vault access (and no Docker access). Serves the proxy activities on
`corral-proxy`: session bindings and MCP calls made with credentials that never leave this process.

It also serves the git smart-HTTP proxy (`CORRAL_GIT_PROXY_HOST`, default 0.0.0.0, and `CORRAL_GIT_PROXY_PORT`,
default 8767) that adds a session's repository token to `git pull`/`git push` made inside its sandbox.

Vault login, from this process's environment only: `VAULT_ADDR` (or `BAO_ADDR`) and either `VAULT_TOKEN` (or
`BAO_TOKEN`) or AppRole (`VAULT_ROLE_ID` + `VAULT_SECRET_ID`). `CORRAL_VAULT_MOUNT` names the KV v2 mount
(default `corral`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import hvac
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities.proxy import ProxyActivities
from corral.names import PROXY_TASK_QUEUE
from corral.temporal import connect
from proxy import GitProxyServer, VaultStore, ensure_kv_v2_mount
from workers._run import GRACEFUL_SHUTDOWN, run_until_stopped, setup_logging

log = logging.getLogger("workers.proxy")


def vault_from_environment() -> tuple[hvac.Client, str]:
    """An authenticated Vault client and the mount, or exit with a message that says what is missing."""
    address = os.environ.get("VAULT_ADDR") or os.environ.get("BAO_ADDR")
    if not address:
        sys.exit("corral-proxy: set VAULT_ADDR (or BAO_ADDR) to the Vault/OpenBao server, or run `corral up`")
    client = hvac.Client(url=address)
    token = os.environ.get("VAULT_TOKEN") or os.environ.get("BAO_TOKEN")
    if token:
        client.token = token
    elif os.environ.get("VAULT_ROLE_ID") and os.environ.get("VAULT_SECRET_ID"):
        client.auth.approle.login(role_id=os.environ["VAULT_ROLE_ID"], secret_id=os.environ["VAULT_SECRET_ID"])
    else:
        sys.exit("corral-proxy: set VAULT_TOKEN, or VAULT_ROLE_ID and VAULT_SECRET_ID (AppRole)")
    if not client.is_authenticated():
        sys.exit(f"corral-proxy: Vault at {address} rejected this process's credentials")
    return client, os.environ.get("CORRAL_VAULT_MOUNT", "corral")


REAP_INTERVAL_SECONDS = float(os.environ.get("CORRAL_REAP_INTERVAL_SECONDS", "60"))


async def revoke_closed_sessions(temporal: Client, store: VaultStore) -> list[str]:
    """A session that ended without cleaning up (terminated, say) loses its reference and git tokens here.

    Only sessions this Temporal server knows as closed are revoked: one not found may not have started yet
    (`corral start` stores a repository token first) or may belong to another server sharing this Vault."""
    revoked = []
    for session_id in await asyncio.to_thread(store.bound_sessions):
        try:
            description = await temporal.get_workflow_handle(session_id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                continue
            raise
        if description.status != WorkflowExecutionStatus.RUNNING:
            await asyncio.to_thread(store.revoke_session, session_id)
            revoked.append(session_id)
    return revoked


async def _revoke_forever(temporal: Client, store: VaultStore) -> None:
    while True:
        try:
            await revoke_closed_sessions(temporal, store)
        except Exception:  # outlive a passing Vault or server hiccup
            log.exception("revoking closed sessions failed; trying again later")
        await asyncio.sleep(REAP_INTERVAL_SECONDS)


def proxy_worker(client: Client, activities: ProxyActivities, task_queue: str = PROXY_TASK_QUEUE) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        activities=[
            activities.bind_session,
            activities.mcp_list_tools,
            activities.mcp_call_tool,
            activities.release_session,
        ],
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
    )


async def _main() -> None:
    vault, mount = vault_from_environment()
    ensure_kv_v2_mount(vault, mount)
    store = VaultStore(vault, mount)
    temporal = await connect()
    # The git proxy: sandboxes reach it (through the egress proxy, or the bridge) at the host's Docker gateway.
    git = GitProxyServer(
        store,
        host=os.environ.get("CORRAL_GIT_PROXY_HOST", "0.0.0.0"),
        port=int(os.environ.get("CORRAL_GIT_PROXY_PORT", "8767")),
    )
    git.start()
    reaper = asyncio.create_task(_revoke_forever(temporal, store))
    try:
        await run_until_stopped([proxy_worker(temporal, ProxyActivities(store))])
    finally:
        reaper.cancel()
        git.stop()


def main() -> None:
    setup_logging()
    asyncio.run(_main())


if __name__ == "__main__":
    main()
