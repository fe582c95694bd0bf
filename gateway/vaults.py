"""Vaults and their credentials over HTTP (`/v1/vaults`), and the check of the vaults a new session names.

A vault is two things under one id (`vlt_…`): a record of the caller's workspace (`corral.records`, kind "vault"),
which scopes it and holds what the API shows, and the proxy's vault in Vault (`proxy.VaultStore`), which holds the
credentials. The proxy binds a session to the ids in its `SessionInput.vault_ids`, so a session created with
`vault_ids=[<this id>]` makes its MCP calls with this vault's credentials.

Secrets are write-only: a request's secret goes to Vault through `VaultStore` (the code path `corral vault
add-credential` uses) and nowhere else: not into a record, a workflow's history, a log line or a response. The
gateway's Vault login cannot read a secret back (`proxy.access`): a credential's metadata is read back from Vault,
never cached here, and no endpoint reads its secret to show or to merge (so a rotation gives the secret whole).
The one that uses it, `mcp_oauth_validate`, has the proxy worker probe the credential's server with it (a
`CredentialValidationWorkflow`), and answers what the probe found, scrubbed of every secret.
Credentials that would put a secret inside the sandbox (`environment_variable`) are refused: in corral,
credentials never reach the sandbox. Without Vault (see `gateway.vault_access`) these routes answer 503 and the
rest of the gateway works.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.records import RecordArchived, RecordNotFound, Records, RecordView
from gateway.errors import ApiError, invalid, not_found
from gateway.http import Authed, Tell, body, flag, whole
from gateway.owned import id_of, own_record, record_prefix
from gateway.shapes import check_metadata, patch_metadata, problem, when
from gateway.vault_access import ACCESS, VaultAccess, in_vault, validate_in_proxy
from proxy import Credential, CredentialParams, CredentialValidation

T = TypeVar("T")

VAULT_KIND = "vault"
VAULT_ID_PREFIX = record_prefix(VAULT_KIND)
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


def validation_view(validation: CredentialValidation) -> dict[str, Any]:
    view = validation.model_dump(mode="json")
    view["validated_at"] = when(validation.validated_at)
    return {"type": "vault_credential_validation", **view}


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
        if kind == "mcp_oauth" and "refresh" not in auth and getattr(current.auth, "refresh", None) is not None:
            raise invalid("auth.refresh: give it again whole (or null to drop it): a rotation replaces the stored "
                          "secrets, and its refresh token cannot be read back to keep")  # fmt: skip
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

    def __init__(self, records: Records, access: VaultAccess, tell: Tell) -> None:
        self.records = records
        self.access = access
        self.tell = tell
        """Emits a webhook event (`Gateway.tell`)."""

    async def own(self, workspace: str, vault_id: str) -> RecordView:
        return await own_record(self.records, workspace, vault_id, VAULT_KIND, "vault_id")

    async def own_credential(self, request: Request, workspace: str) -> tuple[str, str]:
        """The vault and credential ids of a credential's path: the vault the workspace's, the credential id one."""
        vault_id, credential_id = request.path_params["id"], request.path_params["credential_id"]
        await self.own(workspace, vault_id)
        return vault_id, id_of(credential_id, "credential_id", "credential")

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
        await self.tell("vault.created", record.id, workspace)
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
        archived = await self.records.archive(vault_id, workspace, kind=VAULT_KIND)
        await self.tell("vault.archived", vault_id, workspace)
        return JSONResponse(vault_view(archived))

    async def delete(self, request: Request, workspace: str) -> Response:
        """The credentials are destroyed first, so a failure half-way leaves a record, never a secret."""
        vault_id = request.path_params["id"]
        await self.own(workspace, vault_id)
        store = await self.access.store()
        await in_vault(store.delete_vault, vault_id)
        await self.records.delete(vault_id, workspace, kind=VAULT_KIND)
        await self.tell("vault.deleted", vault_id, workspace)
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
        await self.tell("vault_credential.created", credential.id, workspace, vault_id=vault_id)
        return JSONResponse(credential_view(credential))

    async def get_credential(self, request: Request, workspace: str) -> Response:
        vault_id, credential_id = await self.own_credential(request, workspace)
        store = await self.access.store()
        return JSONResponse(credential_view(await in_vault(store.get_credential, vault_id, credential_id)))

    async def update_credential(self, request: Request, workspace: str) -> Response:
        """A new secret (`auth`) is a rotation; labels change apart from it. The secret is given whole: what is
        stored cannot be read back to merge a part into."""
        vault_id, credential_id = await self.own_credential(request, workspace)
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
        vault_id, credential_id = await self.own_credential(request, workspace)
        store = await self.access.store()
        archived = await in_vault(store.archive_credential, vault_id, credential_id)
        await self.tell("vault_credential.archived", credential_id, workspace, vault_id=vault_id)
        return JSONResponse(credential_view(archived))

    async def delete_credential(self, request: Request, workspace: str) -> Response:
        vault_id, credential_id = await self.own_credential(request, workspace)
        store = await self.access.store()
        await in_vault(store.get_credential, vault_id, credential_id)  # 404 for one that is not there
        await in_vault(store.delete_credential, vault_id, credential_id)
        await self.tell("vault_credential.deleted", credential_id, workspace, vault_id=vault_id)
        return JSONResponse({"id": credential_id, "type": "vault_credential_deleted"})

    async def validate_credential(self, request: Request, workspace: str) -> Response:
        """A live probe of an `mcp_oauth` credential against its server (see `McpProxy.validate_credential`), run
        by the proxy (the gateway may not read the secret it needs); always a 200 with the verdict, whatever the
        server answered. The probe may refresh the token and store the new one, as a session's call would."""
        vault_id, credential_id = await self.own_credential(request, workspace)
        store = await self.access.store()
        current = await in_vault(store.get_credential, vault_id, credential_id)
        if current.kind != "mcp_oauth":
            raise invalid(f"credential {credential_id} is {current.kind}: mcp_oauth_validate validates mcp_oauth "
                          "credentials only")  # fmt: skip
        if current.archived_at is not None:
            raise invalid(f"credential {credential_id} is archived: its tokens were destroyed, there is nothing "
                          "to validate")  # fmt: skip
        return JSONResponse(validation_view(await validate_in_proxy(self.records, vault_id, credential_id)))

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


# ---- sessions: the vaults they name -------------------------------------------------------------------------------


async def check_vault_ids(records: Records, workspace: str, vault_ids: list[str]) -> None:
    """Every vault a new session names is the workspace's and not archived (404 / 400 otherwise)."""
    for index, vault_id in enumerate(vault_ids):
        vault = await own_record(records, workspace, vault_id, VAULT_KIND, f"vault_ids[{index}]")
        if vault.archived_at is not None:
            raise ApiError(
                400, f"vault {vault_id!r} is archived: a new session cannot use it", error_code="vault_archived"
            )


# ---- routes -----------------------------------------------------------------------------------------------------


def vault_routes(gateway: Any, authed: Authed) -> list[Route]:
    """Vaults and their credentials (`gateway` is the app's `Gateway`; its records scope every vault)."""
    vaults = Vaults(gateway.records, ACCESS, gateway.tell)
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
        Route(one + "/mcp_oauth_validate", authed(vaults.validate_credential), methods=["POST"]),
    ]
