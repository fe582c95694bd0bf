"""MCP servers and what crosses to the proxy: references and names, never a credential.

Persisted schemas: add optional fields, never repurpose one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.contract.grammar import branch_problem, default_mount_name, repository_url_problem, workspace_path_problem
from corral.contract.sandbox import (
    PermissionPolicyType,
    ToolsetDefaultConfig,
    check_permission_policy,
    policy_type,
)

# Error types the proxy activities raise (ApplicationError.type), as the workflow reads them.
MCP_CONNECTION_FAILED = "McpConnectionFailed"
MCP_AUTHENTICATION_FAILED = "McpAuthenticationFailed"
PROXY_REJECTED = "ProxyRejected"
VAULT_NOT_FOUND = "VaultNotFound"
CREDENTIAL_NOT_FOUND = "CredentialNotFound"
VAULT_UNAVAILABLE = "VaultUnavailable"
"""Retryable: Temporal tries the activity again."""

MCP_SERVER_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,32}$"
"""Short enough that `mcp__<server>__<tool>` stays within the Messages API's 64-character tool names."""


class McpServerUrl(BaseModel):
    """An MCP server reached over Streamable HTTP (`agent.mcp_servers`, up to 20)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["url"] = "url"
    name: str = Field(pattern=MCP_SERVER_NAME_PATTERN)
    url: str

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("an MCP server url must start with http:// or https://")
        if "@" in url.split("/")[2]:
            raise ValueError("put credentials in a vault, not in the MCP server url")
        return url


class McpToolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    enabled: bool | None = None
    permission_policy: dict[str, Any] | None = None


class McpToolset(BaseModel):
    """Expose the tools of one MCP server to the model (all of them unless configured otherwise)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["mcp_toolset"] = "mcp_toolset"
    mcp_server_name: str
    default_config: ToolsetDefaultConfig | None = None
    configs: list[McpToolConfig] = Field(default_factory=list)

    @field_validator("configs")
    @classmethod
    def _policies(cls, configs: list[McpToolConfig]) -> list[McpToolConfig]:
        for config in configs:
            check_permission_policy(config.permission_policy, config.name)
        return configs

    def enabled(self, tool: str) -> bool:
        explicit = {config.name: config.enabled for config in self.configs if config.enabled is not None}
        default = self.default_config is None or self.default_config.enabled is not False
        return explicit.get(tool, default)

    def permission(self, tool: str) -> PermissionPolicyType:
        """A tool's policy: its own config's, else the toolset default's, else `always_allow` (corral's default;
        the HTTP API writes upstream's `always_ask` into the agents it stores, gateway/shapes.py)."""
        default = policy_type(self.default_config.permission_policy if self.default_config else None)
        return policy_type(next((c.permission_policy for c in self.configs if c.name == tool), None), default)


def mcp_tool_name(server: str, tool: str) -> str:
    """The name the model sees for an MCP tool: `mcp__<server>__<tool>` (the one place it is built)."""
    return f"mcp__{server}__{tool}"


class McpToolSpec(BaseModel):
    """A tool an MCP server offers, as discovered through the proxy (recorded in history as data)."""

    server: str
    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @property
    def model_name(self) -> str:
        return mcp_tool_name(self.server, self.name)


class GitCheckout(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["branch", "commit"]
    name: str | None = None
    sha: str | None = None

    @field_validator("sha")
    @classmethod
    def _sha(cls, sha: str | None) -> str | None:
        if sha is not None and not (7 <= len(sha) <= 40 and all(c in "0123456789abcdef" for c in sha.lower())):
            raise ValueError("a commit sha is 7 to 40 hex digits")
        return sha

    @field_validator("name")
    @classmethod
    def _name(cls, name: str | None) -> str | None:
        problem = None if name is None else branch_problem(name)
        if problem is not None:
            raise ValueError(problem)
        return name

    def ref(self) -> str | None:
        return self.name if self.type == "branch" else self.sha


class GitRepositoryResource(BaseModel):
    """A git repository cloned into the sandbox. Its token never appears here: the client stores it in Vault
    under `repository_id` before the session starts (`corral start --repo … --repo-token-file …`)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["github_repository", "git_repository"] = "github_repository"
    url: str
    repository_id: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    mount_path: str | None = None
    checkout: GitCheckout | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        problem = repository_url_problem(url)
        if problem is not None:
            raise ValueError(problem)
        return url

    @field_validator("mount_path")
    @classmethod
    def _mount(cls, path: str | None) -> str | None:
        problem = None if path is None else workspace_path_problem(path)
        if problem is not None:
            raise ValueError(f"mount_path {problem}")
        return path

    def mount(self) -> str:
        return self.mount_path or f"/workspace/{default_mount_name(self.url, self.repository_id)}"


class BindSessionInput(BaseModel):
    session_id: str
    vault_ids: list[str]


class BindSessionResult(BaseModel):
    reference: str
    """Opaque; useless outside the proxy and for any other session."""


class McpListToolsInput(BaseModel):
    session_id: str
    reference: str
    server: McpServerUrl


class McpCallToolInput(BaseModel):
    session_id: str
    reference: str
    server: McpServerUrl
    tool: str
    arguments: dict[str, Any]
    tool_use_id: str


class McpCallToolResult(BaseModel):
    text: str
    is_error: bool = False


class ReleaseSessionInput(BaseModel):
    session_id: str


class ValidateCredentialInput(BaseModel):
    """A credential to validate live against its server, by ids: its secret stays in the proxy."""

    vault_id: str
    credential_id: str


class ValidateCredentialResult(BaseModel):
    validation: dict[str, Any]
    """`proxy.CredentialValidation` as JSON: the verdict, already scrubbed of every secret by the proxy."""
