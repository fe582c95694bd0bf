"""The local stack as detached processes: the Temporal dev server, the offline model server and the workers.

Everything lives under one state directory (pid files, logs, the Temporal SQLite file, `stack.json`) so that
`corral up`, `status` and `down`, run from different shells at different times, agree on what is running.
Processes start in their own session, so they outlive the `corral up` that started them and a Ctrl-C in that
shell does not reach them. No typer and no rich here: this module is the mechanism, the CLI is the voice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from corral.names import ENV_TEMPORAL_ADDRESS, ENV_TEMPORAL_NAMESPACE, SEARCH_ATTRIBUTE_MODEL, SEARCH_ATTRIBUTE_STATUS

TEMPORAL = "temporal"
MODEL_SERVER = "model-server"
STREAM_RELAY = "stream-relay"
VAULT = "vault"
PROXY_WORKER = "proxy-worker"
ALL_IN_ONE = "all-in-one"
HARNESS = "harness"
MODEL_WORKER = "model-worker"
UTILITY_HAND = "utility-hand"
SANDBOX_WORKER = "sandbox-worker"
DOCKERD = "dockerd"
"""Started by the sandbox set-up (corral.sandbox.engine) only when no engine answered; its pid file sits here too."""

PROCESS_ORDER: tuple[str, ...] = (
    TEMPORAL,
    VAULT,
    MODEL_SERVER,
    STREAM_RELAY,
    PROXY_WORKER,
    DOCKERD,
    HARNESS,
    MODEL_WORKER,
    UTILITY_HAND,
    SANDBOX_WORKER,
    ALL_IN_ONE,
)
"""Start order; `down` stops in reverse so workers never outlive the server they talk to."""
SPLIT_WORKERS: tuple[str, ...] = (HARNESS, MODEL_WORKER, UTILITY_HAND, SANDBOX_WORKER)
WORKER_MODULES: dict[str, str] = {
    ALL_IN_ONE: "workers.all_in_one",
    HARNESS: "workers.harness",
    MODEL_WORKER: "workers.model",
    UTILITY_HAND: "workers.utility_hand",
    SANDBOX_WORKER: "workers.sandbox",
}
_CMDLINE_MARKERS: dict[str, str] = {
    TEMPORAL: "temporal",
    MODEL_SERVER: "corral.modelserver",
    STREAM_RELAY: "corral.streaming",
    VAULT: "bao",
    PROXY_WORKER: "workers.proxy",
    DOCKERD: "dockerd",
    **WORKER_MODULES,
}
"""A word each process's command line contains: a pid file whose pid was reused by another program is stale."""

OFFLINE_API_KEY = "offline-stand-in"
"""A dummy key for the offline model server, which accepts any non-empty key; never a real secret."""
_LOG_HEADER = "--- corral up "
_MODEL_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN")
VAULT_ENV = ("VAULT_ADDR", "VAULT_TOKEN", "BAO_ADDR", "BAO_TOKEN", "VAULT_ROLE_ID", "VAULT_SECRET_ID")
"""Only the proxy worker gets these: it is the one process with Vault access."""


class StackError(Exception):
    """A process of the stack could not be started or did not come up."""


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
    marker = _CMDLINE_MARKERS.get(name or "")
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
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
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


# ---- commands and environments ----------------------------------------------------------------------------------


def temporal_command(paths: StatePaths, port: int, ui_port: int, namespace: str) -> list[str]:
    from corral.temporal import temporal_binary

    argv = [
        temporal_binary(),
        "server",
        "start-dev",
        "--db-filename",
        str(paths.database),
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--search-attribute",
        f"{SEARCH_ATTRIBUTE_STATUS}=Keyword",
        "--search-attribute",
        f"{SEARCH_ATTRIBUTE_MODEL}=Keyword",
        "--log-level",
        "warn",
    ]
    if namespace != "default":
        argv += ["--namespace", namespace]
    return argv


def model_server_command(port: int) -> list[str]:
    return [sys.executable, "-m", "corral.modelserver", "--host", "127.0.0.1", "--port", str(port)]


def proxy_worker_command() -> list[str]:
    return [sys.executable, "-m", "workers.proxy"]


def stream_relay_command(port: int) -> list[str]:
    return [sys.executable, "-m", "corral.streaming", "--host", "127.0.0.1", "--port", str(port)]


def worker_command(name: str) -> list[str]:
    return [sys.executable, "-m", WORKER_MODULES[name]]


def base_environment() -> dict[str, str]:
    """The user's environment without model or Vault credentials: only the model and proxy roles get those."""
    env = {key: value for key, value in os.environ.items() if key not in _MODEL_ENV and key not in VAULT_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def worker_environment(
    name: str,
    address: str,
    namespace: str,
    model_url: str | None,
    sandbox_image: str | None = None,
    stream_url: str | None = None,
    git_proxy_port: int | None = None,
) -> dict[str, str]:
    """A worker's environment: where Temporal is, and model credentials only for roles that run model turns.

    With `model_url` (offline mode) the model role talks to the stand-in with a dummy key; otherwise it gets the
    user's ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL as they are.
    """
    env = base_environment()
    env[ENV_TEMPORAL_ADDRESS] = address
    env[ENV_TEMPORAL_NAMESPACE] = namespace
    if sandbox_image is not None and name in (ALL_IN_ONE, SANDBOX_WORKER):
        env["CORRAL_SANDBOX_IMAGE"] = sandbox_image
    if stream_url is not None and name in (ALL_IN_ONE, MODEL_WORKER):
        env["CORRAL_STREAM_URL"] = stream_url
    if git_proxy_port is not None and name in (ALL_IN_ONE, SANDBOX_WORKER, PROXY_WORKER):
        env["CORRAL_GIT_PROXY_PORT"] = str(git_proxy_port)  # the proxy listens there, sandboxes' origin points there
    if name in (ALL_IN_ONE, MODEL_WORKER):
        if model_url is not None:
            env["ANTHROPIC_BASE_URL"] = model_url
            env["ANTHROPIC_API_KEY"] = OFFLINE_API_KEY
        else:
            env.update({key: os.environ[key] for key in _MODEL_ENV if key in os.environ})
    return env


# ---- readiness --------------------------------------------------------------------------------------------------


async def wait_for_temporal(
    address: str, namespace: str, timeout: float, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Return once Temporal accepts a client connection; StackError if `process` exits or time runs out."""
    from corral.temporal import connect

    deadline = time.monotonic() + timeout
    last_error = "no attempt made"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise StackError(f"the Temporal server exited with code {process.returncode}")
        try:
            await asyncio.wait_for(connect(address, namespace), timeout=5)
            return
        except (RuntimeError, TimeoutError) as exc:
            last_error = str(exc) or type(exc).__name__
        await asyncio.sleep(0.3)
    raise StackError(f"Temporal at {address} did not accept connections within {timeout:.0f} s ({last_error})")


async def temporal_cluster_id(address: str, namespace: str) -> str:
    from corral.temporal import cluster_id, connect

    return await cluster_id(await connect(address, namespace))


async def wait_for_http(url: str, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Return once `url` answers 200; StackError if `process` exits or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as client:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise StackError(f"the process serving {url} exited with code {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise StackError(f"{url} did not answer within {timeout:.0f} s")
