"""Where corral keeps things in Vault: the KV v2 mount and every path under it, written here once, so the stores
that write them (`proxy.vault`, `proxy.sessions`), the gateway's policy (`proxy.access`) and a test that reads a
raw document all name the same place.

KV layout under the mount (all JSON documents)::

    vaults/<vlt_id>                             the vault record
    credentials/<vlt_id>/<vcrd_id>              a credential's public part: what the API shows
    secrets/<vlt_id>/<vcrd_id>                  its secret part (destroyed on archive)
    server_urls/<vlt_id>/<sha256(url)>          the claim: which credential serves that URL in that vault
    bindings/<sha256(reference)>                {session_id, vault_ids, created_at, revoked_at}
    sessions/<sesn_id>/binding                  {reference_sha256}: the one live reference of the session
    sessions/<sesn_id>/repositories/<repo_id>   {url, scheme, username, token}
    webhook_secrets/<whep_id>                   {secret}: a webhook endpoint's signing secret (proxy.webhooks)

A secret lives apart from its public part so that a Vault policy can let a writer (the gateway) create and replace
it, and read everything else, without ever reading it back (`proxy.access`). A folder's name ends with '/'; a key
listed in it is appended as it is. Ids are checked before they reach a path (`proxy.vault`, `proxy.sessions`).
"""

from __future__ import annotations

from typing import Final

from proxy._ids import url_key

DEFAULT_MOUNT: Final = "corral"
"""The KV v2 mount when `CORRAL_VAULT_MOUNT` names none (`proxy.login`)."""

VAULTS: Final = "vaults"
CREDENTIALS: Final = "credentials"
SECRETS: Final = "secrets"
SERVER_URLS: Final = "server_urls"
BINDINGS: Final = "bindings"
SESSIONS: Final = "sessions"
REPOSITORIES: Final = "repositories"
WEBHOOK_SECRETS: Final = "webhook_secrets"


def vaults_folder() -> str:
    return f"{VAULTS}/"


def vault_path(vault_id: str) -> str:
    return f"{VAULTS}/{vault_id}"


def credentials_folder(vault_id: str) -> str:
    return f"{CREDENTIALS}/{vault_id}/"


def credential_path(vault_id: str, credential_id: str) -> str:
    """A credential's public part."""
    return f"{CREDENTIALS}/{vault_id}/{credential_id}"


def secrets_folder(vault_id: str) -> str:
    return f"{SECRETS}/{vault_id}/"


def secret_path(vault_id: str, credential_id: str) -> str:
    """A credential's secret part: written by the gateway, read by the proxy alone."""
    return f"{SECRETS}/{vault_id}/{credential_id}"


def claims_folder(vault_id: str) -> str:
    return f"{SERVER_URLS}/{vault_id}/"


def claim_path(vault_id: str, server_url: str) -> str:
    """The vault's claim on an MCP server URL (its normalised form, hashed): one active credential per URL."""
    return f"{SERVER_URLS}/{vault_id}/{url_key(server_url)}"


def binding_path(reference_key: str) -> str:
    """A session binding, filed under its reference's hash (`proxy._ids.reference_key`)."""
    return f"{BINDINGS}/{reference_key}"


def sessions_folder() -> str:
    return f"{SESSIONS}/"


def session_binding_path(session_id: str) -> str:
    """The pointer to the session's one live binding."""
    return f"{SESSIONS}/{session_id}/binding"


def repositories_folder(session_id: str) -> str:
    return f"{SESSIONS}/{session_id}/{REPOSITORIES}/"


def repository_path(session_id: str, repo_id: str) -> str:
    """A session's git token for one repository."""
    return f"{SESSIONS}/{session_id}/{REPOSITORIES}/{repo_id}"


def webhook_secret_path(endpoint_id: str) -> str:
    """A webhook endpoint's signing secret: written by the gateway, read by the proxy alone, which signs with it."""
    return f"{WEBHOOK_SECRETS}/{endpoint_id}"
