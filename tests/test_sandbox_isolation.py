"""Sandboxes cannot reach each other, in any networking mode, on the real Docker engine: a server runs in one, a
client in the other asks for it by container name and by address, past the egress proxy, and gets nothing. Each
still reaches what it should: a limited sandbox its allowed hosts through the proxy (and no others), an
unrestricted one the host, routed. Each sandbox's network goes with it, and the reaper removes an orphaned one.
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import docker
import docker.errors
import docker.types
import pytest
from docker.models.containers import Container

from corral.contract.sandbox import Environment
from sandbox import list_sandbox_resources, remove_all_sandboxes
from sandbox.containers import Provisioned, ensure_container
from sandbox.egress import EGRESS_CONTAINER, EGRESS_NETWORK, refresh_policy
from sandbox.networks import SUBNET_POOL, ensure_network, preferred_slot, subnets
from sandbox.sessions import remove_session, session_ids_with_containers
from sandbox.workspace import SANDBOX_GID, SANDBOX_UID
from tests.conftest import unique

SCOPE = "test-isolation/default"
ALLOWED = {"allowed_hosts": ["example.invalid"]}


@dataclass
class Sandboxes:
    """Sessions and networks a test made, removed at its end whatever the test did."""

    client: docker.DockerClient
    image: str
    sessions: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)

    def make(self, networking: str, **extra: object) -> Provisioned:
        self.sessions.append(f"sesn_{uuid.uuid4().hex[:26]}")
        environment = Environment.model_validate({"networking": {"type": networking, **extra}})
        return ensure_container(self.client, self.sessions[-1], environment, 0, self.image, scope=SCOPE)


@pytest.fixture
def sandboxes(docker_client: docker.DockerClient, sandbox_image: str) -> Iterator[Sandboxes]:
    made = Sandboxes(docker_client, sandbox_image)
    yield made
    for session_id in made.sessions:
        remove_session(docker_client, session_id, remove_volume=True)
    for name in made.networks:
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.networks.get(name).remove()


def sh(container: Container, script: str) -> str:
    result = container.exec_run(["bash", "-c", script], user=f"{SANDBOX_UID}:{SANDBOX_GID}")
    return str(result.output.decode(errors="replace"))


def serve_canary(container: Container) -> str:
    """Serve a canary from the sandbox's workspace on port 8000; the canary, once the server answers there."""
    canary = f"canary-{uuid.uuid4().hex}"
    container.exec_run(
        [
            "bash",
            "-c",
            f"mkdir -p /workspace/site && echo {canary} > /workspace/site/c.txt && cd /workspace/site && "
            "exec python3 -m http.server 8000",
        ],
        user=f"{SANDBOX_UID}:{SANDBOX_GID}",
        detach=True,
    )
    served = sh(
        container,
        "for i in $(seq 100); do curl -sf --noproxy '*' http://127.0.0.1:8000/c.txt && break; sleep 0.1; done",
    )
    assert served.strip() == canary, f"the server must be up for the probe to mean anything: {served!r}"
    return canary


def address(client: docker.DockerClient, name: str) -> str:
    networks = client.containers.get(name).attrs["NetworkSettings"]["Networks"]
    [settings] = networks.values()
    return str(settings["IPAddress"])


def direct(target: str) -> str:
    """Ask for the canary past any proxy; the answer and curl's exit code."""
    return f"curl -s --noproxy '*' --max-time 3 http://{target}:8000/c.txt; echo \" curl exit $?\"; "


@pytest.mark.parametrize(
    ("server_mode", "client_mode"),
    [
        ("limited", "limited"),
        ("unrestricted", "unrestricted"),
        ("unrestricted", "limited"),
        ("limited", "unrestricted"),
    ],
)
def test_a_sandbox_cannot_reach_a_server_in_another_by_name_or_address(
    sandboxes: Sandboxes, server_mode: str, client_mode: str
) -> None:
    client = sandboxes.client
    server = sandboxes.make(server_mode, **(ALLOWED if server_mode == "limited" else {}))
    victim_address = address(client, server.container_name)
    # The attacker's allow list names the victim's address: even so, the proxy must not lead to another sandbox.
    attacker = sandboxes.make(client_mode, **({"allowed_hosts": [victim_address]} if client_mode == "limited" else {}))
    canary = serve_canary(client.containers.get(server.container_name))

    probes = direct(server.container_name) + direct(victim_address)
    if client_mode == "limited":  # and through the egress proxy, by name and by address
        probes += f'curl -s --max-time 5 http://{server.container_name}:8000/c.txt; echo " proxy exit $?"; '
        probes += f'curl -s --max-time 5 http://{victim_address}:8000/c.txt; echo " proxy exit $?"'
    answer = sh(client.containers.get(attacker.container_name), probes)

    assert canary not in answer and answer.count("curl exit") == 2, answer
    if client_mode == "limited":  # no route at all; an unrestricted sandbox's packets to an address that is not
        # on the host (a limited sandbox's network has no address there) follow its default route out, and what
        # answers out there is not the victim (the canary above)
        assert "curl exit 0" not in answer, answer
    for network in client.containers.get(attacker.container_name).attrs["NetworkSettings"]["Networks"]:
        assert network == attacker.container_name, "a sandbox sits alone on a network of its own"


