"""Vaults and their credentials over HTTP, and the repository tokens sessions are created with.

A vault is two things under one id (`vlt_…`): a record of the caller's workspace (`corral.records`, kind "vault"),
which scopes it and holds what the API shows, and the proxy's vault in Vault (`proxy.VaultStore`), which holds the
credentials. The proxy binds a session to the ids in its `SessionInput.vault_ids`, so a session created with
`vault_ids=[<this id>]` makes its MCP calls with this vault's credentials.

Secrets are write-only: a request's secret goes to Vault through `VaultStore` (the code path `corral vault
add-credential` uses) and nowhere else: not into a record, a workflow's history, a log line or a response. A
credential's metadata is read back from Vault, never cached here. Credentials that would put a secret inside the
sandbox (`environment_variable`) are refused: in corral, credentials never reach the sandbox.

The gateway logs in to Vault the way the proxy worker does (`VAULT_ADDR` + `VAULT_TOKEN`, or AppRole with
`VAULT_ROLE_ID` + `VAULT_SECRET_ID`; `CORRAL_VAULT_MOUNT`), on first use. Without it these routes answer 503 and
the rest of the gateway works.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import hvac
import hvac.exceptions
import requests
from pydantic import SecretStr, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.contract.proxy import GitRepositoryResource
from corral.records import RecordArchived, RecordNotFound, Records, RecordView
from gateway.errors import ApiError, invalid, not_found
from gateway.http import Authed, body, flag, whole
from gateway.shapes import check_metadata, patch_metadata, problem, when
from proxy import (
    Credential,
    CredentialConflict,
    CredentialInvalid,
    CredentialNotFound,
    CredentialParams,
    ProxyError,
    Vault,
    VaultArchived,
    VaultNotFound,
    VaultStore,
    VaultUnavailable,
    ensure_kv_v2_mount,
)
from proxy._ids import now
from proxy._kv import CasMismatch

T = TypeVar("T")

VAULT_KIND = "vault"
VAULT_ID_PREFIX = "vlt"
"""Record ids are `vlt_` and 26 lower-case letters and digits: the shape the proxy's vault ids have too."""
MAX_LIST = 100
CREDENTIAL_TYPES = ("static_bearer", "mcp_oauth")
NO_SANDBOX_SECRETS = (
    "credentials never reach the sandbox in corral, and this type would put a secret inside it; use a "
    "static_bearer or mcp_oauth credential for an MCP server (the proxy adds it to the agent's MCP calls, outside "
    "the sandbox), or a github_repository session resource with an authorization_token for git (the git proxy "
    "adds it to pulls and pushes)"
)
_PARAMS = TypeAdapter[CredentialParams](CredentialParams)


# ---- Vault access -----------------------------------------------------------------------------------------------


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


def _log_in(login: VaultLogin) -> GatewayVaultStore:
    client = hvac.Client(url=login.address)
    try:
        if login.token is not None:
            client.token = login.token
        else:
            client.auth.approle.login(role_id=login.role_id, secret_id=login.secret_id)
        authenticated = client.is_authenticated()
        if authenticated:
            ensure_kv_v2_mount(client, login.mount)
    except (requests.RequestException, hvac.exceptions.VaultError, ProxyError) as exc:
        raise ApiError(503, f"vaults are not available: Vault at {login.address} did not answer "
                            f"({type(exc).__name__})") from exc  # fmt: skip
    if not authenticated:
        raise ApiError(503, f"vaults are not available: Vault at {login.address} rejected the gateway's login")
    return GatewayVaultStore(client, login.mount)


ACCESS = VaultAccess(VaultLogin.from_environment())
"""One per process: the process's environment says where Vault is, as it does for the proxy worker."""


