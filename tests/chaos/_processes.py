"""Real role processes a fault test can SIGKILL and start again: the workers' own entrypoints and the stream relay.

Each runs as `python -m <module>`, configured by its environment as in production, its output appended to a log in
the test's tmp dir. `kill()` is the fault (SIGKILL, no clean-up of any kind); `start()` again is the replacement.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from corral.names import ENV_TEMPORAL_ADDRESS

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RoleProcess:
    """One role's process: started, SIGKILLed, started again; every process it started is stopped at the end."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def current(self) -> subprocess.Popen[bytes]:
        return self.processes[-1]

    def start(self) -> None:
        with self.log.open("ab") as log:
            log.write(f"\n--- {self.name}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.processes.append(
                subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
            )

    def kill(self) -> float:
        """SIGKILL the running process and reap it; returns when (monotonic) it was dead."""
        process = self.current
        assert process.poll() is None, f"{self.name} exited before the fault: see {self.log}"
        process.send_signal(signal.SIGKILL)
        process.wait()
        return time.monotonic()

    def alive(self) -> bool:
        return bool(self.processes) and self.current.poll() is None

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@contextmanager
def role_process(name: str, argv: list[str], log_dir: Path, **env: str) -> Iterator[RoleProcess]:
    """`argv` started now with the test run's environment plus `env`; every process of it stopped at the end."""
    role = RoleProcess(name, argv, {**os.environ, "PYTHONUNBUFFERED": "1", **env}, log_dir / f"{name}.log")
    role.start()
    try:
        yield role
    finally:
        role.stop_all()


def worker_argv(role: str) -> list[str]:
    """A worker's own entrypoint (`workers/<role>.py`), serving its role's default task queue."""
    return [sys.executable, "-m", f"workers.{role}"]


def temporal_env(address: str) -> dict[str, str]:
    return {ENV_TEMPORAL_ADDRESS: address}


async def until_healthy(base_url: str, role: RoleProcess, within: float = 120) -> None:
    """Wait until `GET /healthz` answers 200 (the relay or another small HTTP server is serving). Generous: on two
    loaded cores a process took over 30 s to start; one that exits fails the wait at once."""
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=2) as http:
        while time.monotonic() < deadline:
            assert role.alive(), f"{role.name} exited: see {role.log}"
            try:
                if (await http.get(f"{base_url}/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"{role.name} did not answer at {base_url} within {within}s: see {role.log}")
