"""The warm pool: started sandboxes, each with a fresh workspace volume, waiting for a session's first tool call.

A member is made exactly as a session's sandbox is (hardened options, resident runner, its own workspace volume),
but named `corral-pool-<id>` and labelled with the pool key of the recipe it serves. A session claims one through
the member's runner: the runner answers every `claim` with the first owner it was given, so a member goes to one
session only, even when several sandbox workers share the engine and race for it. The winner renames it to the
session's container name, applies the session's memory and CPU limits with `docker update`, and the session's
handle records the member's volume as its workspace.

Which recipes a pool serves: those with the default image and no packages (the default recipe, and others
differing in limits, working directory or networking). A recipe with packages or an image of its own is provisioned
as before. The pool's key covers what cannot change after create (image, /tmp size, process limit, working
directory, and the networking type: a `limited` sandbox's processes see the egress proxy in their environment);
memory and CPU are applied at claim. A member with networking waits on the parking network, which reaches nothing;
at claim it joins a network of the session's own (with the allow-list of a `limited` recipe as that network's
label) and leaves the parking one, then the session's repositories are cloned into it
(`containers.settle_claimed`).

No Temporal here: the sandbox worker runs `WarmPool.maintain` beside its workers and asks `claim` from
`provision_sandbox`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import docker
import docker.errors
from docker.models.containers import Container

from corral.contract.sandbox import Environment
from sandbox import containers, sessions, workspace
from sandbox.errors import SandboxError
from sandbox.runner import RunnerLost, Runners

log = logging.getLogger(__name__)
T = TypeVar("T")

POOL_LABEL = "corral.pool"
"""On pool members: the key of the recipe they serve."""
CREATED_LABEL = "corral.pool.created"
"""When the member was made (Unix seconds): its age, without parsing the engine's timestamps."""
MEMBER_PREFIX = "corral-pool-"
RECENT_SECONDS = 30 * 60
"""A recipe seen in a claim within this time gets a pool of its own (besides the default recipe's)."""
MAX_POOLS = 4
CLAIM_WAIT_SECONDS = 5.0
MAKING_WAIT_SECONDS = 5.0
"""How long a claim that found no member waits for one of its recipe that is being made."""
IDLE_SECONDS = 1.0
"""How often the maintenance loop looks again when there is nothing to do (a claim wakes it at once)."""
FAILED_PAUSE_SECONDS = 10.0
MAKING_GRACE_SECONDS = 60.0
"""A member not running is being made (another worker's, between create and start) until this old: making one
takes well under a second."""


@dataclass(frozen=True)
class PoolSettings:
    size: int = 2
    """Started members kept ready per recipe; 0 turns the pool off."""
    max_age_seconds: float = 3600.0
    """A member older than this is removed and made again (a fresh one picks up a rebuilt image)."""

    @property
    def enabled(self) -> bool:
        return self.size > 0


@dataclass
class PoolStats:
    hits: int = 0
    misses: int = 0
    """Claims the pool could have served but had no member for (a recipe it cannot serve is not counted)."""
    made: int = 0
    removed: int = 0

    @property
    def hit_rate(self) -> float | None:
        total = self.hits + self.misses
        return self.hits / total if total else None


