"""The sandboxes on an engine listed, then one stack's removed at once (`corral down --sandboxes`), on the real
engine: the sessions' containers and workspace volumes go, the images stay, and the egress proxy and its networks go
with the last sandbox. Removal is always scoped here: other stacks (a developer's `corral up`, another test run)
may share the engine, and their sandboxes must survive this test.
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
from sandbox import SandboxResources, connect_docker, list_sandbox_resources, remove_all_sandboxes
from sandbox.cleanup import SHARED_NETWORKS
from sandbox.containers import ensure_container
from sandbox.egress import EGRESS_CONTAINER, EGRESS_NETWORK
from sandbox.sessions import remove_session
from sandbox.workspace import ONESHOT_LABEL

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


def test_removing_one_stacks_sandboxes_leaves_the_others_and_keeps_the_images(
    docker_client: docker.DockerClient, sandbox_image: str, made: Made
) -> None:
    """`corral down --sandboxes` removes the sandboxes of its own Temporal server (the `corral.scope` label): a
    running limited sandbox and a stopped later generation of it, with their workspace volume and their own
    networks. Another stack's sandbox on the same engine stays, and so does the egress proxy while any other sandbox
    may need it."""
    ours_scope, their_scope = f"test-{uuid.uuid4().hex[:8]}/default", f"test-{uuid.uuid4().hex[:8]}/default"
    images = {image.id for image in docker_client.images.list()}
    session_id = made.session()
    running = ensure_container(docker_client, session_id, LIMITED, 0, sandbox_image, scope=ours_scope)
    stopped = ensure_container(docker_client, session_id, LIMITED, 1, sandbox_image, scope=ours_scope)
    docker_client.containers.get(stopped.container_name).stop(timeout=1)
    theirs = ensure_container(docker_client, made.session(), Environment(), 0, sandbox_image, scope=their_scope)

    listed = list_sandbox_resources(docker_client, ours_scope)
    removed = remove_all_sandboxes(docker_client, ours_scope)

    assert listed == removed
    assert {running.container_name, stopped.container_name} <= set(removed.containers)
    assert theirs.container_name not in removed.containers and theirs.volume not in removed.volumes
    assert removed.volumes == (running.volume,)
    assert sorted(removed.networks) == sorted([running.container_name, stopped.container_name]), "their own networks"
    assert EGRESS_CONTAINER not in removed.containers, "another sandbox may still need it"
    for name in removed.networks:
        with pytest.raises(docker.errors.NotFound):
            docker_client.networks.get(name)
    for name in (running.container_name, stopped.container_name):
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(name)
    with pytest.raises(docker.errors.NotFound):
        docker_client.volumes.get(running.volume)
    assert docker_client.containers.get(theirs.container_name).status == "running"
    assert images <= {image.id for image in docker_client.images.list()}, "an image was removed"
    assert remove_all_sandboxes(docker_client, ours_scope).empty, "a second run finds nothing"

    # The last stack's sandboxes go with the egress proxy and its networks, once no sandbox of any stack is left.
    left = remove_all_sandboxes(docker_client, their_scope)
    others = list_sandbox_resources(docker_client)
    if not [name for name in others.containers if name != EGRESS_CONTAINER]:
        assert EGRESS_CONTAINER in left.containers and set(left.networks) <= set(SHARED_NETWORKS)
        assert EGRESS_NETWORK in left.networks
    else:  # another stack (a demo left running, a test run beside this one) still has a sandbox here
        assert EGRESS_CONTAINER not in left.containers


def left_by_a_killed_worker(client: docker.DockerClient, image: str, volume: str) -> str:
    """The one-shot that prepares `volume`, as a worker SIGKILLed while it ran leaves it: exited (its `--rm` is the
    client's, and the client died), still holding the volume. Its name."""
    oneshot = client.containers.run(
        image, ["true"], network_mode="none", detach=True, volumes={volume: {"bind": "/workspace", "mode": "rw"}},
        labels={ONESHOT_LABEL: volume},
    )  # fmt: skip
    oneshot.wait()
    return str(oneshot.name)


def test_a_one_shot_left_by_a_killed_worker_is_listed_and_removed_before_its_volume(
    docker_client: docker.DockerClient, sandbox_image: str, made: Made
) -> None:
    scope = f"test-{uuid.uuid4().hex[:8]}/default"
    session_id = made.session()
    sandbox = ensure_container(docker_client, session_id, Environment(), 0, sandbox_image, scope=scope)
    oneshot = left_by_a_killed_worker(docker_client, sandbox_image, sandbox.volume)
    with pytest.raises(docker.errors.APIError, match="in use"):
        docker_client.volumes.get(sandbox.volume).remove()  # what held clean-ups up before

    assert oneshot in list_sandbox_resources(docker_client).containers
    removed = remove_all_sandboxes(docker_client, scope)

    assert set(removed.containers) == {sandbox.container_name, oneshot} and removed.volumes == (sandbox.volume,)
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(oneshot)


def test_a_session_released_takes_the_one_shot_left_on_its_volume(
    docker_client: docker.DockerClient, sandbox_image: str, made: Made
) -> None:
    session_id = made.session()
    sandbox = ensure_container(docker_client, session_id, Environment(), 0, sandbox_image, scope="test/cleanup")
    oneshot = left_by_a_killed_worker(docker_client, sandbox_image, sandbox.volume)

    assert remove_session(docker_client, session_id, remove_volume=True) == 1, "the one-shot is not the session's"

    for lookup, name in ((docker_client.containers.get, oneshot), (docker_client.volumes.get, sandbox.volume)):
        with pytest.raises(docker.errors.NotFound):
            lookup(name)


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
