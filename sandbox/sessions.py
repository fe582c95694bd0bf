"""A session's sandbox on a Docker engine: how its containers and workspace volume are named and labelled, how
they are found (a claimed warm pool member included), stopped and removed, and which sessions have any.

No Temporal here: the sandbox activities, the reaper and `corral down` call these functions.
"""

from __future__ import annotations

import re

import docker
import docker.errors
from docker.models.containers import Container

from sandbox import egress, networks
from sandbox.workspace import WORKSPACE, remove_oneshots

SESSION_LABEL = "corral.session"
SCOPE_LABEL = "corral.scope"
"""`<temporal cluster id>/<namespace>`: a reaper judges only the sessions of its own server and namespace."""
GENERATION_LABEL = "corral.generation"
CLAIMED_NAME = re.compile(r"^/?corral-(?!pool-)(.+)-g\d+$")


def container_name(session_id: str, generation: int) -> str:
    return f"corral-{session_id}-g{generation}"


def volume_name(session_id: str) -> str:
    return f"corral-ws-{session_id}"


def workspace_mount(container: Container) -> str | None:
    """The name of the volume mounted at the container's /workspace."""
    for mount in container.attrs.get("Mounts", []):
        if mount.get("Destination") == WORKSPACE and mount.get("Type") == "volume":
            return str(mount.get("Name"))
    return None


def session_containers(client: docker.DockerClient, session_id: str) -> list[Container]:
    """Every container of a session: those made for it (labelled) and warm pool members it claimed (renamed)."""
    labelled = client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"}, ignore_removed=True)
    pattern = re.compile(rf"^/?{re.escape(container_name(session_id, 0)[:-1])}\d+$")
    named = client.containers.list(all=True, filters={"name": container_name(session_id, 0)[:-1]}, ignore_removed=True)
    by_id = {str(c.id): c for c in labelled}
    by_id.update({str(c.id): c for c in named if pattern.match(str(c.name))})
    return list(by_id.values())


def has_sandbox(client: docker.DockerClient, session_id: str, generation: int) -> bool:
    """Whether the session already has this generation's container or a workspace volume of its own (a fork's
    copy, or one made before the warm pool): two lookups by name, for the first call's fast path."""
    for lookup, name in ((client.containers.get, container_name(session_id, generation)),
                         (client.volumes.get, volume_name(session_id))):  # fmt: skip
        try:
            lookup(name)
            return True
        except docker.errors.NotFound:
            continue
    return False


def session_volume(client: docker.DockerClient, session_id: str) -> str | None:
    """The session's workspace volume as it exists on this engine: its own, or the pool member's it claimed."""
    own = volume_name(session_id)
    try:
        client.volumes.get(own)
        return own
    except docker.errors.NotFound:
        pass
    for container in session_containers(client, session_id):
        mounted = workspace_mount(container)
        if mounted:
            return mounted
    return None


def stop_container(client: docker.DockerClient, container_id: str) -> None:
    try:
        client.containers.get(container_id).stop(timeout=2)
    except docker.errors.NotFound:
        pass
    egress.refresh_policy(client)


def remove_session(client: docker.DockerClient, session_id: str, remove_volume: bool) -> int:
    """Remove every container of a session (and its workspace volume); returns how many containers."""
    containers = session_containers(client, session_id)
    volumes = {volume_name(session_id)} | {v for v in map(workspace_mount, containers) if v}
    for container in containers:
        container.remove(force=True)
    networks.remove_networks(client, f"{SESSION_LABEL}={session_id}")
    if remove_volume:
        for volume in volumes:
            remove_oneshots(client, volume)  # one a killed worker left would hold the volume
            try:
                client.volumes.get(volume).remove(force=True)
            except docker.errors.NotFound:
                pass
    if containers:
        egress.refresh_policy(client)
    return len(containers)


def session_ids_with_containers(client: docker.DockerClient, scope: str) -> set[str]:
    """Sessions of `scope` (cluster and namespace) that have a container (running or stopped) on this engine, or
    a sandbox network left without one (its worker died between making the network and the container)."""
    containers = client.containers.list(all=True, filters={"label": f"{SCOPE_LABEL}={scope}"}, ignore_removed=True)
    sessions = {str(c.labels[SESSION_LABEL]) for c in containers if SESSION_LABEL in c.labels}
    # Warm pool members claimed by a session carry its name (`corral-<session>-g<n>`), not its label.
    claimed = (CLAIMED_NAME.match(str(c.name)) for c in containers if SESSION_LABEL not in c.labels)
    sessions |= {match.group(1) for match in claimed if match}
    for network in client.networks.list(filters={"label": [f"{SCOPE_LABEL}={scope}", egress.NETWORK_LABEL]}):
        session_id = (network.attrs.get("Labels") or {}).get(SESSION_LABEL)
        if session_id:
            sessions.add(str(session_id))
    return sessions
