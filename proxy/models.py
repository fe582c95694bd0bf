"""The proxy's data shapes, named after the Managed Agents API (`anthropic.types.beta.vaults`).

Two families, kept apart on purpose:

- *params* (`McpOAuthParams`, `StaticBearerParams`, ...) carry secrets into the proxy. Every secret field is a
  pydantic `SecretStr`, so a repr, a log line or a JSON dump shows `**********`, never the value.
- *records* (`Vault`, `Credential`, ...) come back out. They have no secret field at all: secrets are
  write-only, as in the Managed Agents API.

The `SessionBinding`, `McpServer`, `ToolSpec` and `ToolOutcome` shapes are what a workflow may hold: references
and plain data, no secret.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, SecretStr

CredentialKind = Literal["mcp_oauth", "static_bearer"]
TokenEndpointAuthType = Literal["none", "client_secret_basic", "client_secret_post"]
RepositoryAuthScheme = Literal["basic", "bearer"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- params: secrets going in -------------------------------------------------------------------------------


class TokenEndpointAuthNone(_Frozen):
    """A public OAuth client: the refresh request carries `client_id` in its body and no secret."""

    type: Literal["none"] = "none"


class TokenEndpointAuthBasic(_Frozen):
    """A confidential client authenticated with HTTP Basic (`client_secret_basic`, RFC 6749 section 2.3.1)."""

    type: Literal["client_secret_basic"] = "client_secret_basic"
    client_secret: SecretStr


class TokenEndpointAuthPost(_Frozen):
    """A confidential client that sends `client_id` and `client_secret` in the form body (`client_secret_post`)."""

    type: Literal["client_secret_post"] = "client_secret_post"
    client_secret: SecretStr


TokenEndpointAuth = Annotated[
    TokenEndpointAuthNone | TokenEndpointAuthBasic | TokenEndpointAuthPost, Field(discriminator="type")
]


class McpOAuthRefreshParams(_Frozen):
    """What the proxy needs to get a new access token when the current one expires or is rejected."""

    token_endpoint: str
    client_id: str
    refresh_token: SecretStr
    token_endpoint_auth: TokenEndpointAuth = TokenEndpointAuthNone()
    resource: str | None = None
    scope: str | None = None


class McpOAuthParams(_Frozen):
    """An OAuth access token for one MCP server, with its expiry and (optionally) how to refresh it."""

    type: Literal["mcp_oauth"] = "mcp_oauth"
    mcp_server_url: str
    access_token: SecretStr
    expires_at: AwareDatetime | None = None
    refresh: McpOAuthRefreshParams | None = None


class StaticBearerParams(_Frozen):
    """A static bearer token (an API key, a personal access token) for one MCP server."""

    type: Literal["static_bearer"] = "static_bearer"
    mcp_server_url: str
    token: SecretStr


CredentialParams = Annotated[McpOAuthParams | StaticBearerParams, Field(discriminator="type")]


# --- records: metadata coming out ---------------------------------------------------------------------------


class Vault(_Frozen):
    """A named collection of credentials (`vlt_…`); archived vaults keep their record but are not used."""

    type: Literal["vault"] = "vault"
    id: str
    display_name: str
    metadata: dict[str, str] = Field(default_factory=dict)
    created_at: datetime
    updated_at: datetime
    archived_at: datetime | None = None


class TokenEndpointAuthInfo(_Frozen):
    """How the proxy authenticates to the token endpoint (the method only, never the client secret)."""

    type: TokenEndpointAuthType


class McpOAuthRefreshInfo(_Frozen):
    """The refresh configuration of an `mcp_oauth` credential, without the refresh token or client secret."""

    token_endpoint: str
    client_id: str
    token_endpoint_auth: TokenEndpointAuthInfo
    resource: str | None = None
    scope: str | None = None


class McpOAuthAuth(_Frozen):
    """The public half of an `mcp_oauth` credential."""

    type: Literal["mcp_oauth"] = "mcp_oauth"
    mcp_server_url: str
    expires_at: datetime | None = None
    refresh: McpOAuthRefreshInfo | None = None


class StaticBearerAuth(_Frozen):
    """The public half of a `static_bearer` credential."""

    type: Literal["static_bearer"] = "static_bearer"
    mcp_server_url: str


class Credential(_Frozen):
    """A credential's metadata (`vcrd_…`): what it is for and when it changed. Its secret is never returned."""

    type: Literal["vault_credential"] = "vault_credential"
    id: str
    vault_id: str
    display_name: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    auth: Annotated[McpOAuthAuth | StaticBearerAuth, Field(discriminator="type")]
    created_at: datetime
    updated_at: datetime
    archived_at: datetime | None = None

    @property
    def kind(self) -> CredentialKind:
        return self.auth.type

    @property
    def mcp_server_url(self) -> str:
        return self.auth.mcp_server_url

    @property
    def expires_at(self) -> datetime | None:
        return self.auth.expires_at if isinstance(self.auth, McpOAuthAuth) else None


# --- what a workflow holds ----------------------------------------------------------------------------------


class SessionBinding(_Frozen):
    """What the harness passes back on each proxy call: its session id and the opaque reference `bind_session`
    issued. The reference resolves only inside the proxy, only for this session, and only until it is revoked."""

    session_id: str
    reference: str


class McpServer(_Frozen):
    """An MCP server as an agent names it (`{type: "url", name, url}` in the Managed Agents API)."""

    name: str
    url: str


class ToolSpec(_Frozen):
    """One tool a server offers, as the model will see it (the harness prefixes `mcp__<server>__`)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolOutcome(_Frozen):
    """The result of one tool call, flattened to text for the model; `is_error` marks a tool-level failure."""

    text: str
    is_error: bool = False
