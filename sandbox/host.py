"""Host-side helpers shared by the engine and the image builder: state paths, a file lock, apt-get.

Both `ensure_docker_engine` and `ensure_sandbox_image` may be called at once by different processes (the test
suite and `corral up`, say); a lock file under the state directory serialises the slow, one-time steps so the
second caller waits and then finds the work done, instead of starting a second daemon or a second debootstrap.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import PackageInstallError

Progress = Callable[[str], None]
"""Where long steps report what they are doing (a line of text each); `print` by default."""

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""dockerd, debootstrap and apt-get live in sbin and call tools there (iptables, chroot); a CI PATH may lack it."""

_APT_LOCK_WAIT_S = 300
_apt_lists_updated = False


@dataclass(frozen=True)
class SandboxStatePaths:
    """Where the sandbox helpers keep their state under the corral state directory; created on demand."""

    root: Path

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def image_work(self) -> Path:
        """Scratch space for building the sandbox image (the debootstrap root lives here while it is imported)."""
        return self.root / "sandbox-image"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.pid"

    def lock_file(self, name: str) -> Path:
        return self.locks / f"{name}.lock"

    def ensure(self) -> None:
        for folder in (self.logs, self.pids, self.locks):
            folder.mkdir(parents=True, exist_ok=True)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `path` (blocking); released when the block ends or the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def system_env() -> dict[str, str]:
    """The current environment with the system directories on PATH and apt kept non-interactive."""
    env = dict(os.environ)
    extra = [part for part in SYSTEM_PATH.split(":") if part not in env.get("PATH", "").split(":")]
    env["PATH"] = ":".join(filter(None, [env.get("PATH", ""), *extra]))
    env["DEBIAN_FRONTEND"] = "noninteractive"
    return env


def find_program(name: str) -> str | None:
    """`name` on PATH or in the system directories (sbin is not on every PATH)."""
    return shutil.which(name, path=system_env()["PATH"])


def is_root() -> bool:
    return os.geteuid() == 0


def apt_install(packages: Sequence[str], *, log_file: Path, progress: Progress, purpose: str) -> None:
    """Install Debian packages with apt-get, running `apt-get update` once per process first.

    A failed update is not fatal by itself (one unreachable extra source must not stop the install); a failed
    install is, with the log file named in the error.
    """
    global _apt_lists_updated
    names = " ".join(packages)
    if not is_root():
        raise PackageInstallError(
            f"{purpose} needs the Debian package(s) {names}; install them as root, or run as root"
        )
    apt_get = find_program("apt-get")
    if apt_get is None:
        raise PackageInstallError(f"{purpose} needs the Debian package(s) {names}, and this machine has no apt-get")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    lock_wait = ["-o", f"DPkg::Lock::Timeout={_APT_LOCK_WAIT_S}"]
    with log_file.open("ab") as log:
        if not _apt_lists_updated:
            progress(f"apt-get update (log: {log_file})")
            subprocess.run(
                [apt_get, *lock_wait, "update"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=system_env(),
                check=False,
            )
            _apt_lists_updated = True
        progress(f"installing {names} with apt-get for {purpose} (one time, usually under a minute)")
        started = time.monotonic()
        result = subprocess.run(
            [apt_get, *lock_wait, "install", "-y", "--no-install-recommends", *packages],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=system_env(),
            check=False,
        )
    if result.returncode != 0:
        raise PackageInstallError(
            f"apt-get install {names} failed (exit {result.returncode}) for {purpose}; see {log_file}"
        )
    progress(f"installed {names} in {time.monotonic() - started:.0f} s")
