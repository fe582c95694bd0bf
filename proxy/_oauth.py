"""The OAuth 2.0 refresh-token grant (RFC 6749 section 6), as the MCP proxy needs it.

Client authentication follows the credential's `token_endpoint_auth`: `none` (public client: `client_id` in the
body), `client_secret_basic` (HTTP Basic with the form-urlencoded id and secret, section 2.3.1) or
`client_secret_post` (both in the body). Failures are sorted for the caller:

- an OAuth error answer (4xx, e.g. `invalid_grant`) means the refresh token is no good: `McpTokenRefreshFailed`,
  not retryable, with the OAuth error *code* only (a description could quote anything);
- an endpoint that is down, times out or answers 5xx may recover: `McpConnectionFailed`, retryable.

`exchange_refresh_token` returns a refusal rather than raising it (`TokenEndpointRefusal`, its `error` the one
above), so a credential validation can report the endpoint's answer; a call raises the `error`.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import quote, urlsplit

import httpx
from pydantic import SecretStr

from proxy._credentials import ResolvedMcpCredential
from proxy._ids import now
from proxy.errors import McpConnectionFailed, McpError, McpTokenRefreshFailed

_ERROR_CODE = re.compile(r"^[a-z_]{1,64}$")


@dataclass(frozen=True)
class RefreshedToken:
    """A new access token, when it expires, and the rotated refresh token if the endpoint issued one."""

    access_token: SecretStr
    expires_at: datetime | None
    refresh_token: SecretStr | None


@dataclass(frozen=True)
class TokenEndpointRefusal:
    """The token endpoint's answer to a refresh it did not grant (an error status, or a 200 with no bearer token
    in it). `body` is the endpoint's raw answer and may quote a secret: it goes to `proxy.validation`, which
    scrubs it, and nowhere else; `error` is what a call raises for it, safe to show."""

    status_code: int
    content_type: str
    body: bytes = field(repr=False)
    error: McpError


async def exchange_refresh_token(
    credential: ResolvedMcpCredential, *, timeout: float = 15.0
) -> RefreshedToken | TokenEndpointRefusal:
    """The refresh exchange: a new token, or the endpoint's refusal; `McpConnectionFailed` when it cannot be
    reached at all."""
    if not credential.refreshable:
        raise McpTokenRefreshFailed(f"credential {credential.credential_id} has no refresh token")
    assert credential.token_endpoint is not None and credential.client_id is not None
    assert credential.refresh_token is not None
    endpoint_host = urlsplit(credential.token_endpoint).netloc
    form = {"grant_type": "refresh_token", "refresh_token": credential.refresh_token.get_secret_value()}
    if credential.scope:
        form["scope"] = credential.scope
    if credential.resource:
        form["resource"] = credential.resource
    headers = {"Accept": "application/json"}
    secret = credential.client_secret.get_secret_value() if credential.client_secret is not None else ""
    if credential.token_endpoint_auth == "client_secret_basic":
        pair = f"{quote(credential.client_id, safe='')}:{quote(secret, safe='')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    else:
        form["client_id"] = credential.client_id
        if credential.token_endpoint_auth == "client_secret_post":
            form["client_secret"] = secret
    try:
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            response = await client.post(credential.token_endpoint, data=form, headers=headers)
    except httpx.HTTPError as exc:
        raise McpConnectionFailed(
            f"the token endpoint at {endpoint_host} could not be reached ({type(exc).__name__})"
        ) from None
    error: McpError
    if response.status_code >= 500:
        error = McpConnectionFailed(f"the token endpoint at {endpoint_host} answered {response.status_code}")
    elif response.status_code != 200:
        error = McpTokenRefreshFailed(
            f"the token endpoint at {endpoint_host} refused to refresh credential {credential.credential_id} "
            f"(HTTP {response.status_code}, {_oauth_error_code(response)})"
        )
    else:
        try:
            return _parse_token_response(response, endpoint_host, credential.credential_id)
        except McpTokenRefreshFailed as exc:
            error = exc
    content_type = response.headers.get("content-type", "")
    return TokenEndpointRefusal(response.status_code, content_type, response.content, error)


def _oauth_error_code(response: httpx.Response) -> str:
    try:
        code = response.json().get("error")
    except ValueError:
        return "no OAuth error code"
    return code if isinstance(code, str) and _ERROR_CODE.match(code) else "no OAuth error code"


def _parse_token_response(response: httpx.Response, endpoint_host: str, credential_id: str) -> RefreshedToken:
    try:
        body = response.json()
    except ValueError:
        body = None
    access_token = body.get("access_token") if isinstance(body, dict) else None
    if not isinstance(access_token, str) or not access_token:
        raise McpTokenRefreshFailed(
            f"the token endpoint at {endpoint_host} sent no access token for credential {credential_id}"
        )
    assert isinstance(body, dict)
    token_type = str(body.get("token_type", "bearer")).lower()
    if token_type != "bearer":
        raise McpTokenRefreshFailed(f"the token endpoint at {endpoint_host} issued a {token_type!r} token, not bearer")
    expires_in = body.get("expires_in")
    expires_at = now() + timedelta(seconds=int(expires_in)) if isinstance(expires_in, int | float) else None
    rotated = body.get("refresh_token")
    return RefreshedToken(
        access_token=SecretStr(access_token),
        expires_at=expires_at,
        refresh_token=SecretStr(rotated) if isinstance(rotated, str) and rotated else None,
    )
