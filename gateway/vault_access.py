"""The gateway's way into Vault: a login that writes credentials and cannot read one back (`proxy.access`).

The gateway logs in from its environment: `VAULT_ADDR` (or `BAO_ADDR`) and an AppRole (`VAULT_ROLE_ID` +
`VAULT_SECRET_ID`, what `corral up` gives it) or `VAULT_TOKEN` (or `BAO_TOKEN`); `CORRAL_VAULT_MOUNT` names the KV
v2 mount, which the proxy worker makes (the gateway's policy does not let it read the mount table). It logs in on
first use, so a gateway starts (and serves everything but vaults and repository tokens) while Vault is down or
not configured; those routes answer 503 meanwhile.

A credential validation needs the secret, so the proxy worker runs it (`validate_in_proxy`).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError

from corral.contract.proxy import (
    CREDENTIAL_NOT_FOUND,
    VAULT_NOT_FOUND,
    ValidateCredentialInput,
    ValidateCredentialResult,
)
from corral.names import CREDENTIAL_VALIDATION_WORKFLOW, ENV_VAULT_MOUNT
from corral.records import Records
from gateway.errors import ApiError, invalid
from proxy import (
    CredentialConflict,
    CredentialInvalid,
    CredentialNotFound,
    CredentialValidation,
    ProxyError,
    VaultArchived,
    VaultNotFound,
    VaultStore,
    VaultUnavailable,
    log_in,
)

T = TypeVar("T")


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
        return cls(address, token or None, role_id, secret_id, env.get(ENV_VAULT_MOUNT) or "corral")


class VaultAccess:
    """The gateway's store, logged in on first use (so the gateway starts, and serves everything else, while
    Vault is down); a failed login is tried again on the next request."""

    def __init__(self, login: VaultLogin | None) -> None:
        self.login = login
        self._store: VaultStore | None = None
        self._lock = asyncio.Lock()

    async def store(self) -> VaultStore:
        if self._store is not None:
            return self._store
        if self.login is None:
            raise ApiError(503, "vaults are not available: this gateway has no Vault configured (start it with "
                                "VAULT_ADDR and VAULT_TOKEN, or VAULT_ROLE_ID and VAULT_SECRET_ID, set)")  # fmt: skip
        async with self._lock:
            if self._store is None:
                self._store = await asyncio.to_thread(_log_in, self.login)
        return self._store


def _log_in(login: VaultLogin) -> VaultStore:
    try:
        client = log_in(login.address, login.mount, login.token, login.role_id, login.secret_id, prepare_mount=False)
    except ProxyError as exc:
        raise ApiError(503, f"vaults are not available: {exc}") from exc
    return VaultStore(client, login.mount)


ACCESS = VaultAccess(VaultLogin.from_environment())
"""One per process: the process's environment says where Vault is, as it does for the proxy worker."""


async def in_vault(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a (blocking, hvac) store call off the event loop, its refusals as API errors."""
    with store_errors():
        return await asyncio.to_thread(call, *args, **kwargs)


async def validate_in_proxy(records: Records, vault_id: str, credential_id: str) -> CredentialValidation:
    """A live validation of a credential, run by the proxy worker (`CredentialValidationWorkflow` on the harness
    queue, its activity on the proxy's): ids go, a verdict scrubbed of secrets comes back."""
    try:
        result = await records.client.execute_workflow(
            CREDENTIAL_VALIDATION_WORKFLOW, ValidateCredentialInput(vault_id=vault_id, credential_id=credential_id),
            id=f"validate-{credential_id}-{uuid.uuid4().hex[:12]}", task_queue=records.task_queue,
            result_type=ValidateCredentialResult, execution_timeout=timedelta(minutes=3),
        )  # fmt: skip
    except WorkflowFailureError as exc:
        cause = exc.cause.cause if isinstance(exc.cause, ActivityError) else exc.cause
        kind = cause.type if isinstance(cause, ApplicationError) else None
        message = cause.message if isinstance(cause, ApplicationError) else "the validation did not finish"
        if kind == VAULT_NOT_FOUND:
            raise ApiError(404, message, error_code="vault_not_found") from exc
        if kind == CREDENTIAL_NOT_FOUND:
            raise ApiError(404, message, error_code="credential_not_found") from exc
        raise ApiError(503, f"the proxy could not validate credential {credential_id}: {message}") from exc
    return CredentialValidation.model_validate(result.validation)


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
