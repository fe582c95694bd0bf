"""How every process that keeps credentials logs in to Vault (or OpenBao): a token, else an AppRole whose token is
renewed by logging in again when Vault refuses it.
"""

from __future__ import annotations

from typing import Any

import hvac
import hvac.exceptions
import requests

from proxy.devvault import ensure_kv_v2_mount
from proxy.errors import ProxyError, VaultUnavailable


def log_in(
    address: str,
    mount: str,
    token: str | None = None,
    role_id: str | None = None,
    secret_id: str | None = None,
    *,
    prepare_mount: bool = True,
) -> hvac.Client:
    """An authenticated client of the Vault at `address` (a token, else an AppRole), its KV v2 `mount` made if
    missing (unless `prepare_mount` is False: the gateway's write-only login may not read the mount table): how
    every process that keeps credentials logs in. VaultUnavailable when Vault does not answer or rejects the
    login; the message names the error's type, never a credential."""
    if token is not None:
        client = hvac.Client(url=address)
        client.token = token
    else:  # an AppRole's token expires: the client logs in again when Vault refuses it (_AppRoleAdapter)
        client = hvac.Client(url=address, adapter=_AppRoleAdapter, role_id=role_id, secret_id=secret_id)
    try:
        if token is None:
            client.adapter.log_in()
        authenticated = client.is_authenticated()
    except (requests.RequestException, hvac.exceptions.VaultError) as exc:
        raise VaultUnavailable(f"cannot log in to Vault at {address} ({type(exc).__name__})") from exc
    if not authenticated:
        raise VaultUnavailable(f"Vault at {address} rejected this process's credentials")
    if not prepare_mount:
        return client
    try:
        ensure_kv_v2_mount(client, mount)
    except ProxyError as exc:
        raise VaultUnavailable(f"Vault at {address}: {exc}") from exc
    return client


class _AppRoleAdapter(hvac.adapters.JSONAdapter):
    """hvac's JSON adapter, logged in with an AppRole, that logs in again once when Vault refuses its token (403:
    the token's TTL ran out, or it was revoked) and repeats the request: a worker lives longer than its token."""

    def __init__(self, *args: Any, role_id: str | None = None, secret_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._role = {"role_id": role_id, "secret_id": secret_id}

    def log_in(self) -> None:
        """Take a new token from the AppRole login (sent without the old token, which may be what Vault refuses)."""
        self.token = None
        response = super().request("post", "/v1/auth/approle/login", json=self._role)
        self.token = self.get_login_token(response)

    def request(self, method: str, url: str, headers: Any = None, raise_exception: bool = True, **kwargs: Any) -> Any:
        try:
            return super().request(method, url, headers=headers, raise_exception=raise_exception, **kwargs)
        except hvac.exceptions.Forbidden:
            if url.rstrip("/").endswith("/login"):
                raise  # the AppRole itself was refused: nothing to retry with
        self.log_in()
        return super().request(method, url, headers=headers, raise_exception=raise_exception, **kwargs)