def test_limited_sandboxes_each_get_their_own_allow_list_through_the_proxy(
    sandboxes: Sandboxes, docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    """The proxy tells sandboxes apart by source address, now on networks of their own: each is let through to
    its own allowed host only, by the proxy's name that HTTP(S)_PROXY uses."""
    names = [unique("corral-test-web") for _ in range(2)]
    first = sandboxes.make("limited", allowed_hosts=[names[0]])
    second = sandboxes.make("limited", allowed_hosts=[names[1]])
    servers = [
        docker_client.containers.run(
            sandbox_image, ["python3", "-m", "http.server", "8000"], name=name, network=EGRESS_NETWORK, detach=True
        )
        for name in names
    ]
    try:
        probe = "".join(
            f"curl -s -o /dev/null -w '%{{http_code}} ' --retry 20 --retry-connrefused --retry-delay 0 "
            f"--max-time 10 http://{name}:8000/; "
            for name in names
        )
        assert sh(docker_client.containers.get(first.container_name), probe).split() == ["200", "403"]
        assert sh(docker_client.containers.get(second.container_name), probe).split() == ["403", "200"]
        policy = refresh_policy(docker_client)
        assert policy[address(docker_client, first.container_name)] == [names[0]]
        assert policy[address(docker_client, second.container_name)] == [names[1]]
    finally:
        for server in servers:
            server.remove(force=True)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from the host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def host_server() -> Iterator[int]:
    """An HTTP server of the host on every address; its port."""
    host = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Hello)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    yield host.server_address[1]
    host.shutdown()
    host.server_close()


def test_an_unrestricted_sandbox_is_routed_out(
    sandboxes: Sandboxes, docker_client: docker.DockerClient, host_server: int
) -> None:
    """Routed, as before: a default route, and the host reached at its network's gateway (where the git proxy is)."""
    sandbox = sandboxes.make("unrestricted")
    network = docker_client.networks.get(sandbox.container_name)
    gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
    assert ipaddress.ip_address(gateway) in SUBNET_POOL and not network.attrs["Internal"]
    answer = sh(
        docker_client.containers.get(sandbox.container_name),
        f"curl -s --max-time 10 http://{gateway}:{host_server}/; echo; "
        'awk \'$2 == "00000000" {print "default route"}\' /proc/net/route',
    )
    assert answer.split("\n")[:2] == ["hello from the host", "default route"], answer


def test_a_limited_sandbox_cannot_reach_the_host_at_its_gateway(
    sandboxes: Sandboxes, docker_client: docker.DockerClient, host_server: int
) -> None:
    """A host service listening on every address is no way out past the egress proxy (it was, at the internal
    network's gateway address, which the host held)."""
    sandbox = sandboxes.make("limited", **ALLOWED)
    gateway = docker_client.networks.get(sandbox.container_name).attrs["IPAM"]["Config"][0]["Gateway"]
    answer = sh(
        docker_client.containers.get(sandbox.container_name),
        f"curl -s --noproxy '*' --max-time 3 http://{gateway}:{host_server}/; echo \" curl exit $?\"",
    )
    assert "hello from the host" not in answer and "curl exit 0" not in answer, answer


