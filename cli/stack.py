"""The local stack as detached processes, described as data: `SERVICES` says, per process, how it starts, where
it listens, how `corral up` knows it is ready, which environment it gets and what it depends on.

Everything lives under one state directory (pid files, logs, the Temporal SQLite file, `stack.json`); how the
processes are spawned, found again and stopped is in `processes.py`. No typer and no rich here: these modules are
the mechanism, the CLI is the voice.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from corral.names import (
    DEFAULT_GIT_PROXY_PORT,
    ENV_STREAM_TOKEN,
    ENV_STREAM_URL,
    SEARCH_ATTRIBUTE_MODEL,
    SEARCH_ATTRIBUTE_STATUS,
)

TEMPORAL = "temporal"
VAULT = "vault"
MODEL_SERVER = "model-server"
STREAM_RELAY = "stream-relay"
GATEWAY = "gateway"
PROXY_WORKER = "proxy-worker"
DOCKERD = "dockerd"
HARNESS = "harness"
MODEL_WORKER = "model-worker"
UTILITY_HAND = "utility-hand"
SANDBOX_WORKER = "sandbox-worker"
ALL_IN_ONE = "all-in-one"
SPLIT_WORKERS: tuple[str, ...] = (HARNESS, MODEL_WORKER, UTILITY_HAND, SANDBOX_WORKER)
WORKERS: tuple[str, ...] = (ALL_IN_ONE, *SPLIT_WORKERS)
"""The session workers; the proxy worker is not one of them (it runs whichever layout the workers have)."""


@dataclass(frozen=True)
class StatePaths:
    """Where the stack keeps its state; created on demand."""

    root: Path

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def database(self) -> Path:
        return self.root / "temporal.db"

    @property
    def stack_file(self) -> Path:
        return self.root / "stack.json"

    @property
    def stream_token_file(self) -> Path:
        return self.root / "stream.token"

    def pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def ensure(self) -> None:
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)


STREAM_TOKEN_ENV = ENV_STREAM_TOKEN
"""The stream relay's bearer token, in the environment of the relay, its publishers and its subscribers."""


def read_stream_token(paths: StatePaths) -> str | None:
    """The token `corral up` made for the stream relay, None when there is none (or it cannot be read)."""
    try:
        return paths.stream_token_file.read_text().strip() or None
    except OSError:
        return None


def follow_with_stream_token(token: str | None) -> None:
    """Let this CLI process's live view (`corral tail`, the demo) subscribe to the stack's relay with its token; a
    relay of the user's own (`CORRAL_STREAM_URL`) keeps the token the user gave with it."""
    if token is not None and not os.environ.get(ENV_STREAM_URL):
        os.environ[STREAM_TOKEN_ENV] = token


