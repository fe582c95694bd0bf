"""The gateway's ASGI app: routes, authentication, and the agent and environment resources.

Every request names its API key (`Authorization: Bearer`, as the SDK sends it, or `x-api-key`); the key's
workspace scopes everything the request sees. A verified key is remembered for `KEY_CACHE_SECONDS`, so a revoked
key stops working within that time on every gateway.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from temporalio.client import Client

from corral import telemetry
from corral.apikeys import KEY_PREFIX, verify_key
from corral.errors import SessionEnded
from corral.names import HARNESS_TASK_QUEUE, MODEL_TASK_QUEUE
from corral.records import RecordArchived, RecordNotFound, Records, RecordView, VersionConflict
from gateway.errors import ApiError, api_error_handler, error_response, invalid, not_found
from gateway.hands import check_hands
from gateway.http import DEFAULT_STREAMS_PER_KEY, Authed, Handler, StreamSlots, body, flag, whole
from gateway.owned import WORKSPACE_HEADER, check_selected_workspace, own_record, record_prefix
from gateway.session_admin import session_admin_routes
from gateway.session_status import session_ended_handler
from gateway.sessions import Sessions, session_routes
from gateway.shapes import agent_body, agent_view, environment_body, environment_view
from gateway.vaults import vault_routes

KEY_CACHE_SECONDS = 10.0
DEFAULT_PORT = 8780
CREATED_AT_BOUNDS = {"agent": ("created_at[gte]", "created_at[lte]")}
"""The creation-time bounds a listing takes, as the SDK sends them (`agents.list(created_at_gte=...)`); the SDK's
`environments.list` has none, so an environment listing refuses them all."""

_RFC_3339 = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt ](?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<fraction>\d+))?"
    r"(?P<offset>[Zz]|[+-]\d{2}:\d{2})"
)


class Gateway:
    """The app's state: a Temporal client and what is built on it. Nothing else: two gateways serve alike."""

    def __init__(
        self,
        client: Client,
        harness_queue: str = HARNESS_TASK_QUEUE,
        model_queue: str = MODEL_TASK_QUEUE,
        streams_per_key: int = DEFAULT_STREAMS_PER_KEY,
    ) -> None:
        self.records = Records(client, task_queue=harness_queue)
        self.sessions = Sessions(client, self.records, harness_queue, model_queue)
        self.streams = StreamSlots(streams_per_key)
        self._keys: dict[str, tuple[str, float]] = {}

    async def workspace(self, request: Request) -> str:
        """The workspace of the request's key; the key's record id is left in `request.state.key_id` (the key's
        own bounds, such as its open streams, are counted by it: never by the secret)."""
        authorization = request.headers.get("authorization", "")
        key = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
        key = key or request.headers.get("x-api-key", "").strip()
        if not key:
            raise ApiError(401, "no API key: send it as `Authorization: Bearer <key>` (or `x-api-key`)")
        request.state.key_id = key.removeprefix(KEY_PREFIX).partition("-")[0]  # only read once the key is verified
        cached = self._keys.get(key)
        if cached is not None and time.monotonic() - cached[1] < KEY_CACHE_SECONDS:
            return cached[0]
        workspace = await verify_key(self.records, key)
        if workspace is None:
            self._keys.pop(key, None)
            raise ApiError(401, "invalid API key (create one with `corral api-key create --workspace NAME`)")
        self._keys[key] = (workspace, time.monotonic())
        return workspace


# ---- agents and environments ------------------------------------------------------------------------------------