async def in_vault(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a (blocking, hvac) store call off the event loop, its refusals as API errors."""
    try:
        return await asyncio.to_thread(call, *args, **kwargs)
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


# ---- views ------------------------------------------------------------------------------------------------------


def vault_view(record: RecordView) -> dict[str, Any]:
    return {
        "id": record.id,
        "type": "vault",
        "display_name": record.body.get("display_name"),
        "metadata": record.body.get("metadata") or {},
        "created_at": when(record.created_at),
        "updated_at": when(record.updated_at),
        "archived_at": when(record.archived_at),
    }


def credential_view(credential: Credential) -> dict[str, Any]:
    auth = credential.auth.model_dump(mode="json")
    if auth.get("expires_at") is not None:
        auth["expires_at"] = when(credential.expires_at)
    return {
        "id": credential.id,
        "type": "vault_credential",
        "vault_id": credential.vault_id,
        "display_name": credential.display_name,
        "metadata": credential.metadata,
        "auth": auth,
        "created_at": when(credential.created_at),
        "updated_at": when(credential.updated_at),
        "archived_at": when(credential.archived_at),
    }


def display_name(value: Any, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 255:
        raise invalid("display_name must be a string of 1 to 255 characters")
    return value


def only(request: dict[str, Any], known: set[str], what: str) -> None:
    unknown = sorted(set(request) - known)
    if unknown:
        raise invalid(f"unknown {what} field(s): {', '.join(unknown)}")


def credential_params(auth: Any, current: Credential | None = None) -> CredentialParams:
    """The write side of `auth` as the proxy's params (secrets as `SecretStr`). On update, `current` supplies the
    type and server URL, which cannot change. Errors name fields, never values (a value may be a secret)."""
    if not isinstance(auth, dict):
        raise invalid("auth must be an object")
    kind = auth.get("type", current.kind if current else None)
    if kind not in CREDENTIAL_TYPES:
        if isinstance(kind, str) and kind:
            raise invalid(f"auth.type {kind!r} is refused: " + NO_SANDBOX_SECRETS)
        raise invalid("auth.type must be static_bearer or mcp_oauth")
    if current is not None:
        if kind != current.kind:
            raise invalid(f"auth.type: credential {current.id} is {current.kind}; it cannot become {kind}")
        url = auth.get("mcp_server_url", current.mcp_server_url)
        if url != current.mcp_server_url:
            raise invalid(f"auth.mcp_server_url: credential {current.id} serves {current.mcp_server_url}; "
                          "add a new credential for another server")  # fmt: skip
        auth = {**auth, "type": kind, "mcp_server_url": url}
    url = auth.get("mcp_server_url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        raise invalid("auth.mcp_server_url must be an http(s) URL with no credentials in it")
    try:
        return _PARAMS.validate_python(auth)
    except ValidationError as exc:
        raise invalid(problem(exc, "auth")) from exc


def _cursor_after(items: list[T], key: Callable[[T], str], page: str | None) -> list[T]:
    if page is None:
        return items
    keys = [key(item) for item in items]
    if page not in keys:
        raise invalid("page: not a cursor this list gave")
    return items[keys.index(page) + 1 :]


# ---- endpoints --------------------------------------------------------------------------------------------------


class Vaults:
    """The vault and credential endpoints: records for scope and labels, Vault for credentials."""

    def __init__(self, records: Records, access: VaultAccess) -> None:
        self.records = records
        self.access = access

    async def own(self, workspace: str, vault_id: str) -> RecordView:
        try:
            return await self.records.get(vault_id, workspace, kind=VAULT_KIND)
        except RecordNotFound as exc:
            raise not_found("vault", vault_id) from exc

    # ---- vaults -------------------------------------------------------------------------------------------

    async def create(self, request: Request, workspace: str) -> Response:
        changes = await body(request)
        only(changes, {"display_name", "metadata"}, "vault")
        name = display_name(changes.get("display_name"), required=True)
        labels = {"display_name": name, "metadata": check_metadata(changes.get("metadata"))}
        store = await self.access.store()  # before the record: without Vault, nothing is written
        record = await self.records.create(VAULT_KIND, workspace, labels, VAULT_ID_PREFIX)
        try:
            await in_vault(store.open_vault, record.id, labels["display_name"], labels["metadata"])
        except BaseException:
            await self.records.delete(record.id, workspace)
            raise
        return JSONResponse(vault_view(record))

    async def retrieve(self, request: Request, workspace: str) -> Response:
        return JSONResponse(vault_view(await self.own(workspace, request.path_params["id"])))

    async def update(self, request: Request, workspace: str) -> Response:
        vault_id = request.path_params["id"]
        current = await self.own(workspace, vault_id)
        changes = await body(request)
        only(changes, {"display_name", "metadata"}, "vault")
        name = display_name(changes.get("display_name"), required=False) or current.body["display_name"]
        labels = {"display_name": name, "metadata": patch_metadata(current.body.get("metadata") or {},
                                                                   changes.get("metadata"))}  # fmt: skip
        store = await self.access.store()
        try:
            record = await self.records.put(vault_id, workspace, labels, kind=VAULT_KIND)
        except RecordArchived as exc:
            raise invalid(f"vault {vault_id!r} is archived and cannot change") from exc
        except RecordNotFound as exc:
            raise not_found("vault", vault_id) from exc
        await in_vault(store.relabel_vault, vault_id, labels["display_name"], labels["metadata"])
        return JSONResponse(vault_view(record))

    async def archive(self, request: Request, workspace: str) -> Response:
        """The proxy's vault first: once it is archived, no new session binds it and no call resolves it."""
        vault_id = request.path_params["id"]
        await self.own(workspace, vault_id)
        store = await self.access.store()
        await in_vault(store.archive_vault, vault_id)
        return JSONResponse(vault_view(await self.records.archive(vault_id, workspace, kind=VAULT_KIND)))

    async def delete(self, request: Request, workspace: str) -> Response:
        """The credentials are destroyed first, so a failure half-way leaves a record, never a secret."""
        vault_id = request.path_params["id"]
        await self.own(workspace, vault_id)
        store = await self.access.store()
        await in_vault(store.delete_vault, vault_id)
        await self.records.delete(vault_id, workspace, kind=VAULT_KIND)
        return JSONResponse({"id": vault_id, "type": "vault_deleted"})

    async def list(self, request: Request, workspace: str) -> Response:
        params = request.query_params
        limit = whole(params.get("limit"), "limit") or 20
        if limit > MAX_LIST:
            raise invalid(f"limit must be at most {MAX_LIST}")
        try:
            records, next_page = await self.records.list(
                VAULT_KIND, workspace, limit=limit, page=params.get("page"),
                include_archived=flag(params.get("include_archived")),
            )  # fmt: skip
        except ValueError as exc:
            raise invalid(f"page: {exc}") from exc
        return JSONResponse({"data": [vault_view(r) for r in records], "next_page": next_page})

    # ---- credentials --------------------------------------------------------------------------------------

    async def add_credential(self, request: Request, workspace: str) -> Response:
        vault_id = request.path_params["id"]
        await self.own(workspace, vault_id)
        changes = await body(request)
        only(changes, {"auth", "display_name", "metadata"}, "credential")
        params = credential_params(changes.get("auth"))
        name = display_name(changes.get("display_name"), required=False)
        metadata = check_metadata(changes.get("metadata"))
        store = await self.access.store()
        credential = await in_vault(store.add_credential, vault_id, params, display_name=name, metadata=metadata)
        return JSONResponse(credential_view(credential))

    async def get_credential(self, request: Request, workspace: str) -> Response:
        vault_id, credential_id = request.path_params["id"], request.path_params["credential_id"]
        await self.own(workspace, vault_id)
        store = await self.access.store()
        return JSONResponse(credential_view(await in_vault(store.get_credential, vault_id, credential_id)))

    async def update_credential(self, request: Request, workspace: str) -> Response:
        """A new secret (`auth`) is a rotation; labels change apart from it. The secret is given whole: what is
        stored cannot be read back to merge a part into."""
        vault_id, credential_id = request.path_params["id"], request.path_params["credential_id"]
        await self.own(workspace, vault_id)
        changes = await body(request)
        only(changes, {"auth", "display_name", "metadata"}, "credential")
        store = await self.access.store()
        current = await in_vault(store.get_credential, vault_id, credential_id)
        if current.archived_at is not None:
            raise invalid(f"credential {credential_id} is archived and cannot change")
        params = credential_params(changes["auth"], current) if changes.get("auth") is not None else None
        name = current.display_name
        if "display_name" in changes:
            name = display_name(changes["display_name"], required=False)
        metadata = patch_metadata(current.metadata, changes.get("metadata"))
        if params is not None:
            current = await in_vault(store.rotate_credential, vault_id, credential_id, params)
        if (name, metadata) != (current.display_name, current.metadata):
            current = await in_vault(store.relabel_credential, vault_id, credential_id, name, metadata)
        return JSONResponse(credential_view(current))

    async def archive_credential(self, request: Request, workspace: str) -> Response:
        vault_id, credential_id = request.path_params["id"], request.path_params["credential_id"]
        await self.own(workspace, vault_id)
        store = await self.access.store()
        return JSONResponse(credential_view(await in_vault(store.archive_credential, vault_id, credential_id)))

    async def delete_credential(self, request: Request, workspace: str) -> Response:
        vault_id, credential_id = request.path_params["id"], request.path_params["credential_id"]
        await self.own(workspace, vault_id)
        store = await self.access.store()
        await in_vault(store.get_credential, vault_id, credential_id)  # 404 for one that is not there
        await in_vault(store.delete_credential, vault_id, credential_id)
        return JSONResponse({"id": credential_id, "type": "vault_credential_deleted"})

    async def list_credentials(self, request: Request, workspace: str) -> Response:
        vault_id = request.path_params["id"]
        await self.own(workspace, vault_id)
        params = request.query_params
        limit = whole(params.get("limit"), "limit") or 20
        if limit > MAX_LIST:
            raise invalid(f"limit must be at most {MAX_LIST}")
        store = await self.access.store()
        found = await in_vault(store.list_credentials, vault_id, include_archived=flag(params.get("include_archived")))
        rest = _cursor_after(found, lambda credential: credential.id, params.get("page"))
        page = rest[:limit]
        next_page = page[-1].id if len(rest) > limit else None
        return JSONResponse({"data": [credential_view(c) for c in page], "next_page": next_page})


# ---- sessions: vault ids and repositories -----------------------------------------------------------------------


async def check_vault_ids(records: Records, workspace: str, vault_ids: list[str]) -> None:
    """Every vault a new session names is the workspace's and not archived (404 / 400 otherwise)."""
    for vault_id in vault_ids:
        try:
            vault = await records.get(vault_id, workspace, kind=VAULT_KIND)
        except RecordNotFound as exc:
            raise ApiError(404, f"vault {vault_id!r} was not found", error_code="vault_not_found") from exc
        if vault.archived_at is not None:
            raise invalid(f"vault {vault_id!r} is archived: a new session cannot use it")


@dataclass(frozen=True)
class Repository:
    """A `github_repository` session resource: what the session gets (no token), and the token for Vault."""

    resource: GitRepositoryResource
    token: SecretStr

    def view(self, created: datetime | None) -> dict[str, Any]:
        """How the session shows it: the token never."""
        checkout = self.resource.checkout.model_dump(exclude_none=True) if self.resource.checkout else None
        return {"type": "github_repository", "id": self.resource.repository_id, "url": self.resource.url,
                "mount_path": self.resource.mount(), "checkout": checkout, "created_at": when(created),
                "updated_at": when(created)}  # fmt: skip


def session_repositories(resources: Any) -> list[Repository]:
    """The session's `github_repository` resources, checked; other kinds are refused with the reason."""
    if resources is None:
        return []
    if not isinstance(resources, list) or len(resources) > 20:
        raise invalid("resources must be a list of at most 20 resources")
    found = []
    for index, resource in enumerate(resources):
        where = f"resources[{index}]"
        if not isinstance(resource, dict) or resource.get("type") != "github_repository":
            kind = resource.get("type") if isinstance(resource, dict) else None
            raise invalid(f"{where}: corral sessions take github_repository resources only, not {kind!r}")
        only(resource, {"type", "url", "authorization_token", "checkout", "mount_path"}, where)
        token = resource.get("authorization_token")
        if not isinstance(token, str) or not token:
            raise invalid(f"{where}.authorization_token is required: corral clones through its git proxy, which "
                          "adds the token outside the sandbox")  # fmt: skip
        fields = {key: value for key, value in resource.items() if key != "authorization_token"}
        try:
            checked = GitRepositoryResource.model_validate({**fields, "repository_id": f"repo{index + 1}"})
        except ValidationError as exc:
            raise invalid(problem(exc, where)) from exc
        found.append(Repository(checked, SecretStr(token)))
    return found


def repository_views(found: list[Repository]) -> list[dict[str, Any]]:
    created = datetime.now(UTC)
    return [repository.view(created) for repository in found]


async def store_repository_tokens(session_id: str, found: list[Repository]) -> None:
    """Each token into Vault for the session before it starts, as `corral start --repo-token-file` does; all or
    none (a failure takes back the ones stored)."""
    if not found:
        return
    store = await ACCESS.store()
    try:
        for repository in found:
            resource = repository.resource
            await in_vault(store.store_repository_token, session_id, resource.repository_id, resource.url,
                           repository.token)  # fmt: skip
    except BaseException:
        await forget_repository_tokens(session_id, found)
        raise


async def forget_repository_tokens(session_id: str, found: list[Repository]) -> None:
    """Take back the tokens of a session that did not start."""
    if not found:
        return
    store = await ACCESS.store()
    for repository in found:
        await asyncio.to_thread(store.delete_repository_token, session_id, repository.resource.repository_id)


# ---- routes -----------------------------------------------------------------------------------------------------


def vault_routes(gateway: Any, authed: Authed) -> list[Route]:
    """Vaults and their credentials (`gateway` is the app's `Gateway`; its records scope every vault)."""
    vaults = Vaults(gateway.records, ACCESS)
    base, one = "/v1/vaults", "/v1/vaults/{id}/credentials/{credential_id}"
    return [
        Route(base, authed(vaults.create), methods=["POST"]),
        Route(base, authed(vaults.list), methods=["GET"]),
        Route(base + "/{id}", authed(vaults.retrieve), methods=["GET"]),
        Route(base + "/{id}", authed(vaults.update), methods=["POST"]),
        Route(base + "/{id}", authed(vaults.delete), methods=["DELETE"]),
        Route(base + "/{id}/archive", authed(vaults.archive), methods=["POST"]),
        Route(base + "/{id}/credentials", authed(vaults.add_credential), methods=["POST"]),
        Route(base + "/{id}/credentials", authed(vaults.list_credentials), methods=["GET"]),
        Route(one, authed(vaults.get_credential), methods=["GET"]),
        Route(one, authed(vaults.update_credential), methods=["POST"]),
        Route(one, authed(vaults.delete_credential), methods=["DELETE"]),
        Route(one + "/archive", authed(vaults.archive_credential), methods=["POST"]),
    ]
