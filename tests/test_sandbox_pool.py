"""The warm pool: started sandboxes claimed by one session each, on the real engine and the real dev server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import docker
import docker.errors
import pytest

from activities.sandbox import SandboxActivities
from corral.contract.sandbox import Environment, Networking, ResourceLimits
from corral.temporal import cluster_id
from sandbox import containers, sessions
from sandbox.cleanup import list_sandbox_resources, remove_pool_members
from sandbox.egress import ALLOWED_HOSTS_LABEL, EGRESS_NETWORK, NETWORK_LABEL, ensure_egress
from sandbox.networks import PARKING_NETWORK
from sandbox.pool import (
    CREATED_LABEL,
    MAKING_GRACE_SECONDS,
    MEMBER_PREFIX,
    POOL_LABEL,
    PoolSettings,
    WarmPool,
    pool_key,
)
from sandbox.runner import Runners
from sandbox.workspace import ONESHOT_LABEL
from tests.conftest import (
    Stack,
    assert_log_is_whole,
    remove_sandboxes,
    terminate_sessions,
    texts,
    unique,
    wait_for_idle,
)
from workers.roles import sandbox_workers
from workers.sandbox import keeping_filled

TOOLSET = [{"type": "agent_toolset_20260401"}]


def bash(command: str) -> dict[str, Any]:
    return {"tool_uses": [{"name": "bash", "input": {"command": command}}]}


def members(client: docker.DockerClient, scope: str) -> list[str]:
    """The unclaimed members of `scope`, running or not."""
    found = client.containers.list(all=True, filters={"label": [POOL_LABEL, f"{sessions.SCOPE_LABEL}={scope}"]})
    return sorted(str(c.name) for c in found if str(c.name).startswith(MEMBER_PREFIX))


async def fill(pool: WarmPool) -> None:
    while await pool.maintain_once():
        pass


def remove_scope(client: docker.DockerClient, scope: str) -> None:
    """Every container and volume a test's pools made, claimed or not."""
    for container in client.containers.list(all=True, filters={"label": f"{sessions.SCOPE_LABEL}={scope}"}):
        volume = sessions.workspace_mount(container)
        container.remove(force=True)
        if volume:
            client.volumes.get(volume).remove(force=True)
    for volume in client.volumes.list(filters={"label": f"{sessions.SCOPE_LABEL}={scope}"}):
        volume.remove(force=True)


@pytest.fixture
async def scope(docker_client: docker.DockerClient) -> AsyncIterator[str]:
    name = f"pool-test-{uuid.uuid4().hex[:8]}/default"
    yield name
    await asyncio.to_thread(remove_scope, docker_client, name)


def new_pool(client: docker.DockerClient, image: str, scope: str, size: int = 2, max_age: float = 3600) -> WarmPool:
    """A pool as one sandbox worker holds it: its own engine connection and its own runner streams."""
    engine = docker.from_env()  # the engine `docker_client` reached (the fixture started it if it had to)
    return WarmPool(engine, image, scope, Runners(engine), PoolSettings(size=size, max_age_seconds=max_age))


async def test_concurrent_claims_from_two_workers_never_share_a_member(
    docker_client: docker.DockerClient, sandbox_image: str, scope: str
) -> None:
    first, second = new_pool(docker_client, sandbox_image, scope, size=3), new_pool(docker_client, sandbox_image, scope)
    await fill(first)
    ready = members(docker_client, scope)
    assert len(ready) == 3
    claims = [
        pool.claim(f"owner-{n}", sessions.container_name(f"sess{n}", 0), Environment())
        for n, pool in enumerate([first, second] * 4)
    ]
    made = [m for m in await asyncio.gather(*claims) if m is not None]
    assert len(made) == 3, "every member claimed, by one claimant each"
    assert len({m.container_id for m in made}) == 3 and len({m.volume for m in made}) == 3
    assert first.stats.hits + second.stats.hits == 3 and first.stats.misses + second.stats.misses == 5
    for m in made:
        owner = m.container_name.removeprefix("corral-sess").removesuffix("-g0")
        answer = await first._runners.request(m.container_id, "claim", 10, owner="someone else")
        assert answer["owner"] == f"owner-{owner}", "the runner keeps the first claim"
        assert docker_client.containers.get(m.container_id).name == m.container_name
    assert members(docker_client, scope) == []


