"""A Docker network of its own for every sandbox that has networking, so that no sandbox can reach another.

A sandbox with `limited` networking sits alone on an internal network named after its container, which the egress
proxy joins; one with `unrestricted` networking sits alone on a routed bridge (inter-container traffic off, for
good measure). Docker drops traffic between bridges, so a sandbox reaches no other by name or by address.

Each network gets an explicit small subnet out of `SUBNET_POOL`, not one of Docker's default pools (those hold
only ~31 networks, and docker0 sits in them). The first subnet tried is chosen by the network's name; when Docker
refuses it because another network holds an overlapping one (perhaps made by another sandbox worker on the same
engine at the same moment), the next free one. As subnets never overlap, a sandbox's address identifies it, which
the egress proxy's policy (keyed by source address) relies on.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging

import docker
import docker.errors
import docker.types
from docker.models.networks import Network

from sandbox import egress
from sandbox.egress import EGRESS_CONTAINER, NETWORK_LABEL
from sandbox.errors import SandboxSetupError

log = logging.getLogger(__name__)

SUBNET_POOL = ipaddress.IPv4Network(egress.SUBNET_POOL)
SUBNET_PREFIX = 28
"""14 addresses: the gateway, the sandbox and the egress proxy need three; 4096 networks fit in the pool."""
MAX_ATTEMPTS = 32
"""Subnets tried before giving up: each failure but a lost race is answered by skipping every subnet in use."""
ICC_OPTION = "com.docker.network.bridge.enable_icc"
INHIBIT_IPV4_OPTION = "com.docker.network.bridge.inhibit_ipv4"
PARKING_NETWORK = "corral-pool-parking"
"""Where warm pool members for recipes with networking wait to be claimed (`ensure_parking`)."""


def subnets() -> list[ipaddress.IPv4Network]:
    return list(SUBNET_POOL.subnets(new_prefix=SUBNET_PREFIX))


def preferred_slot(name: str, slots: int) -> int:
    """The first subnet tried for a network: the same for a name on every worker, spread evenly over the pool."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % slots


def ensure_network(client: docker.DockerClient, name: str, networking: str, labels: dict[str, str]) -> Network:
    """The sandbox network `name` (made now if missing): internal for `limited`, routed for `unrestricted`."""
    existing = _get(client, name)
    if existing is not None:
        return existing
    pool = subnets()
    start = preferred_slot(name, len(pool))
    used: list[ipaddress.IPv4Network] = []
    attempts = 0
    for offset in range(len(pool)):
        subnet = pool[(start + offset) % len(pool)]
        if _overlaps(subnet, used):
            continue
        if attempts == MAX_ATTEMPTS:
            break
        attempts += 1
        try:
            return _create(client, name, networking, labels, subnet)
        except docker.errors.APIError as exc:
            made = _get(client, name)
            if made is not None:  # another worker made it meanwhile (Docker refuses a second network of a name)
                return made
            if not _is_overlap(exc):
                raise SandboxSetupError(f"could not create the sandbox network {name}: {exc}") from exc
            log.info("subnet %s for %s is taken; trying another", subnet, name)
            used = _subnets_in_use(client)
    raise SandboxSetupError(
        f"could not create the sandbox network {name}: no free /{SUBNET_PREFIX} subnet in {SUBNET_POOL} "
        f"after {attempts} attempts (remove unused networks with `corral down --sandboxes`)"
    )


def _create(
    client: docker.DockerClient, name: str, networking: str, labels: dict[str, str], subnet: ipaddress.IPv4Network
) -> Network:
    ipam = docker.types.IPAMConfig(
        pool_configs=[docker.types.IPAMPool(subnet=str(subnet), gateway=str(subnet.network_address + 1))]
    )
    return client.networks.create(
        name,
        driver="bridge",
        internal=networking == "limited",
        options=_options(networking),
        ipam=ipam,
        check_duplicate=True,
        labels={**labels, NETWORK_LABEL: networking},
    )


