"""A memory store's memories (`/v1/memory_stores/{id}/memories`) and their versions (`…/memory_versions`), as the
SDK's `client.beta.memory_stores.memories` and `.memory_versions` call them. Memories are addressed by id; a path
is a value (a rename keeps the id). An update with `precondition` and a delete with `expected_content_sha256` apply
only if the memory's content is still the one named: else 409, which the SDK does not retry.

Every write is attributed to the API key it was made with (`api_actor`), in the version it adds.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.memory_paths import DEFAULT_LIMIT
from gateway.errors import invalid
from gateway.http import Authed, body
from gateway.memory_shapes import MemoryApi, actor_of, fields_of, full_view, store_id_of, whole_number
from gateway.owned import id_of
from gateway.pages import instant

MEMORY_FIELDS = frozenset({"path", "content"})
UPDATE_FIELDS = frozenset({"path", "content", "precondition"})


def memory_id_of(request: Request) -> str:
    return id_of(request.path_params["memory_id"], "memory_id", "memory")


def precondition_sha(precondition: Any) -> str | None:
    """The digest a `{type: "content_sha256", content_sha256}` precondition names (None when there is none)."""
    if precondition is None:
        return None
    if not isinstance(precondition, dict) or precondition.get("type") != "content_sha256":
        raise invalid('precondition must be {"type": "content_sha256", "content_sha256": "<64 hex characters>"}')
    unknown = sorted(set(precondition) - {"type", "content_sha256"})
    if unknown:
        raise invalid(f"unknown precondition field(s): {', '.join(unknown)[:200]}")
    if "content_sha256" not in precondition:
        raise invalid("precondition.content_sha256 is required")
    return str(precondition["content_sha256"]) if isinstance(precondition["content_sha256"], str) else "?"


class MemoryRoutes:
    def __init__(self, api: MemoryApi) -> None:
        self.api = api
        self.stores = api.stores

    async def create(self, request: Request, workspace: str) -> Response:
        store_id, full = store_id_of(request), full_view(request, "basic")
        given = fields_of(await body(request), MEMORY_FIELDS, "memory")
        if "path" not in given or "content" not in given:
            raise invalid('path and content are required (content may be "" for an empty memory)')
        memory = await self.api.answer(self.stores.create_memory, workspace, store_id, given["path"],
                                       given["content"], actor_of(request))  # fmt: skip
        return JSONResponse(memory.view(full))

    async def retrieve(self, request: Request, workspace: str) -> Response:
        store_id, memory_id, full = store_id_of(request), memory_id_of(request), full_view(request, "full")
        memory = await self.api.answer(self.stores.get_memory, workspace, store_id, memory_id, full)
        return JSONResponse(memory.view(full))

    async def update(self, request: Request, workspace: str) -> Response:
        store_id, memory_id, full = store_id_of(request), memory_id_of(request), full_view(request, "basic")
        given = fields_of(await body(request), UPDATE_FIELDS, "memory update")
        memory = await self.api.answer(
            self.stores.update_memory,
            workspace,
            store_id,
            memory_id,
            actor_of(request),
            content=given.get("content"),
            path=given.get("path"),
            expected_sha256=precondition_sha(given.get("precondition")),
        )
        return JSONResponse(memory.view(full))

    async def delete(self, request: Request, workspace: str) -> Response:
        store_id, memory_id = store_id_of(request), memory_id_of(request)
        expected = request.query_params.get("expected_content_sha256")
        await self.api.answer(self.stores.delete_memory, workspace, store_id, memory_id, actor_of(request), expected)
        return JSONResponse({"id": memory_id, "type": "memory_deleted"})

    async def listing(self, request: Request, workspace: str) -> Response:
        store_id, full = store_id_of(request), full_view(request, "basic")
        page = await self.api.answer(
            self.stores.list_memories,
            workspace,
            store_id,
            path_prefix=request.query_params.get("path_prefix"),
            depth=whole_number(request, "depth", 0),
            limit=whole_number(request, "limit", DEFAULT_LIMIT),
            page=request.query_params.get("page"),
            full=full,
        )
        return JSONResponse({"data": [item.view(full) for item in page.data], "next_page": page.next_page})

    def routes(self, authed: Authed) -> list[Route]:
        base = "/v1/memory_stores/{memory_store_id}/memories"
        one = base + "/{memory_id}"
        return [
            Route(base, authed(self.create), methods=["POST"]),
            Route(base, authed(self.listing), methods=["GET"]),
            Route(one, authed(self.retrieve), methods=["GET"]),
            Route(one, authed(self.update), methods=["POST"]),
            Route(one, authed(self.delete), methods=["DELETE"]),
        ]


class MemoryVersionRoutes:
    def __init__(self, api: MemoryApi) -> None:
        self.api = api
        self.stores = api.stores

    async def listing(self, request: Request, workspace: str) -> Response:
        store_id, full, params = store_id_of(request), full_view(request, "basic"), request.query_params
        memory_id, session_id = params.get("memory_id"), params.get("session_id")
        page = await self.api.answer(
            self.stores.list_versions,
            workspace,
            store_id,
            memory_id=None if memory_id is None else id_of(memory_id, "memory_id", "memory"),
            session_id=None if session_id is None else id_of(session_id, "session_id", "session"),
            api_key_id=params.get("api_key_id"),
            service_account_id=params.get("service_account_id"),
            operation=params.get("operation"),
            created_at_gte=instant(params.get("created_at[gte]"), "created_at[gte]"),
            created_at_lte=instant(params.get("created_at[lte]"), "created_at[lte]", round_up=False),
            limit=whole_number(request, "limit", DEFAULT_LIMIT),
            page=params.get("page"),
            full=full,
        )
        return JSONResponse({"data": [version.view(full) for version in page.data], "next_page": page.next_page})

    def version_id_of(self, request: Request) -> str:
        return id_of(request.path_params["memory_version_id"], "memory_version_id", "memory version")

    async def retrieve(self, request: Request, workspace: str) -> Response:
        store_id, version_id, full = store_id_of(request), self.version_id_of(request), full_view(request, "full")
        version = await self.api.answer(self.stores.get_version, workspace, store_id, version_id, full)
        return JSONResponse(version.view(full))

    async def redact(self, request: Request, workspace: str) -> Response:
        store_id, version_id = store_id_of(request), self.version_id_of(request)
        fields_of(await body(request), frozenset(), "redact")
        version = await self.api.answer(self.stores.redact_version, workspace, store_id, version_id,
                                        actor_of(request))  # fmt: skip
        return JSONResponse(version.view(True))

    def routes(self, authed: Authed) -> list[Route]:
        base = "/v1/memory_stores/{memory_store_id}/memory_versions"
        one = base + "/{memory_version_id}"
        return [
            Route(base, authed(self.listing), methods=["GET"]),
            Route(one, authed(self.retrieve), methods=["GET"]),
            Route(one + "/redact", authed(self.redact), methods=["POST"]),
        ]
