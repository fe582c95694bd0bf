"""The versioned-record resources (agents, environments, and the ones to come that are records too): a resource is
a `RecordResource` subclass that names its kind and says how a request becomes a body and a record becomes a view.

Every record is one entity workflow (`corral.records`, `workflows/records.py`) of the caller's workspace: each
route checks the id's kind and workspace first (`gateway/owned.py`), so another workspace's record is a 404.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.records import RecordArchived, RecordNotFound, RecordView, VersionConflict
from gateway.errors import ApiError, invalid, not_found
from gateway.http import Authed, body, flag, whole
from gateway.owned import own_record, record_prefix
from gateway.pages import instant

if TYPE_CHECKING:
    from gateway.app import Gateway

MAX_RECORDS_PER_PAGE = 100


class RecordResource:
    """A versioned record kind under `/v1/<plural>`: create, list, retrieve, update and archive; then either the
    versions of a `versioned` kind (which is archived, never deleted, as upstream) or delete."""

    kind: str
    plural: str
    versioned = False
    """Whether an update may name the `version` it changes (409 when it is not the latest), and old versions are
    listed and read."""
    webhook_kind: str | None = None
    """The kind of its webhook events (`agent` makes `agent.created`, ...); None: it emits none."""
    created_at_bounds: tuple[str, ...] = ()
    """The creation-time bounds a listing takes, as the SDK sends them; any other is refused, not ignored."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def make_body(self, request: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
        """The record body a create (`current` None) or an update asks for, checked: 400 naming the field."""
        raise NotImplementedError

    def show(self, record: RecordView) -> dict[str, Any]:
        """The record as the API shows it."""
        raise NotImplementedError

    async def check(self, workspace: str, made: dict[str, Any]) -> None:
        """What a body needs beyond its shape (such as the hands it names), checked before any write."""

    async def settle(self, workspace: str, made: dict[str, Any], current: RecordView | None) -> dict[str, Any]:
        """`made` with what only reading other records can settle (such as the versions of the agents it names),
        before any write; `current` is the record an update changes."""
        return made

    def routes(self, authed: Authed) -> list[Route]:
        base = f"/v1/{self.plural}"
        routes = [
            Route(base, authed(self.create), methods=["POST"]),
            Route(base, authed(self.list), methods=["GET"]),
            Route(base + "/{id}", authed(self.retrieve), methods=["GET"]),
            Route(base + "/{id}", authed(self.update), methods=["POST"]),
            Route(base + "/{id}/archive", authed(self.archive), methods=["POST"]),
        ]
        if self.versioned:
            routes.append(Route(base + "/{id}/versions", authed(self.versions), methods=["GET"]))
        else:
            routes.append(Route(base + "/{id}", authed(self.delete), methods=["DELETE"]))
        return routes

    # ---- endpoints ------------------------------------------------------------------------------------------

    async def get(self, workspace: str, record_id: str, version: int | None = None) -> RecordView:
        return await own_record(self.gateway.records, workspace, record_id, self.kind, f"{self.kind}_id", version)

    async def create(self, request: Request, workspace: str) -> Response:
        made = await self.settle(workspace, self.make_body(await body(request)), None)
        await self.check(workspace, made)
        record = await self.gateway.records.create(self.kind, workspace, made, record_prefix(self.kind))
        await self.tell("created", record.id, workspace)
        return JSONResponse(self.show(record))

    async def retrieve(self, request: Request, workspace: str) -> Response:
        version = whole(request.query_params.get("version"), "version")
        return JSONResponse(self.show(await self.get(workspace, request.path_params["id"], version)))

    async def update(self, request: Request, workspace: str) -> Response:
        record_id = request.path_params["id"]
        current = await self.get(workspace, record_id)
        changes = await body(request)
        expected = changes.pop("version", None) if self.versioned else None
        if expected is not None and (not isinstance(expected, int) or expected < 1):
            raise invalid("version must be a positive integer")
        made = await self.settle(workspace, self.make_body(changes, current.body), current)
        await self.check(workspace, made)
        try:
            record = await self.gateway.records.put(record_id, workspace, made, expected_version=expected,
                                                    kind=self.kind)  # fmt: skip
        except VersionConflict as exc:
            raise ApiError(409, f"{self.kind} {record_id!r} is at version {current.version}, not {expected}: "
                                "read it again and apply the change to the latest version") from exc  # fmt: skip
        except RecordArchived as exc:
            raise invalid(f"{self.kind} {record_id!r} is archived and cannot change") from exc
        except RecordNotFound as exc:
            raise not_found(self.kind, record_id) from exc
        await self.tell("updated", record_id, workspace)
        return JSONResponse(self.show(record))

    async def archive(self, request: Request, workspace: str) -> Response:
        record_id = request.path_params["id"]
        await self.get(workspace, record_id)
        archived = await self.gateway.records.archive(record_id, workspace, kind=self.kind)
        await self.tell("archived", record_id, workspace)
        return JSONResponse(self.show(archived))

    async def delete(self, request: Request, workspace: str) -> Response:
        record_id = request.path_params["id"]
        await self.get(workspace, record_id)
        await self.gateway.records.delete(record_id, workspace, kind=self.kind)
        await self.tell("deleted", record_id, workspace)
        return JSONResponse({"id": record_id, "type": f"{self.kind}_deleted"})

    async def tell(self, change: str, record_id: str, workspace: str) -> None:
        if self.webhook_kind is not None:
            await self.gateway.tell(f"{self.webhook_kind}.{change}", record_id, workspace)

    async def list(self, request: Request, workspace: str) -> Response:
        params = request.query_params
        limit = whole(params.get("limit"), "limit") or 20
        if limit > MAX_RECORDS_PER_PAGE:
            raise invalid(f"limit must be at most {MAX_RECORDS_PER_PAGE}")
        filters = sorted(key for key in params if key.startswith("created_at[") and key not in self.created_at_bounds)
        if filters:  # refused rather than ignored: a client must not take an unfiltered list for a filtered one
            raise invalid(f"{', '.join(filters)}: listing {self.kind}s by creation time is not supported yet")
        gte = instant(params.get("created_at[gte]"), "created_at[gte]")
        lte = instant(params.get("created_at[lte]"), "created_at[lte]", round_up=False)
        try:
            records, next_page = await self.gateway.records.list(
                self.kind, workspace, include_archived=flag(params.get("include_archived")), limit=limit,
                page=params.get("page"), created_at_gte=gte, created_at_lte=lte,
            )  # fmt: skip
        except ValueError as exc:
            raise invalid(f"page: {exc}") from exc
        return JSONResponse({"data": [self.show(r) for r in records], "next_page": next_page})

    async def versions(self, request: Request, workspace: str) -> Response:
        record_id = request.path_params["id"]
        await self.get(workspace, record_id)
        versions = await self.gateway.records.versions(record_id, workspace, kind=self.kind)
        return JSONResponse({"data": [self.show(r) for r in sorted(versions, key=lambda r: -r.version)],
                             "next_page": None})  # fmt: skip
