"""Every sandbox on an engine at once, listed or removed: what `corral down --sandboxes` clears.

A sandbox is a session's containers (label `corral.session`, or `corral.pool` for warm pool members and the
sessions that claimed them; `corral.oneshot` for a container left by a worker killed while it prepared a workspace
volume), its workspace volume (label `corral.session`, or named `corral-ws-*`) and the network of each container
that has networking (labels `corral.session` and `corral.network`). Shared by all sandboxes of the engine: the
egress proxy `corral-egress` and its routed network, which serve the limited ones; the parking network
`corral-pool-parking`, where warm pool members with networking wait; and `corral-limited`, the network limited
sandboxes shared before each had its own, removed when found. Images are never touched: the base sandbox image and
the package images derived from it are a cache that takes minutes to rebuild, and a session that outlives the
removal makes its sandbox again from them.

Removal is idempotent: whatever another process removed meanwhile (NotFound) is simply not reported. No Temporal
here: the CLI and the tests call these functions directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import docker
import docker.constants
import docker.errors
import requests
from docker.models.containers import Container

from sandbox.egress import EGRESS_CONTAINER, EGRESS_NETWORK, LIMITED_NETWORK, NETWORK_LABEL
from sandbox.errors import SandboxError
from sandbox.networks import PARKING_NETWORK, remove_network
from sandbox.pool import MEMBER_PREFIX, POOL_LABEL
from sandbox.sessions import SCOPE_LABEL, SESSION_LABEL, volume_name, workspace_mount
from sandbox.workspace import oneshots

EGRESS_LABEL = "corral=egress"
"""The label `egress.ensure_egress` puts on the proxy container and on its network."""
SHARED_NETWORKS = [EGRESS_NETWORK, LIMITED_NETWORK, PARKING_NETWORK]
"""The egress proxy's network, the warm pool's parking network, and the one limited sandboxes shared before (each
listed only where it exists)."""
WORKSPACE_PREFIX = volume_name("")
"""`corral-ws-`: a volume so named is a workspace even without the label."""


@dataclass(frozen=True)
class SandboxResources:
    """Names of sandbox resources on one engine: the ones there (`list_sandbox_resources`) or the ones removed."""

    containers: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()
    networks: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.containers or self.volumes or self.networks)

    def describe(self) -> str:
        """One line for a person: `3 containers, 1 workspace volume and 2 networks`, or `no sandboxes`."""
        counts = [(self.containers, "container"), (self.volumes, "workspace volume"), (self.networks, "network")]
        parts = [f"{len(names)} {noun}{'' if len(names) == 1 else 's'}" for names, noun in counts if names]
        if not parts:
            return "no sandboxes"
        return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def connect_docker(ping_timeout: float = 5.0) -> docker.DockerClient | None:
    """The engine of `DOCKER_HOST` (else the local socket) if it answers a ping within `ping_timeout`, else None.

    Never starts an engine: listing or removing sandboxes has nothing to do where none runs.
    """
    unreachable = (docker.errors.DockerException, requests.RequestException, OSError)
    try:
        # Constructing the client already asks the engine for its API version, so it fails when none answers.
        client = docker.from_env(timeout=max(1, round(ping_timeout)))
    except unreachable:
        return None
    try:
        client.ping()
    except unreachable:
        client.close()
        return None
    client.api.timeout = docker.constants.DEFAULT_TIMEOUT_SECONDS  # the short timeout was for the ping only
    return client


def list_sandbox_resources(client: docker.DockerClient, scope: str | None = None) -> SandboxResources:
    """Every sandbox container, workspace volume and network on the engine, the egress proxy and its networks;
    read only.

    With `scope` (`<Temporal cluster id>/<namespace>`, the `corral.scope` label), only the sandboxes of that
    server's sessions; the egress proxy and its networks are shared by every sandbox of the engine, so they are
    included only when no other sandbox is left to need them.
    """
    # ignore_removed: a container another clean-up removes between the engine's list and its inspect is left out.
    sandboxes = client.containers.list(all=True, filters={"label": SESSION_LABEL}, ignore_removed=True)
    # Warm pool members, or claimed by a session.
    sandboxes += client.containers.list(all=True, filters={"label": POOL_LABEL}, ignore_removed=True)
    if scope is not None:
        return _of_scope(client, scope, sandboxes)
    containers = {str(c.name) for c in sandboxes} | set(oneshots(client))
    # The proxy and its networks by label and by name (a name filter matches substrings, hence the equality).
    egress = {
        str(c.name) for c in client.containers.list(all=True, filters={"label": EGRESS_LABEL}, ignore_removed=True)
    }
    egress |= {
        str(c.name) for c in client.containers.list(all=True, filters={"name": EGRESS_CONTAINER}, ignore_removed=True)
    } & {EGRESS_CONTAINER}
    volumes = {
        str(volume.name)
        for volume in client.volumes.list()
        if SESSION_LABEL in (volume.attrs.get("Labels") or {}) or str(volume.name).startswith(WORKSPACE_PREFIX)
    }
    shared = {str(network.name) for network in client.networks.list(filters={"label": EGRESS_LABEL})}
    shared |= {str(network.name) for network in client.networks.list(names=SHARED_NETWORKS)} & set(SHARED_NETWORKS)
    own = {str(network.name) for network in client.networks.list(filters={"label": [SESSION_LABEL, NETWORK_LABEL]})}
    return SandboxResources(
        containers=tuple(sorted(containers)) + tuple(sorted(egress - containers)),
        volumes=tuple(sorted(volumes)),
        networks=tuple(sorted(own)) + tuple(sorted(shared - own)),
    )


def _of_scope(client: docker.DockerClient, scope: str, sandboxes: list[Container]) -> SandboxResources:
    """The sandboxes labelled with `scope`, their volumes and networks, and the egress when no other sandbox needs
    it."""
    ours = [c for c in sandboxes if c.labels.get(SCOPE_LABEL) == scope]
    sessions = {str(c.labels[SESSION_LABEL]) for c in ours if SESSION_LABEL in c.labels}
    labelled = client.volumes.list(filters={"label": f"{SCOPE_LABEL}={scope}"})
    volumes = {str(volume.name) for volume in labelled}
    volumes |= {volume_name(session) for session in sessions if _volume_exists(client, volume_name(session))}
    own = client.networks.list(filters={"label": [f"{SCOPE_LABEL}={scope}", NETWORK_LABEL]})
    networks = sorted(str(network.name) for network in own)
    names = {str(c.name) for c in ours} | {name for volume in volumes for name in oneshots(client, volume)}
    shared = list_sandbox_resources(client) if len(ours) == len(sandboxes) else SandboxResources()
    egress = tuple(name for name in shared.containers if name == EGRESS_CONTAINER)
    shared_networks = tuple(name for name in shared.networks if name in SHARED_NETWORKS)
    return SandboxResources(
        containers=tuple(sorted(names)) + egress,
        volumes=tuple(sorted(volumes)),
        networks=tuple(networks) + shared_networks,
    )


def _volume_exists(client: docker.DockerClient, name: str) -> bool:
    try:
        client.volumes.get(name)
    except docker.errors.NotFound:
        return False
    return True


def remove_all_sandboxes(client: docker.DockerClient, scope: str | None = None) -> SandboxResources:
    """Remove every sandbox on the engine (with `scope`, those of one Temporal server: see
    `list_sandbox_resources`), workspace files included, then the egress proxy and its networks.

    Running containers are killed. Returns what this call removed; run again, it removes nothing. What Docker
    refuses to remove (a volume or network that a container which is not corral's still uses) does not stop the
    rest: it is named in one SandboxError at the end, which also says what was removed.
    """
    found = list_sandbox_resources(client, scope)
    failures: list[str] = []
    removed = SandboxResources(
        containers=_remove_each(client, "container", found.containers, failures),
        volumes=_remove_each(client, "volume", found.volumes, failures),
        networks=_remove_each(client, "network", found.networks, failures),
    )
    if failures:
        raise SandboxError(f"removed {removed.describe()}, but not: " + "; ".join(failures))
    return removed


def remove_pool_members(client: docker.DockerClient, scope: str) -> SandboxResources:
    """Remove the unclaimed warm pool members of `scope` and their (empty) workspace volumes: `corral down` does,
    once the sandbox workers are stopped, so a stopped stack leaves no idle sandbox running. A member a session
    claimed carries the session's name, and stays with the session's sandboxes. A member a killed worker did not
    finish making is removed too, with the one-shot that may still hold its volume."""
    labels = [POOL_LABEL, f"{SCOPE_LABEL}={scope}"]
    members = client.containers.list(all=True, filters={"label": labels}, ignore_removed=True)
    unclaimed = [c for c in members if str(c.name).startswith(MEMBER_PREFIX)]
    volumes = tuple(v for v in (workspace_mount(c) for c in unclaimed) if v)
    left = tuple(name for volume in volumes for name in oneshots(client, volume))
    failures: list[str] = []
    removed = SandboxResources(
        containers=_remove_each(client, "container", tuple(str(c.name) for c in unclaimed) + left, failures),
        volumes=_remove_each(client, "volume", volumes, failures),
    )
    if failures:
        raise SandboxError(f"removed {removed.describe()}, but not: " + "; ".join(failures))
    return removed


def _remove_each(
    client: docker.DockerClient, kind: str, names: tuple[str, ...], failures: list[str]
) -> tuple[str, ...]:
    """Remove each resource by name; the ones this call removed (one already gone is skipped, not an error)."""
    removed = []
    for name in names:
        try:
            if kind == "container":
                client.containers.get(name).remove(force=True)
            elif kind == "volume":
                client.volumes.get(name).remove(force=True)
            elif not remove_network(client, name):  # the egress proxy taken off it first
                continue
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:
            detail = str(exc.explanation or exc)
            users = _network_users(client, name) if kind == "network" else []
            failures.append(f"{kind} {name}: {detail}" + (f" (attached: {', '.join(users)})" if users else ""))
            continue
        removed.append(name)
    return tuple(removed)


def _network_users(client: docker.DockerClient, name: str) -> list[str]:
    """The containers attached to a network (the reason Docker refuses to remove it)."""
    try:
        attached = client.networks.get(name).attrs.get("Containers") or {}
    except docker.errors.APIError:
        return []
    return sorted(str(endpoint.get("Name", container_id[:12])) for container_id, endpoint in attached.items())
