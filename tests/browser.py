"""Debian's Chromium for the Web UI test: installed here with apt when absent (a new machine or CI has none), so
the README's test command needs no step by hand. `run-tests` runs this module before pytest; the test's fixture
calls `ensure_chromium` again (a no-op once installed), so running that test alone works too.

Playwright drives this Chromium (`executable_path`), never its own browser download: there is no CDN access."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

CHROMIUM = "/usr/bin/chromium"

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


def ensure_chromium() -> str:
    """The path of Chromium, installed with apt first if absent. ChromiumUnavailable says why it cannot be."""
    if _runs(CHROMIUM):
        return CHROMIUM
    apt = shutil.which("apt-get")
    if apt is None:
        raise ChromiumUnavailable(f"{CHROMIUM} is missing and there is no apt-get to install Debian's `chromium`")
    if os.geteuid() != 0:
        raise ChromiumUnavailable(f"{CHROMIUM} is missing: install it as root with `apt-get install -y chromium`")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "--no-install-recommends", "chromium"]
    done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:  # the package lists may be stale or absent (a fresh image): update them, then again
        update = subprocess.run([apt, "update"], env=env, capture_output=True, text=True, check=False)
        if update.returncode != 0:
            raise ChromiumUnavailable(f"`apt-get update` failed: {update.stderr.strip()[-2000:]}")
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    if done.returncode == 0 and _runs(CHROMIUM):
        return CHROMIUM
    raise ChromiumUnavailable(f"`{' '.join(install)}` did not install {CHROMIUM}: {done.stderr.strip()[-2000:]}")


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