def ensure_stream_token(paths: StatePaths) -> str:
    """The stream relay's token: kept in the state dir (mode 0600, written so from its first byte) so that a relay
    still running from an earlier `corral up` and the processes started now agree on it."""
    found = read_stream_token(paths)
    if found is not None:
        return found
    paths.root.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    descriptor = os.open(paths.stream_token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(token + "\n")
    return token


class StackConfig(BaseModel):
    """`stack.json`: how the running stack was started, so other commands find its addresses and model mode."""

    temporal_address: str
    namespace: str
    temporal_port: int
    ui_port: int
    offline: bool
    model_url: str | None = None
    stream_url: str | None = None
    api_url: str | None = None
    """The Managed Agents API (the gateway): an `anthropic` client's base_url."""
    git_proxy_port: int | None = None
    mode: Literal["all-in-one", "split"] = "all-in-one"
    started_at: datetime
    cluster_id: str | None = None
    """The Temporal server's cluster id: sandboxes are labelled with it, so `down --sandboxes` removes only ours."""

    @property
    def sandbox_scope(self) -> str | None:
        """The `corral.scope` label value of this stack's sandboxes (see sandbox.containers)."""
        return f"{self.cluster_id}/{self.namespace}" if self.cluster_id else None

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"


def read_stack(paths: StatePaths) -> StackConfig | None:
    """The recorded stack, or None when there is none (or it cannot be read: it is only a hint)."""
    try:
        return StackConfig.model_validate_json(paths.stack_file.read_text())
    except (OSError, ValueError):
        return None


def write_stack(paths: StatePaths, config: StackConfig) -> None:
    paths.ensure()
    paths.stack_file.write_text(config.model_dump_json(indent=2) + "\n")


# ---- the services -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpOptions:
    """`corral up`'s options: where each service listens when it is started here, and the workers' layout."""

    temporal_port: int = 7233
    ui_port: int = 8233
    model_port: int = 8765
    stream_port: int = 8766
    git_proxy_port: int = DEFAULT_GIT_PROXY_PORT
    split: bool = False
    api_port: int = 8780


@dataclass(frozen=True)
class Port:
    """A port a service listens on: the `UpOptions` field (and `corral up` option) that sets it, what listens there,
    and where stack.json records it (a running service keeps its port)."""

    name: str
    what: str
    recorded: Callable[[StackConfig], int | None]

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


Readiness = Literal["temporal", "http", "stays up", "ensured"]
Grant = Literal["temporal", "model", "vault", "vault-writer", "sandbox", "stream", "git-proxy"]


@dataclass(frozen=True)
class Service:
    """One process of the stack: how `corral up` starts it and knows it is up, and how `down` recognises it."""

    name: str
    what: str
    marker: str
    """A word its command line contains: a pid file whose pid was reused by another program is stale."""
    ready: Readiness
    """It accepts a Temporal client / answers GET /healthz / still runs after a few seconds / it was started and
    checked by its own set-up (Vault: `proxy.ensure_local_vault`, dockerd: `sandbox.ensure_docker_engine`)."""
    command: Callable[[Plan], list[str]] | None = None
    """None for the two `corral up` does not spawn as a plain process (`ready="ensured"`)."""
    ports: tuple[Port, ...] = ()
    env: tuple[Grant, ...] = ()
    """What its environment holds beyond the base one, which has no credential at all (see `up.environment`)."""
    after: tuple[str, ...] = ()
    """The services it needs (when they run at all); `SERVICES` lists each after these."""
    when: Callable[[Plan], bool] = lambda plan: True
    """Whether this `corral up` wants it (the model mode, the workers' layout, a Vault of the user's)."""


@dataclass
class Plan:
    """One `corral up`: what it decided before starting anything (model mode, workers), and what the services
    started so far tell the ones after them (their ports, Vault's address and token, the sandbox image)."""

    paths: StatePaths
    options: UpOptions
    namespace: str
    previous: StackConfig | None
    offline: bool
    workers: tuple[str, ...]
    new_workers: bool
    """Some of `workers` is not running yet: the Docker engine and the sandbox image are needed."""
    vault_env: dict[str, str]
    """What the proxy worker gets to reach Vault: the user's VAULT_* (or BAO_*), or the state dir's OpenBao's."""
    ports: dict[str, int] = field(default_factory=dict)
    sandbox_image: str | None = None
    gateway_vault_env: dict[str, str] = field(default_factory=dict)
    """What the gateway gets: a login that writes credentials and cannot read them (`proxy.access`), never the
    proxy's; empty when there is none (then its vault routes answer 503)."""
    stream_token: str | None = None
    """The stream relay's bearer token (`ensure_stream_token`)."""

    def choose_ports(self, service: Service, running: bool) -> None:
        """A running service keeps the ports stack.json records; a new one gets the options'."""
        for port in service.ports:
            recorded = port.recorded(self.previous) if running and self.previous is not None else None
            self.ports[port.name] = recorded or self.port(port.name)

    def port(self, name: str) -> int:
        return self.ports.get(name) or int(getattr(self.options, name))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port('temporal_port')}"

    @property
    def model_url(self) -> str | None:
        return f"http://127.0.0.1:{self.port('model_port')}" if self.offline else None

    @property
    def stream_url(self) -> str:
        return f"http://127.0.0.1:{self.port('stream_port')}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port('api_port')}"


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _http_server(
    name: str, what: str, module: str, *, port: str, url: Callable[[StackConfig], str | None], **more: Any
) -> Service:
    """One of our small HTTP servers: it listens on the `UpOptions` field `port`; stack.json records its `url`."""

    def command(plan: Plan) -> list[str]:
        return _python(module, "--host", "127.0.0.1", "--port", str(plan.port(port)))

    def recorded(config: StackConfig) -> int | None:
        found = url(config)
        return int(found.rsplit(":", 1)[1]) if found else None

    return Service(
        name, what, marker=module, ready="http", command=command, ports=(Port(port, what, recorded),), **more
    )


def _worker(name: str, module: str, *, env: tuple[Grant, ...] = (), after: tuple[str, ...] = ()) -> Service:
    """A session worker: it needs Temporal, and starts in the layout (`--split` or all-in-one) this `up` uses."""
    return Service(
        name, f"{name.removesuffix('-worker')} worker", marker=module, ready="stays up",
        command=lambda plan: _python(module), env=("temporal", *env), after=(TEMPORAL, *after),
        when=lambda plan: name in plan.workers,
    )  # fmt: skip


