"""`limited` networking: an internal network per sandbox with no route out, and one allow-list proxy per engine.

Each sandbox with `networking.type = limited` sits alone on an internal network of its own (`networks.py`, named
after its container) and gets HTTP(S)_PROXY set to the egress proxy, a container (`corral-egress`, running
`corral-egress` from the sandbox image) that sits on a routed network and joins every limited sandbox's network
under the alias `corral-egress`. Sandboxes never share a network, so one cannot reach another, only the proxy.
The proxy lets a request through only if its host is on the allow list of the sandbox it comes from, keyed by the
sandbox's address (unique: the sandboxes' subnets never overlap); the worker rewrites the whole policy from the
labels of the running sandboxes' networks whenever one starts or goes, so an address that is reused never inherits
a stale list.
"""

from __future__ import annotations

import base64
import json
import logging

import docker
import docker.errors
from docker.models.containers import Container

from sandbox.errors import SandboxSetupError
from sandbox.workspace import SANDBOX_GID, SANDBOX_UID

log = logging.getLogger(__name__)

LIMITED_NETWORK = "corral-limited"
"""The internal network all limited sandboxes shared before each got its own: gone once no old sandbox needs it."""
SUBNET_POOL = "10.199.0.0/16"
"""Where each sandbox's network gets its subnet (`networks.py`); the proxy refuses to connect to any address in it.
Outside docker0 (172.17/16), Docker's default pools (172.17-31/16, 192.168/16) and the test ranges (10.213/16)."""
DENIED_ENV = "CORRAL_EGRESS_DENIED"
"""The proxy's variable naming the networks it must never connect to; a proxy made without it is made again."""
NETWORK_LABEL = "corral.network"
"""On a sandbox's own network: the networking it serves, `limited` or `unrestricted`."""
EGRESS_NETWORK = "corral-egress-net"
EGRESS_CONTAINER = "corral-egress"
EGRESS_PORT = 3128
EGRESS_POLICY = "/run/corral-egress/policy.json"
ALLOWED_HOSTS_LABEL = "corral.allowed_hosts"
PROXY_URL = f"http://{EGRESS_CONTAINER}:{EGRESS_PORT}"


def proxy_environment() -> dict[str, str]:
    """What a limited sandbox's processes see: the proxy, for every common client's spelling."""
    return {
        "HTTP_PROXY": PROXY_URL,
        "HTTPS_PROXY": PROXY_URL,
        "http_proxy": PROXY_URL,
        "https_proxy": PROXY_URL,
        "NO_PROXY": "localhost,127.0.0.1",
        "no_proxy": "localhost,127.0.0.1",
    }


def _network(client: docker.DockerClient, name: str, internal: bool) -> None:
    try:
        client.networks.get(name)
    except docker.errors.NotFound:
        client.networks.create(name, driver="bridge", internal=internal, labels={"corral": "egress"})


def ensure_egress(client: docker.DockerClient, image: str) -> None:
    """The routed network and the proxy container on it, made once per engine; a proxy made again (it was removed)
    joins every limited sandbox's network at once, so the sandboxes already running keep their way out."""
    try:
        _network(client, EGRESS_NETWORK, internal=False)
        try:
            proxy = client.containers.get(EGRESS_CONTAINER)
        except docker.errors.NotFound:
            proxy = None
        if proxy is not None and f"{DENIED_ENV}={SUBNET_POOL}" not in (proxy.attrs["Config"].get("Env") or []):
            log.info("replacing the egress proxy: it predates the refusal to reach sandboxes")
            proxy.remove(force=True)
            proxy = None
        if proxy is not None:
            if proxy.status != "running":
                proxy.start()
            return
        try:
            proxy = _create_proxy(client, image)
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise
            return  # another worker made it at the same moment, and joins it to the networks
        proxy.start()
        # Every limited sandbox's network, and the shared one of sandboxes made before each had its own (so that
        # those keep their way out through an upgrade, until they are made again on networks of their own).
        limited = client.networks.list(filters={"label": f"{NETWORK_LABEL}=limited"})
        for name in [str(network.name) for network in limited] + _existing(client, LIMITED_NETWORK):
            connect_proxy(client, name)
    except docker.errors.APIError as exc:
        raise SandboxSetupError(f"could not set up the egress proxy for limited networking: {exc}") from exc


def _existing(client: docker.DockerClient, network: str) -> list[str]:
    try:
        return [str(client.networks.get(network).name)]
    except docker.errors.NotFound:
        return []


