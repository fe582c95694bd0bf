"""The local stack as detached processes, described as data: `SERVICES` says, per process, how it starts, where
it listens, how `corral up` knows it is ready, which environment it gets and what it depends on.

Everything lives under one state directory (pid files, logs, the Temporal SQLite file, `stack.json`) so that
`corral up`, `status` and `down`, run from different shells at different times, agree on what is running.
Processes start in their own session, so they outlive the `corral up` that started them and a Ctrl-C in that
shell does not reach them. No typer and no rich here: this module is the mechanism, the CLI is the voice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from corral.names import DEFAULT_GIT_PROXY_PORT, SEARCH_ATTRIBUTE_MODEL, SEARCH_ATTRIBUTE_STATUS

TEMPORAL = "temporal"
VAULT = "vault"
MODEL_SERVER = "model-server"
STREAM_RELAY = "stream-relay"
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

_LOG_HEADER = "--- corral up "


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

    def pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def ensure(self) -> None:
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)


class StackConfig(BaseModel):
    """`stack.json`: how the running stack was started, so other commands find its addresses and model mode."""

    temporal_address: str
    namespace: str
    temporal_port: int
    ui_port: int
    offline: bool
    model_url: str | None = None
    stream_url: str | None = None
    git_proxy_port: int | None = None
    mode: Literal["all-in-one", "split"] = "all-in-one"
    started_at: datetime
    cluster_id: str | None = None
    """The Temporal server's cluster id: sandboxes are labelled with it, so `down --sandboxes` removes only ours."""

    @property
    def sandbox_scope(self) -> str | None:
        """The `corral.scope` label value of this stack's sandboxes (see corral.sandbox.containers)."""
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
Grant = Literal["temporal", "model", "vault", "sandbox", "stream", "git-proxy"]


@dataclass(frozen=True)
class Service:
    """One process of the stack: how `corral up` starts it and knows it is up, and how `down` recognises it."""

    name: str
    what: str
    marker: str
    """A word its command line contains: a pid file whose pid was reused by another program is stale."""
    ready: Readiness
    """It accepts a Temporal client / answers GET /healthz / still runs after a few seconds / it was started and
    checked by its own set-up (Vault: `proxy.ensure_dev_vault`, dockerd: `corral.sandbox.ensure_docker_engine`)."""
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
    """What the proxy worker gets to reach Vault: the user's VAULT_* (or BAO_*), or the dev server's."""
    ports: dict[str, int] = field(default_factory=dict)
    sandbox_image: str | None = None

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


def temporal_command(plan: Plan) -> list[str]:
    from corral.temporal import temporal_binary

    argv = [temporal_binary(), "server", "start-dev", "--db-filename", str(plan.paths.database), "--ip", "127.0.0.1"]
    argv += ["--port", str(plan.port("temporal_port")), "--ui-port", str(plan.port("ui_port")), "--log-level", "warn"]
    for attribute in (SEARCH_ATTRIBUTE_STATUS, SEARCH_ATTRIBUTE_MODEL):
        argv += ["--search-attribute", f"{attribute}=Keyword"]
    return argv + (["--namespace", plan.namespace] if plan.namespace != "default" else [])