def _users_vault() -> bool:
    """Whether the environment names a Vault of the user's (`proxy.login`); then `corral up` runs no OpenBao."""
    from proxy import vault_address  # the proxy library loads when `corral up` runs, not for `corral --help`

    return vault_address(os.environ) is not None


def temporal_command(plan: Plan) -> list[str]:
    from corral.temporal import LOCAL_SERVER_ARGS, temporal_binary

    argv = [temporal_binary(), "server", "start-dev", "--db-filename", str(plan.paths.database), "--ip", "127.0.0.1"]
    argv += LOCAL_SERVER_ARGS
    argv += ["--port", str(plan.port("temporal_port")), "--ui-port", str(plan.port("ui_port")), "--log-level", "warn"]
    for attribute in (SEARCH_ATTRIBUTE_STATUS, SEARCH_ATTRIBUTE_MODEL):
        argv += ["--search-attribute", f"{attribute}=Keyword"]
    return argv + (["--namespace", plan.namespace] if plan.namespace != "default" else [])


SERVICES: tuple[Service, ...] = (
    Service(TEMPORAL, "Temporal dev server", marker="temporal", ready="temporal", command=temporal_command,
            ports=(Port("temporal_port", "Temporal gRPC", lambda config: config.temporal_port),
                   Port("ui_port", "Temporal Web UI", lambda config: config.ui_port))),
    # The user's Vault (VAULT_ADDR or BAO_ADDR) if there is one, else OpenBao with its storage in the state dir.
    Service(VAULT, "OpenBao server", marker="bao", ready="ensured",
            when=lambda plan: not _users_vault()),
    _http_server(MODEL_SERVER, "offline model server", "modelserver", port="model_port",
                 url=lambda config: config.model_url, when=lambda plan: plan.offline),
    # The live-delta relay: model workers publish to it, `corral tail` subscribes (see relay).
    # Only the holders of its token (in the state dir) may publish or subscribe.
    _http_server(STREAM_RELAY, "stream relay", "relay", port="stream_port",
                 url=lambda config: config.stream_url, env=("stream",)),
    # Anthropic's Managed Agents API over the stack (gateway/): stateless, previews live text from the relay; writes
    # credentials to Vault with a login that cannot read them back (proxy/access.py).
    _http_server(GATEWAY, "Managed Agents API gateway", "gateway", port="api_port", url=lambda config: config.api_url,
                 env=("temporal", "stream", "vault-writer"), after=(TEMPORAL, VAULT, STREAM_RELAY)),
    # The one process with Vault access, never part of the all-in-one; its git proxy is the sandboxes' origin.
    Service(PROXY_WORKER, "proxy worker", marker="workers.proxy", ready="stays up",
            command=lambda plan: _python("workers.proxy"),
            ports=(Port("git_proxy_port", "git proxy", lambda config: config.git_proxy_port),),
            env=("temporal", "vault", "git-proxy"), after=(TEMPORAL, VAULT)),
    # Started by the sandbox set-up only when no engine answers (its pid file sits here too), and only when a worker
    # is to start: the sandbox image (built here once, no registry) goes into the workers' environment.
    Service(DOCKERD, "Docker engine", marker="dockerd", ready="ensured", when=lambda plan: plan.new_workers),
    _worker(HARNESS, "workers.harness"),
    _worker(MODEL_WORKER, "workers.model", env=("model", "stream"), after=(MODEL_SERVER, STREAM_RELAY)),
    _worker(UTILITY_HAND, "workers.utility_hand"),
    _worker(SANDBOX_WORKER, "workers.sandbox", env=("sandbox", "git-proxy"), after=(DOCKERD, PROXY_WORKER)),
    _worker(ALL_IN_ONE, "workers.all_in_one", env=("model", "stream", "sandbox", "git-proxy"),
            after=(MODEL_SERVER, STREAM_RELAY, DOCKERD, PROXY_WORKER)),
)  # fmt: skip
"""In start order, each after what it needs; `down` stops in reverse so workers never outlive their server."""
PROCESS_ORDER: tuple[str, ...] = tuple(service.name for service in SERVICES)
MARKERS: dict[str, str] = {service.name: service.marker for service in SERVICES}
"""A word each process's command line contains: a pid file whose pid was reused by another program is stale."""
