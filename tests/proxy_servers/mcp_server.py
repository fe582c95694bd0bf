"""A real Streamable-HTTP MCP server (the `mcp` SDK's `MCPServer`) that accepts only bearer tokens the token
authority issued and that have not expired; every tool call records the token it came with."""

from __future__ import annotations

import base64
import time
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.proxy_servers.tokens import TokenAuthority

# A 1x1 transparent PNG, for the non-text content summary.
PIXEL_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


class AuthorityVerifier:
    """The SDK's `TokenVerifier` protocol, answered from the token authority."""

    def __init__(self, authority: TokenAuthority) -> None:
        self.authority = authority

    async def verify_token(self, token: str) -> AccessToken | None:
        expires = self.authority.expiry_of(token)
        if expires is None:
            self.authority.record_rejection(token)
            return None
        return AccessToken(token=token, client_id=self.authority.client_id, scopes=[], expires_at=int(expires))


def create_mcp_app(authority: TokenAuthority, base_url: str) -> Any:
    """The server's ASGI app: MCP at `/mcp`; `/unavailable` always answers 503 (a server in trouble); `/careless`
    answers 401 quoting the token it was sent."""
    server = MCPServer(
        "corral-test-mcp",
        token_verifier=AuthorityVerifier(authority),
        auth=AuthSettings(issuer_url=base_url, resource_server_url=None),
        log_level="WARNING",
    )

    def caller_token() -> str:
        token = get_access_token()
        assert token is not None, "the bearer middleware let an unauthenticated call through"
        return token.token

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        authority.record_tool_call("echo", caller_token())
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        authority.record_tool_call("add", caller_token())
        return a + b

    @server.tool()
    def fail(reason: str) -> str:
        """Always fails, with the reason given (a `ToolError` message reaches the client; other exceptions do not)."""
        authority.record_tool_call("fail", caller_token())
        raise ToolError(reason)

    @server.tool()
    def pixel() -> Image:
        """A one-pixel PNG (non-text content)."""
        authority.record_tool_call("pixel", caller_token())
        return Image(data=PIXEL_PNG, format="png")

    @server.tool()
    def slow(seconds: float) -> str:
        """Sleep, then answer (for timeouts)."""
        authority.record_tool_call("slow", caller_token())
        time.sleep(seconds)
        return "done"

    @server.custom_route("/unavailable", methods=["GET", "POST", "DELETE"])
    async def unavailable(request: Request) -> Response:
        return JSONResponse({"error": "maintenance"}, status_code=503)

    @server.custom_route("/careless", methods=["GET", "POST", "DELETE"])
    async def careless(request: Request) -> Response:
        """Refuses every token and quotes it back, as a careless server might: whatever shows its answer must not."""
        received = request.headers.get("authorization", "")
        token = received.removeprefix("Bearer ")
        return JSONResponse(
            {"error": "invalid_token", "error_description": f"token {token} is unknown", "received": received},
            status_code=401,
        )

    return server.streamable_http_app()