async def test_a_claim_applies_the_sessions_limits_and_a_recipe_the_pool_cannot_serve_is_not_served(
    docker_client: docker.DockerClient, sandbox_image: str, scope: str
) -> None:
    pool = new_pool(docker_client, sandbox_image, scope, size=1)
    await fill(pool)
    limited = Environment(networking=Networking(type="limited", allowed_hosts=["example.com"]))
    elsewhere = Environment(networking=Networking(type="limited", allowed_hosts=["example.org"]))
    assert pool_key(limited, sandbox_image) == pool_key(elsewhere, sandbox_image), "allow-lists are set at claim"
    assert pool_key(limited, sandbox_image) not in (None, pool_key(Environment(), sandbox_image))
    assert pool_key(Environment(packages={"pip": ["six"]}), sandbox_image) is None
    assert await pool.claim("b", "corral-b-g0", Environment(image="debian:bookworm")) is None
    assert pool.stats.misses == 0, "a recipe no pool serves is not a miss"
    other_tmp = Environment(limits=ResourceLimits(tmp_mb=32))
    assert pool_key(other_tmp, sandbox_image) != pool_key(Environment(), sandbox_image)
    assert await pool.claim("c", "corral-c-g0", other_tmp) is None, "no member was made for that /tmp size yet"
    assert pool.stats.misses == 1
    smaller = Environment(limits=ResourceLimits(memory_mb=256, cpus=0.5))
    made = await pool.claim("d", "corral-d-g0", smaller)
    assert made is not None and made.from_pool
    host = docker_client.containers.get(made.container_id).attrs["HostConfig"]
    assert (host["Memory"], host["CpuQuota"], host["CpuPeriod"]) == (256 * 1024 * 1024, 50_000, 100_000)
    await fill(pool)  # the recipe just seen gets a pool of its own
    assert len(members(docker_client, scope)) == 2


async def test_a_claim_while_a_member_is_being_made_waits_for_it(
    docker_client: docker.DockerClient, sandbox_image: str, scope: str
) -> None:
    pool = new_pool(docker_client, sandbox_image, scope, size=1)
    making = asyncio.ensure_future(pool.maintain_once())  # a worker that just started: its first member is coming
    for _ in range(200):
        if pool._making is not None:
            break
        await asyncio.sleep(0.01)
    assert pool._making is not None and not pool._making.done(), "the member must still be in the making"
    made = await pool.claim("owner", "corral-early-g0", Environment())
    assert made is not None and (pool.stats.hits, pool.stats.misses) == (1, 0)
    assert await making


async def test_stale_members_are_removed_and_claimed_ones_never_touched(
    docker_client: docker.DockerClient, sandbox_image: str, scope: str
) -> None:
    pool = new_pool(docker_client, sandbox_image, scope, size=2)
    await fill(pool)
    made = await pool.claim("owner", "corral-claimed-g0", Environment())
    assert made is not None
    old = members(docker_client, scope)
    assert len(old) == 1
    aged = new_pool(docker_client, sandbox_image, scope, size=2, max_age=0.001)  # everything is stale to it
    assert await aged._remove_one_stale()
    assert not await aged._remove_one_stale(), "the claimed member is not the pool's any more"
    assert members(docker_client, scope) == []
    with pytest.raises(docker.errors.NotFound):
        docker_client.volumes.get(containers.POOL_VOLUME_PREFIX + old[0].removeprefix("corral-"))
    assert docker_client.containers.get(made.container_id).status == "running"
    assert aged.stats.removed == 1


class WorkerKilled(BaseException):
    """Where a SIGKILL would have stopped the worker: nothing after it runs."""