def _create_proxy(client: docker.DockerClient, image: str) -> Container:
    return client.containers.create(
        image,
        ["/opt/corral/bin/corral-egress"],
        name=EGRESS_CONTAINER,
        user=f"{SANDBOX_UID}:{SANDBOX_GID}",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=256,
        mem_limit="256m",
        init=True,
        network=EGRESS_NETWORK,
        environment={
            "CORRAL_EGRESS_POLICY": EGRESS_POLICY,
            "CORRAL_EGRESS_PORT": str(EGRESS_PORT),
            DENIED_ENV: SUBNET_POOL,
        },
        tmpfs={"/run/corral-egress": f"rw,size=4m,uid={SANDBOX_UID},gid={SANDBOX_GID},mode=0755"},
        restart_policy={"Name": "unless-stopped"},
        labels={"corral": "egress"},
    )


def connect_proxy(client: docker.DockerClient, network: str) -> None:
    """Put the egress proxy on a limited sandbox's network under the name the sandbox's HTTP(S)_PROXY uses; a
    proxy already there is left as it is."""
    try:
        client.networks.get(network).connect(EGRESS_CONTAINER, aliases=[EGRESS_CONTAINER])
    except docker.errors.APIError as exc:
        attached = client.networks.get(network).attrs.get("Containers") or {}
        if not any(endpoint.get("Name") == EGRESS_CONTAINER for endpoint in attached.values()):
            raise SandboxSetupError(f"could not connect the egress proxy to {network}: {exc}") from exc


def gateway(client: docker.DockerClient, network: str) -> str:
    """The host's address on a Docker network: where a sandbox reaches services of the host (the git proxy)."""
    config = client.networks.get(network).attrs.get("IPAM", {}).get("Config") or [{}]
    address = config[0].get("Gateway")
    if not address:
        raise SandboxSetupError(f"the Docker network {network} has no gateway address")
    return str(address)


def refresh_policy(client: docker.DockerClient) -> dict[str, list[str]]:
    """Rewrite the proxy's allow lists from the running limited sandboxes; returns the policy written.

    A sandbox's allow-list is a label of its own network (which a claimed warm pool member joins only at claim,
    so it cannot be one of the container's), keyed by the sandbox's address on that network."""
    try:
        proxy = client.containers.get(EGRESS_CONTAINER)
    except docker.errors.NotFound:
        return {}
    policy: dict[str, list[str]] = {}
    # Sandboxes made before the allow-lists moved onto the networks carry theirs as a container label. One that
    # ends between the engine's list and its inspect is left out (ignore_removed), not a NotFound.
    for container in client.containers.list(
        filters={"label": ALLOWED_HOSTS_LABEL, "status": "running"}, ignore_removed=True
    ):
        address = _address(container)
        if address:
            policy[address] = json.loads(container.labels[ALLOWED_HOSTS_LABEL])
    labelled = client.networks.list(filters={"label": [f"{NETWORK_LABEL}=limited", ALLOWED_HOSTS_LABEL]}, greedy=True)
    for network in labelled:
        hosts = json.loads(network.attrs["Labels"][ALLOWED_HOSTS_LABEL])
        for endpoint in (network.attrs.get("Containers") or {}).values():  # running containers only
            address = str(endpoint.get("IPv4Address") or "").split("/")[0]
            if address and endpoint.get("Name") != EGRESS_CONTAINER:
                policy[address] = hosts
    encoded = base64.b64encode(json.dumps(policy).encode()).decode()
    write = (
        "import base64, os, sys\n"
        f"path = {EGRESS_POLICY!r}\n"
        "open(path + '.tmp', 'wb').write(base64.b64decode(sys.argv[1]))\n"
        "os.replace(path + '.tmp', path)\n"
    )
    # A fixed script (EGRESS_POLICY is a constant); the policy, built from session labels, is its argument only.
    result = proxy.exec_run(["python3", "-c", write, encoded])
    if result.exit_code != 0:
        raise SandboxSetupError(f"could not update the egress policy: {result.output!r}")
    return policy


def _address(container: Container) -> str | None:
    """The sandbox's address on its own network (named after it), or on the shared one of an older sandbox."""
    networks = container.attrs.get("NetworkSettings", {}).get("Networks", {})
    network = networks.get(str(container.name)) or networks.get(LIMITED_NETWORK) or {}
    address = network.get("IPAddress")
    return str(address) if address else None