SERVICES: tuple[Service, ...] = (
    Service(TEMPORAL, "Temporal dev server", marker="temporal", ready="temporal", command=temporal_command,
            ports=(Port("temporal_port", "Temporal gRPC", lambda config: config.temporal_port),
                   Port("ui_port", "Temporal Web UI", lambda config: config.ui_port))),
    # The user's Vault (VAULT_ADDR or BAO_ADDR) if there is one, else an OpenBao dev server here.
    Service(VAULT, "OpenBao dev server", marker="bao", ready="ensured",
            when=lambda plan: not (os.environ.get("VAULT_ADDR") or os.environ.get("BAO_ADDR"))),
    _http_server(MODEL_SERVER, "offline model server", "corral.modelserver", port="model_port",
                 url=lambda config: config.model_url, when=lambda plan: plan.offline),
    # The live-delta relay: model workers publish to it, `corral tail` subscribes (see corral/streaming).
    _http_server(STREAM_RELAY, "stream relay", "corral.streaming", port="stream_port",
                 url=lambda config: config.stream_url),
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
_MARKERS: dict[str, str] = {service.name: service.marker for service in SERVICES}


# ---- processes ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessState:
    """One process of the stack as its pid file describes it."""

    name: str
    pid: int | None
    alive: bool
    log: Path


def read_pid(paths: StatePaths, name: str) -> int | None:
    try:
        return int(paths.pid_file(name).read_text().strip())
    except (OSError, ValueError):
        return None


def is_alive(pid: int, name: str | None = None) -> bool:
    """Whether `pid` runs (and, given `name`, is that stack process rather than a program that reused the pid)."""
    with contextlib.suppress(ChildProcessError, OSError):
        # Our own child that exited is a zombie until reaped; reap it so it does not look alive.
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # It exists but belongs to someone else; the command-line check below decides.
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True  # Not Linux: no way to look closer, trust the signal check.
    try:
        if any(
            line.split()[1:2] == ["Z"] for line in (proc / "status").read_text().splitlines() if line[:6] == "State:"
        ):
            return False
        cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    marker = _MARKERS.get(name or "")
    return marker is None or marker in cmdline


def process_state(paths: StatePaths, name: str) -> ProcessState:
    pid = read_pid(paths, name)
    return ProcessState(name, pid, pid is not None and is_alive(pid, name), paths.log_file(name))


def running_pid(paths: StatePaths, name: str) -> int | None:
    """The pid of `name` if it runs; a stale pid file is removed on the way."""
    state = process_state(paths, name)
    if state.pid is not None and not state.alive:
        paths.pid_file(name).unlink(missing_ok=True)
    return state.pid if state.alive else None


def known_processes(paths: StatePaths) -> list[str]:
    """Names with a pid file, in start order (unknown names last, so they are stopped first)."""
    found = {path.stem for path in paths.pids.glob("*.pid")} if paths.pids.is_dir() else set()
    return [name for name in PROCESS_ORDER if name in found] + sorted(found - set(PROCESS_ORDER))


def spawn(paths: StatePaths, name: str, argv: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start `argv` detached, output appended to its log, and record its pid."""
    paths.ensure()
    log_path = paths.log_file(name)
    with log_path.open("ab") as log:
        started = datetime.now(UTC).isoformat(timespec="seconds")
        log.write(f"\n{_LOG_HEADER}{started}: {' '.join(argv)}\n".encode())
        log.flush()
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True
        )
    paths.pid_file(name).write_text(f"{process.pid}\n")
    return process


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group we created with `start_new_session`, or just the pid if it is not a leader."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


StopOutcome = Literal["stopped", "killed", "not running"]


def stop(paths: StatePaths, name: str, timeout: float = 10.0) -> tuple[int | None, StopOutcome]:
    """SIGTERM, wait up to `timeout`, then SIGKILL; the pid file is removed in every case."""
    state = process_state(paths, name)
    try:
        if state.pid is None or not state.alive:
            return state.pid, "not running"
        _signal_group(state.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not is_alive(state.pid, name):
                return state.pid, "stopped"
            time.sleep(0.1)
        _signal_group(state.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while is_alive(state.pid, name) and time.monotonic() < deadline:
            time.sleep(0.1)
        return state.pid, "killed"
    finally:
        paths.pid_file(name).unlink(missing_ok=True)


def log_tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines the latest run wrote (logs are appended to across runs, each after a header)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    starts = [index for index, line in enumerate(text) if line.startswith(_LOG_HEADER)]
    return "\n".join(text[starts[-1] if starts else 0 :][-lines:])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on `port`, checked before starting a server there.

    SO_REUSEADDR as the servers themselves use it: a port left in TIME_WAIT by a server that just stopped is free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False