def killed_while_preparing_the_volume(
    monkeypatch: pytest.MonkeyPatch, client: docker.DockerClient, image: str, scope: str, made_at: float
) -> tuple[str, str, str]:
    """Make a member as a worker SIGKILLed during the workspace's chown would leave it: the member created, not
    started, and the one-shot exited, still holding the volume (its `--rm` is done by the client, which died).
    `made_at` is the member's time of making. Returns the names of the member, its volume and the one-shot."""
    left: list[str] = []

    def chown_then_die(client: docker.DockerClient, volume: str, image: str) -> str:
        oneshot = client.containers.run(
            image, ["chown", "1000:1000", "/workspace"], user="0:0", network_mode="none", detach=True,
            volumes={volume: {"bind": "/workspace", "mode": "rw"}}, labels={ONESHOT_LABEL: volume},
        )  # fmt: skip
        oneshot.wait()
        left.append(str(oneshot.name))
        raise WorkerKilled

    monkeypatch.setattr(containers, "chown_workspace", chown_then_die)
    name = f"{MEMBER_PREFIX}{uuid.uuid4().hex[:12]}"
    labels = {POOL_LABEL: "key", sessions.SCOPE_LABEL: scope, CREATED_LABEL: f"{made_at:.0f}"}
    with pytest.raises(WorkerKilled):
        containers.make_pool_member(client, name, Environment(), image, labels)
    monkeypatch.undo()
    member = client.containers.get(name)
    volume = sessions.workspace_mount(member)
    assert member.status == "created" and volume is not None and volume.startswith(containers.POOL_VOLUME_PREFIX)
    assert client.volumes.get(volume).attrs["Labels"] == {sessions.SCOPE_LABEL: scope}
    return name, volume, left[0]


def gone(client: docker.DockerClient, *, containers: tuple[str, ...] = (), volumes: tuple[str, ...] = ()) -> bool:
    for lookup, names in ((client.containers.get, containers), (client.volumes.get, volumes)):
        for name in names:
            try:
                lookup(name)
                return False
            except docker.errors.NotFound:
                continue
    return True


async def test_a_member_a_killed_worker_left_half_made_is_removed_with_its_volume_and_one_shot(
    monkeypatch: pytest.MonkeyPatch, docker_client: docker.DockerClient, sandbox_image: str, scope: str
) -> None:
    made_at = time.time() - 2 * MAKING_GRACE_SECONDS
    name, volume, oneshot = killed_while_preparing_the_volume(monkeypatch, docker_client, sandbox_image, scope, made_at)
    listed = list_sandbox_resources(docker_client, scope)
    assert {name, oneshot} <= set(listed.containers) and volume in listed.volumes
    pool = new_pool(docker_client, sandbox_image, scope, size=0)
    assert await pool._remove_one_stale(), "a member that is not running and past the making's grace is stale"
    assert gone(docker_client, containers=(name, oneshot), volumes=(volume,))


async def test_a_member_not_yet_started_by_its_worker_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, docker_client: docker.DockerClient, sandbox_image: str, scope: str
) -> None:
    # As another worker sees a member being made now, between its create and its start.
    name, volume, oneshot = killed_while_preparing_the_volume(
        monkeypatch, docker_client, sandbox_image, scope, made_at=time.time()
    )
    pool = new_pool(docker_client, sandbox_image, scope, size=0)
    assert not await pool._remove_one_stale()
    assert not gone(docker_client, containers=(name, oneshot), volumes=(volume,))
    removed = await asyncio.to_thread(remove_pool_members, docker_client, scope)  # corral down: no worker runs
    assert set(removed.containers) == {name, oneshot} and removed.volumes == (volume,)
    assert gone(docker_client, containers=(name, oneshot), volumes=(volume,))


async def test_a_new_worker_claims_the_members_an_earlier_one_made(
    docker_client: docker.DockerClient, sandbox_image: str, scope: str
) -> None:
    earlier = new_pool(docker_client, sandbox_image, scope, size=1)
    await fill(earlier)
    earlier._runners.close()  # the worker is gone; its member runs on
    later = new_pool(docker_client, sandbox_image, scope, size=1)
    made = await later.claim("owner", "corral-later-g0", Environment())
    assert made is not None
    answer = await later._runners.request(made.container_id, "bash", 30, call="c1", command="id -u; pwd",
                                          workdir="/workspace", timeout=10, head=100, tail=100)  # fmt: skip
    assert answer["output"] == "1000\n/workspace\n"


