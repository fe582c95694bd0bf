"""A real OAuth 2.0 token endpoint (Starlette) for the refresh-token grant, with the client authentication the
token authority demands: `none` (client_id in the body), `client_secret_basic` or `client_secret_post`."""

from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.proxy_servers.tokens import TokenAuthority

TOKEN_PATH = "/oauth/token"


def _basic_credentials(request: Request) -> tuple[str, str] | None:
    header = request.headers.get("authorization", "")
    if not header.lower().startswith("basic "):
        return None
    try:
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return unquote(user), unquote(password)


def create_token_app(authority: TokenAuthority) -> Starlette:
    """POST /oauth/token: grant_type=refresh_token → a new access token (and a rotated refresh token)."""

    async def token(request: Request) -> JSONResponse:
        form = await request.form()
        fields = {name: value for name, value in form.items() if isinstance(value, str)}
        basic = _basic_credentials(request)
        client_id: str | None
        client_secret: str | None
        if authority.client_auth == "client_secret_basic":
            client_id, client_secret = basic if basic else (None, None)
            used = "client_secret_basic" if basic else "missing"
        else:
            client_id, client_secret = fields.get("client_id"), fields.get("client_secret")
            used = "client_secret_post" if client_secret is not None else "none"
        if not authority.client_authenticates(client_id, client_secret) or used != authority.client_auth:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        if fields.get("grant_type") != "refresh_token":
            return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
        granted = authority.exchange(fields.get("refresh_token", ""), used)
        if granted is None:
            return JSONResponse(
                {"error": "invalid_grant", "error_description": "refresh token unknown"}, status_code=400
            )
        access, rotated = granted
        body: dict[str, object] = {"access_token": access, "token_type": "Bearer", "expires_in": authority.access_ttl}
        if rotated is not None:
            body["refresh_token"] = rotated
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    return Starlette(routes=[Route(TOKEN_PATH, token, methods=["POST"])])
