"""What a live validation of a credential found (`McpProxy.validate_credential`), in the shapes of the Managed
Agents API's `BetaManagedAgentsCredentialValidation`, and how the HTTP answers it quotes are made safe to show.

A validation reports the failing step's HTTP answer (the MCP server's, or the token endpoint's) because that is
what a person needs to fix a credential. Such an answer is the other side's text and may quote a secret (a
server that echoes the bearer token, a token endpoint that sends a token in an answer it still refuses), so it
leaves the proxy only through `captured_response`: every secret of the credential is replaced, as are the
values of token-like fields and `Bearer`/`Basic` credentials, and the body is cut to `MAX_BODY_CHARS` (after the
scrubbing, so a cut never leaves half a secret behind).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal
from urllib.parse import quote

import httpx2
from pydantic import BaseModel, ConfigDict, SecretStr

MAX_BODY_CHARS = 2048
REDACTED = "[redacted]"
ValidationStatus = Literal["valid", "invalid", "unknown"]
RefreshStatus = Literal["succeeded", "failed", "connect_error", "no_refresh_token"]

_TOKEN_FIELDS = r"access_token|refresh_token|id_token|client_secret|token|assertion|password"
_JSON_FIELD = re.compile(rf'("(?:{_TOKEN_FIELDS})"\s*:\s*)"(?:[^"\\]|\\.)*"', re.IGNORECASE)
_FORM_FIELD = re.compile(rf"\b((?:{_TOKEN_FIELDS})=)[^&\s\"']+", re.IGNORECASE)
_AUTH_SCHEME = re.compile(r"\b((?:bearer|basic)\s+)[A-Za-z0-9\-._~+/]+=*", re.IGNORECASE)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CapturedResponse(_Frozen):
    """An HTTP answer met during a validation, scrubbed (`BetaManagedAgentsRefreshHTTPResponse`)."""

    status_code: int
    content_type: str
    body: str
    body_truncated: bool


class McpProbeFailure(_Frozen):
    """The step of the MCP probe that failed (`BetaManagedAgentsMCPProbe`): its JSON-RPC method, and the server's
    HTTP error answer to it, or None when there was none (a timeout, a refused connection, a JSON-RPC error)."""

    method: str
    http_response: CapturedResponse | None = None


class RefreshReport(_Frozen):
    """The refresh-token exchange tried after a 401 (`BetaManagedAgentsRefreshObject`); `http_response` only
    when the token endpoint refused (`failed`)."""

    status: RefreshStatus
    http_response: CapturedResponse | None = None


class CredentialValidation(_Frozen):
    """The verdict on one credential, and what it rests on (`BetaManagedAgentsCredentialValidation` less its
    `type`). `mcp_probe` is the failing step of the last probe, None when it succeeded or nothing was probed."""

    vault_id: str
    credential_id: str
    status: ValidationStatus
    has_refresh_token: bool
    mcp_probe: McpProbeFailure | None = None
    refresh: RefreshReport | None = None
    validated_at: datetime


def captured_response(status_code: int, content_type: str, body: bytes, secrets: list[SecretStr]) -> CapturedResponse:
    """An answer as a validation may show it: decoded, scrubbed of `secrets` and token-like values, then cut."""
    text = body.decode("utf-8", errors="replace")
    for secret in secrets:
        value = secret.get_secret_value()
        if len(value) < 4:
            continue  # too short to be a real secret, and replacing it would garble the whole body
        for form in {value, quote(value, safe=""), json.dumps(value)[1:-1]}:
            text = text.replace(form, REDACTED)
    text = _JSON_FIELD.sub(rf'\1"{REDACTED}"', text)
    text = _FORM_FIELD.sub(rf"\1{REDACTED}", text)
    text = _AUTH_SCHEME.sub(rf"\1{REDACTED}", text)
    truncated = len(text) > MAX_BODY_CHARS
    return CapturedResponse(
        status_code=status_code,
        content_type=content_type[:255],
        body=text[:MAX_BODY_CHARS],
        body_truncated=truncated,
    )


@dataclass
class _Step:
    method: str
    is_request: bool
    status_code: int | None = None
    content_type: str = ""
    body: bytes = field(default=b"", repr=False)


@dataclass
class HttpTrace:
    """The HTTP exchanges of one MCP connection, as `McpProxy._attempt`'s event hooks see them: every status, and
    when `keep_steps`, every JSON-RPC POST by method with the body of an error answer (raw: see the module doc)."""

    keep_steps: bool = False
    statuses: list[int] = field(default_factory=list)
    steps: list[_Step] = field(default_factory=list, repr=False)
    _by_request: dict[int, _Step] = field(default_factory=dict, repr=False)

    async def on_request(self, request: httpx2.Request) -> None:
        if not self.keep_steps or request.method != "POST":
            return
        try:
            message = json.loads(request.content)
        except (httpx2.RequestNotRead, ValueError):
            return
        method = message.get("method") if isinstance(message, dict) else None
        if isinstance(method, str):
            step = _Step(method, is_request="id" in message)
            self.steps.append(step)
            self._by_request[id(request)] = step

    async def on_response(self, response: httpx2.Response) -> None:
        self.statuses.append(response.status_code)
        step = self._by_request.pop(id(response.request), None)
        if step is None:
            return
        step.status_code = response.status_code
        if response.status_code >= 400:
            step.content_type = response.headers.get("content-type", "")
            step.body = await response.aread()

    def failing_step(self, secrets: list[SecretStr]) -> McpProbeFailure:
        """The step a failed probe ended on: its last request (a notification, such as the cancellation of a
        request that timed out, is never the failure), with the server's answer if that was an HTTP error."""
        requests = [step for step in self.steps if step.is_request] or self.steps
        if not requests:
            return McpProbeFailure(method="connect")  # not one message went out
        step = requests[-1]
        if step.status_code is None or step.status_code < 400:
            return McpProbeFailure(method=step.method)
        answer = captured_response(step.status_code, step.content_type, step.body, secrets)
        return McpProbeFailure(method=step.method, http_response=answer)