async def test_a_stopping_worker_removes_the_members_it_made_and_leaves_the_others(
    docker_client: docker.DockerClient, sandbox_image: str, scope: str
) -> None:
    other = new_pool(docker_client, sandbox_image, scope, size=1)
    await fill(other)
    stopping = new_pool(docker_client, sandbox_image, scope, size=2)
    await fill(stopping)  # makes one more: the other worker's member counts towards the size
    assert len(members(docker_client, scope)) == 2
    assert await stopping.drain() == 1
    assert members(docker_client, scope) == [other._ready[next(iter(other._ready))][0].name]


async def test_corral_down_removes_idle_members_and_keeps_claimed_ones_and_their_workspace(
    docker_client: docker.DockerClient, sandbox_image: str, scope: str
) -> None:
    pool = new_pool(docker_client, sandbox_image, scope, size=2)
    await fill(pool)
    made = await pool.claim("owner", "corral-claimed-g0", Environment())
    assert made is not None and len(members(docker_client, scope)) == 1
    removed = await asyncio.to_thread(remove_pool_members, docker_client, scope)
    assert len(removed.containers) == 1 and removed.volumes[0].startswith(containers.POOL_VOLUME_PREFIX)
    assert members(docker_client, scope) == []
    assert docker_client.containers.get(made.container_id).status == "running"
    assert docker_client.volumes.get(made.volume).name == made.volume


@pytest.fixture
async def pool_stack(stack: Stack, docker_client: docker.DockerClient, sandbox_image: str) -> AsyncIterator[Stack]:
    """`stack` plus a sandbox hand with a warm pool of one, kept filled in the background."""
    activities = SandboxActivities(
        docker_client, sandbox_image, await cluster_id(stack.client), pool=PoolSettings(size=1)
    )
    assert activities.pool is not None
    stack.pool = activities.pool  # type: ignore[attr-defined]
    try:
        async with AsyncExitStack() as workers, keeping_filled(activities.pool):
            for worker in sandbox_workers(stack.client, activities):
                await workers.enter_async_context(worker)
            yield stack
            await terminate_sessions(stack.started)
    finally:
        remove_sandboxes(docker_client, stack.started)
        await activities.pool.remove_unclaimed()


async def test_a_session_gets_a_warm_sandbox_whose_workspace_outlives_its_container_and_goes_with_it(
    pool_stack: Stack, docker_client: docker.DockerClient
) -> None:
    pool: WarmPool = pool_stack.pool  # type: ignore[attr-defined]
    for _ in range(600):
        if pool.stats.made:
            break
        await asyncio.sleep(0.1)
    model = pool_stack.script(
        [
            bash("echo kept > note; pkill -KILL -x corral-runner; sleep 30"),
            bash("cat note"),
            {"text": "done"},
        ]
    )
    handle = await pool_stack.start(model, message="go", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=120)
    assert pool.stats.hits == 1
    results = texts(events, "agent.tool_result")
    assert results[1] == "kept", "the second container mounts the pool member's workspace"
    session = sessions.session_containers(docker_client, handle.id)
    assert len(session) == 2
    volumes = {sessions.workspace_mount(c) for c in session}
    assert len(volumes) == 1 and str(next(iter(volumes))).startswith(containers.POOL_VOLUME_PREFIX)
    assert_log_is_whole(events)
    scope = f"{await cluster_id(pool_stack.client)}/default"
    assert handle.id in sessions.session_ids_with_containers(docker_client, scope), "the reaper sees the session"
    await handle.cancel()
    volume = str(volumes.pop())
    for _ in range(200):  # the release removes the containers, then the volume
        if not sessions.session_containers(docker_client, handle.id) and gone(docker_client, volumes=(volume,)):
            break
        await asyncio.sleep(0.1)
    assert sessions.session_containers(docker_client, handle.id) == []
    with pytest.raises(docker.errors.NotFound):
        docker_client.volumes.get(volume)


