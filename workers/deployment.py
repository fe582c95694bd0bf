"""Safe harness upgrades with Temporal's Worker Deployment versioning.

With `CORRAL_HARNESS_DEPLOYMENT` set, the harness worker is one *build* (`CORRAL_HARNESS_BUILD_ID`) of a Worker
Deployment. New sessions start on the deployment's current build; which build a running session's workflow
tasks go to is the deployment's choice, `CORRAL_HARNESS_UPGRADE`:

- `pinned` (the default): a session stays on the build it started with while its run lasts, and moves to the
  current build at its next safe point, by continuing as new (workflows/_handover.py): between a tool result and
  the next model call, or when it goes idle. The new run starts from the carried state, not by replaying the old
  build's history, so any harness change is safe, even one that would not replay. Only the carried state
  (`corral.contract.carry`, `SessionInput`) must stay readable by the new build.
- `auto-upgrade`: a session moves to the current build at its next workflow task, mid-turn included; the new build
  replays the session's history, so only a change made with `workflow.patched` is safe (check it first with
  `corral harness check`).

Records (agents, environments, vaults) always auto-upgrade: they are long-lived and mostly idle, and would keep an
old build alive forever otherwise; change them with patches only.

Without `CORRAL_HARNESS_DEPLOYMENT` the harness is unversioned, as before: every worker takes every task.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import cast

from temporalio.api.enums.v1 import deployment_pb2, task_queue_pb2
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentResponse,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from workers.errors import DeploymentError
from workers.settings import ENV_BUILD_ID, ENV_DEPLOYMENT, HarnessDeployment

_BEHAVIOR = {"pinned": VersioningBehavior.PINNED, "auto-upgrade": VersioningBehavior.AUTO_UPGRADE}
_NOT_YET = (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION)
"""The build has not registered yet: its worker's first poll makes it known."""
_TRANSIENT = (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE,
              RPCStatusCode.ABORTED, RPCStatusCode.RESOURCE_EXHAUSTED)  # fmt: skip
"""A busy server: the deployment's change is made by a system workflow, which may be cancelled or time out."""
_ROUTING_DONE = task_queue_pb2.RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_COMPLETED

logger = logging.getLogger("corral.harness")


def worker_config(deployment: HarnessDeployment) -> WorkerDeploymentConfig:
    """What a harness worker of `deployment` is built with: its version, and the upgrade policy as the default
    versioning behavior of its sessions."""
    return WorkerDeploymentConfig(
        version=deployment.version,
        use_worker_versioning=True,
        default_versioning_behavior=_BEHAVIOR[deployment.upgrade],
    )


# ---- the deployment on the server -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildState:
    """One build of a deployment as the server sees it."""

    build_id: str
    status: str
    """`current`, `ramping`, `draining` (pinned sessions still run on it), `drained`, `inactive` or `created`."""


@dataclass(frozen=True)
class DeploymentState:
    name: str
    current: str | None
    builds: list[BuildState]


async def describe_deployment(client: Client, name: str) -> DeploymentState | None:
    """The deployment's builds and its current one, or None while no worker of it has polled yet."""
    try:
        response = await _describe(client, name)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    info = response.worker_deployment_info
    builds = [
        BuildState(summary.deployment_version.build_id, _status_name(summary.status))
        for summary in info.version_summaries
    ]
    return DeploymentState(name, info.routing_config.current_deployment_version.build_id or None, builds)


async def set_current_build(client: Client, name: str, build_id: str, *, timeout: float = 60.0) -> None:
    """Make `build_id` the deployment's current build, once a worker of it polls, and wait until the server routes
    new sessions (and `pinned` sessions' safe points) to it. Raises `DeploymentError` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace, deployment_name=name, build_id=build_id, identity=client.identity
    )
    while True:
        try:
            await client.workflow_service.set_worker_deployment_current_version(request)
            break
        except RPCError as err:
            if err.status not in _NOT_YET and err.status not in _TRANSIENT:
                raise DeploymentError(f"Temporal refused to make {build_id} current in {name}: {err.message}") from err
            if loop.time() >= deadline:
                raise DeploymentError(
                    f"build {build_id} of {name} is not known to Temporal after {timeout:.0f} s: start a harness "
                    f"worker with {ENV_DEPLOYMENT}={name} {ENV_BUILD_ID}={build_id} first ({err.message})"
                    if err.status in _NOT_YET
                    else f"Temporal did not make {build_id} current in {name} within {timeout:.0f} s: {err.message}"
                ) from err
        await asyncio.sleep(0.2)
    while True:
        try:
            info = (await _describe(client, name)).worker_deployment_info
        except RPCError as err:
            if err.status not in _TRANSIENT or loop.time() >= deadline:
                raise DeploymentError(f"could not read {name} from Temporal: {err.message}") from err
        else:
            routed = info.routing_config.current_deployment_version.build_id == build_id
            if routed and info.routing_config_update_state == _ROUTING_DONE:
                return
            if loop.time() >= deadline:
                raise DeploymentError(f"Temporal did not finish routing {name} to {build_id} within {timeout:.0f} s")
        await asyncio.sleep(0.2)


async def become_current_if_first(client: Client, deployment: HarnessDeployment, *, timeout: float = 60.0) -> bool:
    """The first build of a deployment makes itself current (else no session would start anywhere); later builds
    wait to be promoted (`corral harness promote`). True when this build became current."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            state = await describe_deployment(client, deployment.name)
        except RPCError as err:
            if err.status not in _TRANSIENT or loop.time() >= deadline:
                raise
            state = None
        if state is not None and state.current is not None:
            return False
        if state is not None and any(build.build_id == deployment.build_id for build in state.builds):
            await set_current_build(client, deployment.name, deployment.build_id, timeout=timeout)
            logger.info("%s: build %s is the first and now current", deployment.name, deployment.build_id)
            return True
        if loop.time() >= deadline:
            raise DeploymentError(f"build {deployment.build_id} did not register in {deployment.name}")
        await asyncio.sleep(0.2)


TRANSIENT = (RPCStatusCode.CANCELLED, RPCStatusCode.UNAVAILABLE)
"""What a describe may meet while the server recycles a connection ("operation was canceled"): asked again."""
DESCRIBE_ATTEMPTS = 4


async def _describe(client: Client, name: str) -> DescribeWorkerDeploymentResponse:
    """The deployment's description; a read, so a transient failure is asked again (with back-off) before it is
    reported."""
    request = DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
    for attempt in range(1, DESCRIBE_ATTEMPTS):
        try:
            return await client.workflow_service.describe_worker_deployment(request, retry=True)
        except RPCError as err:
            if err.status not in TRANSIENT:
                raise
        await asyncio.sleep(0.2 * 2**attempt)
    return await client.workflow_service.describe_worker_deployment(request, retry=True)


def _status_name(status: int) -> str:
    statuses = deployment_pb2.WorkerDeploymentVersionStatus
    name = statuses.Name(cast(deployment_pb2.WorkerDeploymentVersionStatus.ValueType, status))
    return name.removeprefix("WORKER_DEPLOYMENT_VERSION_STATUS_").lower()