def test_a_sandbox_network_goes_with_its_sandbox_and_the_proxy_leaves_it(
    sandboxes: Sandboxes, docker_client: docker.DockerClient
) -> None:
    sandbox = sandboxes.make("limited", **ALLOWED)
    attached = docker_client.networks.get(sandbox.container_name).attrs["Containers"]
    assert {endpoint["Name"] for endpoint in attached.values()} == {sandbox.container_name, EGRESS_CONTAINER}
    assert docker_client.networks.get(sandbox.container_name).attrs["Internal"]

    remove_session(docker_client, sandboxes.sessions[-1], remove_volume=True)

    with pytest.raises(docker.errors.NotFound):
        docker_client.networks.get(sandbox.container_name)
    proxy_networks = docker_client.containers.get(EGRESS_CONTAINER).attrs["NetworkSettings"]["Networks"]
    assert sandbox.container_name not in proxy_networks


def test_an_orphaned_sandbox_network_is_found_by_the_reaper_and_by_corral_down(
    sandboxes: Sandboxes, docker_client: docker.DockerClient
) -> None:
    """A worker that died between making a sandbox's network and its container left the network alone: the
    reaper sees its session (and removes it with the session), and `corral down --sandboxes` lists it."""
    scope = f"test-{uuid.uuid4().hex[:8]}/default"
    reaped, downed = f"sesn_{uuid.uuid4().hex[:26]}", f"sesn_{uuid.uuid4().hex[:26]}"
    for session_id in (reaped, downed):
        sandboxes.sessions.append(session_id)
        name = f"corral-{session_id}-g0"
        ensure_network(docker_client, name, "limited", {"corral.session": session_id, "corral.scope": scope})

    assert session_ids_with_containers(docker_client, scope) == {reaped, downed}
    remove_session(docker_client, reaped, remove_volume=True)
    assert session_ids_with_containers(docker_client, scope) == {downed}
    assert f"corral-{downed}-g0" in list_sandbox_resources(docker_client).networks
    removed = remove_all_sandboxes(docker_client, scope).networks
    assert f"corral-{downed}-g0" in removed and f"corral-{reaped}-g0" not in removed, removed
    assert session_ids_with_containers(docker_client, scope) == set()


def test_subnets_are_chosen_by_name_and_taken_ones_are_skipped_even_in_a_race(
    sandboxes: Sandboxes, docker_client: docker.DockerClient
) -> None:
    """Two workers making networks whose names prefer the same subnet, at once, while another network already
    holds that subnet: each gets a subnet of its own, out of the pool."""
    pool = subnets()
    first = unique("corral-test-net")
    slot = preferred_slot(first, len(pool))
    second = next(
        name for name in (unique("corral-test-net") for _ in range(100_000)) if preferred_slot(name, len(pool)) == slot
    )
    blocker = unique("corral-test-blocker")
    sandboxes.networks += [blocker, first, second]
    ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(pool[slot]))])
    docker_client.networks.create(blocker, driver="bridge", internal=True, ipam=ipam)

    with ThreadPoolExecutor(2) as threads:
        made = list(threads.map(lambda name: ensure_network(docker_client, name, "limited", {}), [first, second]))

    chosen = [ipaddress.IPv4Network(network.attrs["IPAM"]["Config"][0]["Subnet"]) for network in made]
    assert len(set(chosen)) == 2 and pool[slot] not in chosen, chosen
    assert all(subnet.subnet_of(SUBNET_POOL) for subnet in chosen)


def test_a_sandbox_made_on_a_shared_network_before_the_upgrade_is_made_again_on_its_own(
    sandboxes: Sandboxes, docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    """A stopped sandbox of an earlier corral sits on the engine's shared bridge: started again as it is, it could
    reach its neighbours. It is made again on a network of its own, and its workspace is kept."""
    first = sandboxes.make("unrestricted")
    session_id = sandboxes.sessions[-1]
    sh(docker_client.containers.get(first.container_name), "echo kept > /workspace/mark")
    docker_client.containers.get(first.container_name).remove(force=True)
    docker_client.networks.get(first.container_name).remove()
    labels = {"corral.session": session_id, "corral.generation": "0", "corral.scope": SCOPE}
    docker_client.containers.create(
        sandbox_image, ["sleep", "infinity"], name=first.container_name, labels=labels, network_mode="bridge"
    )

    again = ensure_container(
        docker_client,
        session_id,
        Environment.model_validate({"networking": {"type": "unrestricted"}}),
        0,
        sandbox_image,
    )

    container = docker_client.containers.get(again.container_name)
    assert list(container.attrs["NetworkSettings"]["Networks"]) == [again.container_name]
    assert sh(container, "cat /workspace/mark").strip() == "kept"
