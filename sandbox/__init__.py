"""The sandbox hand's groundwork: a Docker engine that answers and the sandbox image, both made on demand.

`ensure_docker_engine` finds or starts an engine; `ensure_sandbox_image` builds `corral-sandbox:<hash>` with no
registry (debootstrap, `docker import`, a Dockerfile layer). `python -m sandbox.prepare` runs both.
`prepare_workspace_volume` and `hardened_run_options` are how a sandbox container is meant to be run.
`list_sandbox_resources` and `remove_all_sandboxes` see or clear every sandbox on an engine (`corral down`),
through `connect_docker`, which never starts an engine.
"""

from sandbox.cleanup import (
    SandboxResources,
    connect_docker,
    list_sandbox_resources,
    remove_all_sandboxes,
    remove_pool_members,
)
from sandbox.engine import ensure_docker_engine, stop_docker_engine
from sandbox.errors import (
    DockerEngineError,
    PackageInstallError,
    SandboxError,
    SandboxImageError,
    SandboxSetupError,
)
from sandbox.image import ensure_sandbox_image, sandbox_image_tag
from sandbox.workspace import hardened_run_options, prepare_workspace_volume

__all__ = [
    "DockerEngineError",
    "PackageInstallError",
    "SandboxError",
    "SandboxImageError",
    "SandboxResources",
    "SandboxSetupError",
    "connect_docker",
    "ensure_docker_engine",
    "ensure_sandbox_image",
    "hardened_run_options",
    "list_sandbox_resources",
    "prepare_workspace_volume",
    "remove_all_sandboxes",
    "remove_pool_members",
    "sandbox_image_tag",
    "stop_docker_engine",
]
