"""`corral-sandbox`: the sandbox hand. Docker access (local engine or `DOCKER_HOST`), no credential of any kind.

Serves `provision_sandbox` on `corral-sandbox` and the container calls on `corral-sandbox@<engine>`, and runs the
reaper: containers whose session workflow is closed (terminated, cancelled, gone) are removed with their volume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import docker
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities.sandbox import SandboxActivities
from corral.sandbox import containers
from corral.sandbox.image import ensure_sandbox_image
from corral.temporal import cluster_id, connect
from workers._run import run_until_stopped, setup_logging
from workers.roles import sandbox_workers

log = logging.getLogger("workers.sandbox")
REAP_INTERVAL_SECONDS = float(os.environ.get("CORRAL_REAP_INTERVAL_SECONDS", "60"))


async def reap_closed_sessions(temporal: Client, engine: docker.DockerClient) -> list[str]:
    """Remove the containers and volumes of this server's and namespace's sessions whose workflow is closed."""
    reaped = []
    scope = f"{await cluster_id(temporal)}/{temporal.namespace}"
    for session_id in await asyncio.to_thread(containers.session_ids_with_containers, engine, scope):
        try:
            description = await temporal.get_workflow_handle(session_id).describe()
            closed = description.status != WorkflowExecutionStatus.RUNNING
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            closed = True
        if closed:
            await asyncio.to_thread(containers.remove_session, engine, session_id, True)
            log.info("reaped the sandbox of closed session %s", session_id)
            reaped.append(session_id)
    return reaped


async def _reap_forever(temporal: Client, engine: docker.DockerClient) -> None:
    while True:
        try:
            await reap_closed_sessions(temporal, engine)
        except Exception:  # the reaper must outlive a passing engine or server hiccup
            log.exception("reaper pass failed; trying again later")
        await asyncio.sleep(REAP_INTERVAL_SECONDS)


def sandbox_image(engine: docker.DockerClient) -> str:
    """`CORRAL_SANDBOX_IMAGE`, or the image built on this machine (built now if missing: slow, once)."""
    configured = os.environ.get("CORRAL_SANDBOX_IMAGE")
    if configured:
        return configured
    state_dir = Path(os.environ.get("CORRAL_STATE_DIR", ".corral"))
    return ensure_sandbox_image(engine, state_dir, progress=log.info)


@contextlib.asynccontextmanager
async def sandbox_role(temporal: Client) -> AsyncIterator[list[Worker]]:
    """The sandbox workers, with the reaper running beside them; used by this entrypoint and the all-in-one."""
    engine = docker.from_env()
    engine.ping()
    image = await asyncio.to_thread(sandbox_image, engine)
    activities = SandboxActivities(engine, image, await cluster_id(temporal))
    log.info("sandbox hand on corral-sandbox and %s", activities.task_queue)
    reaper = asyncio.create_task(_reap_forever(temporal, engine))
    try:
        yield sandbox_workers(temporal, activities)
    finally:
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper


async def _main() -> None:
    temporal = await connect()
    async with sandbox_role(temporal) as workers:
        await run_until_stopped(workers)


def main() -> None:
    setup_logging()
    asyncio.run(_main())


if __name__ == "__main__":
    main()