class Resource:
    """A versioned record kind (agents, environments) under `/v1/<plural>`."""

    def __init__(self, gateway: Gateway, kind: str, make_body: Any, view: Any) -> None:
        self.gateway, self.kind = gateway, kind
        self.make_body, self.view = make_body, view

    def show(self, record: RecordView) -> dict[str, Any]:
        if self.kind == "agent":
            return self.view(record.id, record.version, record.body, record.created_at, record.updated_at,
                             record.archived_at)  # fmt: skip
        return self.view(record.id, record.body, record.created_at, record.updated_at, record.archived_at)

    async def get(self, workspace: str, record_id: str, version: int | None = None) -> RecordView:
        return await own_record(self.gateway.records, workspace, record_id, self.kind, f"{self.kind}_id", version)

    async def create(self, request: Request, workspace: str) -> Response:
        made = self.make_body(await body(request))
        await self.check_hands(workspace, made)
        record = await self.gateway.records.create(self.kind, workspace, made, record_prefix(self.kind))
        return JSONResponse(self.show(record))

    async def check_hands(self, workspace: str, made: dict[str, Any]) -> None:
        """An agent's hands must be registered for its workspace (gateway/hands.py): checked before any write."""
        if self.kind == "agent":
            await check_hands(self.gateway.records, workspace, made.get("tools"),
                              own_queues=self.gateway.sessions.own_queues())  # fmt: skip

    async def retrieve(self, request: Request, workspace: str) -> Response:
        version = whole(request.query_params.get("version"), "version")
        return JSONResponse(self.show(await self.get(workspace, request.path_params["id"], version)))

    async def update(self, request: Request, workspace: str) -> Response:
        record_id = request.path_params["id"]
        current = await self.get(workspace, record_id)
        changes = await body(request)
        expected = changes.pop("version", None) if self.kind == "agent" else None
        if expected is not None and (not isinstance(expected, int) or expected < 1):
            raise invalid("version must be a positive integer")
        made = self.make_body(changes, current.body)
        await self.check_hands(workspace, made)
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
        return JSONResponse(self.show(record))

    async def archive(self, request: Request, workspace: str) -> Response:
        record_id = request.path_params["id"]
        await self.get(workspace, record_id)
        return JSONResponse(self.show(await self.gateway.records.archive(record_id, workspace, kind=self.kind)))

    async def delete(self, request: Request, workspace: str) -> Response:
        record_id = request.path_params["id"]
        await self.get(workspace, record_id)
        await self.gateway.records.delete(record_id, workspace, kind=self.kind)
        return JSONResponse({"id": record_id, "type": f"{self.kind}_deleted"})

    async def list(self, request: Request, workspace: str) -> Response:
        params = request.query_params
        limit = whole(params.get("limit"), "limit") or 20
        if limit > 100:
            raise invalid("limit must be at most 100")
        supported = CREATED_AT_BOUNDS.get(self.kind, ())
        filters = sorted(key for key in params if key.startswith("created_at[") and key not in supported)
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


def instant(value: str | None, where: str, *, round_up: bool = True) -> datetime | None:
    """An RFC 3339 timestamp (the SDK sends a datetime's isoformat(), a string as given), with its offset: a time
    without one is refused, not guessed. Past microseconds, a lower bound rounds up and an upper one down, so an
    inclusive bound keeps exactly the times it names."""
    if value is None:
        return None
    refused = invalid(f"{where} must be an RFC 3339 timestamp with a time zone, like 2026-01-31T09:30:00Z, "
                      f"not {value!r}")  # fmt: skip
    match = _RFC_3339.fullmatch(value)
    if match is None:
        raise refused
    fraction = match["fraction"] or "0"
    offset = "+00:00" if match["offset"] in ("Z", "z") else match["offset"]
    try:  # the pattern has the shape; this checks the values (no February 30th)
        moment = datetime.fromisoformat(f"{match['date']}T{match['time']}.{fraction[:6]:0<6}{offset}")
    except ValueError as exc:
        raise refused from exc
    if round_up and fraction[6:].strip("0"):
        moment += timedelta(microseconds=1)
    return moment


# ---- observability ---------------------------------------------------------------------------------------------

_SESSION_PATH = re.compile(r"^/v1/sessions/([^/]+)")
_TRACE_HEADERS = (b"traceparent", b"tracestate", b"baggage")


