"""MCP calls on a session's behalf, over Streamable HTTP, with the bearer token taken from Vault.

The harness passes a `SessionBinding` (session id + opaque reference) and an `McpServer` (name + URL); the proxy
resolves the session's vaults, finds the credential bound to that server URL, and calls the server with
`Authorization: Bearer …` using the `mcp` SDK's `Client` (v2 API: `mode="auto"` negotiates the 2026 protocol
with `server/discover`, falling back to the `initialize` handshake for older servers).

Token life cycle, per call:

1. an `mcp_oauth` token whose `expires_at` is past (or within `expiry_margin`) is refreshed before the call;
2. on HTTP 401 the token is refreshed with the refresh token (`proxy._oauth`), the new access token (and
   rotated refresh token, and expiry) is written back to Vault check-and-set, and the call is retried once;
3. still 401, 403, no refresh token, or a refused refresh: `McpAuthenticationFailed`.

A refresh is single-flight per credential within a process (a lock), and across processes by re-reading the
credential first: if another proxy already replaced the rejected token, its token is used instead of refreshing
again (a rotated refresh token can be spent only once).

`validate_credential` probes one credential by its ids (connect and list tools, refresh on a 401 as a call does,
probe again) and reports each step in the Managed Agents API's terms (`proxy.validation`). How a server's answers
and failures are read (a failure as the proxy's error, a result as text) is `proxy._mcp_answers`.

Connections are short-lived: one HTTP client and one MCP connection per call, closed afterwards. That is the
simplest correct choice (no connection outlives the token it was opened with, no state to lose when a worker
dies) and costs a `server/discover` round trip and client setup per call. Measured on loopback against the test
server (2 cores): a proxied `call_tool` p50 ≈ 16 ms, of which ≈ 5 ms are the Vault reads (binding + credential)
and ≈ 6 ms the SDK's connect + discover + call; a call on a connection kept open is ≈ 2 ms. A pooled connection
per (server, token) is the optimisation to reach for if that ever matters.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar

import httpx2
import mcp_types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import SecretStr, ValidationError

from proxy._credentials import ResolvedMcpCredential, _resolved
from proxy._ids import now
from proxy._kv import CasMismatch
from proxy._mcp_answers import _connection_failure, _leaves, _malformed_answer, _result_text, _tool_spec
from proxy._oauth import TokenEndpointRefusal, exchange_refresh_token
from proxy.errors import (
    CredentialNotFound,
    McpAuthenticationFailed,
    McpConnectionFailed,
    McpError,
    McpTokenRefreshFailed,
)
from proxy.models import McpServer, SessionBinding, ToolOutcome, ToolSpec
from proxy.validation import (
    CredentialValidation,
    HttpTrace,
    McpProbeFailure,
    RefreshReport,
    ValidationStatus,
    captured_response,
)
from proxy.vault import VaultStore

logger = logging.getLogger(__name__)

T = TypeVar("T")
_PAGE_CAP = 100
_SERVER_TROUBLE = (mcp_types.PARSE_ERROR, mcp_types.INTERNAL_ERROR)
"""JSON-RPC errors that say the server is in trouble rather than refusing: an answer that is not JSON (the SDK's
parse error), one that is not MCP (`_malformed_answer`), or the server's own internal error."""


@dataclass
class _Unauthorized:
    """The server answered 401 to the token tried."""


@dataclass(frozen=True)
class _Refreshed:
    """A credential with a new token; `exchanged` is False when another caller had already replaced the rejected
    token, so no refresh token was spent here."""

    credential: ResolvedMcpCredential
    exchanged: bool


_ProbeVerdict = Literal["ok", "unauthorized", "rejected", "inconclusive"]
_VERDICT_STATUS: dict[_ProbeVerdict, ValidationStatus] = {
    "ok": "valid",
    "unauthorized": "invalid",
    "rejected": "invalid",
    "inconclusive": "unknown",
}


