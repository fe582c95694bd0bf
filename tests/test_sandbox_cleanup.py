"""Every sandbox on the engine listed, then removed at once (`corral down --sandboxes`), on the real engine: the
sessions' containers and workspace volumes, the egress proxy and its networks go; the images stay.

`remove_all_sandboxes` clears the whole engine, so the test of it runs only on an engine that holds no other
sandbox: on a developer's machine it would otherwise destroy the workspaces of their `corral up` sessions, or
the sandboxes of another test run going on beside this one.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import docker
import docker.errors
import pytest

from corral.contract.sandbox import Environment
from corral.sandbox import SandboxResources, connect_docker, list_sandbox_resources, remove_all_sandboxes
from corral.sandbox.cleanup import EGRESS_NETWORKS
from corral.sandbox.containers import SESSION_LABEL, ensure_container, remove_session, volume_name
from corral.sandbox.egress import EGRESS_CONTAINER

LIMITED = Environment.model_validate({"networking": {"type": "limited", "allowed_hosts": ["example.invalid"]}})


@dataclass
class Made:
    """What a test made, removed at its end whatever the test did."""

    sessions: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)

    def session(self) -> str:
        self.sessions.append(f"sesn_{uuid.uuid4().hex[:26]}")
        return self.sessions[-1]


@pytest.fixture
def made(docker_client: docker.DockerClient) -> Iterator[Made]:
    made = Made()
    yield made
    for session_id in made.sessions:
        remove_session(docker_client, session_id, remove_volume=True)
    for name in made.volumes:
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.volumes.get(name).remove(force=True)


def test_the_listing_finds_a_sandbox_and_removes_nothing(
    docker_client: docker.DockerClient, sandbox_image: str, made: Made
) -> None:
    sandbox = ensure_container(docker_client, made.session(), Environment(), 0, sandbox_image, scope="test/cleanup")

    found = list_sandbox_resources(docker_client)

    assert sandbox.container_name in found.containers and sandbox.volume in found.volumes
    assert docker_client.containers.get(sandbox.container_name).status == "running"
    assert docker_client.volumes.get(sandbox.volume)


def test_remove_all_sandboxes_removes_sandboxes_volumes_and_the_egress_and_keeps_the_images(
    docker_client: docker.DockerClient, sandbox_image: str, made: Made
) -> None:
    others = list_sandbox_resources(docker_client)
    if [name for name in others.containers if name != EGRESS_CONTAINER] or others.volumes:
        pytest.skip(f"the engine holds other sandboxes, which this would remove: {others}")
    images = {image.id for image in docker_client.images.list()}
    # A running limited sandbox (with the egress proxy and its networks), a stopped later generation of it, and
    # two volumes that only one of the two marks makes a workspace: the label, or the name.
    session_id = made.session()
    running = ensure_container(docker_client, session_id, LIMITED, 0, sandbox_image, scope="test/cleanup")
    stopped = ensure_container(docker_client, session_id, LIMITED, 1, sandbox_image, scope="test/cleanup")
    docker_client.containers.get(stopped.container_name).stop(timeout=1)
    made.volumes += [f"corral-test-{uuid.uuid4().hex[:10]}", volume_name(made.session())]
    docker_client.volumes.create(made.volumes[0], labels={SESSION_LABEL: session_id})
    docker_client.volumes.create(made.volumes[1])
    ours = SandboxResources(
        containers=(running.container_name, stopped.container_name, EGRESS_CONTAINER),
        volumes=(running.volume, *made.volumes),
        networks=tuple(EGRESS_NETWORKS),
    )

    removed = remove_all_sandboxes(docker_client)

    assert set(ours.containers) <= set(removed.containers), removed
    assert removed.containers[-1] == EGRESS_CONTAINER, "the proxy goes after the sandboxes that use it"
    assert set(ours.volumes) <= set(removed.volumes), removed
    assert sorted(removed.networks) == sorted(ours.networks)
    left = list_sandbox_resources(docker_client)
    assert not {*left.containers, *left.volumes, *left.networks} & {*ours.containers, *ours.volumes, *ours.networks}
    for name in ours.containers:
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(name)
    assert images <= {image.id for image in docker_client.images.list()}, "an image was removed"
    assert docker_client.images.get(sandbox_image)

    again = remove_all_sandboxes(docker_client)
    assert not {*again.containers, *again.volumes, *again.networks} & {*ours.containers, *ours.volumes}


def test_the_description_counts_what_there_is() -> None:
    assert SandboxResources().empty and SandboxResources().describe() == "no sandboxes"
    assert SandboxResources(volumes=("v",)).describe() == "1 workspace volume"
    two_kinds = SandboxResources(containers=("a",), networks=("n1", "n2"))
    assert not two_kinds.empty and two_kinds.describe() == "1 container and 2 networks"
    every_kind = SandboxResources(("a", "b"), ("v",), ("n",))
    assert every_kind.describe() == "2 containers, 1 workspace volume and 1 network"


def test_no_engine_answering_is_none_and_none_is_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix:///tmp/corral-no-engine-{uuid.uuid4().hex[:8]}.sock")
    assert connect_docker(ping_timeout=1) is None
