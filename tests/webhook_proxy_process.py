"""A real proxy worker process for the webhook fault test: the proxy's activities and the webhook deliveries on a
given task queue, logged in to Vault from its environment as `corral-proxy` is (`VAULT_ADDR`, `VAULT_TOKEN`,
`CORRAL_VAULT_MOUNT`)."""

from __future__ import annotations

import argparse
import asyncio

from activities.proxy import ProxyActivities
from activities.webhook_delivery import WebhookDeliveryActivities
from corral.temporal import connect
from proxy import VaultLogin
from workers.proxy import proxy_worker
from workers.run import run_until_stopped, setup_logging


async def _main(args: argparse.Namespace) -> None:
    store = VaultLogin.from_environment().open_store()
    client = await connect(args.address)
    worker = proxy_worker(client, ProxyActivities(store), args.queue, webhooks=WebhookDeliveryActivities(store))
    await run_until_stopped([worker])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--queue", required=True)
    setup_logging()
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