class McpProxy:
    """Lists and calls MCP tools for a session, with credentials that only this process can read."""

    def __init__(
        self,
        store: VaultStore,
        *,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
        expiry_margin: timedelta = timedelta(seconds=30),
        on_refresh_refused: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.on_refresh_refused = on_refresh_refused
        """Told `(vault_id, credential_id)` when a call's token endpoint refuses a refresh (a webhook event)."""
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.expiry_margin = expiry_margin
        self._refresh_locks: dict[str, asyncio.Lock] = {}
        # Building a TLS context costs ~18 ms (it loads the trust store); one shared context keeps it off every call.
        self._tls = httpx2.create_ssl_context()

    def __repr__(self) -> str:
        return f"McpProxy({self.store!r})"

    async def list_tools(self, binding: SessionBinding, server: McpServer) -> list[ToolSpec]:
        """Every tool the server offers (all pages), as plain data the workflow can record."""

        async def operation(client: Client) -> list[ToolSpec]:
            specs: list[ToolSpec] = []
            cursor: str | None = None
            for _ in range(_PAGE_CAP):
                page = await client.list_tools(cursor=cursor)
                specs.extend(_tool_spec(tool) for tool in page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            return specs

        try:
            return await self._with_credential(binding, server, operation)
        except MCPError as exc:
            answered = f"MCP server {server.name} answered tools/list with error {exc.code}: {exc.message}"
            if exc.code in _SERVER_TROUBLE:
                raise McpConnectionFailed(answered) from None  # garbage or a crash: a later attempt may do better
            raise McpError(answered) from None

    async def call_tool(
        self, binding: SessionBinding, server: McpServer, tool: str, arguments: dict[str, Any] | None = None
    ) -> ToolOutcome:
        """Call one tool. A tool-level failure (the tool raised, or the server refused the request with a JSON-RPC
        error such as an unknown tool, or answered with something that is not MCP) is a `ToolOutcome` with
        `is_error=True`, for the model to read, and is never sent again; transport
        and credential failures raise `McpConnectionFailed` / `McpAuthenticationFailed`."""

        async def operation(client: Client) -> ToolOutcome:
            result = await client.call_tool(tool, arguments or {})
            return ToolOutcome(text=_result_text(result), is_error=bool(result.is_error))

        try:
            return await self._with_credential(binding, server, operation)
        except MCPError as exc:
            return ToolOutcome(text=f"MCP error {exc.code}: {exc.message}", is_error=True)

    # --- credential life cycle ------------------------------------------------------------------------------

    async def _with_credential(
        self, binding: SessionBinding, server: McpServer, operation: Callable[[Client], Awaitable[T]]
    ) -> T:
        vault_ids = await asyncio.to_thread(self.store.resolve_binding, binding.reference, binding.session_id)
        credential = await asyncio.to_thread(self.store._resolve_mcp_credential, vault_ids, server.url)
        if credential is None:
            raise McpAuthenticationFailed(
                f"no credential for MCP server {server.name} ({server.url}) in this session's vaults"
            )
        refreshed = False
        if credential.refreshable and self._expired(credential):
            credential = await self._refresh(credential)
            refreshed = True
        outcome = await self._attempt(server, credential, operation)
        if isinstance(outcome, _Unauthorized) and credential.refreshable and not refreshed:
            credential = await self._refresh(credential)
            outcome = await self._attempt(server, credential, operation)
        if isinstance(outcome, _Unauthorized):
            why = "after a token refresh" if credential.refreshable else "and the credential cannot be refreshed"
            raise McpAuthenticationFailed(
                f"MCP server {server.name} ({server.url}) rejected credential {credential.credential_id} {why}"
            )
        return outcome

    def _expired(self, credential: ResolvedMcpCredential) -> bool:
        return credential.expires_at is not None and credential.expires_at <= now() + self.expiry_margin

    async def _refresh(self, stale: ResolvedMcpCredential) -> ResolvedMcpCredential:
        outcome = await self._refresh_or_adopt(stale)
        if isinstance(outcome, TokenEndpointRefusal):
            if isinstance(outcome.error, McpTokenRefreshFailed) and self.on_refresh_refused is not None:
                await self.on_refresh_refused(stale.vault_id, stale.credential_id)
            raise outcome.error
        return outcome.credential

    async def _refresh_or_adopt(self, stale: ResolvedMcpCredential) -> _Refreshed | TokenEndpointRefusal:
        """A new token for `stale`, written back to Vault check-and-set: another caller's, if it replaced the token
        meanwhile, else one from the token endpoint; or the endpoint's refusal. Raises `McpConnectionFailed` when
        the endpoint cannot be reached."""
        lock = self._refresh_locks.setdefault(stale.credential_id, asyncio.Lock())
        async with lock:
            current = await asyncio.to_thread(self.store._reread_mcp_credential, stale)
            if current is None:
                raise McpAuthenticationFailed(f"credential {stale.credential_id} was removed while in use")
            replaced = current.token.get_secret_value() != stale.token.get_secret_value()
            if replaced and not self._expired(current):
                # another caller refreshed it meanwhile: use that token, spend no refresh token
                return _Refreshed(current, exchanged=False)
            fresh = await exchange_refresh_token(current, timeout=self.connect_timeout + 5)
            if isinstance(fresh, TokenEndpointRefusal):
                return fresh
            try:
                stored = await asyncio.to_thread(
                    self.store._store_refreshed_token,
                    current,
                    fresh.access_token,
                    fresh.expires_at,
                    fresh.refresh_token,
                )
            except CasMismatch:
                # Another process wrote a refresh first; Vault's copy wins so every proxy converges on one token.
                latest = await asyncio.to_thread(self.store._reread_mcp_credential, current)
                if latest is None:
                    raise McpAuthenticationFailed(
                        f"credential {stale.credential_id} was removed while in use"
                    ) from None
                return _Refreshed(latest, exchanged=True)
            return _Refreshed(stored, exchanged=True)

    # --- validation -----------------------------------------------------------------------------------------

    async def validate_credential(self, vault_id: str, credential_id: str) -> CredentialValidation:
        """A live probe of one credential against its server: connect and list tools with the stored token.

        On a 401, the refresh token is exchanged as a call would exchange it (the new token is written back to
        Vault, so later calls use it) and the server is probed again with the new token: `valid` then means the
        token now in Vault works, rather than the API's `unknown` for a refreshed token left untested. `invalid`:
        the server rejected the credential (401 or 403) and no refresh recovered it (none configured, or the
        token endpoint refused it), or no token is stored. `unknown`: the probe could not tell (no answer, a
        5xx, an answer that is not MCP, a token endpoint unreachable or answering 5xx). `refresh` is filled in
        after a 401 only, `no_refresh_token` included; `mcp_probe` is the failing step of the last probe.
        Raises `VaultNotFound` / `CredentialNotFound` for ids that name nothing."""
        started = now()
        credential = await asyncio.to_thread(self._stored_credential, vault_id, credential_id)
        report = functools.partial(
            CredentialValidation,
            vault_id=vault_id,
            credential_id=credential_id,
            has_refresh_token=credential is not None and credential.refresh_token is not None,
            validated_at=started,
        )
        if credential is None:
            return report(status="invalid")  # no token to try
        hidden = _secrets_of(credential)
        verdict, failure = await self._probe(credential, hidden)
        if verdict != "unauthorized":
            return report(status=_VERDICT_STATUS[verdict], mcp_probe=failure)
        if not credential.refreshable:
            return report(status="invalid", mcp_probe=failure, refresh=RefreshReport(status="no_refresh_token"))
        try:
            refreshed = await self._refresh_or_adopt(credential)
        except McpConnectionFailed:
            return report(status="unknown", mcp_probe=failure, refresh=RefreshReport(status="connect_error"))
        except McpAuthenticationFailed:
            raise CredentialNotFound(f"credential {credential_id} was removed while it was validated") from None
        if isinstance(refreshed, TokenEndpointRefusal):
            # A refusal (4xx) is final, as for a call; an endpoint in trouble (5xx) may grant it later.
            answer = captured_response(refreshed.status_code, refreshed.content_type, refreshed.body, hidden)
            status: ValidationStatus = "unknown" if refreshed.error.retryable else "invalid"
            refused = RefreshReport(status="failed", http_response=answer)
            return report(status=status, mcp_probe=failure, refresh=refused)
        refresh = RefreshReport(status="succeeded") if refreshed.exchanged else None
        verdict, failure = await self._probe(refreshed.credential, [*hidden, *_secrets_of(refreshed.credential)])
        return report(status=_VERDICT_STATUS[verdict], mcp_probe=failure, refresh=refresh)

    def _stored_credential(self, vault_id: str, credential_id: str) -> ResolvedMcpCredential | None:
        """The credential with its secrets, or None when it has no token to try (archived: its secret is gone)."""
        self.store._require_credential(vault_id, credential_id)  # VaultNotFound / CredentialNotFound
        found = self.store._with_secret(vault_id, credential_id)
        if found is None:
            return None
        document, version = found
        secret = document["secret"]
        token_field = "token" if document.get("auth", {}).get("type") == "static_bearer" else "access_token"
        if not isinstance(secret, dict) or not secret.get(token_field):
            return None
        return _resolved(document, version)

    async def _probe(
        self, credential: ResolvedMcpCredential, hidden: list[SecretStr]
    ) -> tuple[_ProbeVerdict, McpProbeFailure | None]:
        """Connect (discover or initialize) and list the first page of tools with the credential's token: the
        smallest round trip that is authenticated on every MCP server that authenticates at all."""
        trace = HttpTrace(keep_steps=True)
        server = McpServer(name=credential.credential_id, url=credential.mcp_server_url)

        async def operation(client: Client) -> None:
            await client.list_tools()

        try:
            outcome = await self._attempt(server, credential, operation, trace)
        except McpAuthenticationFailed:  # a 403: the server refuses this credential
            return "rejected", trace.failing_step(hidden)
        except Exception as exc:  # every other failure leaves the credential untested; the trace says where
            if not isinstance(exc, McpError | MCPError):
                logger.warning("probe of credential %s failed with %s", credential.credential_id, type(exc).__name__)
            return "inconclusive", trace.failing_step(hidden)
        if isinstance(outcome, _Unauthorized):
            return "unauthorized", trace.failing_step(hidden)
        return "ok", None

    # --- one connection -------------------------------------------------------------------------------------

    async def _attempt(
        self,
        server: McpServer,
        credential: ResolvedMcpCredential,
        operation: Callable[[Client], Awaitable[T]],
        trace: HttpTrace | None = None,
    ) -> T | _Unauthorized:
        """Open a connection with this token, run `operation`, close. HTTP statuses are recorded as they arrive
        (in `trace`, given to see them), because the SDK turns an HTTP 401 or 503 into the same JSON-RPC error as
        any other failure."""
        trace = trace or HttpTrace()
        statuses = trace.statuses
        started = False
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {credential.token.get_secret_value()}"},
            timeout=httpx2.Timeout(self.timeout, connect=self.connect_timeout),
            event_hooks={"request": [trace.on_request], "response": [trace.on_response]},
            verify=self._tls,
        )
        try:
            async with (
                http,
                Client(
                    streamable_http_client(server.url, http_client=http, terminate_on_close=True),
                    read_timeout_seconds=self.timeout,
                    cache=None,
                ) as client,
            ):
                started = True
                return await operation(client)
        except Exception as exc:  # classified below; anything unrecognised is re-raised as it was
            leaves = _leaves(exc)
            if 401 in statuses:
                return _Unauthorized()
            if 403 in statuses:
                raise McpAuthenticationFailed(
                    f"MCP server {server.name} ({server.url}) refused credential {credential.credential_id} (403)"
                ) from None
            failure = _connection_failure(server, statuses, leaves, started)
            if failure is not None:
                raise failure from None
            rpc_errors = [leaf for leaf in leaves if isinstance(leaf, MCPError)]
            if rpc_errors:
                raise rpc_errors[0] from None
            malformed = [leaf for leaf in leaves if isinstance(leaf, ValidationError)]
            if malformed:
                # The server answered, with something that is not MCP: like an answer that is not JSON (which the
                # SDK itself turns into a parse error), it is the server's answer, final, and never worth
                # sending the request again (a retried tool call would run its side effects again).
                raise _malformed_answer(server, malformed[0]) from None
            raise


def _secrets_of(credential: ResolvedMcpCredential) -> list[SecretStr]:
    found = [credential.token, credential.refresh_token, credential.client_secret]
    return [secret for secret in found if secret is not None]
