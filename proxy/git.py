"""A git smart-HTTP proxy that adds a session's repository token outside the sandbox.

The sandbox's `origin` is `http://<proxy>/<reference>/<repo_id>`: no token in the URL, the config or the
environment of the container. This proxy resolves the reference to its session (only while the session's binding
is live), looks up that session's repository `repo_id`, and forwards the three smart-HTTP endpoints to the real
URL with `Authorization` added (GitHub style `Basic x-access-token:TOKEN`, or `Bearer`):

    GET  /<reference>/<repo_id>/info/refs?service=git-upload-pack|git-receive-pack
    POST /<reference>/<repo_id>/git-upload-pack
    POST /<reference>/<repo_id>/git-receive-pack

Anything else (an unknown or revoked reference, another session's repository, the dumb HTTP protocol) is a 404
and is never forwarded. Bodies stream both ways (a push or a clone is never held in memory), bytes untouched
(a gzip-encoded request stays gzip-encoded). The upstream's redirects and authentication challenges are not passed
on: a redirect would lead the client away from the proxy, and a challenge would make it ask for a password.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from corral.serving import ServerThread
from proxy.sessions import ResolvedRepository
from proxy.vault import VaultStore

logger = logging.getLogger(__name__)

_SERVICES = ("git-upload-pack", "git-receive-pack")
_REQUEST_HEADERS = ("content-type", "content-encoding", "content-length", "accept", "git-protocol", "user-agent")
_RESPONSE_HEADERS = ("content-type", "content-encoding", "cache-control", "expires", "pragma")


def create_git_proxy_app(store: VaultStore, *, connect_timeout: float = 10.0, read_timeout: float = 300.0) -> Starlette:
    """The proxy as an ASGI app (one shared upstream HTTP client, opened and closed with the app's lifespan)."""
    clients: list[httpx.AsyncClient] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            clients.append(client)
            yield
            clients.clear()

    def resolve(reference: str, repo_id: str) -> ResolvedRepository | None:
        session_id = store._resolve_reference(reference)
        return None if session_id is None else store._resolve_repository(session_id, repo_id)

    async def forward(request: Request) -> Response:
        endpoint = str(request.path_params["endpoint"])
        if endpoint == "info/refs":
            if request.method != "GET" or request.query_params.get("service") not in _SERVICES:
                return _not_found()
        elif endpoint not in _SERVICES or request.method != "POST":
            return _not_found()
        repository = await asyncio.to_thread(resolve, request.path_params["reference"], request.path_params["repo_id"])
        if repository is None:
            return _not_found()
        return await _relay(clients[0], request, repository, endpoint)

    routes = [Route("/{reference}/{repo_id}/{endpoint:path}", forward, methods=["GET", "POST"])]
    return Starlette(routes=routes, lifespan=lifespan)


async def _relay(
    client: httpx.AsyncClient, request: Request, repository: ResolvedRepository, endpoint: str
) -> Response:
    url = repository.url.rstrip("/") + "/" + endpoint
    if request.url.query:
        url += "?" + request.url.query
    headers = {name: value for name in _REQUEST_HEADERS if (value := request.headers.get(name)) is not None}
    headers["authorization"] = repository.authorization()
    body = request.stream() if request.method == "POST" else None
    upstream_request = client.build_request(request.method, url, headers=headers, content=body)
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.HTTPError as exc:
        logger.warning("git proxy: upstream %s unreachable (%s)", _host(repository.url), type(exc).__name__)
        return PlainTextResponse(f"the git server {_host(repository.url)} could not be reached\n", status_code=502)
    if upstream.status_code == 401 or 300 <= upstream.status_code < 400:
        await upstream.aclose()
        logger.warning("git proxy: upstream %s answered %s", _host(repository.url), upstream.status_code)
        reason = "refused the repository token" if upstream.status_code == 401 else "redirected the request"
        return PlainTextResponse(f"the git server {_host(repository.url)} {reason}\n", status_code=502)
    response_headers = {name: value for name in _RESPONSE_HEADERS if (value := upstream.headers.get(name)) is not None}
    return StreamingResponse(
        upstream.aiter_raw(),
        status_code=upstream.status_code,
        headers=response_headers,
        background=BackgroundTask(upstream.aclose),
    )


def _not_found() -> Response:
    return PlainTextResponse("not found\n", status_code=404)


def _host(url: str) -> str:
    return httpx.URL(url).host


class GitProxyServer(ServerThread):
    """The git proxy served by uvicorn in a daemon thread.

    `host` defaults to loopback; pass the address the sandboxes can reach (e.g. the Docker bridge gateway) to
    serve them. `repository_url(reference, repo_id)` is the `origin` a sandbox should use."""

    def __init__(self, store: VaultStore, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(create_git_proxy_app(store), host=host, port=port, name="corral-git-proxy", lifespan="on")

    def repository_url(self, reference: str, repo_id: str) -> str:
        """The URL a sandbox clones from and pushes to for one of its session's repositories."""
        if self.base_url is None:
            raise RuntimeError("the git proxy is not running")
        return f"{self.base_url}/{reference}/{repo_id}"
