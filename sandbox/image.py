"""Build the sandbox image on this machine with no registry, once per recipe.

No image can be pulled here, so the base is made from Debian packages: `debootstrap --variant=minbase` writes a
minimal root with the sandbox's tools into a scratch folder, which is trimmed (apt caches, docs, man pages,
locales, host-specific files), streamed into the engine with `docker import` as `corral-sandbox-base:<hash>`, and
deleted. `images/sandbox/Dockerfile.layer` then adds the non-root user and `/workspace` on top, giving
`corral-sandbox:<hash>`. The hash covers everything that decides the content (suite, variant, packages, trim
list, the layer's build context), so an existing tag is reused at once and a changed recipe builds a new one.
On a machine of this kind debootstrap takes about a minute and the import a few seconds. What goes in the root, and
how it is trimmed and streamed, is `sandbox/rootfs.py`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from sandbox.errors import SandboxImageError
from sandbox.host import (
    Progress,
    SandboxStatePaths,
    apt_install,
    file_lock,
    find_program,
    is_root,
    system_env,
)
from sandbox.rootfs import (
    PACKAGES,
    SUITE,
    TRIMMED_PATHS,
    VARIANT,
    host_debian_mirror,
    remove_root,
    tar_stream,
    trim_root,
)

IMAGE_REPOSITORY = "corral-sandbox"
BASE_REPOSITORY = "corral-sandbox-base"
RECIPE_LABEL = "org.corral.sandbox.recipe"
LAYER_DIR = Path(__file__).resolve().parents[1] / "images" / "sandbox"
LAYER_DOCKERFILE = "Dockerfile.layer"


def sandbox_image_tag() -> str:
    """The tag the current recipe builds, `corral-sandbox:<hash>`; computed without any engine."""
    return f"{IMAGE_REPOSITORY}:{_digest(_base_hash(), _layer_context())}"


def base_image_tag() -> str:
    """The tag of the imported Debian root, `corral-sandbox-base:<hash>`."""
    return f"{BASE_REPOSITORY}:{_base_hash()}"


def base_work_dir(state_dir: Path) -> Path:
    """Where debootstrap writes the root (deleted again after the import)."""
    return SandboxStatePaths(state_dir).image_work / f"rootfs-{_base_hash()}"


def ensure_sandbox_image(client: docker.DockerClient, state_dir: Path, *, progress: Progress = print) -> str:
    """The tag of the sandbox image for the current recipe, building it first if the engine lacks it.

    An existing tag is returned at once (one API call, nothing printed). A build is serialised by a lock under
    `state_dir`, so concurrent callers build once. Raises `SandboxImageError` (or `PackageInstallError` when
    debootstrap cannot be installed), naming the log file.
    """
    try:
        return _ensure_sandbox_image(client, state_dir, progress)
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise SandboxImageError(f"the Docker engine failed while building the sandbox image: {exc}") from exc


def _ensure_sandbox_image(client: docker.DockerClient, state_dir: Path, progress: Progress) -> str:
    tag = sandbox_image_tag()
    if _has_image(client, tag):
        return tag
    paths = SandboxStatePaths(state_dir)
    paths.ensure()
    with file_lock(paths.lock_file("sandbox-image")):
        if _has_image(client, tag):  # built by another process while we waited
            return tag
        started = time.monotonic()
        progress(f"building the sandbox image {tag} (once per machine and recipe)")
        base_tag = base_image_tag()
        if not _has_image(client, base_tag):
            _build_base(client, paths, base_tag, progress)
        _build_layer(client, paths, base_tag, tag, progress)
        size_mb = (client.images.get(tag).attrs.get("Size") or 0) / 1e6
        progress(f"sandbox image {tag} is ready ({size_mb:.0f} MB) after {time.monotonic() - started:.0f} s")
    return tag


# ---- the base: debootstrap, trim, import --------------------------------------------------------------------


def _build_base(client: docker.DockerClient, paths: SandboxStatePaths, base_tag: str, progress: Progress) -> None:
    if not is_root():
        raise SandboxImageError(
            f"building the sandbox base image {base_tag} needs root (debootstrap); run `python -m "
            "sandbox.prepare` once as root"
        )
    if find_program("debootstrap") is None:
        apt_install(["debootstrap"], log_file=paths.log_file("apt"), progress=progress, purpose="the sandbox image")
    debootstrap = find_program("debootstrap")
    if debootstrap is None:
        raise SandboxImageError(f"debootstrap is missing even after apt-get install; see {paths.log_file('apt')}")
    rootfs = paths.image_work / f"rootfs-{_base_hash()}"
    log_path = paths.log_file("debootstrap")
    mirror = host_debian_mirror()
    remove_root(rootfs)  # a leftover of an interrupted build would make debootstrap fail or mix two roots
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    try:
        progress(f"debootstrap --variant={VARIANT} {SUITE} from {mirror} (about a minute; log: {log_path})")
        started = time.monotonic()
        with log_path.open("ab") as log:
            log.write(f"\n--- corral: debootstrap into {rootfs}\n".encode())
            log.flush()
            result = subprocess.run(
                [
                    debootstrap,
                    f"--variant={VARIANT}",
                    "--components=main",
                    f"--include={','.join(PACKAGES)}",
                    SUITE,
                    str(rootfs),
                    mirror,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=system_env(),
                check=False,
            )
        if result.returncode != 0:
            raise SandboxImageError(f"debootstrap failed (exit {result.returncode}); see {log_path}")
        progress(f"debootstrap done in {time.monotonic() - started:.0f} s; trimming and importing as {base_tag}")
        trim_root(rootfs)
        started = time.monotonic()
        _import(client, rootfs, base_tag, log_path)
        progress(f"imported {base_tag} in {time.monotonic() - started:.0f} s")
    finally:
        remove_root(rootfs)  # ~230 MB that the engine now holds a copy of


def _import(client: docker.DockerClient, rootfs: Path, base_tag: str, log_path: Path) -> None:
    repository, tag = base_tag.split(":", 1)
    changes = [f"LABEL {RECIPE_LABEL}={_base_hash()}", "ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]']
    try:
        client.api.import_image_from_stream(
            tar_stream(rootfs, log_path), repository=repository, tag=tag, changes=changes
        )
    except (docker.errors.DockerException, OSError) as exc:
        raise SandboxImageError(f"docker import of the sandbox root failed: {exc}; see {log_path}") from exc
    if not _has_image(client, base_tag):
        raise SandboxImageError(f"docker import finished but {base_tag} does not exist; see {log_path}")


# ---- the layer ------------------------------------------------------------------------------------------------


def _build_layer(
    client: docker.DockerClient, paths: SandboxStatePaths, base_tag: str, tag: str, progress: Progress
) -> None:
    log_path = paths.log_file("sandbox-image-build")
    progress(f"building {tag} from {base_tag} and {LAYER_DIR / LAYER_DOCKERFILE} (log: {log_path})")
    try:
        _, output = client.images.build(
            path=str(LAYER_DIR),
            dockerfile=LAYER_DOCKERFILE,
            buildargs={"BASE_IMAGE": base_tag},
            tag=tag,
            labels={RECIPE_LABEL: tag.split(":", 1)[1]},
            pull=False,
            rm=True,
            forcerm=True,
        )
        _write_build_log(log_path, output)
    except docker.errors.BuildError as exc:
        _write_build_log(log_path, exc.build_log)
        raise SandboxImageError(f"building {tag} failed: {exc.msg}; see {log_path}") from exc
    except docker.errors.DockerException as exc:
        raise SandboxImageError(f"building {tag} failed: {exc}") from exc


def _write_build_log(log_path: Path, output: Iterable[Any]) -> None:
    """The builder's output lines (each entry a dict with `stream` or `error`)."""
    with log_path.open("a") as log:
        for entry in output:
            if isinstance(entry, dict):
                log.write(str(entry.get("stream") or entry.get("error") or ""))


# ---- the recipe hash ------------------------------------------------------------------------------------------


def _base_hash() -> str:
    return _digest(
        json.dumps({"suite": SUITE, "variant": VARIANT, "packages": sorted(PACKAGES), "trim": TRIMMED_PATHS})
    )


def _layer_context() -> str:
    """The layer's build context as text to hash: every file's path, executable bit and content.

    The whole folder counts, not only Dockerfile.layer, so a file the layer copies in (a helper script, say) also
    makes a new tag when it changes. The production `Dockerfile` is left out: it does not shape the local image.
    """
    if not (LAYER_DIR / LAYER_DOCKERFILE).is_file():
        raise SandboxImageError(
            f"{LAYER_DIR / LAYER_DOCKERFILE} is missing: the sandbox image is built from a source checkout of corral"
        )
    digest = hashlib.sha256()
    for path in sorted(LAYER_DIR.rglob("*")):
        if path.is_file() and path.relative_to(LAYER_DIR).as_posix() != "Dockerfile":
            executable = path.stat().st_mode & 0o111 != 0
            digest.update(f"{path.relative_to(LAYER_DIR).as_posix()}\0{executable}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _has_image(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True
