"""The stack's processes, detached: spawned with their output in a log and their pid in a file under the state
directory, found again by pid (checked against their command line, as pids are reused), and stopped by process
group. `corral up`, `status` and `down`, run from different shells at different times, agree through these files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from cli.stack import MARKERS, PROCESS_ORDER, StatePaths

_LOG_HEADER = "--- corral up "


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
    marker = MARKERS.get(name or "")
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
    """Signal the process group we created with `start_new_session` (it outlives its leader while children of the
    leader remain), or just the pid if there is no such group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _group_left(leader: int) -> bool:
    """Whether a process of the group `leader` started (its children) outlives it: they are stopped with it."""
    try:
        os.killpg(leader, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return any(_group_of(pid) == leader and not _zombie(pid) for pid in (int(entry.name) for entry in _proc_entries()))


def _proc_entries() -> list[Path]:
    return [entry for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _group_of(pid: int) -> int | None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        return os.getpgid(pid)
    return None


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    return True


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
            if not is_alive(state.pid, name) and not _group_left(state.pid):
                return state.pid, "stopped"
            time.sleep(0.1)
        _signal_group(state.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while (is_alive(state.pid, name) or _group_left(state.pid)) and time.monotonic() < deadline:
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
