"""A session's `github_repository` resources: checked at session creation, their tokens put in Vault for the git
proxy (as `corral start --repo-token-file` does), and shown, never with a token, under
`/v1/sessions/{id}/resources`, where a token can also be rotated.

The session gets each repository as a `GitRepositoryResource` (URL, checkout, mount path and an id, `repo1`,
`repo2`…, which is also the key of its token in Vault); its memo keeps the API's view of it (without the token).
The git proxy reads the token on every pull and push, so a rotation takes effect on the next one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import Client, WorkflowUpdateFailedError

from corral.contract.knowledge import FileResourceChange
from corral.contract.proxy import GitRepositoryResource
from corral.names import FILE_RESOURCE_ID_PREFIX, UPDATE_ADD_FILE, UPDATE_REMOVE_FILE
from gateway.errors import invalid, not_found
from gateway.http import Authed, body, whole
from gateway.owned import id_of, own_session
from gateway.session_knowledge import KnowledgeResolver, file_view
from gateway.shapes import problem, when
from gateway.vault_access import ACCESS, VaultAccess, in_vault

MAX_LIST = 1000
MAX_REPOSITORIES = 20


def _only(request: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(request) - known)
    if unknown:
        raise invalid(f"unknown {where} field(s): {', '.join(unknown)}")


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
    if not isinstance(resources, list) or len(resources) > MAX_REPOSITORIES:
        raise invalid(f"resources must be a list of at most {MAX_REPOSITORIES} resources")
    found = []
    for index, resource in enumerate(resources):
        where = f"resources[{index}]"
        if not isinstance(resource, dict) or resource.get("type") != "github_repository":
            kind = resource.get("type") if isinstance(resource, dict) else None
            raise invalid(f"{where}: corral sessions take github_repository resources only, not {kind!r}")
        _only(resource, {"type", "url", "authorization_token", "checkout", "mount_path"}, where)
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


# ---- /v1/sessions/{id}/resources ----------------------------------------------------------------------------------


class SessionResources:
    """List and retrieve a session's resources; rotate a repository's token; add and remove files."""

    def __init__(self, client: Client, access: VaultAccess, resolver: KnowledgeResolver | None = None) -> None:
        self.client = client
        self.access = access
        self.resolver = resolver

    async def _own(self, workspace: str, session_id: str) -> tuple[list[dict[str, Any]], bool]:
        """The session's resources as its memo keeps them, and whether it still runs; 404 for another workspace's
        session, as for none."""
        _, description = await own_session(self.client, workspace, session_id)
        memo = await description.memo()
        running = description.status is not None and description.status.name == "RUNNING"
        return list(memo.get("resources") or []), running

    async def _one(self, workspace: str, session_id: str, resource_id: str) -> tuple[dict[str, Any], bool]:
        resources, running = await self._own(workspace, session_id)
        if not resource_id.startswith(FILE_RESOURCE_ID_PREFIX):
            id_of(resource_id, "resource_id", "session resource")
        for resource in resources:
            if resource.get("id") == resource_id:
                return resource, running
        raise not_found("session resource", resource_id)

    async def list(self, request: Request, workspace: str) -> Response:
        resources, _ = await self._own(workspace, request.path_params["id"])
        params = request.query_params
        limit = whole(params.get("limit"), "limit") or MAX_LIST
        if limit > MAX_LIST:
            raise invalid(f"limit must be at most {MAX_LIST}")
        page = params.get("page")
        if page is not None:
            ids = [resource.get("id") for resource in resources]
            if page not in ids:
                raise invalid("page: not a cursor this list gave")
            resources = resources[ids.index(page) + 1 :]
        chosen = resources[:limit]
        next_page = chosen[-1]["id"] if len(resources) > limit else None
        return JSONResponse({"data": chosen, "next_page": next_page})

    async def retrieve(self, request: Request, workspace: str) -> Response:
        resource, _ = await self._one(workspace, request.path_params["id"], request.path_params["resource_id"])
        return JSONResponse(resource)

    async def update(self, request: Request, workspace: str) -> Response:
        """A new token for the repository (the only change upstream allows); from the next pull or push on."""
        session_id, resource_id = request.path_params["id"], request.path_params["resource_id"]
        resource, running = await self._one(workspace, session_id, resource_id)
        if resource.get("type") != "github_repository":
            raise invalid(f"a {resource.get('type')} resource has nothing to update: remove it and add another")
        changes = await body(request)
        _only(changes, {"authorization_token"}, "session resource")
        token = changes.get("authorization_token")
        if not isinstance(token, str) or not token:
            raise invalid("authorization_token is required: the new token of the repository")
        if not running:
            raise invalid(f"session {session_id!r} has ended: its repository tokens were revoked with it")
        store = await self.access.store()
        await in_vault(store.store_repository_token, session_id, resource_id, resource["url"], SecretStr(token))
        return JSONResponse({**resource, "updated_at": when(datetime.now(UTC))})

    async def add(self, request: Request, workspace: str) -> Response:
        """A file (uploaded through the Files API) mounted into the running session, as upstream: only files can be
        added after the create. It is placed before the session's next tool call."""
        session_id = request.path_params["id"]
        resources, running = await self._own(workspace, session_id)
        payload = await body(request)
        if payload.get("type") != "file":
            raise invalid(f"a session resource of type {payload.get('type')!r} cannot be added: only file resources "
                          "can be added to a session after it is created")  # fmt: skip
        if self.resolver is None:
            raise invalid("this gateway serves no files")
        mount = await self.resolver.file_mount(workspace, payload, "resource")
        if any(other.get("mount_path") == mount.mount_path for other in resources):
            raise invalid(f"mount_path {mount.mount_path!r} is taken by another resource of this session")
        if not running:
            raise invalid(f"session {session_id!r} has ended: it takes no more resources")
        view = file_view(mount)
        await self._change(session_id, UPDATE_ADD_FILE, FileResourceChange(mount=mount, resources=[*resources, view]))
        return JSONResponse(view)

    async def delete(self, request: Request, workspace: str) -> Response:
        """A file resource is mounted no more (containers made from now on lack it). A repository stays with its
        session (its clone is the session's workspace); its token can be rotated."""
        session_id, resource_id = request.path_params["id"], request.path_params["resource_id"]
        resource, running = await self._one(workspace, session_id, resource_id)
        if resource.get("type") == "file":
            if not running:
                raise invalid(f"session {session_id!r} has ended: its resources stay as they were")
            kept = [other for other in (await self._own(workspace, session_id))[0] if other.get("id") != resource_id]
            await self._change(session_id, UPDATE_REMOVE_FILE,
                               FileResourceChange(resource_id=resource_id, resources=kept))  # fmt: skip
            return JSONResponse({"id": resource_id, "type": "session_resource_deleted"})
        raise invalid(f"repository {resource_id!r} stays with session {session_id!r} while it lives: rotate its "
                      "token (update the resource), or delete the session, which revokes it")  # fmt: skip

    async def _change(self, session_id: str, update: str, change: FileResourceChange) -> None:
        try:
            await self.client.get_workflow_handle(session_id).execute_update(update, change)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            raise invalid(getattr(cause, "message", None) or str(exc)) from exc


def repository_routes(gateway: Any, authed: Authed) -> list[Route]:
    """`/v1/sessions/{id}/resources` (`gateway` is the app's `Gateway`)."""
    resources = SessionResources(gateway.records.client, ACCESS, gateway.sessions.knowledge)
    base = "/v1/sessions/{id}/resources"
    return [
        Route(base, authed(resources.list), methods=["GET"]),
        Route(base, authed(resources.add), methods=["POST"]),
        Route(base + "/{resource_id}", authed(resources.retrieve), methods=["GET"]),
        Route(base + "/{resource_id}", authed(resources.update), methods=["POST"]),
        Route(base + "/{resource_id}", authed(resources.delete), methods=["DELETE"]),
    ]
