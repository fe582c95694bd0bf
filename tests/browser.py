"""Debian's Chromium for the Web UI test: installed here with apt when absent (a new machine or CI has none), so
the README's test command needs no step by hand. `run-tests` runs this module before pytest; the test's fixture
calls `ensure_chromium` again (a no-op once installed), so running that test alone works too.

Playwright drives this Chromium (`executable_path`), never its own browser download: there is no CDN access."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sandbox.errors import PackageInstallError
from sandbox.host import Progress, SandboxStatePaths, apt_install

CHROMIUM = "/usr/bin/chromium"
STATE_DIR = Path(__file__).resolve().parents[1] / ".corral"
"""The test run's state directory (as tests/conftest.py's): the apt log goes under it."""

CHROMIUM_ARGS = [
    "--no-sandbox",  # root in a container: Chromium's own sandbox cannot start there
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""Flags that make Chromium start here with no display, no GPU and no calls home. Playwright adds `--headless` and
a new, empty profile (`--user-data-dir`) itself."""


class ChromiumUnavailable(RuntimeError):
    """Chromium is not installed and could not be installed (not root, no apt, or apt failed)."""


def ensure_chromium(progress: Progress = print) -> str:
    """The path of Chromium, installed with apt first if absent. ChromiumUnavailable says why it cannot be."""
    if _runs(CHROMIUM):
        return CHROMIUM
    log_file = SandboxStatePaths(STATE_DIR).log_file("apt")
    try:
        apt_install(["chromium"], log_file=log_file, progress=progress, purpose="the Web UI test")
    except PackageInstallError as exc:
        raise ChromiumUnavailable(str(exc)) from exc
    if not _runs(CHROMIUM):
        raise ChromiumUnavailable(f"Debian's `chromium` installed, but {CHROMIUM} does not run; see {log_file}")
    return CHROMIUM


def _runs(path: str) -> bool:
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return False
    done = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return done.returncode == 0


def main() -> None:
    started = time.monotonic()
    try:
        path = ensure_chromium()
    except ChromiumUnavailable as exc:
        sys.exit(f"chromium: {exc}")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"chromium: {version} at {path} ({time.monotonic() - started:.1f}s)")


if __name__ == "__main__":
    main()
