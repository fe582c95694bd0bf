"""The sandbox user's workspace volume and the hardened container options every sandbox runs with.

A fresh named volume is owned by root. Docker copies the image's `/workspace` (owned by uid 1000) into an empty
volume on its first mount, but only for a plain volume mount: not with `nocopy`, not for every volume driver, and
not for a volume that something else mounted first. So the volume is prepared explicitly: one short-lived root
container with no capability but CAP_CHOWN and no network chowns the volume's top directory (never recursively:
a sandbox may have planted symlinks inside). It costs one `docker run` per volume, not per command.

Such a one-shot is labelled `corral.oneshot=<volume>`, and nothing else: it belongs to no session, so nothing that
works on a session's containers sees it. A worker killed while one runs leaves it behind, exited, and holding the
volume; `remove_oneshots` is how every clean-up removes it before the volume.
"""

from __future__ import annotations

from typing import Any

import docker
import docker.errors

from sandbox.errors import SandboxSetupError

SANDBOX_USER = "sandbox"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
WORKSPACE = "/workspace"
ONESHOT_LABEL = "corral.oneshot"
"""On the short-lived containers that prepare or copy a workspace volume: the name of the volume."""


def prepare_workspace_volume(
    client: docker.DockerClient, name: str, image: str, *, labels: dict[str, str] | None = None
) -> str:
    """Create the named volume `name` (or reuse it) and make its top directory owned by the sandbox user."""
    try:
        client.volumes.create(name=name, labels=labels or {})
    except docker.errors.DockerException as exc:
        raise SandboxSetupError(f"could not prepare the workspace volume {name}: {exc}") from exc
    return chown_workspace(client, name, image)


def chown_workspace(client: docker.DockerClient, name: str, image: str) -> str:
    """Make the top directory of the existing volume `name` owned by the sandbox user."""
    try:
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
            labels={ONESHOT_LABEL: name},
            remove=True,
        )
    except docker.errors.DockerException as exc:
        raise SandboxSetupError(f"could not prepare the workspace volume {name}: {exc}") from exc
    return name


def oneshots(client: docker.DockerClient, volume: str | None = None) -> list[str]:
    """The names of the one-shots (running or left behind) that prepare or copy `volume`; with None, every one."""
    label = ONESHOT_LABEL if volume is None else f"{ONESHOT_LABEL}={volume}"
    found = client.containers.list(all=True, filters={"label": label}, ignore_removed=True)
    return sorted(str(container.name) for container in found)


def remove_oneshots(client: docker.DockerClient, volume: str) -> int:
    """Remove the one-shots of `volume`, so the volume can go: how many."""
    removed = 0
    for name in oneshots(client, volume):
        try:
            client.containers.get(name).remove(force=True)
        except docker.errors.NotFound:
            continue
        removed += 1
    return removed


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
            labels={ONESHOT_LABEL: target},
            remove=True,
        )
    except docker.errors.DockerException as exc:
        raise SandboxSetupError(f"could not copy the workspace {source} to {target}: {exc}") from exc
    return True
