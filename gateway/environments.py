"""Environments (`/v1/environments`): records of where a session's built-in tools run. A `cloud` environment is the
sandbox corral runs (its engine, packages, network), read as a recipe when a session is made; a `self_hosted` one
is a work queue that the user's own worker serves (corral.contract.work), started when the environment is made.

A self-hosted environment's keys (`/v1/environments/{id}/keys`, a corral extension: upstream issues them in its
Console) are what its worker holds instead of an API key (corral.envkeys). They are managed with an API key only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.envkeys import create_environment_key, list_environment_keys, revoke_environment_key
from corral.records import RecordNotFound, RecordView
from gateway.environment_config import SELF_HOSTED, config_type, environment_body, environment_view
from gateway.errors import ApiError, invalid
from gateway.http import Authed, body
from gateway.owned import id_of, own_record, record_prefix
from gateway.records import RecordResource
from gateway.shapes import when

if TYPE_CHECKING:
    from gateway.app import Gateway

MAX_KEY_NAME = 256


class Environments(RecordResource):
    kind = "environment"
    webhook_kind = "environment"
    plural = "environments"
    created_at_bounds = ()
    """The SDK's `environments.list` has none, so a listing refuses them all."""

    def make_body(self, request: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
        return environment_body(request, current)

    def show(self, record: RecordView) -> dict[str, Any]:
        return environment_view(record.id, record.body, record.created_at, record.updated_at, record.archived_at)

    async def create(self, request: Request, workspace: str) -> Response:
        """As every record's create; a self-hosted environment's queue is started with it, so that its workers can
        poll it (and `corral environment work` show it) before any session asks for hands."""
        made = await self.settle(workspace, self.make_body(await body(request)), None)
        await self.check(workspace, made)
        record = await self.gateway.records.create(self.kind, workspace, made, record_prefix(self.kind))
        if config_type(record.body) == SELF_HOSTED:
            await self.gateway.work_queues.ensure(record.id, workspace)
        await self.tell("created", record.id, workspace)
        return JSONResponse(self.show(record))


class EnvironmentKeys:
    """`/v1/environments/{id}/keys`: issue, list and revoke a self-hosted environment's keys."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def self_hosted(self, workspace: str, environment_id: Any) -> RecordView:
        """The environment, if it is a self-hosted one of the caller's (404 for another workspace's, 400 else)."""
        environment = await own_record(self.gateway.records, workspace, environment_id, "environment",
                                       "environment_id")  # fmt: skip
        if config_type(environment.body) != SELF_HOSTED:
            raise invalid(f"environment_id: {environment.id} is a cloud environment; only a self_hosted one has keys "
                          "(its worker holds one instead of an API key)")  # fmt: skip
        return environment

    async def create(self, request: Request, workspace: str) -> Response:
        environment = await self.self_hosted(workspace, request.path_params["id"])
        given = await body(request)
        unknown = sorted(set(given) - {"name"})
        if unknown:
            raise invalid(f"unknown environment key field(s): {', '.join(unknown)}")
        name = given.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > MAX_KEY_NAME):
            raise invalid(f"name must be a string of at most {MAX_KEY_NAME} characters")
        key, record = await create_environment_key(self.gateway.records, workspace, environment.id, name or None)
        return JSONResponse({**key_view(record), "key": key})  # the only time the key is shown

    async def listing(self, request: Request, workspace: str) -> Response:
        environment = await self.self_hosted(workspace, request.path_params["id"])
        keys = await list_environment_keys(self.gateway.records, workspace, environment.id)
        return JSONResponse({"data": [key_view(key) for key in keys], "next_page": None})

    async def revoke(self, request: Request, workspace: str) -> Response:
        environment = await self.self_hosted(workspace, request.path_params["id"])
        key_id = id_of(request.path_params["key_id"], "key_id", "environment key")
        try:
            record = await revoke_environment_key(self.gateway.records, workspace, environment.id, key_id)
        except RecordNotFound as exc:
            raise ApiError(404, f"environment key {key_id!r} was not found in environment {environment.id}",
                           error_code="environment_key_not_found") from exc  # fmt: skip
        self.gateway.credentials.forget_environment_key(record.id)
        return JSONResponse(key_view(record))

    def routes(self, authed: Authed) -> list[Route]:
        base = "/v1/environments/{id}/keys"
        return [
            Route(base, authed(self.create), methods=["POST"]),
            Route(base, authed(self.listing), methods=["GET"]),
            Route(base + "/{key_id}/revoke", authed(self.revoke), methods=["POST"]),
        ]


def key_view(record: RecordView) -> dict[str, Any]:
    """An environment key as the API shows it: never its secret, only the first characters (`prefix`)."""
    return {
        "type": "environment_key",
        "id": record.id,
        "environment_id": record.body.get("environment_id"),
        "name": record.body.get("name"),
        "prefix": record.body.get("prefix"),
        "created_at": when(record.created_at),
        "revoked_at": record.body.get("revoked_at"),
    }


def environment_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    return [*Environments(gateway).routes(authed), *EnvironmentKeys(gateway).routes(authed)]
