"""The gateway's way into Vault, and the store operations the API needs beyond the CLI's.

The gateway logs in the way the proxy worker does (workers/proxy.py), from its environment: `VAULT_ADDR` (or
`BAO_ADDR`) and `VAULT_TOKEN` (or `BAO_TOKEN`), or AppRole with `VAULT_ROLE_ID` + `VAULT_SECRET_ID`;
`CORRAL_VAULT_MOUNT` names the KV v2 mount. It logs in on first use, so a gateway starts (and serves everything
but vaults and repository tokens) while Vault is down or not configured; those routes answer 503 meanwhile.

The gateway opens an MCP connection for one thing only, a credential validation: through the proxy's own
`McpProxy` over this store, so it refreshes a token and writes it back exactly as a proxy worker does.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.errors import ApiError, invalid
from proxy import (
    Credential,
    CredentialConflict,
    CredentialInvalid,
    CredentialNotFound,
    McpProxy,
    ProxyError,
    Vault,
    VaultArchived,
    VaultNotFound,
    VaultStore,
    VaultUnavailable,
    log_in,
)
from proxy._ids import now
from proxy._kv import CasMismatch

T = TypeVar("T")

PROBE_TIMEOUT = 20.0
"""Seconds a validation waits for one MCP answer (10 to connect): long enough for a slow server, short enough
that the SDK's request (600 s by default) never waits on a server that hangs."""


class GatewayVaultStore(VaultStore):
    """`VaultStore` plus what the API needs and the CLI does not: a vault under an id chosen elsewhere (the
    record's), and labels (display name, metadata) that change without touching a secret."""

    def open_vault(self, vault_id: str, display_name: str, metadata: dict[str, str]) -> Vault:
        """The proxy's vault for a new record: the same document `create_vault` writes, under `vault_id`."""
        moment = now()
        vault = Vault(id=vault_id, display_name=display_name, metadata=metadata, created_at=moment, updated_at=moment)
        self._kv.write(f"vaults/{vault_id}", vault.model_dump(mode="json"), cas=0)
        return vault

    def relabel_vault(self, vault_id: str, display_name: str, metadata: dict[str, str]) -> None:
        vault, version = self._require_vault(vault_id)
        changed = vault.model_copy(update={"display_name": display_name, "metadata": metadata, "updated_at": now()})
        self._kv.write(f"vaults/{vault_id}", changed.model_dump(mode="json"), cas=version)

    def relabel_credential(
        self, vault_id: str, credential_id: str, display_name: str | None, metadata: dict[str, str]
    ) -> Credential:
        """Change a credential's display name and metadata; its secret part is carried over untouched."""
        for _ in range(3):
            document, version = self._require_credential(vault_id, credential_id)
            updated = {**document, "display_name": display_name, "metadata": metadata, "updated_at": now().isoformat()}
            try:
                self._kv.write(f"credentials/{vault_id}/{credential_id}", updated, cas=version)
            except CasMismatch:
                continue  # refreshed by the proxy meanwhile: apply the labels to the new version
            return self.get_credential(vault_id, credential_id)
        raise CredentialConflict(f"credential {credential_id} is changing: try again")


@dataclass(frozen=True)
class VaultLogin:
    """Where and how to log in to Vault; the token and secret id never appear in a repr."""

    address: str
    token: str | None = None
    role_id: str | None = None
    secret_id: str | None = None
    mount: str = "corral"

    def __repr__(self) -> str:
        return f"VaultLogin(address={self.address!r}, mount={self.mount!r})"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> VaultLogin | None:
        """The proxy worker's variables (workers/proxy.py); None when no Vault is configured."""
        env = os.environ if environ is None else environ
        address = env.get("VAULT_ADDR") or env.get("BAO_ADDR")
        token = env.get("VAULT_TOKEN") or env.get("BAO_TOKEN")
        role_id, secret_id = env.get("VAULT_ROLE_ID"), env.get("VAULT_SECRET_ID")
        if not address or not (token or (role_id and secret_id)):
            return None
        return cls(address, token or None, role_id, secret_id, env.get("CORRAL_VAULT_MOUNT") or "corral")


class VaultAccess:
    """The gateway's store, logged in on first use (so the gateway starts, and serves everything else, while
    Vault is down); a failed login is tried again on the next request."""

    def __init__(self, login: VaultLogin | None) -> None:
        self.login = login
        self._store: GatewayVaultStore | None = None
        self._mcp: McpProxy | None = None
        self._lock = asyncio.Lock()

    async def store(self) -> GatewayVaultStore:
        if self._store is not None:
            return self._store
        if self.login is None:
            raise ApiError(503, "vaults are not available: this gateway has no Vault configured (start it with "
                                "VAULT_ADDR and VAULT_TOKEN, or VAULT_ROLE_ID and VAULT_SECRET_ID, set)")  # fmt: skip
        async with self._lock:
            if self._store is None:
                self._store = await asyncio.to_thread(_log_in, self.login)
        return self._store

    async def mcp(self) -> McpProxy:
        """The proxy's MCP client over this store, one per process, so that two validations of a credential
        refresh it once (its refresh lock is per process, as in a proxy worker)."""
        store = await self.store()
        if self._mcp is None:
            self._mcp = McpProxy(store, timeout=PROBE_TIMEOUT, connect_timeout=10.0)
        return self._mcp


def _log_in(login: VaultLogin) -> GatewayVaultStore:
    try:
        client = log_in(login.address, login.mount, login.token, login.role_id, login.secret_id)
    except ProxyError as exc:
        raise ApiError(503, f"vaults are not available: {exc}") from exc
    return GatewayVaultStore(client, login.mount)


ACCESS = VaultAccess(VaultLogin.from_environment())
"""One per process: the process's environment says where Vault is, as it does for the proxy worker."""


async def in_vault(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a (blocking, hvac) store call off the event loop, its refusals as API errors."""
    with store_errors():
        return await asyncio.to_thread(call, *args, **kwargs)


async def in_proxy(call: Awaitable[T]) -> T:
    """Await a proxy coroutine (which reads the store on its own), its refusals as API errors."""
    with store_errors():
        return await call


@contextmanager
def store_errors() -> Iterator[None]:
    """The proxy's refusals as the API's errors; every message is safe to show (it names ids, never secrets)."""
    try:
        yield
    except CredentialConflict as exc:
        raise ApiError(409, str(exc), error_code="credential_conflict") from exc
    except CredentialNotFound as exc:
        raise ApiError(404, str(exc), error_code="credential_not_found") from exc
    except VaultNotFound as exc:
        raise ApiError(404, str(exc), error_code="vault_not_found") from exc
    except (VaultArchived, CredentialInvalid, ValueError) as exc:
        raise invalid(str(exc)) from exc
    except VaultUnavailable as exc:
        raise ApiError(503, f"Vault is not available: {exc}") from exc
