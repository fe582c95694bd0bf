"""The sandbox user's workspace volume and the hardened container options every sandbox runs with.

A fresh named volume is owned by root. Docker copies the image's `/workspace` (owned by uid 1000) into an empty
volume on its first mount, but only for a plain volume mount: not with `nocopy`, not for every volume driver, and
not for a volume that something else mounted first. So the volume is prepared explicitly: one short-lived root
container with no capability but CAP_CHOWN and no network chowns the volume's top directory (never recursively:
a sandbox may have planted symlinks inside). It costs one `docker run` per volume, not per command.
"""

from __future__ import annotations

from typing import Any

import docker
import docker.errors

from corral.sandbox.errors import SandboxSetupError

SANDBOX_USER = "sandbox"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
WORKSPACE = "/workspace"


def prepare_workspace_volume(
    client: docker.DockerClient, name: str, image: str, *, labels: dict[str, str] | None = None
) -> str:
    """Create the named volume `name` (or reuse it) and make its top directory owned by the sandbox user."""
    try:
        client.volumes.create(name=name, labels=labels or {})
        client.containers.run(
            image,
            ["chown", f"{SANDBOX_UID}:{SANDBOX_GID}", WORKSPACE],
            user="0:0",
            cap_drop=["ALL"],
            cap_add=["CHOWN"],
            security_opt=["no-new-privileges"],
            network_mode="none",
            read_only=True,
            volumes={name: {"bind": WORKSPACE, "mode": "rw"}},
            remove=True,
        )
    except docker.errors.DockerException as exc:
        raise SandboxSetupError(f"could not prepare the workspace volume {name}: {exc}") from exc
    return name


def hardened_run_options(workspace_volume: str) -> dict[str, Any]:
    """Keyword arguments for `client.containers.run/create` that confine a sandbox.

    Read-only root, no capabilities, no privilege gain, bounded processes/memory/CPU, an init to reap zombies, no
    network at all, a small /tmp in memory, and the workspace volume as the only persistent writable place.
    """
    return {
        "user": f"{SANDBOX_UID}:{SANDBOX_GID}",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": 128,
        "mem_limit": "512m",
        "nano_cpus": 1_000_000_000,
        "init": True,
        "network_mode": "none",
        "tmpfs": {"/tmp": "rw,nosuid,nodev,size=64m"},
        "volumes": {workspace_volume: {"bind": WORKSPACE, "mode": "rw"}},
        "working_dir": WORKSPACE,
    }


def copy_workspace(
    client: docker.DockerClient, source: str, target: str, image: str, *, labels: dict[str, str] | None = None
) -> bool:
    """Make volume `target` a copy of volume `source` (a fork's workspace); False when `source` is not on this
    engine. A one-shot container with no network and no capability copies the files, as the sandbox user."""
    try:
        client.volumes.get(source)
    except docker.errors.NotFound:
        return False
    prepare_workspace_volume(client, target, image, labels=labels)
    try:
        client.containers.run(
            image,
            ["cp", "-a", "/from/.", WORKSPACE],
            user=f"{SANDBOX_UID}:{SANDBOX_GID}",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            network_mode="none",
            read_only=True,
            volumes={source: {"bind": "/from", "mode": "ro"}, target: {"bind": WORKSPACE, "mode": "rw"}},
            remove=True,
        )
    except docker.errors.DockerException as exc:
        raise SandboxSetupError(f"could not copy the workspace {source} to {target}: {exc}") from exc
    return True
