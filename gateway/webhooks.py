"""Webhook endpoints (`/v1/webhook_endpoints`): a corral extension of the API, documented in docs/webhooks.md (the
SDK covers only organisation endpoints, which corral does not have).

A workspace registers the URLs it wants events at, each with the event types it wants (`["all"]`: every type,
including types added later). Creating an endpoint, and `rotate_secret`, make a new signing secret, write it to
Vault through the gateway's write-only login (`proxy.access`: it cannot read it back) and show it in that answer
only: the proxy, which sends the deliveries, is the one process that reads it. Without Vault these routes answer
503 (as the vaults' do). `deliveries` shows what became of each event owed to the endpoint, and why a failing one
failed; an endpoint disabled after a delivery was given up is enabled again with `enable`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.contract.webhooks import webhook_event_types_problem
from corral.webhook_deliveries import STATUSES, WebhookDeliveries, delivery_view
from corral.webhooks import DISABLED, ENABLED, EndpointNotFound, InvalidEndpoint, WebhookEndpoints, endpoint_view
from gateway.errors import ApiError, invalid
from gateway.http import Authed, body, whole
from gateway.owned import id_of
from gateway.vault_access import ACCESS, VaultAccess, in_vault
from proxy import new_webhook_secret

if TYPE_CHECKING:
    from gateway.app import Gateway

logger = logging.getLogger(__name__)
KIND = "webhook endpoint"
FIELDS = frozenset({"url", "events", "description"})
MAX_DESCRIPTION = 1024
MAX_DELIVERIES = 100


def _not_found(endpoint_id: str) -> ApiError:
    return ApiError(404, f"webhook endpoint {endpoint_id!r} was not found", error_code="webhook_endpoint_not_found")


def _fields(given: dict[str, Any], required: bool) -> dict[str, Any]:
    """The body's fields, checked: a 400 names the field and the problem."""
    unknown = sorted(set(given) - FIELDS)
    if unknown:
        raise invalid(f"unknown webhook endpoint field(s): {', '.join(unknown)}")
    if required and "url" not in given:
        raise invalid("url is required: where the deliveries are POSTed")
    if required and "events" not in given:
        raise invalid('events is required: a list of event types, or ["all"] (see `corral webhook types`)')
    for name in ("url", "events", "description"):
        if name in given and given[name] is None:
            raise invalid(f"{name} cannot be null (omit it to keep the endpoint's)")
    events = given.get("events")
    if events is not None:
        if not isinstance(events, list) or not all(isinstance(t, str) for t in events):
            raise invalid('events must be a list of event type strings, or ["all"]')
        problem = webhook_event_types_problem(events)
        if problem:
            raise invalid(f"events: {problem}")
    description = given.get("description")
    if description is not None and (not isinstance(description, str) or len(description) > MAX_DESCRIPTION):
        raise invalid(f"description must be a string of at most {MAX_DESCRIPTION} characters")
    return given


