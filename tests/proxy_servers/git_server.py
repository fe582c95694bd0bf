"""A real smart-HTTP git server: `git http-backend` (CGI) behind Starlette, serving bare repositories from one
folder, that demands `Authorization: Basic x-access-token:<token>` (GitHub's convention) on every request."""

from __future__ import annotations

import base64
import binascii
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from cli.demo_services import git_http_backend

GIT_USER = "x-access-token"


@dataclass
class GitServerLog:
    """What the server saw: the Basic credentials of every request (None when there were none), and the
    transfer encoding of every request body (`chunked` when the sender streamed it with no length)."""

    credentials: list[tuple[str, str] | None] = field(default_factory=list)
    body_encodings: list[str] = field(default_factory=list)


def _basic(request: Request) -> tuple[str, str] | None:
    header = request.headers.get("authorization", "")
    if not header.lower().startswith("basic "):
        return None
    try:
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return user, password


def create_git_app(project_root: Path, token: str, log: GitServerLog | None = None) -> Starlette:
    """Serve every bare repository under `project_root` at `/<name>.git/…`, for the one token given."""
    seen = log if log is not None else GitServerLog()

    async def backend(request: Request) -> Response:
        credentials = _basic(request)
        seen.credentials.append(credentials)
        if credentials != (GIT_USER, token):
            return PlainTextResponse(
                "authentication required\n", status_code=401, headers={"WWW-Authenticate": 'Basic realm="git"'}
            )
        seen.body_encodings.append(request.headers.get("transfer-encoding", "length"))
        return await git_http_backend(project_root, request, await request.body())

    return Starlette(routes=[Route("/{path:path}", backend, methods=["GET", "POST"])])


def git(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run the real git CLI; raise with its output on failure."""
    result = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


def isolated_git_env(home: Path) -> dict[str, str]:
    """An environment with no user or system git config, no credential helper and no terminal prompt."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "GIT_AUTHOR_NAME": "corral test",
        "GIT_AUTHOR_EMAIL": "test@corral.invalid",
        "GIT_COMMITTER_NAME": "corral test",
        "GIT_COMMITTER_EMAIL": "test@corral.invalid",
    }


def make_bare_repository(project_root: Path, name: str, scratch: Path) -> Path:
    """A bare repository `<project_root>/<name>.git` with one commit on `main`."""
    env = isolated_git_env(scratch / "home")
    work = scratch / f"{name}-seed"
    work.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=work, env=env)
    (work / "README.md").write_text(f"# {name}\n")
    git("add", "README.md", cwd=work, env=env)
    git("commit", "-q", "-m", "initial commit", cwd=work, env=env)
    bare = project_root / f"{name}.git"
    git("clone", "-q", "--bare", str(work), str(bare), env=env)
    return bare
