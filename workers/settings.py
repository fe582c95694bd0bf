"""Each worker's configuration, read from its environment once, in `main()`, and validated before anything starts.

Every variable, its default, and the roles that read it (docs/ documents them; `cli/stack.py` sets them for the
workers it starts)::

    CORRAL_TEMPORAL_ADDRESS          127.0.0.1:7233     every role
    CORRAL_TEMPORAL_NAMESPACE        default            every role
    CORRAL_HARNESS_DEPLOYMENT        (unversioned)      harness: its Worker Deployment (workers/deployment.py)
    CORRAL_HARNESS_BUILD_ID          a hash of the code harness: this build of it
    CORRAL_HARNESS_UPGRADE           pinned             harness: pinned (move at a safe point) or auto-upgrade
    ANTHROPIC_API_KEY                (required)         model
    ANTHROPIC_BASE_URL               Anthropic's API    model: any Messages-API-compatible endpoint
    CORRAL_STREAM_URL                (no live deltas)   model: the stream relay that text deltas are published to;
                                                        a comma-separated list partitions sessions over several
                                                        (`relay/partition.py`), the same list everywhere
    CORRAL_STREAM_TOKEN              (none)             model: the relay's bearer token
    CORRAL_MODEL_STALL_TIMEOUT_SECONDS  120             model: a response stream silent this long is retried
    CORRAL_MODEL_TASK_QUEUE          corral-model       model: the pool it serves (a session's `model_task_queue`)
    CORRAL_SANDBOX_IMAGE             built here         sandbox
    CORRAL_SANDBOX_ENGINE            (default pool)     sandbox: the engine pool it serves, provisioning on
                                                        `corral-sandbox.<name>` instead of `corral-sandbox` for the
                                                        sessions whose environment names it (`engine`); 1-32 of
                                                        a-z, 0-9 and inner hyphens
    CORRAL_STATE_DIR                 .corral            sandbox: where the image is built; model: see below
    CORRAL_BLOB_STORE                $CORRAL_STATE_DIR/blobs   every role and client: archived runs, kept whole
                                                        outputs, and every payload of 256 KiB or more (the data
                                                        converter's): all must see the same store
    CORRAL_REAP_INTERVAL_SECONDS     60                 sandbox, proxy: how often the reaper looks for closed sessions
    CORRAL_SANDBOX_POOL_SIZE         2                  sandbox: started sandboxes kept per recipe (0: no warm pool)
    CORRAL_SANDBOX_POOL_MAX_AGE_SECONDS  3600           sandbox: a pool member older than this is made again
    CORRAL_GIT_PROXY_PORT            8767               sandbox (where git origins point), proxy (where it listens)
    CORRAL_GIT_PROXY_HOST            0.0.0.0            proxy
    VAULT_ADDR or BAO_ADDR           (required)         proxy
    VAULT_TOKEN or BAO_TOKEN, or VAULT_ROLE_ID and VAULT_SECRET_ID (AppRole)    (required) proxy
    CORRAL_VAULT_MOUNT               corral             proxy: the KV v2 mount

The Docker engine (`DOCKER_HOST` and the other `DOCKER_*` variables) is found by the Docker SDK, as everywhere.
An empty variable counts as unset. A missing or malformed one is a `SettingsError` whose one-line message names it
(and never shows a secret's value): `workers.run.run_worker` prints it and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Self, cast

from temporalio.common import WorkerDeploymentVersion

from corral.names import (
    DEFAULT_GIT_PROXY_PORT,
    DEFAULT_MODEL_STALL_TIMEOUT_SECONDS,
    DEFAULT_TEMPORAL_ADDRESS,
    DEFAULT_TEMPORAL_NAMESPACE,
    ENV_GIT_PROXY_PORT,
    ENV_HARNESS_DEPLOYMENT,
    ENV_MODEL_STALL_TIMEOUT,
    ENV_SANDBOX_ENGINE,
    ENV_SANDBOX_IMAGE,
    ENV_STATE_DIR,
    ENV_STREAM_TOKEN,
    ENV_STREAM_URL,
    ENV_TEMPORAL_ADDRESS,
    ENV_TEMPORAL_NAMESPACE,
    MODEL_TASK_QUEUE,
    sandbox_engine_problem,
)
from proxy import VaultLogin, VaultLoginIncomplete
from sandbox.pool import PoolSettings
from workers._variables import (
    Environ,
    SettingsError,
    _check_positive,
    _count,
    _invalid,
    _port,
    _seconds,
    _text,
    _url,
    _urls,
)

MODEL_QUEUE_VARIABLE = "CORRAL_MODEL_TASK_QUEUE"
REAP_INTERVAL = "CORRAL_REAP_INTERVAL_SECONDS"
POOL_SIZE = "CORRAL_SANDBOX_POOL_SIZE"
POOL_MAX_AGE = "CORRAL_SANDBOX_POOL_MAX_AGE_SECONDS"
MAX_POOL_SIZE = 64
GIT_PROXY_PORT = ENV_GIT_PROXY_PORT
DEFAULT_REAP_INTERVAL_SECONDS = 60.0


# ---- sections: one per role, and where Temporal is ---------------------------------------------------------------


@dataclass(frozen=True)
class TemporalSettings:
    """Where the Temporal server is: the whole configuration of the harness and the utility hand."""

    address: str = DEFAULT_TEMPORAL_ADDRESS
    namespace: str = DEFAULT_TEMPORAL_NAMESPACE

    @classmethod
    def from_environment(cls, environ: Environ | None = None) -> TemporalSettings:
        environ = _environ(environ)
        return cls(
            address=_text(environ, ENV_TEMPORAL_ADDRESS) or DEFAULT_TEMPORAL_ADDRESS,
            namespace=_text(environ, ENV_TEMPORAL_NAMESPACE) or DEFAULT_TEMPORAL_NAMESPACE,
        )


@dataclass(frozen=True)
class ModelSettings:
    """The model role: the only one that holds the model API key, the relay its live text deltas go to, and how long
    a response stream may stay silent before the attempt is retried."""

    api_key: str = field(repr=False)
    base_url: str | None = None
    stream_url: str | None = None
    stream_token: str | None = field(default=None, repr=False)
    stall_timeout_seconds: float = DEFAULT_MODEL_STALL_TIMEOUT_SECONDS
    task_queue: str = MODEL_TASK_QUEUE
    """The shared queue of its pool of model workers; sessions choose a pool by their `model_task_queue`."""

    def __post_init__(self) -> None:
        _check_positive(ENV_MODEL_STALL_TIMEOUT, self.stall_timeout_seconds)
        if "@" in self.task_queue or not self.task_queue.strip():
            raise SettingsError(
                f"{MODEL_QUEUE_VARIABLE} must name a task queue without '@' (a worker's own queue is "
                f"'<queue>@<worker>'), not {self.task_queue!r}"
            )

    @classmethod
    def from_environment(cls, environ: Environ | None = None) -> ModelSettings:
        environ = _environ(environ)
        api_key = _text(environ, "ANTHROPIC_API_KEY")
        if api_key is None:
            raise SettingsError(
                "ANTHROPIC_API_KEY is not set. Set it (and ANTHROPIC_BASE_URL for a compatible endpoint), or run "
                "`corral up`, which starts the offline stand-in model when no key is set."
            )
        return cls(
            api_key=api_key,
            base_url=_url(environ, "ANTHROPIC_BASE_URL"),
            stream_url=_urls(environ, ENV_STREAM_URL),
            stream_token=_text(environ, ENV_STREAM_TOKEN),
            stall_timeout_seconds=_seconds(environ, ENV_MODEL_STALL_TIMEOUT, DEFAULT_MODEL_STALL_TIMEOUT_SECONDS),
            task_queue=_text(environ, MODEL_QUEUE_VARIABLE) or MODEL_TASK_QUEUE,
        )


@dataclass(frozen=True)
class SandboxSettings:
    """The sandbox hand: which image (None: build one under `state_dir`), the reaper's pace, the git proxy port, the
    engine pool it serves."""

    image: str | None = None
    state_dir: Path = Path(".corral")
    reap_interval_seconds: float = DEFAULT_REAP_INTERVAL_SECONDS
    git_proxy_port: int = DEFAULT_GIT_PROXY_PORT
    pool: PoolSettings = field(default_factory=PoolSettings)
    """The warm pool: started sandboxes per recipe (`CORRAL_SANDBOX_POOL_SIZE`, 0 turns it off) and their maximum
    age (`CORRAL_SANDBOX_POOL_MAX_AGE_SECONDS`)."""
    engine: str | None = None
    """The engine pool served (`CORRAL_SANDBOX_ENGINE`): sessions whose environment names it are provisioned here."""

    def __post_init__(self) -> None:
        problem = None if self.engine is None else sandbox_engine_problem(self.engine)
        if problem is not None:
            raise SettingsError(f"{ENV_SANDBOX_ENGINE}: {problem}")
        _check_interval(self.reap_interval_seconds)
        _check_port(self.git_proxy_port)
        if not 0 <= self.pool.size <= MAX_POOL_SIZE:
            raise _invalid(POOL_SIZE, self.pool.size, f"a whole number from 0 (off) to {MAX_POOL_SIZE}")
        _check_positive(POOL_MAX_AGE, self.pool.max_age_seconds)

    @classmethod
    def from_environment(cls, environ: Environ | None = None) -> SandboxSettings:
        environ = _environ(environ)
        return cls(
            image=_text(environ, ENV_SANDBOX_IMAGE),
            state_dir=Path(_text(environ, ENV_STATE_DIR) or ".corral"),
            reap_interval_seconds=_seconds(environ, REAP_INTERVAL, DEFAULT_REAP_INTERVAL_SECONDS),
            git_proxy_port=_port(environ, GIT_PROXY_PORT, DEFAULT_GIT_PROXY_PORT),
            pool=PoolSettings(
                size=_count(environ, POOL_SIZE, PoolSettings.size),
                max_age_seconds=_seconds(environ, POOL_MAX_AGE, PoolSettings.max_age_seconds),
            ),
            engine=_text(environ, ENV_SANDBOX_ENGINE),
        )


class VaultSettings(VaultLogin):
    """How the proxy logs in to Vault (or OpenBao): `proxy.login`'s one reading of the environment, its refusal a
    `SettingsError` like every other setting's. Only the proxy role reads these."""

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except VaultLoginIncomplete as exc:
            raise SettingsError(str(exc)) from None

    @classmethod
    def from_environment(cls, environ: Environ | None = None) -> Self:
        try:
            return super().from_environment(_environ(environ))
        except VaultLoginIncomplete as exc:
            raise SettingsError(str(exc)) from None


