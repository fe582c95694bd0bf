"""`python -m sandbox.prepare`: make sure a Docker engine runs and the sandbox image exists.

The README's test command, CI and `corral up` run this (or call the two functions) before anything needs a
sandbox; run by hand it does the one-time work (apt-get, debootstrap) in the open, with progress.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from corral.names import ENV_STATE_DIR
from sandbox.engine import engine_address, ensure_docker_engine
from sandbox.errors import SandboxSetupError
from sandbox.image import ensure_sandbox_image


def _progress(message: str) -> None:
    print(f"[sandbox] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.prepare",
        description="Start a Docker engine if none answers, and build the sandbox image if it is missing.",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get(ENV_STATE_DIR, ".corral")),
        help="where logs, pid files and build scratch space live (default: $CORRAL_STATE_DIR or .corral)",
    )
    args = parser.parse_args(argv)
    state_dir: Path = args.state_dir.resolve()
    try:
        client = ensure_docker_engine(state_dir, progress=_progress)
        version = client.version()
        engine = f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')})"
        _progress(f"engine: {engine} at {engine_address()}")
        tag = ensure_sandbox_image(client, state_dir, progress=_progress)
    except SandboxSetupError as exc:
        print(f"corral sandbox prepare failed: {exc}", file=sys.stderr)
        return 1
    _progress(f"image: {tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
