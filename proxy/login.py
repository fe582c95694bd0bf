"""How a process finds Vault (or OpenBao) and logs in to it, read from its environment in one place: the proxy
worker (`workers.settings`), the gateway (`gateway.vault_access`) and the CLI (`cli.vault`, `cli.up`) all read it
here.

    VAULT_ADDR or BAO_ADDR                       where Vault is (the first one set)
    VAULT_TOKEN or BAO_TOKEN                     a token; it wins over an AppRole
    VAULT_ROLE_ID and VAULT_SECRET_ID            an AppRole: both or neither
    CORRAL_VAULT_MOUNT                           the KV v2 mount (default `corral`, `proxy.layout`)

An empty variable counts as unset. A login is a token, else an AppRole, whose token is renewed by logging in again
when Vault refuses it (`_AppRoleAdapter`): a worker lives longer than its token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Self

import hvac
import hvac.exceptions
import requests

from proxy.devvault import ensure_kv_v2_mount
from proxy.errors import ProxyError, VaultLoginIncomplete, VaultUnavailable
from proxy.layout import DEFAULT_MOUNT

if TYPE_CHECKING:
    from proxy.vault import VaultStore

ENV_VAULT_ADDR: Final = "VAULT_ADDR"
ENV_BAO_ADDR: Final = "BAO_ADDR"
ENV_VAULT_TOKEN: Final = "VAULT_TOKEN"
ENV_BAO_TOKEN: Final = "BAO_TOKEN"
ENV_VAULT_ROLE_ID: Final = "VAULT_ROLE_ID"
ENV_VAULT_SECRET_ID: Final = "VAULT_SECRET_ID"
ENV_VAULT_MOUNT: Final = "CORRAL_VAULT_MOUNT"
ADDRESS_ENV: Final = (ENV_VAULT_ADDR, ENV_BAO_ADDR)
TOKEN_ENV: Final = (ENV_VAULT_TOKEN, ENV_BAO_TOKEN)
LOGIN_ENV: Final = (
    ENV_VAULT_ADDR,
    ENV_VAULT_TOKEN,
    ENV_BAO_ADDR,
    ENV_BAO_TOKEN,
    ENV_VAULT_ROLE_ID,
    ENV_VAULT_SECRET_ID,
)
"""Every variable that says where Vault is or holds a login: what only the process meant to log in may see."""

NO_ADDRESS: Final = f"set {ENV_VAULT_ADDR} (or {ENV_BAO_ADDR}) to the Vault/OpenBao server, or run `corral up`"
NO_LOGIN: Final = f"set {ENV_VAULT_TOKEN}, or {ENV_VAULT_ROLE_ID} and {ENV_VAULT_SECRET_ID} (AppRole)"


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((environ[name] for name in names if environ.get(name)), None)


def vault_address(environ: Mapping[str, str]) -> str | None:
    """Where the environment says Vault is (`VAULT_ADDR`, else `BAO_ADDR`); None when it names no Vault."""
    return _first(environ, ADDRESS_ENV)


def vault_mount(environ: Mapping[str, str]) -> str:
    """The KV v2 mount the environment names (`CORRAL_VAULT_MOUNT`), else `corral`."""
    return environ.get(ENV_VAULT_MOUNT) or DEFAULT_MOUNT


@dataclass(frozen=True)
class VaultLogin:
    """Where Vault is and how to log in to it: a token, else an AppRole. The token and the secret id never appear
    in a repr. `VaultLoginIncomplete` when neither a token nor a whole AppRole is given."""

    address: str
    token: str | None = field(default=None, repr=False)
    role_id: str | None = None
    secret_id: str | None = field(default=None, repr=False)
    mount: str = DEFAULT_MOUNT

    def __post_init__(self) -> None:
        if self.token is not None:
            return
        if (self.role_id is None) != (self.secret_id is None):
            given, missing = (
                (ENV_VAULT_ROLE_ID, ENV_VAULT_SECRET_ID) if self.secret_id is None
                else (ENV_VAULT_SECRET_ID, ENV_VAULT_ROLE_ID)
            )  # fmt: skip
            raise VaultLoginIncomplete(f"{given} is set without {missing}: {NO_LOGIN}")
        if self.role_id is None:
            raise VaultLoginIncomplete(NO_LOGIN)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The login `environ` (default: this process's) gives; `VaultLoginIncomplete` names what is missing."""
        env = os.environ if environ is None else environ
        address = vault_address(env)
        if address is None:
            raise VaultLoginIncomplete(NO_ADDRESS)
        return cls(
            address=address,
            token=_first(env, TOKEN_ENV),
            role_id=env.get(ENV_VAULT_ROLE_ID) or None,
            secret_id=env.get(ENV_VAULT_SECRET_ID) or None,
            mount=vault_mount(env),
        )

    def client(self, *, prepare_mount: bool = True) -> hvac.Client:
        """An authenticated client (`log_in`): VaultUnavailable when Vault does not answer or refuses the login."""
        return log_in(self.address, self.mount, self.token, self.role_id, self.secret_id, prepare_mount=prepare_mount)

    def open_store(self, *, prepare_mount: bool = True) -> VaultStore:
        """The store on the mount, logged in (`prepare_mount=False` for a login that may not read the mount table,
        such as the gateway's write-only one)."""
        from proxy.vault import VaultStore  # the store's models load with it, not with every worker's settings

        return VaultStore(self.client(prepare_mount=prepare_mount), self.mount)


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