@dataclass(frozen=True)
class ProxySettings:
    """The proxy role: its Vault login, where the git proxy listens, the reaper's pace."""

    vault: VaultSettings
    git_proxy_host: str = "0.0.0.0"
    git_proxy_port: int = DEFAULT_GIT_PROXY_PORT
    reap_interval_seconds: float = DEFAULT_REAP_INTERVAL_SECONDS

    def __post_init__(self) -> None:
        _check_interval(self.reap_interval_seconds)
        _check_port(self.git_proxy_port)

    @classmethod
    def from_environment(cls, environ: Environ | None = None) -> ProxySettings:
        environ = _environ(environ)
        return cls(
            vault=VaultSettings.from_environment(environ),
            git_proxy_host=_text(environ, "CORRAL_GIT_PROXY_HOST") or "0.0.0.0",
            git_proxy_port=_port(environ, GIT_PROXY_PORT, DEFAULT_GIT_PROXY_PORT),
            reap_interval_seconds=_seconds(environ, REAP_INTERVAL, DEFAULT_REAP_INTERVAL_SECONDS),
        )


# ---- one object per worker process --------------------------------------------------------------------------------


class _ProcessSettings:
    """A process's settings: one part per concern, each read by its own `from_environment`, in field order."""

    @classmethod
    def from_environment(cls, environ: Environ | None = None) -> Self:
        environ = _environ(environ)
        parts = typing.get_type_hints(cls)
        return cls(*(parts[part.name].from_environment(environ) for part in dataclasses.fields(cls)))  # type: ignore[arg-type]


