"""The default stack as a user starts it: `corral up` in a state dir of its own, on free ports, then `corral down`.

A benchmark that claims to measure what a user gets runs the real CLI in its own processes, as the tests do, so
nothing of the benchmark's own wiring (queues, workers, settings) sits between the figure and the product.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.names import ENV_STATE_DIR

PORT_OPTIONS = ("--temporal-port", "--ui-port", "--model-port", "--stream-port", "--git-proxy-port", "--api-port")
# Below the kernel's ephemeral range (32768-60999): an outgoing connection of another process cannot take a port
# here between the check and `corral up` binding it.
PORT_RANGE = (20000, 32000)


def free_port(taken: set[int]) -> int:
    """A port nothing listens on now, outside the ephemeral range, and not one already picked."""
    for _ in range(200):
        port = random.randint(*PORT_RANGE)
        if port in taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError(f"no free port in {PORT_RANGE}")


@dataclass
class Stack:
    """A running `corral up` stack: its state dir, its ports, and the environment its CLI commands need."""

    state_dir: Path
    ports: dict[str, int]
    env: dict[str, str]

    def corral(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The `corral` command as a user runs it, in its own process; a non-zero exit raises with its output."""
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode:
            raise RuntimeError(f"corral {' '.join(args)} exited {done.returncode}: {done.stdout}{done.stderr}")
        return done

    @property
    def model_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['--model-port']}"

    def events(self, session_id: str) -> list[dict[str, Any]]:
        """The session's whole log as `corral events --json` prints it."""
        out = self.corral("events", session_id, "--json").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def up() -> Stack:
    """`corral up` with a temporary state dir and free ports; the caller must `down` it."""
    state_dir = Path(tempfile.mkdtemp(prefix="corral-bench-stack-"))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANTHROPIC_", "CORRAL_", "VAULT_"))}
    env[ENV_STATE_DIR] = str(state_dir)
    taken: set[int] = set()
    stack = Stack(state_dir, {option: free_port(taken) for option in PORT_OPTIONS}, env)
    try:
        stack.corral("up", *(str(part) for option, port in stack.ports.items() for part in (option, port)))
    except BaseException:
        down(stack)
        raise
    return stack


def down(stack: Stack) -> None:
    """`corral down --sandboxes` (the stack's sandboxes and warm pool go too), then the state dir."""
    subprocess.run(
        [sys.executable, "-m", "cli.main", "down", "--sandboxes"],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    shutil.rmtree(stack.state_dir, ignore_errors=True)