def _options(networking: str) -> dict[str, str]:
    if networking == "limited":
        # The sandbox talks to the egress proxy on it, and to nothing else: the host gets no address on the bridge,
        # so a service of the host listening on every address is not reachable at the network's gateway either.
        return {ICC_OPTION: "true", INHIBIT_IPV4_OPTION: "true"}
    return {ICC_OPTION: "false"}  # only the sandbox is on it: nothing to talk to; the host is at its gateway


def ensure_parking(client: docker.DockerClient) -> Network:
    """The network warm pool members with networking wait on (made once per engine): internal, with no traffic
    between its containers and no address of the host on it, so a member on it reaches nothing at all. A member
    created with no network could never join one; on this one, its claim connects it to the session's network,
    then takes it off this one."""
    existing = _get(client, PARKING_NETWORK)
    if existing is not None:
        return existing
    try:
        return client.networks.create(
            PARKING_NETWORK,
            driver="bridge",
            internal=True,
            options={ICC_OPTION: "false", INHIBIT_IPV4_OPTION: "true"},
            check_duplicate=True,
            labels={"corral": "pool"},
        )
    except docker.errors.APIError as exc:
        made = _get(client, PARKING_NETWORK)
        if made is not None:  # another worker made it at the same moment
            return made
        raise SandboxSetupError(f"could not create the pool's parking network: {exc}") from exc


def leave_parking(client: docker.DockerClient, container_id: str) -> None:
    """Take a claimed member off the parking network (it may have left already: a retried claim)."""
    network = _get(client, PARKING_NETWORK)
    if network is None:
        return
    try:
        network.disconnect(container_id, force=True)
    except docker.errors.APIError as exc:
        if exc.status_code not in (403, 404):  # 403: not connected (any more)
            raise SandboxSetupError(f"could not take {container_id[:12]} off the parking network: {exc}") from exc


def remove_network(client: docker.DockerClient, name: str) -> bool:
    """Remove a sandbox network, taking the egress proxy off it first; False if it was already gone.

    Docker refuses (APIError) while any other container is still attached: the caller removes the sandbox first.
    """
    network = _get(client, name)
    if network is None:
        return False
    attached = network.attrs.get("Containers") or {}
    if any(endpoint.get("Name") == EGRESS_CONTAINER for endpoint in attached.values()):
        try:
            network.disconnect(EGRESS_CONTAINER, force=True)
        except docker.errors.NotFound:
            pass
    try:
        network.remove()
    except docker.errors.NotFound:
        return False
    return True


def remove_networks(client: docker.DockerClient, label: str) -> list[str]:
    """Remove every sandbox network with `label` (`key=value`); the names removed."""
    found = client.networks.list(filters={"label": [label, NETWORK_LABEL]})
    return [str(network.name) for network in found if remove_network(client, str(network.name))]


def _get(client: docker.DockerClient, name: str) -> Network | None:
    try:
        network = client.networks.get(name)
    except docker.errors.NotFound:
        return None
    return network if network.name == name else None  # `get` also matches an id prefix


def _subnets_in_use(client: docker.DockerClient) -> list[ipaddress.IPv4Network]:
    used = []
    for network in client.networks.list():
        for config in (network.attrs.get("IPAM") or {}).get("Config") or []:
            try:
                subnet = ipaddress.ip_network(config.get("Subnet", ""), strict=False)
            except ValueError:
                continue
            if isinstance(subnet, ipaddress.IPv4Network):
                used.append(subnet)
    return used


def _overlaps(subnet: ipaddress.IPv4Network, used: list[ipaddress.IPv4Network]) -> bool:
    return any(subnet.overlaps(other) for other in used)


def _is_overlap(exc: docker.errors.APIError) -> bool:
    text = str(exc.explanation or exc).lower()
    return "overlap" in text or "address already in use" in text or "pool" in text
