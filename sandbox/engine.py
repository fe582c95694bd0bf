"""Make sure a Docker engine answers, starting Debian's `dockerd` on this machine when none does.

The order of preference never starts anything that is not needed:

1. `DOCKER_HOST` is set: that engine, local or remote, is the one to use; nothing is started here.
2. `/var/run/docker.sock` answers a ping: an engine already runs (a system service, or one we started before).
3. Otherwise, as root on Debian: install `docker.io` if `dockerd` is missing, start `dockerd` detached in its own
   session (so it outlives the caller), and wait for it to answer.

The daemon's flags were found by experiment on a machine of this kind (no systemd, cgroup v1 hybrid, ext4 root):
the defaults work there (overlay2, bridge + iptables-nft), but the same code must also come up where overlayfs
cannot be stacked (a Docker data root on overlayfs: "driver not supported") or where iptables is unusable, so
`dockerd` is started through a fallback chain. A failing configuration makes `dockerd` exit within a second or
two, which is how the next one is chosen. Sandboxes run with `network_mode="none"`, so losing the bridge costs
them nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import docker
import requests

from sandbox.errors import DockerEngineError
from sandbox.host import (
    Progress,
    SandboxStatePaths,
    apt_install,
    file_lock,
    find_program,
    is_root,
    system_env,
)

DOCKER_SOCKET = Path("/var/run/docker.sock")
ENGINE_PID_FILE = Path("/var/run/docker.pid")
"""dockerd's own pid file (its default `--pidfile`), distinct from ours under the state directory."""
CONTAINERD_PID_FILE = Path("/var/run/docker/containerd/containerd.pid")
"""The pid file of the containerd that dockerd starts and supervises (under its default `--exec-root`)."""
DOCKERD = "dockerd"
READY_TIMEOUT_S = 60.0
"""How long a started `dockerd` gets to answer a ping (it takes about a second here)."""

_POLL_S = 0.25
_STOP_TIMEOUT_S = 30.0
_started: list[subprocess.Popen[bytes]] = []
"""Daemons started by this process, kept referenced so Python does not warn that they still run when it exits."""


@dataclass(frozen=True)
class DaemonFlags:
    """One configuration of `dockerd` to try; the chain below goes from the fastest to the most permissive."""

    storage_driver: str
    bridge: bool

    def args(self) -> list[str]:
        args = [
            f"--host=unix://{DOCKER_SOCKET}",
            f"--storage-driver={self.storage_driver}",
            # No systemd here: cgroupfs is the only driver that works; saying so keeps dockerd from guessing.
            "--exec-opt=native.cgroupdriver=cgroupfs",
        ]
        if not self.bridge:
            args += ["--iptables=false", "--ip-masq=false", "--bridge=none"]
        return args

    def describe(self) -> str:
        return f"{self.storage_driver} storage, {'bridge networking' if self.bridge else 'no bridge, no iptables'}"


FALLBACK_CHAIN: tuple[DaemonFlags, ...] = (
    DaemonFlags("overlay2", bridge=True),
    DaemonFlags("overlay2", bridge=False),
    DaemonFlags("vfs", bridge=True),
    DaemonFlags("vfs", bridge=False),
)


def ensure_docker_engine(state_dir: Path, *, progress: Progress = print) -> docker.DockerClient:
    """A client of a Docker engine that answers, starting a local `dockerd` first when there is none.

    Idempotent and safe to call from several processes at once: a running engine is reused, and the start is
    serialised by a lock under `state_dir` (logs in `state_dir/logs/dockerd.log`, pid in
    `state_dir/pids/dockerd.pid`). Raises `DockerEngineError` or `PackageInstallError` when it cannot.
    """
    docker_host = os.environ.get("DOCKER_HOST")
    if docker_host:
        client = _connect(None)
        if client is None:
            raise DockerEngineError(
                f"DOCKER_HOST={docker_host} does not answer; start that engine or unset DOCKER_HOST"
            )
        return client
    client = _connect(_local_url())
    if client is not None:
        return client

    paths = SandboxStatePaths(state_dir)
    paths.ensure()
    with file_lock(paths.lock_file(DOCKERD)):
        client = _connect(_local_url())  # another process may have started it while we waited for the lock
        if client is not None:
            return client
        running = our_daemon_pid(state_dir) or _foreign_daemon_pid()
        if running is not None:
            progress(f"waiting for the running dockerd (pid {running}) to answer")
            with contextlib.suppress(_DaemonExited):  # it died meanwhile: start a new one below
                return _wait_until_ready(running, None, paths, deadline=time.monotonic() + READY_TIMEOUT_S)
        if not is_root():
            raise DockerEngineError(
                f"no Docker engine answers at {DOCKER_SOCKET} and starting one needs root; "
                "start Docker (or set DOCKER_HOST to a running engine) and try again"
            )
        if find_program(DOCKERD) is None:
            install_dockerd(state_dir, progress=progress)
            client = _connect(_local_url())  # where no policy-rc.d forbids it, the package starts its own service
            if client is not None:
                return client
        return _start_daemon(paths, progress)