class WebhookEndpointRoutes:
    def __init__(self, gateway: Gateway, access: VaultAccess) -> None:
        self.endpoints = WebhookEndpoints(gateway.knowledge)
        self.deliveries = WebhookDeliveries(gateway.knowledge)
        self.db = gateway.knowledge
        self.access = access
        self.webhooks = gateway.webhooks

    async def _call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """A table call off the event loop, its refusals as the API's."""
        try:
            return await self.db.run(lambda: function(*args, **kwargs))
        except EndpointNotFound as exc:
            raise _not_found(exc.endpoint_id) from exc
        except InvalidEndpoint as exc:
            raise invalid(str(exc)) from exc

    async def _wake(self, workspace: str) -> None:
        """Tell the workspace's running sessions to emit from now on (`Webhooks.wake_sessions`). The endpoint stands
        whatever happens here: a failure is logged, and those sessions emit from their next start."""
        try:
            await self.webhooks.wake_sessions(workspace)
        except Exception as exc:  # the endpoint is made; only the running sessions' events wait for a new one
            logger.warning("the running sessions of %s were not told of its endpoint: %s", workspace, exc)

    async def _own(self, request: Request, workspace: str) -> str:
        endpoint_id = id_of(request.path_params["id"], "webhook_endpoint_id", KIND)
        await self._call(self.endpoints.get, workspace, endpoint_id)
        return endpoint_id

    async def create(self, request: Request, workspace: str) -> Response:
        given = _fields(await body(request), required=True)
        store = await self.access.store()  # 503 before anything is written, when there is no Vault
        endpoint = await self._call(self.endpoints.create, workspace, given["url"], given["events"],
                                    given.get("description") or "")  # fmt: skip
        secret = new_webhook_secret()
        try:
            await in_vault(store.store_webhook_secret, endpoint.id, secret)
        except BaseException:
            await self._call(self.endpoints.delete, workspace, endpoint.id)  # no endpoint without its secret
            raise
        await self._wake(workspace)
        return JSONResponse({**endpoint_view(endpoint), "secret": secret.get_secret_value()})

    async def listing(self, request: Request, workspace: str) -> Response:
        endpoints = await self._call(self.endpoints.in_workspace, workspace)
        return JSONResponse({"data": [endpoint_view(endpoint) for endpoint in endpoints], "next_page": None})

    async def retrieve(self, request: Request, workspace: str) -> Response:
        endpoint_id = id_of(request.path_params["id"], "webhook_endpoint_id", KIND)
        return JSONResponse(endpoint_view(await self._call(self.endpoints.get, workspace, endpoint_id)))

    async def update(self, request: Request, workspace: str) -> Response:
        endpoint_id = id_of(request.path_params["id"], "webhook_endpoint_id", KIND)
        given = _fields(await body(request), required=False)
        endpoint = await self._call(self.endpoints.update, workspace, endpoint_id, url=given.get("url"),
                                    events=given.get("events"), description=given.get("description"))  # fmt: skip
        return JSONResponse(endpoint_view(endpoint))

    async def delete(self, request: Request, workspace: str) -> Response:
        endpoint_id = await self._own(request, workspace)
        store = await self.access.store()
        await self._call(self.endpoints.delete, workspace, endpoint_id)  # deliveries owed to it stop
        await in_vault(store.destroy_webhook_secret, endpoint_id)
        return JSONResponse({"id": endpoint_id, "type": "webhook_endpoint_deleted"})

    async def rotate_secret(self, request: Request, workspace: str) -> Response:
        """A new secret replaces the old at once: the old one signs nothing after this answer (docs/webhooks.md)."""
        endpoint_id = await self._own(request, workspace)
        store = await self.access.store()
        secret = new_webhook_secret()
        await in_vault(store.store_webhook_secret, endpoint_id, secret)
        endpoint = await self._call(self.endpoints.get, workspace, endpoint_id)
        return JSONResponse({**endpoint_view(endpoint), "secret": secret.get_secret_value()})

    async def enable(self, request: Request, workspace: str) -> Response:
        endpoint_id = await self._own(request, workspace)
        endpoint = await self._call(self.endpoints.set_status, endpoint_id, ENABLED)
        await self._wake(workspace)
        return JSONResponse(endpoint_view(endpoint))

    async def disable(self, request: Request, workspace: str) -> Response:
        endpoint_id = await self._own(request, workspace)
        endpoint = await self._call(self.endpoints.set_status, endpoint_id, DISABLED, "disabled by its owner")
        return JSONResponse(endpoint_view(endpoint))

    async def deliveries_of(self, request: Request, workspace: str) -> Response:
        endpoint_id = await self._own(request, workspace)
        status = request.query_params.get("status")
        if status is not None and status not in STATUSES:
            raise invalid(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
        limit = whole(request.query_params.get("limit"), "limit") or MAX_DELIVERIES
        if not 1 <= limit <= MAX_DELIVERIES:
            raise invalid(f"limit must be 1 to {MAX_DELIVERIES}")
        rows = await self._call(self.deliveries.of_endpoint, endpoint_id, status, limit)
        return JSONResponse({"data": [delivery_view(row) for row in rows], "next_page": None})

    def routes(self, authed: Authed) -> list[Route]:
        base, one = "/v1/webhook_endpoints", "/v1/webhook_endpoints/{id}"
        return [
            Route(base, authed(self.create), methods=["POST"]),
            Route(base, authed(self.listing), methods=["GET"]),
            Route(one, authed(self.retrieve), methods=["GET"]),
            Route(one, authed(self.update), methods=["POST"]),
            Route(one, authed(self.delete), methods=["DELETE"]),
            Route(one + "/rotate_secret", authed(self.rotate_secret), methods=["POST"]),
            Route(one + "/enable", authed(self.enable), methods=["POST"]),
            Route(one + "/disable", authed(self.disable), methods=["POST"]),
            Route(one + "/deliveries", authed(self.deliveries_of), methods=["GET"]),
        ]


def webhook_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    """A workspace's webhook endpoints, their secrets (written to Vault, shown once) and their deliveries."""
    return WebhookEndpointRoutes(gateway, ACCESS).routes(authed)