@dataclass(frozen=True)
class ModelWorkerSettings(_ProcessSettings):
    """`corral-model`."""

    temporal: TemporalSettings
    model: ModelSettings


@dataclass(frozen=True)
class SandboxWorkerSettings(_ProcessSettings):
    """`corral-sandbox`."""

    temporal: TemporalSettings
    sandbox: SandboxSettings


@dataclass(frozen=True)
class ProxyWorkerSettings(_ProcessSettings):
    """`corral-proxy`."""

    temporal: TemporalSettings
    proxy: ProxySettings


@dataclass(frozen=True)
class AllInOneSettings(_ProcessSettings):
    """`corral-all-in-one`: the harness, the model, the utility hand and the sandbox hand in one process."""

    temporal: TemporalSettings
    model: ModelSettings
    sandbox: SandboxSettings


# ---- the harness: a build of a versioned deployment, or unversioned (workers/deployment.py) ---------------------

ENV_DEPLOYMENT = ENV_HARNESS_DEPLOYMENT
ENV_BUILD_ID = "CORRAL_HARNESS_BUILD_ID"
ENV_UPGRADE = "CORRAL_HARNESS_UPGRADE"

UpgradePolicy = Literal["pinned", "auto-upgrade"]
UPGRADE_POLICIES: tuple[UpgradePolicy, ...] = ("pinned", "auto-upgrade")
_DEPLOYMENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")  # Temporal refuses '.' and '/' in a deployment name
_BUILD_ID = re.compile(r"^[A-Za-z0-9._+-]{1,100}$")


