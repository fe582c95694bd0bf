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
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from temporalio.api.enums.v1 import deployment_pb2, task_queue_pb2
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentResponse,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from workers._settings import SettingsError, TemporalSettings

ENV_DEPLOYMENT = "CORRAL_HARNESS_DEPLOYMENT"
ENV_BUILD_ID = "CORRAL_HARNESS_BUILD_ID"
ENV_UPGRADE = "CORRAL_HARNESS_UPGRADE"

UpgradePolicy = Literal["pinned", "auto-upgrade"]
UPGRADE_POLICIES: tuple[UpgradePolicy, ...] = ("pinned", "auto-upgrade")
_BEHAVIOR = {"pinned": VersioningBehavior.PINNED, "auto-upgrade": VersioningBehavior.AUTO_UPGRADE}
_DEPLOYMENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")  # Temporal refuses '.' and '/' in a deployment name
_BUILD_ID = re.compile(r"^[A-Za-z0-9._+-]{1,100}$")
_ROUTING_DONE = task_queue_pb2.RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_COMPLETED

logger = logging.getLogger("corral.harness")


class DeploymentError(Exception):
    """Temporal refused a change of the deployment, or it did not happen in time; the message says which."""


@dataclass(frozen=True)
class HarnessDeployment:
    """One build of the harness in a Worker Deployment, and how running sessions move between builds."""

    name: str
    build_id: str
    upgrade: UpgradePolicy = "pinned"

    def __post_init__(self) -> None:
        if not _DEPLOYMENT_NAME.match(self.name):
            raise SettingsError(f"{ENV_DEPLOYMENT} must be 1-100 of A-Z, a-z, 0-9, '_' and '-', got {self.name!r}")
        if not _BUILD_ID.match(self.build_id):
            raise SettingsError(
                f"{ENV_BUILD_ID} must be 1-100 of A-Z, a-z, 0-9, '.', '_', '+' and '-', got {self.build_id!r}"
            )
        if self.upgrade not in UPGRADE_POLICIES:
            raise SettingsError(f"{ENV_UPGRADE} must be one of {', '.join(UPGRADE_POLICIES)}, got {self.upgrade!r}")

    @property
    def version(self) -> WorkerDeploymentVersion:
        return WorkerDeploymentVersion(deployment_name=self.name, build_id=self.build_id)

    def worker_config(self) -> WorkerDeploymentConfig:
        """What the harness worker is built with: this version, and the upgrade policy as its sessions' default."""
        return WorkerDeploymentConfig(
            version=self.version, use_worker_versioning=True, default_versioning_behavior=_BEHAVIOR[self.upgrade]
        )

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> HarnessDeployment | None:
        """The deployment the environment names, or None (an unversioned harness). The build id defaults to a hash
        of the code this process loaded (the SDK's), so two builds of different code never share one."""
        name = environ.get(ENV_DEPLOYMENT) or None
        if name is None:
            for variable in (ENV_BUILD_ID, ENV_UPGRADE):
                if environ.get(variable):
                    raise SettingsError(f"{variable} is set but {ENV_DEPLOYMENT} is not: name the deployment too")
            return None
        upgrade = environ.get(ENV_UPGRADE) or "pinned"
        build_id = environ.get(ENV_BUILD_ID) or _code_build_id()
        return cls(name=name, build_id=build_id, upgrade=cast(UpgradePolicy, upgrade))


def _code_build_id() -> str:
    """A hash of the harness's code: the workflow modules and the contract they read (and the SDK's version), so a
    build of other code never shares an id, and the same code on two hosts shares one."""
    import hashlib
    from importlib.metadata import version
    from pathlib import Path

    import corral.contract
    import workflows

    digest = hashlib.sha256(version("temporalio").encode())
    for package in (workflows, corral.contract):
        root = Path(str(package.__file__)).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return f"code-{digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class HarnessSettings:
    """`corral-harness`: where Temporal is, and the deployment this build belongs to (None: unversioned)."""

    temporal: TemporalSettings
    deployment: HarnessDeployment | None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> HarnessSettings:
        environ = os.environ if environ is None else environ
        return cls(TemporalSettings.from_environment(environ), HarnessDeployment.from_environment(environ))


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
        except RPCError as err:  # the build has not registered yet: its worker's first poll makes it known
            if err.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                raise DeploymentError(f"Temporal refused to make {build_id} current in {name}: {err.message}") from err
            if loop.time() >= deadline:
                raise DeploymentError(
                    f"build {build_id} of {name} is not known to Temporal after {timeout:.0f} s: start a harness "
                    f"worker with {ENV_DEPLOYMENT}={name} {ENV_BUILD_ID}={build_id} first ({err.message})"
                ) from err
        await asyncio.sleep(0.2)
    while True:
        info = (await _describe(client, name)).worker_deployment_info
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
        state = await describe_deployment(client, deployment.name)
        if state is not None and state.current is not None:
            return False
        if state is not None and any(build.build_id == deployment.build_id for build in state.builds):
            await set_current_build(client, deployment.name, deployment.build_id, timeout=timeout)
            logger.info("%s: build %s is the first and now current", deployment.name, deployment.build_id)
            return True
        if loop.time() >= deadline:
            raise DeploymentError(f"build {deployment.build_id} did not register in {deployment.name}")
        await asyncio.sleep(0.2)


async def _describe(client: Client, name: str) -> DescribeWorkerDeploymentResponse:
    return await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
    )


def _status_name(status: int) -> str:
    statuses = deployment_pb2.WorkerDeploymentVersionStatus
    name = statuses.Name(cast(deployment_pb2.WorkerDeploymentVersionStatus.ValueType, status))
    return name.removeprefix("WORKER_DEPLOYMENT_VERSION_STATUS_").lower()