def install_dockerd(state_dir: Path, *, progress: Progress = print) -> str:
    """The path of `dockerd`, installing Debian's `docker.io` first (as root) when it is missing: the one place that
    does, for the engine started here and for whoever starts a `dockerd` of their own (the engine-pool tests).

    Raises `PackageInstallError` when it cannot install, `DockerEngineError` when the package brought no `dockerd`.
    """
    found = find_program(DOCKERD)
    if found is not None:
        return found
    paths = SandboxStatePaths(state_dir)
    paths.ensure()
    apt_install(["docker.io"], log_file=paths.log_file("apt"), progress=progress, purpose="the local Docker engine")
    found = find_program(DOCKERD)
    if found is None:
        raise DockerEngineError(f"dockerd is not installed even after apt-get install docker.io; see {paths.logs}")
    return found


def stop_docker_engine(state_dir: Path, *, timeout: float = _STOP_TIMEOUT_S) -> bool:
    """Stop the `dockerd` that `ensure_docker_engine` started (per its pid file); never any other engine.

    Returns whether a daemon was stopped. Containers it ran are stopped with it.
    """
    paths = SandboxStatePaths(state_dir)
    pid = our_daemon_pid(state_dir)
    if pid is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _is_running(pid, DOCKERD) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    if _is_running(pid, DOCKERD):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    paths.pid_file(DOCKERD).unlink(missing_ok=True)
    return True


def our_daemon_pid(state_dir: Path) -> int | None:
    """The pid of the `dockerd` we started, if it still runs; a stale pid file is removed."""
    pid_file = SandboxStatePaths(state_dir).pid_file(DOCKERD)
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if _is_running(pid, DOCKERD):
        return pid
    pid_file.unlink(missing_ok=True)
    return None


def engine_address() -> str:
    """Where the engine `ensure_docker_engine` returns listens: `DOCKER_HOST`, else the local socket."""
    return os.environ.get("DOCKER_HOST") or _local_url()


