"""The sandbox's Debian root, made on this host: what goes in it (suite, variant, packages), the mirror the host's
apt uses, what is trimmed from the root before import, the root as a tar stream, and its safe removal.

`sandbox/image.py` runs debootstrap with these and imports the root into the engine. No Docker here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from sandbox.errors import SandboxImageError
from sandbox.host import system_env

SUITE = "bookworm"
VARIANT = "minbase"
PACKAGES: tuple[str, ...] = (
    "bash",
    "ca-certificates",
    "coreutils",
    "curl",
    "diffutils",
    "findutils",
    "git",
    "grep",
    "gzip",
    "patch",
    "procps",
    "python3",
    "ripgrep",
    "sed",
    "tar",
    "xz-utils",
)
"""What an agent's bash/read/write/edit/glob/grep tools need; `images/sandbox/Dockerfile` installs the same list."""

DEFAULT_MIRROR = "http://deb.debian.org/debian"

TRIMMED_PATHS: tuple[str, ...] = (
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/*.bin",
    "var/lib/apt/lists/*_*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*/",
    "usr/share/lintian/*",
    "var/log/*.log",
    "var/log/apt/*",
)
"""Removed from the debootstrap root before import: caches and docs nobody reads in a sandbox (~170 MB)."""


def host_debian_mirror(suite: str = SUITE, *, apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror the host's apt uses for `suite` (so the sandbox comes from the same place), or the default.

    Reads both source formats: one-line `deb URI SUITE COMPONENTS` in `*.list`, and deb822 `*.sources` stanzas.
    """
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in files:
        for line in _read_lines(path):
            words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
            if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
                return words[1].rstrip("/")
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in _deb822_stanzas(path):
            enabled = stanza.get("enabled", "yes").lower() != "no"
            if (
                enabled
                and "deb" in stanza.get("types", "").split()
                and suite in stanza.get("suites", "").split()
                and "main" in stanza.get("components", "").split()
            ):
                return stanza.get("uris", DEFAULT_MIRROR).split()[0].rstrip("/")
    return DEFAULT_MIRROR


def trim_root(rootfs: Path) -> None:
    """Delete caches and docs, and replace the files debootstrap copied from the host (name, resolver)."""
    for pattern in TRIMMED_PATHS:
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    doc = rootfs / "usr/share/doc"
    for path in sorted(doc.rglob("*"), reverse=True):  # keep each package's copyright file, drop the rest
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif path.name != "copyright":
            path.unlink()
    # Docker mounts its own /etc/hostname, /etc/hosts and /etc/resolv.conf into every container; the image must
    # not carry the build host's.
    # Each is unlinked first: writing through a symlink in the root would write the host's file of that name.
    for name, text in (
        ("etc/hostname", "sandbox\n"),
        ("etc/resolv.conf", ""),
        ("etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
    ):
        (rootfs / name).unlink(missing_ok=True)
        (rootfs / name).write_text(text)


def tar_stream(rootfs: Path, log_path: Path) -> Iterator[bytes]:
    """The root as an uncompressed tar, read from GNU tar in 1 MiB chunks (never all of it in memory)."""
    with log_path.open("ab") as log:
        tar = subprocess.Popen(
            # /dev, /proc and /sys are provided by the engine in every container; their content stays out.
            [
                "tar",
                "--numeric-owner",
                "--exclude=./dev/*",
                "--exclude=./proc/*",
                "--exclude=./sys/*",
                f"--directory={rootfs}",
                "--create",
                "--file=-",
                ".",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            env=system_env(),
        )
        assert tar.stdout is not None
        with tar.stdout:
            while chunk := tar.stdout.read(1 << 20):
                yield chunk
        if tar.wait() != 0:
            raise SandboxImageError(f"tar of the sandbox root failed (exit {tar.returncode}); see {log_path}")


def remove_root(path: Path) -> None:
    """Delete a debootstrap root, first unmounting what an interrupted debootstrap may have left mounted in it.

    debootstrap mounts /proc, /sys and, inside containers, binds the host's /dev into the root; deleting through
    such a mount would delete the host's files, so a remaining mount stops the removal instead.
    """
    if not path.exists():
        return
    for mount_point in _mounts_below(path):
        subprocess.run(["umount", "--lazy", mount_point], check=False, capture_output=True, env=system_env())
    left = _mounts_below(path)
    if left:
        raise SandboxImageError(f"cannot delete {path}: still mounted there: {', '.join(left)}")
    shutil.rmtree(path)


def _mounts_below(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    mounts = []
    for line in _read_lines(Path("/proc/self/mounts")):
        fields = line.split()
        if len(fields) > 1:
            mount_point = fields[1].replace("\\040", " ")
            if mount_point.startswith(prefix) or mount_point == prefix[:-1]:
                mounts.append(mount_point)
    return sorted(mounts, key=len, reverse=True)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def _deb822_stanzas(path: Path) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = ""
    for line in [*_read_lines(path), ""]:
        if not line.strip():
            if current:
                stanzas.append(current)
            current, key = {}, ""
        elif line.startswith("#"):
            continue
        elif line[0].isspace() and key:
            current[key] += " " + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            key = key.strip().lower()
            current[key] = value.strip()
    return stanzas
