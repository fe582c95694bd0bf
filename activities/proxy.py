"""Proxy activities on `corral-proxy`: the only activities that touch Vault. They take references and names, use
the credentials inside this process, and return results; no secret ever goes back into history."""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from corral.contract.proxy import (
    CREDENTIAL_NOT_FOUND,
    MCP_AUTHENTICATION_FAILED,
    MCP_CONNECTION_FAILED,
    PROXY_REJECTED,
    VAULT_NOT_FOUND,
    VAULT_UNAVAILABLE,
    BindSessionInput,
    BindSessionResult,
    McpCallToolInput,
    McpCallToolResult,
    McpListToolsInput,
    McpToolSpec,
    ReleaseSessionInput,
    ValidateCredentialInput,
    ValidateCredentialResult,
)
from corral.contract.search_attributes import WORKSPACE_KEY
from corral.hands.heartbeat import heartbeating
from corral.hands.output import cut_output
from corral.names import (
    ACTIVITY_MCP_CALL_TOOL,
    ACTIVITY_MCP_LIST_TOOLS,
    ACTIVITY_PROXY_BIND_SESSION,
    ACTIVITY_PROXY_RELEASE_SESSION,
    ACTIVITY_PROXY_VALIDATE_CREDENTIAL,
)
from corral.webhooks import Webhooks, webhook_event
from proxy import (
    CredentialNotFound,
    McpAuthenticationFailed,
    McpConnectionFailed,
    McpProxy,
    McpServer,
    ProxyError,
    SessionBinding,
    VaultNotFound,
    VaultStore,
    VaultUnavailable,
)

VALIDATION_PROBE_TIMEOUT = 20.0
"""Seconds a credential validation waits for one MCP answer: long enough for a slow server, short enough that a
probe, a refresh and a second probe fit in the validation workflow's activity timeout."""


def _translate(exc: ProxyError) -> ApplicationError:
    """Proxy errors to what the session shows; messages are already free of secrets (proxy/errors.py)."""
    if isinstance(exc, VaultUnavailable):
        return ApplicationError(str(exc), type=VAULT_UNAVAILABLE)  # retryable: Temporal tries again
    if isinstance(exc, McpConnectionFailed):
        kind = MCP_CONNECTION_FAILED
    elif isinstance(exc, McpAuthenticationFailed):
        kind = MCP_AUTHENTICATION_FAILED
    else:
        kind = PROXY_REJECTED
    return ApplicationError(str(exc), type=kind, non_retryable=True, category=ApplicationErrorCategory.BENIGN)


class ProxyActivities:
    """Holds the Vault store and the MCP client; one instance per proxy worker."""

    def __init__(self, store: VaultStore, mcp: McpProxy | None = None, webhooks: Webhooks | None = None) -> None:
        self._store = store
        self._webhooks = webhooks
        """Where `vault_credential.refresh_failed` goes (None: nowhere, as for a proxy without the database)."""
        self._mcp = mcp or McpProxy(store, on_refresh_refused=self._refresh_refused)
        # A validation answers an API request: 20 s per MCP answer, not a session call's 60 (a refresh racing a
        # session's is settled by Vault's check-and-set, as between two proxy workers).
        self._validator = McpProxy(store, timeout=VALIDATION_PROBE_TIMEOUT, connect_timeout=10.0)

    async def _refresh_refused(self, vault_id: str, credential_id: str) -> None:
        """Tell the session's workspace that a credential's refresh was refused (`vault_credential.refresh_failed`):
        its owner must authorise again. The event's key is the call's, so a retried call tells it once."""
        if self._webhooks is None:
            return
        info = activity.info()
        described = await self._webhooks.client.get_workflow_handle(info.workflow_id or "").describe()
        workspace = described.typed_search_attributes.get(WORKSPACE_KEY)
        if workspace is not None:
            key = f"{credential_id}/refresh_failed/{info.workflow_id}/{info.activity_id}"
            extra = {"vault_id": vault_id}
            await self._webhooks.tell(webhook_event("vault_credential.refresh_failed", credential_id, workspace,
                                                    key=key, extra=extra))  # fmt: skip

    @activity.defn(name=ACTIVITY_PROXY_BIND_SESSION)
    async def bind_session(self, input: BindSessionInput) -> BindSessionResult:
        """Bind a session to its vaults; the reference it returns works only here and only for that session."""
        try:
            for vault_id in input.vault_ids:
                await asyncio.to_thread(self._store.get_vault, vault_id)  # unknown vaults fail now, clearly
            reference = await asyncio.to_thread(self._store.bind_session, input.session_id, input.vault_ids)
        except ProxyError as exc:
            raise _translate(exc) from exc
        return BindSessionResult(reference=reference)

    @activity.defn(name=ACTIVITY_MCP_LIST_TOOLS)
    async def mcp_list_tools(self, input: McpListToolsInput) -> list[McpToolSpec]:
        binding = SessionBinding(session_id=input.session_id, reference=input.reference)
        async with heartbeating():
            try:
                specs = await self._mcp.list_tools(binding, McpServer(name=input.server.name, url=input.server.url))
            except ProxyError as exc:
                raise _translate(exc) from exc
        return [
            McpToolSpec(server=input.server.name, name=s.name, description=s.description, input_schema=s.input_schema)
            for s in specs
        ]

    @activity.defn(name=ACTIVITY_MCP_CALL_TOOL)
    async def mcp_call_tool(self, input: McpCallToolInput) -> McpCallToolResult:
        binding = SessionBinding(session_id=input.session_id, reference=input.reference)
        server = McpServer(name=input.server.name, url=input.server.url)
        async with heartbeating():
            try:
                outcome = await self._mcp.call_tool(binding, server, input.tool, input.arguments)
            except ProxyError as exc:
                raise _translate(exc) from exc
        return McpCallToolResult(text=cut_output(outcome.text), is_error=outcome.is_error)

    @activity.defn(name=ACTIVITY_PROXY_RELEASE_SESSION)
    async def release_session(self, input: ReleaseSessionInput) -> None:
        """The session ended: its reference and its git tokens stop working."""
        try:
            await asyncio.to_thread(self._store.revoke_session, input.session_id)
        except ProxyError as exc:
            raise _translate(exc) from exc

    @activity.defn(name=ACTIVITY_PROXY_VALIDATE_CREDENTIAL)
    async def validate_credential(self, input: ValidateCredentialInput) -> ValidateCredentialResult:
        """A live probe of one credential (`McpProxy.validate_credential`): only ids come in, and the verdict goes
        out scrubbed of every secret, so the gateway, which may not read the secret, can answer with it."""
        async with heartbeating():
            try:
                validation = await self._validator.validate_credential(input.vault_id, input.credential_id)
            except (VaultNotFound, CredentialNotFound) as exc:  # the gateway answers 404 for these
                kind = VAULT_NOT_FOUND if isinstance(exc, VaultNotFound) else CREDENTIAL_NOT_FOUND
                raise ApplicationError(str(exc), type=kind, non_retryable=True) from exc
            except ProxyError as exc:
                raise _translate(exc) from exc
        return ValidateCredentialResult(validation=validation.model_dump(mode="json"))
