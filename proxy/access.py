"""Who may do what in Vault: the gateway writes credentials but never reads one back; only the proxy reads them.

The gateway logs in with an AppRole whose policy (`gateway_policy`) lets it create, replace, list and delete what
the API manages (vault records, credentials' public parts, URL claims) and read those, but only create, replace
and destroy the secret parts (`secrets/…`) and the sessions' repository tokens: Vault itself refuses it a read
(403). So a gateway, which faces every API client, leaks no stored secret even if it is made to try. The proxy
worker, the one process that uses secrets, keeps a login that reads them.

`corral up` makes the policy and the AppRole in its local OpenBao with the root token (`localvault.py`), keeps the
gateway's login beside that token in the state dir, and gives the gateway that login and never the root token.
With a Vault of one's own, an administrator writes the same policy (`python -m proxy.access MOUNT` prints it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import hvac
import hvac.exceptions
import requests
from pydantic import SecretStr

from proxy.errors import VaultUnavailable
from proxy.layout import (
    CREDENTIALS,
    DEFAULT_MOUNT,
    REPOSITORIES,
    SECRETS,
    SERVER_URLS,
    SESSIONS,
    VAULTS,
    WEBHOOK_SECRETS,
)

GATEWAY_ROLE = "corral-gateway"
GATEWAY_TOKEN_TTL = "1h"
"""A gateway's token lasts an hour: its AppRole login logs in again when Vault refuses an expired one."""


def gateway_policy(mount: str) -> str:
    """The gateway's ACL policy on the KV v2 engine at `mount` (the folders of `proxy.layout`): read and write the
    public documents, write and destroy the secret ones, never read them."""
    kept = (VAULTS, CREDENTIALS, SERVER_URLS)
    repositories = f"{SESSIONS}/+/{REPOSITORIES}"
    lines = ["# corral's gateway: writes credentials, never reads one back (proxy/access.py)."]
    for folder in kept:
        lines.append(f'path "{mount}/data/{folder}/*" {{ capabilities = ["create", "read", "update"] }}')
        lines.append(f'path "{mount}/metadata/{folder}/*" {{ capabilities = ["list", "delete"] }}')
    for folder in (SECRETS, WEBHOOK_SECRETS):
        lines.append(f'path "{mount}/data/{folder}/*" {{ capabilities = ["create", "update"] }}')
        lines.append(f'path "{mount}/metadata/{folder}/*" {{ capabilities = ["list", "delete"] }}')
    lines.append(f'path "{mount}/data/{repositories}/*" {{ capabilities = ["create", "update"] }}')
    lines.append(f'path "{mount}/metadata/{repositories}/*" {{ capabilities = ["delete"] }}')
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class AppRoleLogin:
    """An AppRole's role id and secret id: what a process logs in with (`VAULT_ROLE_ID`, `VAULT_SECRET_ID`)."""

    role_id: str
    secret_id: SecretStr


def ensure_gateway_role(client: hvac.Client, mount: str, kept: AppRoleLogin | None = None) -> AppRoleLogin:
    """Write the gateway's policy and AppRole (idempotent; `client` needs the rights to, e.g. the root token), and
    return its login: `kept` when Vault still accepts it (so a running gateway's login stays good), else a new
    secret id."""
    try:
        client.sys.create_or_update_policy(GATEWAY_ROLE, gateway_policy(mount))
        if "approle/" not in client.sys.list_auth_methods()["data"]:
            client.sys.enable_auth_method("approle")
        client.auth.approle.create_or_update_approle(
            GATEWAY_ROLE, token_policies=[GATEWAY_ROLE], token_ttl=GATEWAY_TOKEN_TTL,
            token_max_ttl=GATEWAY_TOKEN_TTL, secret_id_ttl="0",
        )  # fmt: skip
        role_id = str(client.auth.approle.read_role_id(GATEWAY_ROLE)["data"]["role_id"])
        if kept is not None and kept.role_id == role_id and _accepted(client, kept):
            return kept
        secret_id = client.auth.approle.generate_secret_id(GATEWAY_ROLE)["data"]["secret_id"]
    except (hvac.exceptions.VaultError, requests.RequestException) as exc:
        raise VaultUnavailable(f"could not set up the gateway's Vault login ({type(exc).__name__})") from exc
    return AppRoleLogin(role_id, SecretStr(secret_id))


def _accepted(client: hvac.Client, login: AppRoleLogin) -> bool:
    try:
        found = client.auth.approle.read_secret_id(GATEWAY_ROLE, login.secret_id.get_secret_value())
    except hvac.exceptions.InvalidPath:
        return False
    return bool(found and found.get("data"))


if __name__ == "__main__":  # python -m proxy.access [MOUNT]: the policy, for an administrator's own Vault
    sys.stdout.write(gateway_policy(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MOUNT))
