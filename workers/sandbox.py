"""`corral-sandbox`: the sandbox hand. Docker access (local engine or `DOCKER_HOST`), no credential of any kind.

Serves `provision_sandbox` on its engine pool's queue (`corral-sandbox`, or `corral-sandbox.<name>` with
`CORRAL_SANDBOX_ENGINE=<name>`) and the container calls on `corral-sandbox@<engine>`, and runs the reaper: containers
whose session workflow is closed (terminated, cancelled, gone) are removed with their volume. It only dials out (to
Temporal and its Docker engine), so it can run in another network than the rest of corral.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import docker
import docker.errors
from temporalio.client import Client
from temporalio.worker import Worker

from activities.sandbox import SandboxActivities
from corral.names import sandbox_provision_queue
from corral.temporal import cluster_id
from sandbox import sessions
from sandbox.errors import SandboxSetupError
from sandbox.image import ensure_sandbox_image
from sandbox.pool import WarmPool
from workers._reaper import reap_once, reaping
from workers.roles import sandbox_workers
from workers.run import WorkerStartError, connect_to_temporal, run_until_stopped, run_worker
from workers.settings import SandboxSettings, SandboxWorkerSettings

log = logging.getLogger("workers.sandbox")


class SandboxReaper:
    """What the reaper needs of one engine: the sessions of this server and namespace that have a container
    there, and how to remove a closed one's containers and volume. A workflow the server does not know counts as
    closed: a container is only ever made by a running session."""

    def __init__(self, engine: docker.DockerClient, scope: str) -> None:
        self._engine = engine
        self._scope = scope  # `<cluster id>/<namespace>`: another server's sessions on this engine are not ours

    async def sessions(self) -> set[str]:
        return await asyncio.to_thread(sessions.session_ids_with_containers, self._engine, self._scope)

    async def remove(self, closed: list[str]) -> None:
        for session_id in closed:
            await asyncio.to_thread(sessions.remove_session, self._engine, session_id, True)
            log.info("reaped the sandbox of closed session %s", session_id)


async def reap_closed_sessions(temporal: Client, engine: docker.DockerClient) -> list[str]:
    """One reaper round: remove the containers and volumes of this server's and namespace's closed sessions."""
    reaper = SandboxReaper(engine, f"{await cluster_id(temporal)}/{temporal.namespace}")
    return await reap_once(temporal, reaper.sessions, reaper.remove, missing_means_closed=True)


def sandbox_image(engine: docker.DockerClient, settings: SandboxSettings) -> str:
    """`CORRAL_SANDBOX_IMAGE`, or the image built on this machine (built now if missing: slow, once)."""
    if settings.image:
        return settings.image
    return ensure_sandbox_image(engine, settings.state_dir, progress=log.info)


def _docker_engine() -> docker.DockerClient:
    try:
        engine = docker.from_env()
        engine.ping()
    except docker.errors.DockerException as exc:
        raise WorkerStartError(
            f"cannot reach the Docker engine (DOCKER_HOST, or the local socket): {exc}. "
            "Start it, or run `python -m sandbox.prepare`."
        ) from exc
    return engine


@contextlib.asynccontextmanager
async def sandbox_role(temporal: Client, settings: SandboxSettings) -> AsyncIterator[list[Worker]]:
    """The sandbox workers, with the reaper running beside them; used by this entrypoint and the all-in-one."""
    engine = _docker_engine()
    try:
        image = await asyncio.to_thread(sandbox_image, engine, settings)
    except SandboxSetupError as exc:
        raise WorkerStartError(str(exc)) from exc
    cluster = await cluster_id(temporal)
    activities = SandboxActivities(
        engine,
        image,
        cluster,
        temporal.namespace,
        git_proxy_port=settings.git_proxy_port,
        pool=settings.pool if settings.pool.enabled else None,
    )
    provision_queue = sandbox_provision_queue(settings.engine)
    log.info("sandbox hand on %s and %s", provision_queue, activities.task_queue)
    reaper = SandboxReaper(engine, f"{cluster}/{temporal.namespace}")
    async with (
        reaping(
            temporal,
            settings.reap_interval_seconds,
            reaper.sessions,
            reaper.remove,
            job="reaping the sandboxes of closed sessions",
            missing_means_closed=True,
        ),
        keeping_filled(activities.pool),
    ):
        yield sandbox_workers(temporal, activities, provision_queue)


@contextlib.asynccontextmanager
async def keeping_filled(pool: WarmPool | None) -> AsyncIterator[None]:
    """The warm pool's upkeep in the background while the block runs (nothing when the pool is off)."""
    if pool is None:
        yield
        return
    log.info("warm pool: %d started sandbox(es) per recipe, at most %g s old", pool.settings.size,
             pool.settings.max_age_seconds)  # fmt: skip
    task = asyncio.create_task(pool.maintain())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait([task])
        removed = await pool.close()  # a stopped worker leaves no idle sandbox running behind it
        log.info("warm pool: %d unclaimed member(s) removed on the way out", removed)


async def _serve(settings: SandboxWorkerSettings) -> None:
    temporal = await connect_to_temporal(settings.temporal)
    async with sandbox_role(temporal, settings.sandbox) as workers:
        await run_until_stopped(workers)


def main() -> None:
    run_worker("corral-sandbox", SandboxWorkerSettings.from_environment, _serve)


if __name__ == "__main__":
    main()