class ObservedRequests:
    """Each HTTP request as an OpenTelemetry server span (with tracing on) whose context the handler's Temporal
    calls inherit, so a session's trace starts at the request that made it; and the request's session id for the
    JSON log lines. The span has the method, route, path and status, never a header (API keys) or a body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session = _SESSION_PATH.match(scope["path"])
        token = telemetry.session_id_var.set(session[1] if session else None)
        try:
            if telemetry.tracing_enabled():
                await self._traced(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        finally:
            telemetry.session_id_var.reset(token)

    async def _traced(self, scope: Scope, receive: Receive, send: Send) -> None:
        from opentelemetry import propagate, trace

        carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
                   if name in _TRACE_HEADERS}  # fmt: skip
        method = scope["method"]
        status: list[int] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        with trace.get_tracer("corral.gateway").start_as_current_span(
            f"{method} {scope['path']}",
            context=propagate.extract(carrier),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        ) as span:
            await self.app(scope, receive, sending)
            route = getattr(scope.get("route"), "path", None)
            if route is not None:  # the template, as the span's name: `POST /v1/sessions/{id}/events`
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            if status:
                span.set_attribute("http.response.status_code", status[0])
                if status[0] >= 500:
                    span.set_status(trace.StatusCode.ERROR)


# ---- the app ------------------------------------------------------------------------------------------------


def resource_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    """Agents and environments: versioned records."""
    routes = []
    for resource, plural in (
        (Resource(gateway, "agent", agent_body, agent_view), "agents"),
        (Resource(gateway, "environment", environment_body, environment_view), "environments"),
    ):
        base = f"/v1/{plural}"
        routes += [
            Route(base, authed(resource.create), methods=["POST"]),
            Route(base, authed(resource.list), methods=["GET"]),
            Route(base + "/{id}", authed(resource.retrieve), methods=["GET"]),
            Route(base + "/{id}", authed(resource.update), methods=["POST"]),
            Route(base + "/{id}/archive", authed(resource.archive), methods=["POST"]),
        ]
        if resource.kind == "agent":
            routes.append(Route(base + "/{id}/versions", authed(resource.versions), methods=["GET"]))
        else:  # agents are archived, never deleted (as upstream)
            routes.append(Route(base + "/{id}", authed(resource.delete), methods=["DELETE"]))
    return routes


FEATURES: list[Callable[[Gateway, Authed], list[Route]]] = [
    resource_routes,
    session_routes,
    session_admin_routes,
    vault_routes,
]
"""Each feature module's routes, in the order they are matched."""


def create_app(
    client: Client,
    harness_queue: str = HARNESS_TASK_QUEUE,
    model_queue: str = MODEL_TASK_QUEUE,
    streams_per_key: int = DEFAULT_STREAMS_PER_KEY,
) -> Starlette:
    gateway = Gateway(client, harness_queue, model_queue, streams_per_key)

    def authed(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            workspace = await gateway.workspace(request)
            check_selected_workspace(request.headers.get(WORKSPACE_HEADER), workspace)
            return await handler(request, workspace)

        return endpoint

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [Route("/healthz", health)]
    for feature in FEATURES:
        routes += feature(gateway, authed)

    async def not_found_route(request: Request, exc: Exception) -> Response:
        return error_response(404, f"no such endpoint: {request.method} {request.url.path}")

    async def wrong_method(request: Request, exc: Exception) -> Response:
        return error_response(405, f"{request.method} is not supported on {request.url.path}")

    observed = telemetry.current()
    return Starlette(
        routes=routes,
        exception_handlers={
            ApiError: api_error_handler,
            SessionEnded: session_ended_handler,
            404: not_found_route,
            405: wrong_method,
        },
        middleware=[Middleware(ObservedRequests)] if observed and (observed.tracing or observed.json_logs) else [],
    )