async def test_with_the_pool_off_a_first_call_provisions_as_before(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    model = sandbox_stack.script([bash("pwd"), {"text": "done"}])
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=120)
    assert texts(events, "agent.tool_result") == ["/workspace"]
    [container] = sessions.session_containers(docker_client, handle.id)
    assert container.labels[sessions.SESSION_LABEL] == handle.id and POOL_LABEL not in container.labels
    assert sessions.workspace_mount(container) == sessions.volume_name(handle.id)


async def ready_for(pool: WarmPool, environment: Environment) -> None:
    """Until a member for `environment`'s recipe waits in the pool (the pool learnt the recipe from a claim)."""
    key = pool_key(environment, pool._image)
    assert key is not None
    for _ in range(600):
        if await asyncio.to_thread(pool._members, key):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("no member was made for the recipe")


def own_networks(client: docker.DockerClient, container_id: str) -> dict[str, dict[str, str]]:
    """The networks the container is on, each with its labels."""
    attached = client.containers.get(container_id).attrs["NetworkSettings"]["Networks"]
    return {name: client.networks.get(name).attrs.get("Labels") or {} for name in attached}


async def test_a_recipe_with_networking_gets_a_warm_sandbox_on_a_network_of_its_own_with_its_allow_list(
    pool_stack: Stack, docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    """A limited recipe is served cold the first time, which teaches the pool the recipe; the next session of it
    gets a warm member, moved off the parking network onto one of the session's own, whose allow-list (its own,
    not the first session's) the egress proxy applies. The same for an unrestricted recipe."""
    pool: WarmPool = pool_stack.pool  # type: ignore[attr-defined]
    names = {kind: unique(f"corral-test-{kind}") for kind in ("first", "second")}
    ensure_egress(docker_client, sandbox_image)
    servers = [
        docker_client.containers.run(
            sandbox_image,
            ["python3", "-m", "http.server", "8000"],
            name=name,
            network=EGRESS_NETWORK,
            detach=True,
            remove=True,
        )
        for name in names.values()
    ]
    probe = (
        f"curl -s -o /dev/null -w '%{{http_code}} ' http://{names['first']}:8000/; "
        f"curl -s -o /dev/null -w '%{{http_code}} ' http://{names['second']}:8000/; "
        f"curl -s --noproxy '*' --max-time 3 http://{names['second']}:8000/ >/dev/null && echo direct || echo blocked"
    )

    async def session(networking: dict[str, Any], command: str) -> tuple[str, str]:
        model = pool_stack.script([bash(command), {"text": "done"}])
        handle = await pool_stack.start(model, message="go", tools=TOOLSET, environment={"networking": networking})
        events = await wait_for_idle(handle, within_seconds=120)
        assert_log_is_whole(events)
        [result] = texts(events, "agent.tool_result")
        [container] = sessions.session_containers(docker_client, handle.id)
        return result, str(container.id)

    try:
        hits = pool.stats.hits
        first, _ = await session({"type": "limited", "allowed_hosts": [names["first"]]}, probe)
        assert first.split() == ["200", "403", "blocked"], first
        assert pool.stats.hits == hits, "the first session of a recipe is served cold"
        await ready_for(pool, Environment.model_validate({"networking": {"type": "limited", "allowed_hosts": ["x"]}}))
        second, container_id = await session({"type": "limited", "allowed_hosts": [names["second"]]}, probe)
        assert pool.stats.hits == hits + 1
        assert second.split() == ["403", "200", "blocked"], second
        [(network, labels)] = own_networks(docker_client, container_id).items()
        assert network == docker_client.containers.get(container_id).name and network != PARKING_NETWORK
        assert json.loads(labels[ALLOWED_HOSTS_LABEL]) == [names["second"]]

        unrestricted = {"type": "unrestricted"}
        await session(unrestricted, "true")
        await ready_for(pool, Environment.model_validate({"networking": unrestricted}))
        result, container_id = await session(unrestricted, "echo warm")
        assert result == "warm" and pool.stats.hits == hits + 2
        [(network, labels)] = own_networks(docker_client, container_id).items()
        assert network == docker_client.containers.get(container_id).name
        assert labels[NETWORK_LABEL] == "unrestricted"
    finally:
        for server in servers:
            with contextlib.suppress(docker.errors.APIError):
                server.kill()
