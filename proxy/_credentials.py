"""A credential's two documents in Vault (the public part the API shows, the secret part only the proxy reads), and
the credential with its secrets as the proxy's own calls use it (`ResolvedMcpCredential`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import SecretStr, TypeAdapter

from proxy._ids import unstamp
from proxy.models import (
    Credential,
    McpOAuthAuth,
    McpOAuthParams,
    McpOAuthRefreshInfo,
    StaticBearerAuth,
    StaticBearerParams,
    TokenEndpointAuthInfo,
    TokenEndpointAuthType,
)

_AUTH = TypeAdapter[McpOAuthAuth | StaticBearerAuth](McpOAuthAuth | StaticBearerAuth)


@dataclass(frozen=True)
class ResolvedMcpCredential:
    """INTERNAL: a credential with its secrets, for the proxy's own outbound calls. Never return it to a caller
    outside `proxy`, never log it (its secret fields are `SecretStr`, so its repr is safe)."""

    vault_id: str
    credential_id: str
    kind: str
    mcp_server_url: str
    token: SecretStr
    expires_at: datetime | None
    version: int
    token_endpoint: str | None = None
    client_id: str | None = None
    refresh_token: SecretStr | None = None
    token_endpoint_auth: TokenEndpointAuthType = "none"
    client_secret: SecretStr | None = None
    resource: str | None = None
    scope: str | None = None

    @property
    def refreshable(self) -> bool:
        return self.refresh_token is not None and self.token_endpoint is not None and self.client_id is not None


def _secret_part(params: McpOAuthParams | StaticBearerParams) -> dict[str, str]:
    if isinstance(params, StaticBearerParams):
        return {"token": params.token.get_secret_value()}
    secret = {"access_token": params.access_token.get_secret_value()}
    if params.refresh is not None:
        secret["refresh_token"] = params.refresh.refresh_token.get_secret_value()
        if params.refresh.token_endpoint_auth.type != "none":
            secret["client_secret"] = params.refresh.token_endpoint_auth.client_secret.get_secret_value()
    return secret


def _public_part(params: McpOAuthParams | StaticBearerParams) -> McpOAuthAuth | StaticBearerAuth:
    if isinstance(params, StaticBearerParams):
        return StaticBearerAuth(mcp_server_url=params.mcp_server_url)
    refresh = None
    if params.refresh is not None:
        refresh = McpOAuthRefreshInfo(
            token_endpoint=params.refresh.token_endpoint,
            client_id=params.refresh.client_id,
            token_endpoint_auth=TokenEndpointAuthInfo(type=params.refresh.token_endpoint_auth.type),
            resource=params.refresh.resource,
            scope=params.refresh.scope,
        )
    return McpOAuthAuth(mcp_server_url=params.mcp_server_url, expires_at=params.expires_at, refresh=refresh)


def _public(document: dict[str, Any]) -> Credential:
    return Credential.model_validate({key: value for key, value in document.items() if key != "secret"})


def _resolved(document: dict[str, Any], version: int) -> ResolvedMcpCredential:
    auth = _AUTH.validate_python(document["auth"])
    secret = document["secret"]
    if isinstance(auth, StaticBearerAuth):
        return ResolvedMcpCredential(
            vault_id=document["vault_id"],
            credential_id=document["id"],
            kind=auth.type,
            mcp_server_url=auth.mcp_server_url,
            token=SecretStr(secret["token"]),
            expires_at=None,
            version=version,
        )
    refresh = auth.refresh
    return ResolvedMcpCredential(
        vault_id=document["vault_id"],
        credential_id=document["id"],
        kind=auth.type,
        mcp_server_url=auth.mcp_server_url,
        token=SecretStr(secret["access_token"]),
        expires_at=unstamp(document["auth"].get("expires_at")),
        version=version,
        token_endpoint=refresh.token_endpoint if refresh else None,
        client_id=refresh.client_id if refresh else None,
        refresh_token=SecretStr(secret["refresh_token"]) if "refresh_token" in secret else None,
        token_endpoint_auth=refresh.token_endpoint_auth.type if refresh else "none",
        client_secret=SecretStr(secret["client_secret"]) if "client_secret" in secret else None,
        resource=refresh.resource if refresh else None,
        scope=refresh.scope if refresh else None,
    )
