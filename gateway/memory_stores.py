"""Memory stores (`/v1/memory_stores`): create, list, retrieve, update, archive and delete, as the SDK's
`client.beta.memory_stores` calls them (it sends `anthropic-beta: agent-memory-2026-07-22`). A store's memories and
their versions are in gateway/memories.py; everything is read and written by corral.memory_stores, on the knowledge
database, off the event loop, and its errors become the API's in gateway/memory_shapes.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.memory_paths import DEFAULT_LIMIT
from corral.memory_records import MemoryStoreRecord
from gateway.errors import invalid
from gateway.http import Authed, body, flag
from gateway.memories import MemoryRoutes, MemoryVersionRoutes
from gateway.memory_shapes import MemoryApi, fields_of, store_id_of, whole_number
from gateway.pages import instant

if TYPE_CHECKING:
    from gateway.app import Gateway

STORE_FIELDS = frozenset({"name", "description", "metadata"})


class MemoryStoreRoutes:
    def __init__(self, api: MemoryApi) -> None:
        self.api = api
        self.stores = api.stores

    async def create(self, request: Request, workspace: str) -> Response:
        given = fields_of(await body(request), STORE_FIELDS, "memory store")
        if "name" not in given:
            raise invalid("name is required")
        store = await self.api.answer(self.stores.create_store, workspace, given["name"], given.get("description"),
                                      given.get("metadata"))  # fmt: skip
        await self.api.tell("memory_store.created", store.id, workspace)
        return JSONResponse(store.view())

    async def listing(self, request: Request, workspace: str) -> Response:
        params = request.query_params
        page = await self.api.answer(
            self.stores.list_stores,
            workspace,
            include_archived=flag(params.get("include_archived")),
            created_at_gte=instant(params.get("created_at[gte]"), "created_at[gte]"),
            created_at_lte=instant(params.get("created_at[lte]"), "created_at[lte]", round_up=False),
            limit=whole_number(request, "limit", DEFAULT_LIMIT),
            page=params.get("page"),
        )
        return JSONResponse({"data": [store.view() for store in page.data], "next_page": page.next_page})

    async def retrieve(self, request: Request, workspace: str) -> Response:
        store = await self.api.answer(self.stores.get_store, workspace, store_id_of(request))
        return JSONResponse(store.view())

    async def update(self, request: Request, workspace: str) -> Response:
        store_id = store_id_of(request)
        given = fields_of(await body(request), STORE_FIELDS, "memory store")
        if "name" in given and given["name"] is None:
            raise invalid("name cannot be null (omit it to keep the name)")
        store = await self.api.answer(self.stores.update_store, workspace, store_id, given.get("name"),
                                      given.get("description"), given.get("metadata"))  # fmt: skip
        return JSONResponse(store.view())

    async def archive(self, request: Request, workspace: str) -> Response:
        store: MemoryStoreRecord = await self.api.answer(self.stores.archive_store, workspace, store_id_of(request))
        await self.api.tell("memory_store.archived", store.id, workspace)
        return JSONResponse(store.view())

    async def delete(self, request: Request, workspace: str) -> Response:
        store_id = store_id_of(request)
        await self.api.answer(self.stores.delete_store, workspace, store_id)
        await self.api.tell("memory_store.deleted", store_id, workspace)
        return JSONResponse({"id": store_id, "type": "memory_store_deleted"})

    def routes(self, authed: Authed) -> list[Route]:
        base = "/v1/memory_stores"
        one = base + "/{memory_store_id}"
        return [
            Route(base, authed(self.create), methods=["POST"]),
            Route(base, authed(self.listing), methods=["GET"]),
            Route(one, authed(self.retrieve), methods=["GET"]),
            Route(one, authed(self.update), methods=["POST"]),
            Route(one, authed(self.delete), methods=["DELETE"]),
            Route(one + "/archive", authed(self.archive), methods=["POST"]),
        ]


def memory_store_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    api = MemoryApi(gateway)
    return [
        *MemoryStoreRoutes(api).routes(authed),
        # A self-hosted worker syncs the memories of its session's stores with the session token (gateway/work_auth.py).
        *MemoryRoutes(api).routes(
            lambda handler: gateway.credentials.for_attached(handler, "memory_store", "memory_store_id")
        ),
        *MemoryVersionRoutes(api).routes(authed),
    ]