def pool_key(environment: Environment, image: str) -> str | None:
    """The key of the pool that serves `environment` with the default `image`; None when no pool can."""
    if environment.image or not environment.packages.empty():
        return None
    limits, networking = environment.limits, environment.networking.type
    fixed = [image, limits.tmp_mb, limits.pids, environment.working_dir]
    if networking != "none":  # the key of the default recipe is the same as before networked pools
        fixed.append(networking)
    return hashlib.sha256(json.dumps(fixed).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class _Member:
    container_id: str
    name: str
    volume: str
    memory: int
    cpu_quota: int

    @classmethod
    def of(cls, container: Container) -> _Member:
        host = container.attrs.get("HostConfig", {})
        return cls(
            container_id=str(container.id),
            name=str(container.name),
            volume=sessions.workspace_mount(container) or "",
            memory=int(host.get("Memory") or 0),
            cpu_quota=int(host.get("CpuQuota") or 0),
        )


@dataclass
class _Recipe:
    environment: Environment
    last_seen: float = field(default_factory=time.monotonic)


class WarmPool:
    """One sandbox worker's view of the engine's pools: it claims members (its own or other workers') and keeps
    its recipes' pools filled."""

    def __init__(
        self, client: docker.DockerClient, image: str, scope: str, runners: Runners, settings: PoolSettings
    ) -> None:
        self._docker = client
        self._image = image
        self._scope = scope
        self._runners = runners
        self.settings = settings
        self.stats = PoolStats()
        self._recipes: dict[str, _Recipe] = {}
        self._ready: dict[str, list[_Member]] = {}
        """Members this worker made, by key, not yet tried: a claim needs no engine listing for them."""
        self._wake = asyncio.Event()
        self._upkeep_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-pool")
        """The upkeep's Docker calls run here, one at a time, never in the threads the sandbox calls use."""
        self._making: asyncio.Future[None] | None = None
        self._making_key: str | None = None
        default = Environment()
        key = pool_key(default, image)
        if key is not None and settings.enabled:
            self._recipes[key] = _Recipe(default, last_seen=float("inf"))  # the default recipe is never forgotten

    async def claim(self, owner: str, name: str, environment: Environment) -> containers.Provisioned | None:
        """A started member for `environment`, renamed `name` and given its limits; None when there is none (or
        the recipe is not one a pool serves). `owner` names the session and generation: a retried provision of
        the same one wins the same member again."""
        key = pool_key(environment, self._image)
        if key is None or not self.settings.enabled:
            return None
        recipe = self._recipes.get(key)
        if recipe is None and len(self._recipes) < MAX_POOLS:
            self._recipes[key] = _Recipe(environment)
        elif recipe is not None:
            recipe.last_seen = max(recipe.last_seen, time.monotonic())
        self._wake.set()
        made = await self._claim_one(key, owner, name, environment)
        making = self._making
        if made is None and making is not None and not making.done() and self._making_key == key:
            # A member of this recipe is being made (a worker that just started): it is ready sooner than a
            # sandbox made from scratch now, which would also compete with it for the engine.
            await asyncio.wait([making], timeout=MAKING_WAIT_SECONDS)
            made = await self._claim_one(key, owner, name, environment)
        if made is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return made

    async def _claim_one(
        self, key: str, owner: str, name: str, environment: Environment
    ) -> containers.Provisioned | None:
        async for member in self._candidates(key):
            try:
                answer = await self._runners.request(member.container_id, "claim", CLAIM_WAIT_SECONDS, owner=owner)
            except (RunnerLost, TimeoutError, SandboxError) as exc:
                log.info("pool member %s did not answer its claim (%s); trying another", member.name, exc)
                continue
            if answer.get("owner") != owner:
                continue  # another session (or worker) claimed it first
            try:
                return await asyncio.to_thread(self._hand_over, member, name, environment)
            except docker.errors.APIError as exc:
                log.warning("pool member %s was claimed but could not be handed over: %s", member.name, exc)
        return None

    async def _candidates(self, key: str) -> AsyncIterator[_Member]:
        """The members this worker made and has not handed out (no engine call), then every unclaimed member of
        the key on the engine (other workers' too, and those made before this worker started)."""
        tried = set()
        ready = self._ready.get(key, [])
        while ready:
            member = ready.pop(0)
            tried.add(member.container_id)
            yield member
        for container in await asyncio.to_thread(self._members, key):
            if str(container.id) not in tried:
                yield _Member.of(container)

    def _members(self, key: str) -> list[Container]:
        """This key's unclaimed members on the engine (not yet renamed), the oldest first."""
        labels = [f"{POOL_LABEL}={key}", f"{sessions.SCOPE_LABEL}={self._scope}"]
        found = self._docker.containers.list(filters={"label": labels, "status": "running"}, ignore_removed=True)
        ours = [c for c in found if str(c.name).startswith(MEMBER_PREFIX)]
        return sorted(ours, key=lambda c: str(c.attrs.get("Created", "")))

    def _hand_over(self, member: _Member, name: str, environment: Environment) -> containers.Provisioned:
        if member.name != name:
            self._docker.api.rename(member.container_id, name)
        memory = environment.limits.memory_mb * 1024 * 1024
        quota = containers.cpu_quota(environment.limits.cpus)
        if (member.memory, member.cpu_quota) != (memory, quota):
            self._docker.api.update_container(
                member.container_id,
                mem_limit=memory,
                memswap_limit=memory,
                cpu_period=containers.CPU_PERIOD,
                cpu_quota=quota,
            )
        return containers.Provisioned(
            container_id=member.container_id, container_name=name, volume=member.volume, image=self._image,
            from_pool=True,
        )  # fmt: skip

    # ---- keeping the pools filled ---------------------------------------------------------------------------

    async def _upkeep(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(
            self._upkeep_thread, functools.partial(function, *args, **kwargs)
        )

    async def maintain(self) -> None:
        """Until cancelled: remove stale members, then make missing ones, one at a time (a running call never
        waits for the pool: each step is one Docker call in a thread)."""
        while True:
            pause = IDLE_SECONDS
            try:
                worked = await self.maintain_once()
            except Exception:  # the engine passing through a hiccup: try again, not too often
                log.exception("keeping the sandbox pool filled failed; trying again in %g s", FAILED_PAUSE_SECONDS)
                worked, pause = False, FAILED_PAUSE_SECONDS
            if not worked:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)

    async def maintain_once(self) -> bool:
        """One step: remove one stale member or make one missing one; False when there was nothing to do."""
        now = time.monotonic()
        for key, recipe in list(self._recipes.items()):
            if now - recipe.last_seen > RECENT_SECONDS:
                del self._recipes[key]
        if await self._remove_one_stale():
            return True
        for key, recipe in self._recipes.items():
            members = await self._upkeep(self._members, key)
            if len(members) < self.settings.size:
                # Shielded: a member half made when the upkeep is cancelled is finished, so `close` can drain it.
                self._making, self._making_key = asyncio.ensure_future(self._make(key, recipe.environment)), key
                await asyncio.shield(self._making)
                return True
        return False

    async def remove_unclaimed(self) -> int:
        """Claim and remove every unclaimed member of this worker's scope (a bench or test ending); how many."""
        removed = 0
        while await self._remove_one_stale(everything=True):
            removed += 1
        return removed

    async def close(self) -> int:
        """After `maintain` was cancelled: finish the member being made, then drain."""
        if self._making is not None:
            await asyncio.wait([self._making])
        return await self.drain()

    async def drain(self) -> int:
        """Claim and remove the members this worker made and did not hand out (it is stopping); how many. A worker
        that dies without draining leaves its members to the next one, which claims them as its own."""
        removed = 0
        for ready in self._ready.values():
            while ready:
                member = ready.pop(0)
                owner = f"pool-drain/{os.getpid()}"
                try:
                    answer = await self._runners.request(member.container_id, "claim", CLAIM_WAIT_SECONDS, owner=owner)
                except (RunnerLost, TimeoutError, SandboxError):
                    continue  # gone already, or no longer answering: the upkeep of the next worker removes it
                if answer.get("owner") == owner:
                    await self._upkeep(self._remove_member, member.container_id, member.volume, member.name)
                    removed += 1
        return removed

    async def _remove_one_stale(self, everything: bool = False) -> bool:
        """Claim (so no session can) and remove one unclaimed member that is too old or not running: its runner
        died, or the worker that made it was killed before it started."""
        labels = [POOL_LABEL, f"{sessions.SCOPE_LABEL}={self._scope}"]
        found = await self._upkeep(
            self._docker.containers.list, all=True, filters={"label": labels}, ignore_removed=True
        )
        for member in found:
            if not str(member.name).startswith(MEMBER_PREFIX):
                continue  # claimed by a session: never touched
            age = time.time() - float(member.labels.get(CREATED_LABEL, "0") or 0)
            stopped = member.status != "running" and age > MAKING_GRACE_SECONDS  # not one still being made
            stale = everything or age > self.settings.max_age_seconds or stopped
            if not stale:
                continue
            owner = f"pool-reaper/{os.getpid()}"
            if member.status == "running":
                try:
                    answer = await self._runners.request(str(member.id), "claim", CLAIM_WAIT_SECONDS, owner=owner)
                except (RunnerLost, TimeoutError, SandboxError):
                    answer = {"owner": owner}  # a member whose runner does not answer is no use to anyone
                if answer.get("owner") != owner:
                    continue
            await self._upkeep(self._remove, member)
            return True
        return False

    def _remove(self, member: Container) -> None:
        self._remove_member(str(member.id), sessions.workspace_mount(member), str(member.name))

    def _remove_member(self, container_id: str, volume: str | None, name: str) -> None:
        for ready in self._ready.values():
            ready[:] = [m for m in ready if m.container_id != container_id]
        self._runners.forget(container_id)
        with contextlib.suppress(docker.errors.NotFound):
            self._docker.api.remove_container(container_id, force=True)
        if volume:
            workspace.remove_oneshots(self._docker, volume)  # one a killed worker left holds the volume
            with contextlib.suppress(docker.errors.NotFound):
                self._docker.volumes.get(volume).remove(force=True)
        self.stats.removed += 1
        log.info("removed the pool member %s", name)

    async def _make(self, key: str, environment: Environment) -> None:
        member_id = os.urandom(6).hex()
        labels = {POOL_LABEL: key, sessions.SCOPE_LABEL: self._scope, CREATED_LABEL: f"{time.time():.3f}"}
        made = await self._upkeep(
            containers.make_pool_member, self._docker, f"{MEMBER_PREFIX}{member_id}", environment, self._image, labels
        )
        try:
            await self._runners.request(made.container_id, "hello", 30)  # its runner is up; the stream stays open
        except (RunnerLost, TimeoutError) as exc:
            log.warning("the new pool member %s did not answer: %s", made.container_name, exc)
            return
        self.stats.made += 1
        limits = environment.limits
        member = _Member(
            made.container_id, made.container_name, made.volume, limits.memory_mb * 1024 * 1024,
            containers.cpu_quota(limits.cpus),
        )  # fmt: skip
        self._ready.setdefault(key, []).append(member)
        log.info("pool member %s ready (pool %s)", made.container_name, key)
