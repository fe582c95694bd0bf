"""`corral-harness`: runs `SessionWorkflow` on `corral-harness`. Stateless: kill it any time.

With `CORRAL_HARNESS_DEPLOYMENT` set it is one build of a versioned harness (workers/deployment.py); the first
build of a deployment makes itself current, later ones wait for `corral harness promote`."""

import asyncio
import logging

from temporalio.client import Client
from temporalio.service import RPCError

from corral.temporal import ensure_search_attributes
from workers.deployment import DeploymentError, become_current_if_first
from workers.roles import harness_worker
from workers.run import connect_to_temporal, run_until_stopped, run_worker
from workers.settings import HarnessDeployment, HarnessSettings

log = logging.getLogger("workers")


async def _serve(settings: HarnessSettings) -> None:
    client = await connect_to_temporal(settings.temporal)
    await ensure_search_attributes(client)
    worker = harness_worker(client, deployment=settings.deployment)
    if settings.deployment is None:
        await run_until_stopped([worker])
        return
    first = asyncio.create_task(_first_build(client, settings.deployment))  # needs the worker polling
    try:
        await run_until_stopped([worker])
    finally:
        first.cancel()


async def _first_build(client: Client, deployment: HarnessDeployment) -> None:
    try:
        await become_current_if_first(client, deployment)
    except (DeploymentError, RPCError) as exc:  # the worker goes on: an operator can promote the build by hand
        log.warning("could not make the first build %s of %s current: %s", deployment.build_id, deployment.name, exc)


def main() -> None:
    run_worker("corral-harness", HarnessSettings.from_environment, _serve)


if __name__ == "__main__":
    main()
