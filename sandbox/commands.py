"""The argv of every command the sandbox worker runs in a container or has an image build run: pure functions.

No command here is a shell string with input in it. A value from a session (a mount path, a branch, a package name,
a call id) is one whole argv element, or a positional argument of a fixed script (`sh -c SCRIPT NAME ARG…`, where
SCRIPT is constant text), and the values are checked again where they meet the command (the contract checked them
at the edge). `tests/test_properties_no_shell.py` throws shell metacharacters at each.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from corral.contract.grammar import branch_problem, workspace_path_problem
from corral.contract.sandbox import Packages, RepositoryClone
from sandbox.errors import SandboxError, SandboxSetupError
from sandbox.workspace import SANDBOX_GID, SANDBOX_UID

STATE_DIR = "/run/corral"
OUTPUT_DIR = "/run/corral-out"
"""A tmpfs of its own for bash calls' outputs: endless output fills it, never the calls' records in STATE_DIR."""


_APT_SCRIPT = (
    'apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" '
    "&& rm -rf /var/lib/apt/lists/*"
)
_PIP_SCRIPT = 'pip install --no-cache-dir --break-system-packages -- "$@"'


def packages_dockerfile(base: str, packages: Packages) -> str:
    """The Dockerfile of a recipe's derived image. Its RUN lines are in exec form (JSON argv): each script is fixed
    text, and the package names are its positional arguments, one argv element each, so no shell ever parses a
    name (a pip specifier such as `x>=1` keeps its `>`)."""
    apt = sorted(set(packages.apt) | ({"python3-pip"} if packages.pip else set()))
    lines = [f"FROM {base}", "USER root"]  # `base` is the operator's image setting, not a session's input
    if apt:
        lines.append("RUN " + json.dumps(["sh", "-c", _APT_SCRIPT, "apt", *apt]))
    if packages.pip:
        lines.append("RUN " + json.dumps(["sh", "-c", _PIP_SCRIPT, "pip", *packages.pip]))
    lines.append(f"USER {SANDBOX_UID}:{SANDBOX_GID}")
    return "\n".join(lines)


def working_dir_command(working_dir: str) -> list[str]:
    """The argv that makes the recipe's working directory (one argv element, never an option)."""
    return ["mkdir", "-p", "--", working_dir]


@dataclass(frozen=True)
class CloneCommands:
    """The argv of each step of one repository's clone (no shell: every value is one argv element)."""

    present: list[str]
    """Exits 0 when the workspace already has the clone (it survived a dead container)."""
    clone: list[str]
    checkout: list[str] | None


_PLAIN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def clone_commands(repository: RepositoryClone, proxy: str) -> CloneCommands:
    """The commands that clone `repository` through the git proxy at `proxy`. The contract checked these values
    at the edge; they are checked again here, where they meet a command, so a value that slipped past (an input
    recorded before the check existed) fails the provision with a message instead of reaching git."""
    problem = workspace_path_problem(repository.mount_path)
    if problem is not None:
        raise SandboxSetupError(f"repository {repository.repository_id!r}: mount_path {problem}")
    for what, value in (("repository_id", repository.repository_id), ("reference", repository.reference)):
        if not _PLAIN_ID.fullmatch(value):
            raise SandboxSetupError(f"repository {value!r}: {what} may hold only letters, digits, '_' and '-'")
    checkout = repository.checkout
    problem = None if checkout is None else branch_problem(checkout)
    if problem is not None:
        raise SandboxSetupError(f"repository {repository.repository_id!r}: checkout {checkout!r}: {problem}")
    origin = f"{proxy}/{repository.reference}/{repository.repository_id}"
    mount = repository.mount_path
    return CloneCommands(
        present=["test", "-d", f"{mount}/.git"],
        clone=["git", "clone", "--quiet", "--", origin, mount],
        # The ref is never read as an option (branch_problem refuses a leading '-'; git 2.39's checkout does not
        # honour --end-of-options) nor as a path (`--`).
        checkout=None if not checkout else ["git", "-C", mount, "checkout", "--quiet", checkout, "--"],
    )


def call_output_command(call_id: str) -> list[str]:
    """The argv that prints a bash call's whole output. A fixed script (it falls back from the outputs' tmpfs to
    the call's record): the call id is its positional argument `$1`, never part of its text, and must be one file
    name, as the runner requires of it."""
    if not call_id or call_id in (".", "..") or "/" in call_id or "\0" in call_id:
        raise SandboxError(f"bad call id {call_id!r}")
    script = f'cat -- "{OUTPUT_DIR}/$1" 2>/dev/null || cat -- "{STATE_DIR}/calls/$1/out"'
    return ["sh", "-c", script, "output", call_id]
