"""`limited` networking: an internal network with no route out, and one allow-list proxy per engine.

Sandboxes with `networking.type = limited` join the internal network `corral-limited` and get HTTP(S)_PROXY set
to the egress proxy, a container (`corral-egress`, running `corral-egress` from the sandbox image) that sits on both
that network and a routed one. The proxy lets a request through only if its host is on the allow list of the
sandbox it comes from, keyed by the sandbox's address; the worker rewrites the whole policy from the running
sandboxes' labels whenever one starts or goes, so an address that is reused never inherits a stale list.
"""

from __future__ import annotations

import base64
import json
import logging

import docker
import docker.errors
from docker.models.containers import Container

from corral.sandbox.errors import SandboxSetupError
from corral.sandbox.workspace import SANDBOX_GID, SANDBOX_UID

log = logging.getLogger(__name__)

LIMITED_NETWORK = "corral-limited"
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
    """The internal network, the routed network and the proxy container on both, made once per engine."""
    try:
        _network(client, LIMITED_NETWORK, internal=True)
        _network(client, EGRESS_NETWORK, internal=False)
        try:
            proxy = client.containers.get(EGRESS_CONTAINER)
            if proxy.status != "running":
                proxy.start()
            return
        except docker.errors.NotFound:
            pass
        proxy = client.containers.create(
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
            environment={"CORRAL_EGRESS_POLICY": EGRESS_POLICY, "CORRAL_EGRESS_PORT": str(EGRESS_PORT)},
            tmpfs={"/run/corral-egress": f"rw,size=4m,uid={SANDBOX_UID},gid={SANDBOX_GID},mode=0755"},
            restart_policy={"Name": "unless-stopped"},
            labels={"corral": "egress"},
        )
        client.networks.get(LIMITED_NETWORK).connect(proxy, aliases=[EGRESS_CONTAINER])
        proxy.start()
    except docker.errors.APIError as exc:
        raise SandboxSetupError(f"could not set up the egress proxy for limited networking: {exc}") from exc


def gateway(client: docker.DockerClient, network: str) -> str:
    """The host's address on a Docker network: where a sandbox reaches services of the host (the git proxy)."""
    config = client.networks.get(network).attrs.get("IPAM", {}).get("Config") or [{}]
    address = config[0].get("Gateway")
    if not address:
        raise SandboxSetupError(f"the Docker network {network} has no gateway address")
    return str(address)


def refresh_policy(client: docker.DockerClient) -> dict[str, list[str]]:
    """Rewrite the proxy's allow lists from the running limited sandboxes; returns the policy written."""
    try:
        proxy = client.containers.get(EGRESS_CONTAINER)
    except docker.errors.NotFound:
        return {}
    policy: dict[str, list[str]] = {}
    for container in client.containers.list(filters={"label": ALLOWED_HOSTS_LABEL, "status": "running"}):
        address = _address(container)
        if address:
            policy[address] = json.loads(container.labels[ALLOWED_HOSTS_LABEL])
    encoded = base64.b64encode(json.dumps(policy).encode()).decode()
    write = (
        "import base64, os, sys\n"
        f"path = {EGRESS_POLICY!r}\n"
        "open(path + '.tmp', 'wb').write(base64.b64decode(sys.argv[1]))\n"
        "os.replace(path + '.tmp', path)\n"
    )
    result = proxy.exec_run(["python3", "-c", write, encoded])
    if result.exit_code != 0:
        raise SandboxSetupError(f"could not update the egress policy: {result.output!r}")
    return policy


def _address(container: Container) -> str | None:
    networks = container.attrs.get("NetworkSettings", {}).get("Networks", {})
    address = networks.get(LIMITED_NETWORK, {}).get("IPAddress")
    return str(address) if address else None