@dataclass(frozen=True)
class HarnessDeployment:
    """One build of the harness in a Worker Deployment, and how running sessions move between builds."""

    name: str
    build_id: str
    upgrade: UpgradePolicy = "pinned"

    def __post_init__(self) -> None:
        if not _DEPLOYMENT_NAME.match(self.name):
            raise SettingsError(f"{ENV_DEPLOYMENT} must be 1-100 of A-Z, a-z, 0-9, '_' and '-', got {self.name!r}")
        if not _BUILD_ID.match(self.build_id):
            raise SettingsError(
                f"{ENV_BUILD_ID} must be 1-100 of A-Z, a-z, 0-9, '.', '_', '+' and '-', got {self.build_id!r}"
            )
        if self.upgrade not in UPGRADE_POLICIES:
            raise SettingsError(f"{ENV_UPGRADE} must be one of {', '.join(UPGRADE_POLICIES)}, got {self.upgrade!r}")

    @property
    def version(self) -> WorkerDeploymentVersion:
        return WorkerDeploymentVersion(deployment_name=self.name, build_id=self.build_id)

    @classmethod
    def from_environment(cls, environ: Environ) -> HarnessDeployment | None:
        """The deployment the environment names, or None (an unversioned harness). The build id defaults to a hash
        of the harness code (`_code_build_id`), so two builds of different code never share one."""
        name = environ.get(ENV_DEPLOYMENT) or None
        if name is None:
            for variable in (ENV_BUILD_ID, ENV_UPGRADE):
                if environ.get(variable):
                    raise SettingsError(f"{variable} is set but {ENV_DEPLOYMENT} is not: name the deployment too")
            return None
        upgrade = environ.get(ENV_UPGRADE) or "pinned"
        build_id = environ.get(ENV_BUILD_ID) or _code_build_id()
        return cls(name=name, build_id=build_id, upgrade=cast(UpgradePolicy, upgrade))


def _code_build_id() -> str:
    """A hash of the harness's code: the workflow modules and the contract they read (and the SDK's version), so a
    build of other code never shares an id, and the same code on two hosts shares one."""
    import hashlib
    from importlib.metadata import version
    from pathlib import Path

    import corral.contract
    import workflows

    digest = hashlib.sha256(version("temporalio").encode())
    for package in (workflows, corral.contract):
        root = Path(str(package.__file__)).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return f"code-{digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class HarnessSettings:
    """`corral-harness`: where Temporal is, and the deployment this build belongs to (None: unversioned)."""

    temporal: TemporalSettings
    deployment: HarnessDeployment | None

    @classmethod
    def from_environment(cls, environ: Environ | None = None) -> HarnessSettings:
        environ = _environ(environ)
        return cls(TemporalSettings.from_environment(environ), HarnessDeployment.from_environment(environ))


# ---- the environment, and checking one value (reading one variable: workers/_variables.py) ------------------------


def _environ(environ: Environ | None) -> Environ:
    return os.environ if environ is None else environ


def _check_interval(seconds: float) -> None:
    _check_positive(REAP_INTERVAL, seconds)


def _check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise _invalid(GIT_PROXY_PORT, port, "a TCP port number (1-65535)")