def _start_daemon(paths: SandboxStatePaths, progress: Progress) -> docker.DockerClient:
    dockerd = find_program(DOCKERD)
    if dockerd is None:
        raise DockerEngineError(f"dockerd is not installed even after apt-get install docker.io; see {paths.logs}")
    log_path = paths.log_file(DOCKERD)
    # dockerd refuses to start while its pid file names a live process, and a zombie counts: on this machine pid 1
    # reaps orphans only after a few seconds, so a killed dockerd lingers as a zombie. Only a stale file is removed.
    # The same holds for the containerd that dockerd supervises: a stale pid file there makes dockerd wait for a
    # containerd that never answers ("timeout waiting for containerd to start").
    for pid_file, program in ((ENGINE_PID_FILE, DOCKERD), (CONTAINERD_PID_FILE, "containerd")):
        if _live_pid_in(pid_file, program) is None:
            pid_file.unlink(missing_ok=True)
    tried: list[str] = []
    failed_drivers: set[str] = set()
    for flags in FALLBACK_CHAIN:
        if flags.storage_driver in failed_drivers:
            continue
        progress(f"starting dockerd ({flags.describe()}); log: {log_path}")
        with log_path.open("ab") as log:
            log.write(f"\n--- corral: starting {dockerd} {' '.join(flags.args())}\n".encode())
            log.flush()
            process = subprocess.Popen(
                [dockerd, *flags.args()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=system_env(),  # dockerd runs iptables, containerd, runc and docker-init from sbin/bin
                start_new_session=True,
            )
        _started.append(process)
        paths.pid_file(DOCKERD).write_text(f"{process.pid}\n")
        started = time.monotonic()
        try:
            client = _wait_until_ready(process.pid, process, paths, deadline=started + READY_TIMEOUT_S)
        except _DaemonExited as exited:
            paths.pid_file(DOCKERD).unlink(missing_ok=True)
            reason = str(exited)
            tried.append(f"{flags.describe()}: {reason}")
            # Only a storage or network failure is the configuration's fault; anything else would fail the same way
            # with every configuration, so it is reported at once.
            if _mentions(reason, _STORAGE_FAILURE_WORDS):
                failed_drivers.add(flags.storage_driver)
            elif not _mentions(reason, _NETWORK_FAILURE_WORDS):
                raise DockerEngineError(f"dockerd exited at start: {reason}; see {log_path}") from None
            continue
        progress(f"dockerd is ready ({flags.describe()}) after {time.monotonic() - started:.1f} s")
        return client
    raise DockerEngineError(
        "dockerd would not start with any configuration (" + "; ".join(tried) + f"); see {log_path}"
    )


_STORAGE_FAILURE_WORDS = ("graphdriver", "storage driver", "storage-driver", "overlay")
_NETWORK_FAILURE_WORDS = ("iptables", "bridge", "nat chain", "network controller", "netlink", "docker0")


def _mentions(text: str, words: tuple[str, ...]) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in words)


def _foreign_daemon_pid() -> int | None:
    """The pid in dockerd's own pid file if that process is a live dockerd (started by anyone), else None."""
    return _live_pid_in(ENGINE_PID_FILE, DOCKERD)


def _live_pid_in(pid_file: Path, program: str) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_running(pid, program) else None


class _DaemonExited(Exception):
    """The started dockerd exited before answering: its configuration does not work here."""


def _wait_until_ready(
    pid: int, process: subprocess.Popen[bytes] | None, paths: SandboxStatePaths, *, deadline: float
) -> docker.DockerClient:
    log_path = paths.log_file(DOCKERD)
    while time.monotonic() < deadline:
        client = _connect(_local_url())
        if client is not None:
            return client
        exited = process.poll() is not None if process is not None else not _is_running(pid, DOCKERD)
        if exited:
            raise _DaemonExited(_last_error_line(log_path))
        time.sleep(_POLL_S)
    if process is None:  # a daemon started earlier or by someone else
        raise DockerEngineError(
            f"dockerd (pid {pid}) runs but did not answer at {DOCKER_SOCKET} within {READY_TIMEOUT_S:.0f} s; "
            f"if it listens elsewhere set DOCKER_HOST, otherwise stop it (`kill {pid}`) and try again"
        )
    raise DockerEngineError(
        f"dockerd (pid {pid}) did not answer within {READY_TIMEOUT_S:.0f} s; see {log_path} "
        f"(stop it with `kill {pid}` and try again)"
    )


def _last_error_line(log_path: Path) -> str:
    """The daemon's own reason for exiting, e.g. 'error initializing graphdriver: driver not supported'."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "exited"
    for line in reversed(lines[-40:]):
        if line.startswith("failed to start") or "level=fatal" in line:
            return line.strip()[:300]
    return "exited"


def _local_url() -> str:
    return f"unix://{DOCKER_SOCKET}"


def _connect(base_url: str | None) -> docker.DockerClient | None:
    """A client that answered a ping, or None. `None` as the URL means the environment (`DOCKER_HOST`)."""
    try:
        # Constructing the client already asks the engine for its API version, so it fails when none answers.
        client = docker.from_env() if base_url is None else docker.DockerClient(base_url=base_url)
        client.ping()
    except (docker.errors.DockerException, requests.RequestException, OSError):
        return None
    return client


def _is_running(pid: int, program: str) -> bool:
    """Whether `pid` is a live `program` (not a zombie, not another program that reused the pid)."""
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own exited child: reap it
            return False
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    state = status.rsplit(")", 1)[-1].split()[0]
    return state != "Z" and os.path.basename(command.decode(errors="replace")) == program
