"""Two small local services for `corral demo`, so it can show credentials at work with nothing to sign up for:
an MCP server that demands a bearer token, and a git smart-HTTP server that demands a token. Both tokens are
random, go straight into Vault, and are used only by the proxy worker; the session never holds them."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from cli.errors import DemoRepositoryError
from corral.serving import ServerThread

GIT_USER = "x-access-token"


class _OneToken:
    """The MCP SDK's token verifier protocol, for a single token."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def verify_token(self, token: str) -> AccessToken | None:
        if not secrets.compare_digest(token, self._token):
            return None
        return AccessToken(token=token, client_id="corral-demo", scopes=[])


def demo_mcp_server(token: str) -> ServerThread:
    """An MCP server at `/mcp` with one tool, `word_count`."""

    def build(base_url: str) -> Any:
        server = MCPServer(
            "corral-demo",
            token_verifier=_OneToken(token),
            auth=AuthSettings(issuer_url=base_url, resource_server_url=None),
            log_level="WARNING",
        )

        @server.tool()
        def word_count(text: str) -> str:
            """Count the words of a text."""
            return f"{len(text.split())} words"

        return server.streamable_http_app()

    return ServerThread(build, name="corral-demo-mcp", lifespan="on", app_takes_url=True)


def demo_git_server(root: Path, token: str) -> ServerThread:
    """`git http-backend` serving the bare repositories under `root`, for Basic `x-access-token:<token>` only."""

    async def backend(request: Request) -> Response:
        import base64

        header = request.headers.get("authorization", "")
        try:
            user, _, given = base64.b64decode(header.removeprefix("Basic ")).decode().partition(":")
        except ValueError:
            user, given = "", ""
        if user != GIT_USER or not secrets.compare_digest(given, token):
            return PlainTextResponse("authentication required\n", 401, {"WWW-Authenticate": 'Basic realm="git"'})
        return await git_http_backend(root, request, await request.body())

    return ServerThread(
        Starlette(routes=[Route("/{path:path}", backend, methods=["GET", "POST"])]), name="corral-demo-git"
    )


async def git_http_backend(root: Path, request: Request, body: bytes) -> Response:
    """Answer one smart-HTTP request with `git http-backend` (CGI) for the repositories under `root`."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_PROJECT_ROOT": str(root),
        "GIT_HTTP_EXPORT_ALL": "1",
        "GATEWAY_INTERFACE": "CGI/1.1",
        "REQUEST_METHOD": request.method,
        "PATH_INFO": "/" + request.path_params["path"],
        "QUERY_STRING": request.url.query,
        "CONTENT_TYPE": request.headers.get("content-type", ""),
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_CONTENT_ENCODING": request.headers.get("content-encoding", ""),
        "GIT_PROTOCOL": request.headers.get("git-protocol", ""),
        "REMOTE_USER": GIT_USER,  # an authenticated user enables receive-pack (push)
        "REMOTE_ADDR": "127.0.0.1",
    }
    process = await asyncio.create_subprocess_exec(
        "git", "http-backend", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    output, _ = await process.communicate(body)
    head, _, payload = output.partition(b"\r\n\r\n")
    if not payload and b"\n\n" in output:
        head, _, payload = output.partition(b"\n\n")
    status, headers = 200, {}
    for line in head.decode("latin-1").splitlines():
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.strip().split()[0])
        elif name:
            headers[name.strip()] = value.strip()
    return Response(payload, status_code=status, headers=headers)


def make_demo_repository(root: Path) -> Path:
    """A bare repository `demo.git` with one commit on `main` (made once, kept under the state directory).

    Built in a scratch directory and moved into place only when complete, so a run that failed halfway leaves
    nothing the next run trips over. Every path handed to git is absolute: git runs in the scratch directory.
    """
    root = root.absolute()
    bare = root / "demo.git"
    if (bare / "HEAD").is_file():
        return bare
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "corral demo",
        "GIT_AUTHOR_EMAIL": "demo@corral.invalid",
        "GIT_COMMITTER_NAME": "corral demo",
        "GIT_COMMITTER_EMAIL": "demo@corral.invalid",
    }
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(bare, ignore_errors=True)  # a half-made one from an interrupted run
    with tempfile.TemporaryDirectory(prefix="seed-", dir=root) as scratch:
        work, staged = Path(scratch) / "seed", Path(scratch) / "demo.git"
        work.mkdir()
        (work / "README.md").write_text("# demo\n\nA repository the corral demo clones and pushes to.\n")
        for args in (
            ["init", "-q", "-b", "main"],
            ["add", "README.md"],
            ["commit", "-q", "-m", "initial commit"],
            ["clone", "-q", "--bare", str(work), str(staged)],
        ):
            done = subprocess.run(["git", *args], cwd=work, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                said = (done.stderr or done.stdout).strip() or "(git printed nothing)"
                raise DemoRepositoryError(f"`git {' '.join(args)}` exited with code {done.returncode}: {said}")
        staged.rename(bare)
    return bare


def branches(bare: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "--git-dir", str(bare), "branch", "--format=%(refname:short)"], capture_output=True, text=True
    )
    return listed.stdout.split()
